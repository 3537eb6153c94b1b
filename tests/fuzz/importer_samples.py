"""Small logs of every importer's format, shaped like the real ones the importer tests read
(each exercises calls, results, usage and the format's own bookkeeping), for the fuzzers
to mutate. ``SAMPLES`` maps a format name to its records: one document, or the lines of a
JSON Lines file."""

from __future__ import annotations

from typing import Any

from tests.fuzz.mutate import dumps

_TS = "2025-04-30T16:32:54.707474"

CLAUDE_CODE: list[Any] = [
    {"type": "summary", "summary": "Fix the parser", "leafUuid": "u0"},
    {
        "type": "user",
        "sessionId": "s1",
        "uuid": "u1",
        "cwd": "/repo",
        "timestamp": _TS,
        "message": {"role": "user", "content": "Fix the bug"},
    },
    {
        "type": "assistant",
        "sessionId": "s1",
        "uuid": "u2",
        "requestId": "r1",
        "timestamp": _TS,
        "message": {
            "id": "msg_1",
            "model": "claude-sonnet-4-5",
            "content": [
                {"type": "thinking", "thinking": "look", "signature": "sig"},
                {"type": "text", "text": "Reading"},
                {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"path": "a"}},
            ],
            "stop_reason": "tool_use",
            "usage": {"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 3},
        },
    },
    {
        "type": "user",
        "sessionId": "s1",
        "uuid": "u3",
        "timestamp": _TS,
        "toolUseResult": {"stdout": "x"},
        "message": {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": "file a"}],
                }
            ],
        },
    },
    {"type": "progress", "sessionId": "s1", "uuid": "u4"},
    {
        "type": "system",
        "subtype": "compact_boundary",
        "sessionId": "s1",
        "uuid": "u5",
        "compactMetadata": {"trigger": "auto", "preTokens": 100},
    },
    {
        "type": "user",
        "sessionId": "s1",
        "uuid": "u6",
        "isCompactSummary": True,
        "message": {"role": "user", "content": [{"type": "text", "text": "summary"}]},
    },
]

_RESPONSE = {
    "id": "gen-1",
    "model": "llama-4",
    "choices": [
        {
            "finish_reason": "tool_calls",
            "message": {
                "content": "Listing",
                "tool_calls": [
                    {
                        "id": "toolu_01",
                        "function": {"name": "execute_bash", "arguments": '{"command": "ls"}'},
                    }
                ],
            },
        }
    ],
    "usage": {"prompt_tokens": 20, "completion_tokens": 4, "total_tokens": 24},
}

OPENHANDS: list[Any] = [
    {
        "instance_id": "repo__1",
        "metadata": {"agent_class": "CodeActAgent", "llm_config": {"model": "llama-4"}},
        "metrics": {"accumulated_cost": 0.1},
        "test_result": {"git_patch": "diff"},
        "error": None,
        "history": [
            {
                "id": 0,
                "timestamp": _TS,
                "source": "agent",
                "action": "system",
                "args": {
                    "content": "You are OpenHands",
                    "tools": [
                        {
                            "type": "function",
                            "function": {
                                "name": "execute_bash",
                                "description": "Run",
                                "parameters": {"type": "object", "properties": {}},
                            },
                        }
                    ],
                },
            },
            {
                "id": 1,
                "timestamp": _TS,
                "source": "user",
                "action": "message",
                "args": {"content": "Fix it", "image_urls": []},
            },
            {
                "id": 2,
                "source": "user",
                "action": "recall",
                "args": {"query": "Fix it"},
            },
            {
                "id": 3,
                "source": "environment",
                "observation": "recall",
                "content": "Added workspace context",
                "extras": {"repo_name": ""},
            },
            {
                "id": 4,
                "timestamp": _TS,
                "source": "agent",
                "action": "run",
                "args": {"command": "ls", "thought": ""},
                "tool_call_metadata": {
                    "function_name": "execute_bash",
                    "tool_call_id": "toolu_01",
                    "model_response": _RESPONSE,
                },
            },
            {
                "id": 5,
                "timestamp": _TS,
                "source": "agent",
                "observation": "run",
                "content": "a.py",
                "extras": {"exit_code": 0},
                "tool_call_metadata": {"function_name": "execute_bash", "tool_call_id": "toolu_01"},
            },
            {
                "id": 6,
                "source": "agent",
                "action": "message",
                "args": {"content": "Done"},
            },
        ],
    }
]

MINI_SWE_AGENT_V1: list[Any] = [
    {
        "trajectory_format": "mini-swe-agent-1",
        "instance_id": "pylint-1",
        "info": {
            "exit_status": "Submitted",
            "submission": "diff",
            "config": {"model": {"model_name": "gemini-3-pro"}},
        },
        "messages": [
            {"role": "system", "content": "You are a helpful assistant"},
            {"role": "user", "content": "<pr_description>fix</pr_description>"},
            {
                "role": "assistant",
                "content": "THOUGHT: look\n\n```bash\nls -R\n```",
                "extra": {
                    "response": {
                        "id": "gen-1",
                        "model": "gemini-3-pro",
                        "created": 1763511344,
                        "choices": [
                            {
                                "finish_reason": "stop",
                                "message": {"content": "x", "reasoning": "thinking"},
                            }
                        ],
                        "usage": {"prompt_tokens": 10, "completion_tokens": 3, "cost": 0.01},
                    }
                },
            },
            {"role": "user", "content": "<returncode>0</returncode>\n<output>a</output>"},
            {"role": "assistant", "content": "no block here"},
            {"role": "user", "content": "Please always provide EXACTLY ONE action"},
            {"role": "assistant", "content": "THOUGHT: submit\n\n```bash\nsubmit\n```"},
            {"role": "user", "content": "diff --git a b"},
        ],
    }
]

