"""The acceptance rules: valid bodies pass, and every rule fires on a planted defect.

Each case of ``PLANTED`` breaks one rule in a valid rendered body and names the rule and
the JSON path the violation must point at. ``test_every_rule_has_a_planted_defect`` keeps
the table complete: a rule added to an API without a case here fails the suite.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

import pytest
from provider_samples import sample_request

from kilo_rules.engine.base.errors import CatalogError
from kilo_rules.engine.compiler.plan import CacheSettings
from kilo_rules.engine.formats.request import ModelRequest
from kilo_rules.engine.providers import APIS, render
from kilo_rules.engine.providers.acceptance import RULES, BodyContext, check_body, rules_for
from kilo_rules.engine.runtime.cache import place_markers

Mutate = Callable[[Any], None]


def _keys(path: str) -> list[str | int]:
    """``messages[2].content[0].text`` → ``["messages", 2, "content", 0, "text"]``."""
    return [int(k) if k.isdigit() else k for k in re.findall(r"[^.\[\]]+", path)]


def _parent(body: Any, path: str) -> tuple[Any, Any]:
    *keys, last = _keys(path)
    for key in keys:
        body = body[key]
    return body, last


def put(path: str, value: Any) -> Mutate:
    """Set the value at ``path``."""

    def run(b: Any) -> None:
        parent, key = _parent(b, path)
        parent[key] = copy.deepcopy(value)

    return run


def drop(path: str) -> Mutate:
    """Delete the list item or mapping key at ``path``."""

    def run(b: Any) -> None:
        parent, key = _parent(b, path)
        del parent[key]

    return run


def add(path: str, value: Any) -> Mutate:
    """Insert ``value`` into a list at the index ``path`` ends with."""

    def run(b: Any) -> None:
        parent, key = _parent(b, path)
        parent.insert(key, copy.deepcopy(value))

    return run


def both(*steps: Mutate) -> Mutate:
    def run(b: Any) -> None:
        for step in steps:
            step(b)

    return run


def keep(b: Any) -> None:
    """No change: the defect is in the context (where a signature came from, the window)."""


@dataclass(frozen=True)
class Case:
    api: str
    rule: str
    path: str  # where the violation must point
    mutate: Mutate
    context: BodyContext | None = None

    def __str__(self) -> str:
        return f"{self.api}:{self.rule}"


def _sample(**options: Any) -> ModelRequest:
    marked = place_markers(sample_request(), CacheSettings(placement="last-part"))[0]
    return replace(marked, options=options)


@cache
def _base(api: str) -> dict[str, Any]:
    """The valid body each planted defect starts from (cache marks included)."""
    return render(_sample(prompt_cache_breakpoints=True), api)


def body(api: str) -> dict[str, Any]:
    return copy.deepcopy(_base(api))


TEXT = {"type": "text", "text": "more"}
A_MARK = {"type": "ephemeral"}
B_POINT = {"cachePoint": {"type": "default"}}
O_MARK = {"mode": "explicit"}
SMALL_WINDOW = BodyContext(context_window=2_000, input_tokens=1_500)
GEMINI_3 = BodyContext(model="gemini-3-pro-preview")

# Anthropic: messages = [user, assistant(thinking, text, tool_use x2), user(tool_result x2),
# assistant(redacted_thinking, text+mark), user(text, document+mark)]; marks also on both
# system blocks. Bedrock has the same turns; Gemini the same contents; Chat Completions
# has two system messages first, then one tool message per result.
PLANTED = [
    # --- anthropic
    Case("anthropic", "first-role", "messages[0]", drop("messages[0]")),
    Case(
        "anthropic",
        "alternation",
        "messages[1]",
        add("messages[1]", {"role": "user", "content": [TEXT]}),
    ),
    Case("anthropic", "call-answered", "messages[1].content[3].id", drop("messages[2].content[1]")),
    Case(
        "anthropic",
        "result-has-call",
        "messages[2].content[0].tool_use_id",
        put("messages[2].content[0].tool_use_id", "toolu_99"),
    ),
    Case(
        "anthropic",
        "result-placement",
        "messages[2].content[1]",
        add("messages[2].content[0]", TEXT),
    ),
    Case(
        "anthropic",
        "call-id-unique",
        "messages[1].content[3].id",
        both(
            put("messages[1].content[3].id", "toolu_01"),
            put("messages[1].content[2].id", "toolu_01"),
            put("messages[2].content[0].tool_use_id", "toolu_01"),
            put("messages[2].content[1].tool_use_id", "toolu_01"),
        ),
    ),
    Case(
        "anthropic",
        "text-not-blank",
        "messages[0].content[0].text",
        put("messages[0].content[0].text", " \n"),
    ),
    Case("anthropic", "text-not-blank", "system", put("system", "  ")),
    Case("anthropic", "content-not-empty", "messages[0].content", put("messages[0].content", [])),
    Case(
        "anthropic",
        "marker-budget",
        "messages[4].content[1].cache_control",
        put("tools[1].cache_control", A_MARK),
    ),
    Case(
        "anthropic",
        "marker-on-thinking",
        "messages[1].content[0].cache_control",
        put("messages[1].content[0].cache_control", A_MARK),
    ),
    Case(
        "anthropic",
        "marker-ttl-order",
        "messages[4].content[1].cache_control",
        put("messages[4].content[1].cache_control", {"type": "ephemeral", "ttl": "1h"}),
    ),
    Case(
        "anthropic",
        "signature-issuer",
        "messages[1].content[0].signature",
        keep,
        BodyContext(signature_issuers={"sig-abc": "google"}),
    ),
    Case(
        "anthropic",
        "signature-issuer",
        "messages[3].content[0].data",
        keep,
        BodyContext(signature_issuers={"RU5DUllQVEVE": "openai"}),
    ),
    Case(
        "anthropic",
        "call-id-format",
        "messages[1].content[3].id",
        put("messages[1].content[3].id", "toolu.02"),
    ),
    Case("anthropic", "tool-name-format", "tools[0].name", put("tools[0].name", "read file")),
    Case("anthropic", "output-positive", "max_tokens", put("max_tokens", 0)),
    Case("anthropic", "output-within-window", "max_tokens", keep, SMALL_WINDOW),
    # --- bedrock
    Case("bedrock", "first-role", "messages[0]", drop("messages[0]")),
    Case(
        "bedrock",
        "alternation",
        "messages[1]",
        add("messages[1]", {"role": "user", "content": [{"text": "more"}]}),
    ),
    Case(
        "bedrock",
        "call-answered",
        "messages[1].content[3].toolUse.toolUseId",
        drop("messages[2].content[1]"),
    ),
    Case(
        "bedrock",
        "result-has-call",
        "messages[2].content[0].toolResult.toolUseId",
        put("messages[2].content[0].toolResult.toolUseId", "toolu_99"),
    ),
    Case(
        "bedrock",
        "result-placement",
        "messages[2].content[1].toolResult",
        add("messages[2].content[0]", {"text": "more"}),
    ),
    Case(
        "bedrock",
        "call-id-unique",
        "messages[1].content[3].toolUse.toolUseId",
        put("messages[1].content[3].toolUse.toolUseId", "call_read_1_ba535360"),
    ),
    Case("bedrock", "text-not-blank", "system[0].text", put("system[0].text", "\t")),
    Case(
        "bedrock",
        "content-not-empty",
        "messages[2].content[1].toolResult.content",
        put("messages[2].content[1].toolResult.content", []),
    ),
    Case(
        "bedrock",
        "content-not-empty",
        "messages[4].content",
        put("messages[4].content", [B_POINT]),
    ),
    Case("bedrock", "marker-budget", "messages[4].content[2]", add("toolConfig.tools[2]", B_POINT)),
    Case(
        "bedrock",
        "marker-on-thinking",
        "messages[1].content[1]",
        add("messages[1].content[1]", B_POINT),
    ),
    Case("bedrock", "marker-first", "system[0]", add("system[0]", B_POINT)),
    Case(
        "bedrock",
        "marker-ttl-order",
        "messages[4].content[2]",
        put("messages[4].content[2].cachePoint.ttl", "1h"),
    ),
    Case(
        "bedrock",
        "signature-issuer",
        "messages[1].content[0].reasoningContent.reasoningText.signature",
        keep,
        BodyContext(signature_issuers={"sig-abc": "google"}),
    ),
    Case(
        "bedrock",
        "call-id-format",
        "messages[1].content[3].toolUse.toolUseId",
        put("messages[1].content[3].toolUse.toolUseId", "t" * 65),
    ),
    Case(
        "bedrock",
        "tool-name-format",
        "toolConfig.tools[0].toolSpec.name",
        put("toolConfig.tools[0].toolSpec.name", "read.file"),
    ),
    Case(
        "bedrock",
        "output-positive",
        "inferenceConfig.maxTokens",
        put("inferenceConfig.maxTokens", 0),
    ),
    Case("bedrock", "output-within-window", "inferenceConfig.maxTokens", keep, SMALL_WINDOW),
    # --- gemini
    Case("gemini", "first-role", "contents[0]", drop("contents[0]")),
    Case(
        "gemini",
        "alternation",
        "contents[1]",
        add("contents[1]", {"role": "user", "parts": [{"text": "more"}]}),
    ),
    Case("gemini", "alternation", "contents[3]", put("contents[3].role", "assistant")),
    Case("gemini", "call-answered", "contents[1]", drop("contents[2].parts[1]")),
    Case(
        "gemini",
        "result-has-call",
        "contents[2].parts[0].functionResponse.id",
        put("contents[2].parts[0].functionResponse.id", "nope"),
    ),
    Case(
        "gemini",
        "result-has-call",
        "contents[4].parts[0].functionResponse.id",
        put("contents[4].parts[0]", {"functionResponse": {"name": "bash", "response": {}}}),
    ),
    Case("gemini", "call-position", "contents[0]", drop("contents[0]")),
    Case(
        "gemini",
        "text-not-blank",
        "contents[4].parts[0].text",
        put("contents[4].parts[0].text", ""),
    ),
    Case("gemini", "content-not-empty", "contents[3].parts", put("contents[3].parts", [])),
    Case(
        "gemini",
        "content-not-empty",
        "systemInstruction.parts",
        put("systemInstruction.parts", []),
    ),
    Case(
        "gemini",
        "signature-issuer",
        "contents[1].parts[0].thoughtSignature",
        keep,
        BodyContext(signature_issuers={"sig-abc": "anthropic"}),
    ),
    # The last user text closes the turn; without it the calls are in the current turn.
    Case(
        "gemini",
        "signature-required",
        "contents[1].parts[2]",
        both(drop("contents[4]"), drop("contents[3]")),
        GEMINI_3,
    ),
    Case(
        "gemini",
        "tool-name-format",
        "tools[0].functionDeclarations[0].name",
        put("tools[0].functionDeclarations[0].name", "1read"),
    ),
    Case(
        "gemini",
        "output-positive",
        "generationConfig.maxOutputTokens",
        put("generationConfig.maxOutputTokens", 0),
    ),
    Case("gemini", "output-within-window", "generationConfig.maxOutputTokens", keep, SMALL_WINDOW),
]


def _chat(api: str, mark_key: str, mark: Any) -> list[Case]:
    cases = [
        Case(api, "call-answered", "messages[3].tool_calls[1].id", drop("messages[5]")),
        Case(
            api,
            "call-answered",
            "messages[3].tool_calls[1].id",
            add("messages[5]", {"role": "user", "content": "wait"}),
        ),
        Case(
            api,
            "result-has-call",
            "messages[4].tool_call_id",
            put("messages[4].tool_call_id", "call_99"),
        ),
        Case(
            api,
            "result-has-call",
            "messages[7].tool_call_id",
            add("messages[7]", {"role": "tool", "tool_call_id": "toolu_02", "content": "late"}),
        ),
        Case(
            api,
            "call-id-unique",
            "messages[3].tool_calls[1].id",
            both(
                put("messages[3].tool_calls[1].id", "call.read:1"),
                put("messages[5].tool_call_id", "call.read:1"),
            ),
        ),
        Case(
            api,
            "marker-budget",
            f"messages[7].content[1].{mark_key}",
            put(f"messages[2].content[0].{mark_key}", mark),
        ),
        Case(
            api,
            "marker-on-blank-text",
            f"messages[2].content[2].{mark_key}",
            both(
                put("messages[2].content[2].text", " "),
                put(f"messages[2].content[2].{mark_key}", mark),
                drop(f"messages[7].content[1].{mark_key}"),
            ),
        ),
        Case(api, "assistant-content", "messages[6].content", put("messages[6].content", None)),
        Case(
            api,
            "tool-name-format",
            "tools[0].function.name",
            put("tools[0].function.name", "read file"),
        ),
        Case(api, "output-positive", RULES[api].output_cap[0], put(RULES[api].output_cap[0], 0)),
        Case(api, "output-within-window", RULES[api].output_cap[0], keep, SMALL_WINDOW),
    ]
    if RULES[api].call_id_max is not None:
        cases.append(
            Case(
                api,
                "call-id-format",
                "messages[3].tool_calls[0].id",
                put("messages[3].tool_calls[0].id", "call_" + "x" * 40),
            )
        )
    return cases


PLANTED += _chat("openai", "prompt_cache_breakpoint", O_MARK)
PLANTED += _chat("openai-compatible", "cache_control", A_MARK)

# Copilot: the Chat Completions cases whose body does not depend on where marks sit or how
# ids are cleaned, plus its own. Its marks are on message objects: both system messages,
# messages[6] and messages[7]; the first call's id is cleaned to call_read_1_ba535360.
C_MARK = {"type": "ephemeral"}
C_OWN = {"call-id-unique", "marker-budget", "marker-on-blank-text"}
PLANTED += [c for c in _chat("copilot", "copilot_cache_control", C_MARK) if c.rule not in C_OWN]
PLANTED += [
    Case(
        "copilot",
        "call-id-unique",
        "messages[3].tool_calls[1].id",
        both(
            put("messages[3].tool_calls[1].id", "call_read_1_ba535360"),
            put("messages[5].tool_call_id", "call_read_1_ba535360"),
        ),
    ),
    Case(
        "copilot",
        "marker-budget",
        "messages[7].copilot_cache_control",
        put("messages[2].copilot_cache_control", C_MARK),
    ),
    # A fifth mark on a tool definition comes first in processing order.
    Case(
        "copilot",
        "marker-budget",
        "messages[7].copilot_cache_control",
        put("tools[1].copilot_cache_control", C_MARK),
    ),
    Case(
        "copilot",
        "marker-on-blank-text",
        "messages[2].content[2].copilot_cache_control",
        both(
            put("messages[2].content[2].text", " "),
            put("messages[2].content[2].copilot_cache_control", C_MARK),
            drop("messages[7].copilot_cache_control"),
        ),
    ),
    Case(
        "copilot",
        "call-id-format",
        "messages[3].tool_calls[1].id",
        both(
            put("messages[3].tool_calls[1].id", "toolu.02"),
            put("messages[5].tool_call_id", "toolu.02"),
        ),
    ),
]

# Responses API: input = [user, assistant text, function_call x2, function_call_output x2,
# assistant text, user(text, file+breakpoint)]; the system text is in ``instructions``.
REASONING = {"type": "reasoning", "summary": [], "encrypted_content": "ZW5j"}
PLANTED += [
    Case("openai-responses", "call-answered", "input[3].call_id", drop("input[5]")),
    Case("openai-responses", "call-answered", "input[2].call_id", drop("input[4]")),
    Case(
        "openai-responses",
        "result-has-call",
        "input[4].call_id",
        put("input[4].call_id", "call_99"),
    ),
    # An output before its call answers nothing: pairs are matched by id, in order.
    Case(
        "openai-responses",
        "result-has-call",
        "input[2].call_id",
        add("input[2]", {"type": "function_call_output", "call_id": "toolu_02", "output": "x"}),
    ),
    Case(
        "openai-responses",
        "call-id-unique",
        "input[3].call_id",
        both(put("input[3].call_id", "call.read:1"), put("input[5].call_id", "call.read:1")),
    ),
    Case(
        "openai-responses",
        "marker-budget",
        "input[7].content[1].prompt_cache_breakpoint",
        both(
            put("input[0].content[0].prompt_cache_breakpoint", O_MARK),
            put("input[0].content[1].prompt_cache_breakpoint", O_MARK),
            put("input[0].content[2].prompt_cache_breakpoint", O_MARK),
            put("input[7].content[0].prompt_cache_breakpoint", O_MARK),
        ),
    ),
    Case(
        "openai-responses",
        "signature-issuer",
        "input[1].encrypted_content",
        add("input[1]", REASONING),
        BodyContext(signature_issuers={"ZW5j": "anthropic"}),
    ),
    Case(
        "openai-responses",
        "call-id-format",
        "input[2].call_id",
        both(put("input[2].call_id", "c" * 65), put("input[4].call_id", "c" * 65)),
    ),
    Case(
        "openai-responses", "tool-name-format", "tools[0].name", put("tools[0].name", "read.file")
    ),
    Case("openai-responses", "output-positive", "max_output_tokens", put("max_output_tokens", 0)),
    Case("openai-responses", "output-within-window", "max_output_tokens", keep, SMALL_WINDOW),
]


@pytest.mark.parametrize("case", PLANTED, ids=str)
def test_planted_defect_is_caught(case: Case) -> None:
    b = body(case.api)
    # a case that keeps the body has its defect in the context alone
    assert check_body(b, case.api, None if case.mutate is keep else case.context) == []
    case.mutate(b)
    found = check_body(b, case.api, case.context)
    paths = {v.path for v in found if v.rule == case.rule}
    assert case.path in paths, "\n".join(map(str, found))


def test_every_rule_has_a_planted_defect() -> None:
    planted = {(c.api, c.rule) for c in PLANTED}
    wanted = {(api, rule) for api in RULES for rule in rules_for(api)}
    assert wanted - planted == set()
    assert planted - wanted == set()  # no case for a rule the API does not have


def test_rules_table_covers_every_wire_api() -> None:
    assert sorted(RULES) == sorted(APIS)


# --- valid bodies --------------------------------------------------------------------

MARKINGS: list[dict[str, Any]] = [
    {"placement": "message"},
    {"placement": "last-part"},
    {"placement": "message", "ttl": "1h"},
    {"placement": "last-part", "ttl": "1h"},
    {"rule": "auto"},
    {"rule": "auto", "ttl": "1h", "message_ttl": "5m"},
]
OPTIONS: list[dict[str, Any]] = [
    {},
    {"automatic_cache": "1h"},
    {"prompt_cache_breakpoints": True},
    {"reasoning_field": "reasoning_content"},
    {"system_as_instructions": False, "prompt_cache_breakpoints": True},
]
MODELS = {
    "anthropic": "claude-sonnet-4-5",
    "bedrock": "anthropic.claude-sonnet-4-5",
    "gemini": "gemini-3-pro-preview",
    "openai": "gpt-5.6",
    "openai-compatible": "anthropic/claude-sonnet-4.5",
    "openai-responses": "gpt-5.6",
    "copilot": "claude-sonnet-4.5",
}


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("marking", MARKINGS, ids=str)
@pytest.mark.parametrize("options", OPTIONS, ids=str)
def test_sample_bodies_break_no_rule(
    api: str, marking: dict[str, Any], options: dict[str, Any]
) -> None:
    request = place_markers(sample_request(), CacheSettings(**marking))[0]
    b = render(replace(request, options=options), api)
    context = BodyContext(model=MODELS[api], context_window=200_000, input_tokens=1_000)
    assert check_body(b, api, context) == []


def test_unknown_api_is_a_catalog_error() -> None:
    with pytest.raises(CatalogError, match="unknown wire API 'gemni'") as caught:
        check_body({}, "gemni")
    assert caught.value.diagnostics[0].hint == "did you mean 'gemini'?"


def test_gemini_3_accepts_the_documented_sentinel_and_checks_only_the_current_turn() -> None:
    b = body("gemini")
    del b["contents"][3:]
    call = b["contents"][1]["parts"][2]
    call["thoughtSignature"] = "skip_thought_signature_validator"
    assert check_body(b, "gemini", GEMINI_3) == []
    # the sentinel never counts as a foreign signature either
    issuers = {"skip_thought_signature_validator": "anthropic"}
    assert check_body(b, "gemini", replace(GEMINI_3, signature_issuers=issuers)) == []
    # a parallel call after the first needs no signature of its own; Gemini 2.5 none at all
    del call["thoughtSignature"]
    assert check_body(b, "gemini", BodyContext(model="gemini-2.5-pro")) == []


def test_gemini_takes_blank_text_that_carries_a_signature() -> None:
    b = body("gemini")
    b["contents"][3]["parts"].append({"text": "", "thoughtSignature": "sig-xyz"})
    assert check_body(b, "gemini") == []


def test_anthropic_allows_an_empty_final_assistant_turn() -> None:
    b = body("anthropic")
    b["messages"].append({"role": "assistant", "content": []})
    assert check_body(b, "anthropic") == []


def test_a_result_names_the_rule_path_and_reason() -> None:
    b = body("anthropic")
    b["messages"][0]["content"][0]["text"] = ""
    (v,) = check_body(b, "anthropic")
    assert str(v) == (
        "messages[0].content[0].text: text-not-blank: blank text; the API refuses "
        "whitespace-only text"
    )


def test_the_docs_table_lists_every_rule_for_every_api() -> None:
    """docs/acceptance.md's table says which rules each wire API is checked by; it is
    read back here, so a rule or an API added to the code without the docs fails."""
    import re
    from pathlib import Path

    from kilo_rules.engine.providers import APIS
    from kilo_rules.engine.providers.acceptance import rules_for

    text = (Path(__file__).parents[2] / "docs" / "acceptance.md").read_text("utf-8")
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    header = [c.strip() for c in rows[0].strip("|").split("|")][1:]
    assert sorted(header) == sorted(APIS)
    documented: dict[str, set[str]] = {api: set() for api in header}
    for row in rows[1:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        name = re.match(r"`([^`]+)`", cells[0])
        assert name is not None, row
        for api, cell in zip(header, cells[1:], strict=True):
            if cell == "✓":
                documented[api].add(name.group(1))
    assert {api: set(rules_for(api)) for api in header} == documented
