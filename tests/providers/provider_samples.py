"""A small hand-made request that exercises every part type, shared by the provider tests.

A plain module rather than a conftest, so that tests can import it by a unique name."""

from __future__ import annotations

from kilo_rules.engine.formats.request import (
    Media,
    ModelMessage,
    ModelRequest,
    Reasoning,
    Text,
    ToolCall,
    ToolResult,
    ToolSpec,
)

PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9"
    "awAAAABJRU5ErkJggg=="
)
PDF = "JVBERi0xLjQKJcfsj6IKMSAwIG9iago8PD4+CmVuZG9iagp0cmFpbGVyCjw8Pj4KJSVFT0YK"
ENV = "<environment_details>\ncwd: /repo\n</environment_details>"


def sample_request(model: str = "claude-sonnet-4-5") -> ModelRequest:
    """System + tools + user text and image + assistant reasoning, text and two tool calls
    + their results (one an error) + redacted reasoning + a final user turn with a PDF."""
    return ModelRequest(
        model=model,
        messages=(
            ModelMessage("system", (Text("You are Kilo, a coding agent."),)),
            ModelMessage("system", (Text("Project rules: run the tests before you finish."),)),
            ModelMessage(
                "user",
                (
                    Text("Fix the failing test in app.py."),
                    Media("image/png", data=PNG, filename="screenshot.png"),
                    Text(ENV, synthetic=True),
                ),
                source_id="msg_u1",
            ),
            ModelMessage(
                "assistant",
                (
                    Reasoning("The test imports app; read it first.", signature="sig-abc"),
                    Text("I'll read the file and run the tests."),
                    ToolCall("call.read:1", "read_file", {"path": "app.py"}),
                    ToolCall("toolu_02", "bash", {"command": "pytest -q"}),
                ),
                source_id="msg_a1",
            ),
            ModelMessage(
                "tool",
                (
                    ToolResult(
                        "call.read:1", "read_file", (Text("def add(a, b):\n    return a - b\n"),)
                    ),
                    ToolResult("toolu_02", "bash", (Text("1 failed"),), is_error=True),
                ),
            ),
            ModelMessage(
                "assistant",
                (Reasoning("", encrypted="RU5DUllQVEVE"), Text("add() subtracts; fixing it.")),
                source_id="msg_a2",
            ),
            ModelMessage(
                "user",
                (
                    Text("Also check the spec."),
                    Media("application/pdf", data=PDF, filename="spec.pdf"),
                ),
                source_id="msg_u2",
            ),
        ),
        tools=(
            ToolSpec(
                "read_file",
                "Read a file from the workspace.",
                {
                    "type": "object",
                    "properties": {"path": {"type": "string"}},
                    "required": ["path"],
                    "additionalProperties": False,
                },
            ),
            ToolSpec(
                "bash",
                "Run a shell command.",
                {
                    "type": "object",
                    "properties": {"command": {"type": "string"}},
                    "required": ["command"],
                },
            ),
        ),
        max_tokens=1024,
    )