MINI_SWE_AGENT_V2: list[Any] = [
    {
        "trajectory_format": "mini-swe-agent-1.1",
        "instance_id": "sqlfluff-1",
        "info": {"exit_status": "Submitted", "config": {"model": {"model_name": "deepseek"}}},
        "messages": [
            {"role": "system", "content": "You are a helpful assistant"},
            {"role": "user", "content": "fix"},
            {
                "role": "assistant",
                "content": "Exploring",
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_00",
                        "type": "function",
                        "function": {"name": "bash", "arguments": '{"command": "ls"}'},
                    }
                ],
                "extra": {
                    "cost": 0.002,
                    "timestamp": 1763511344.5,
                    "response": {
                        "id": "r1",
                        "model": "deepseek-chat",
                        "created": 1763511344,
                        "choices": [{"finish_reason": "tool_calls"}],
                        "usage": {
                            "prompt_tokens": 30,
                            "completion_tokens": 5,
                            "prompt_tokens_details": {"cached_tokens": 10},
                        },
                    },
                },
            },
            {
                "role": "tool",
                "tool_call_id": "call_00",
                "content": "<returncode>0</returncode>\n<output>a</output>",
                "extra": {"returncode": 0, "timestamp": 1763511345.0, "raw_output": "a"},
            },
            {"role": "exit", "content": "diff", "extra": {"exit_status": "Submitted"}},
        ],
    }
]

SWE_AGENT: list[Any] = [
    {
        "environment": "swe_main",
        "info": {"exit_status": "submitted", "model_stats": {"tokens_sent": 10}},
        "history": [
            {"role": "system", "content": "SETTING", "agent": "primary"},
            {"role": "user", "content": "demo", "agent": "primary", "is_demo": True},
            {"role": "user", "content": "ISSUE", "agent": "primary"},
            {
                "role": "assistant",
                "content": "DISCUSSION\nopen a\n```\nopen a\n```",
                "thought": "DISCUSSION\nopen a",
                "action": "open a\n",
                "agent": "primary",
            },
            {"role": "user", "content": "[File: a]", "agent": "primary"},
            {
                "role": "assistant",
                "content": "submit",
                "thought": "done",
                "action": "submit\n",
                "agent": "primary",
            },
        ],
        "trajectory": [
            {"action": "open a\n", "observation": "[File: a]", "state": "{}", "thought": "t"},
            {"action": "submit\n", "observation": "diff", "state": "{}", "thought": "t"},
        ],
    }
]

OPENAI_CHAT: list[Any] = [
    {
        "id": "chat-1",
        "model": "gpt-4o",
        "tools": [{"type": "function", "function": {"name": "bash", "parameters": {}}}],
        "messages": [
            {"role": "system", "content": "You are helpful"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}},
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "think",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "bash", "arguments": '{"command": "ls"}'},
                    }
                ],
                "usage": {"prompt_tokens": 5, "completion_tokens": 2},
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "a.py"},
            {"role": "assistant", "content": "done", "finish_reason": "stop"},
        ],
    }
]

ANTHROPIC_MESSAGES: list[Any] = [
    {
        "id": "conv-1",
        "model": "claude-sonnet-4-5",
        "system": [{"type": "text", "text": "You are helpful"}],
        "tools": [{"name": "bash", "description": "Run", "input_schema": {"type": "object"}}],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": "AA=="},
                    },
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hm", "signature": "sig"},
                    {"type": "redacted_thinking", "data": "xx"},
                    {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"c": "ls"}},
                ],
                "stop_reason": "tool_use",
                "usage": {"input_tokens": 3, "output_tokens": 1},
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "is_error": False,
                        "content": [
                            {"type": "text", "text": "a.py"},
                            {
                                "type": "document",
                                "title": "a.pdf",
                                "source": {"type": "url", "url": "https://x/a.pdf"},
                            },
                        ],
                    }
                ],
            },
            {"role": "assistant", "content": "done", "stop_reason": "end_turn"},
        ],
    }
]

SAMPLES: dict[str, list[list[Any]]] = {
    "claude_code": [CLAUDE_CODE],
    "openhands": [OPENHANDS],
    "mini_swe_agent": [MINI_SWE_AGENT_V1, MINI_SWE_AGENT_V2],
    "swe_agent": [SWE_AGENT],
    "openai_chat": [OPENAI_CHAT],
    "anthropic_messages": [ANTHROPIC_MESSAGES],
}
JSONL = {"claude_code", "openhands"}


def log_text(fmt: str, records: list[Any]) -> str:
    """The text of a log in ``fmt`` holding ``records``."""
    if fmt in JSONL:
        return "\n".join(dumps(r) for r in records) + "\n"
    return dumps(records[0], indent=1)
