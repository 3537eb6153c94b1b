"""Routes files: loading (schema, refs, the sandbox), first-match routing, what
``check_routes`` finds, and ``kilo-rules check`` on a routes file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from kilo_rules import PolicyError, Routes, load_routes
from kilo_rules.engine.base.errors import Diagnostic, Location
from kilo_rules.engine.base.sandbox import allow_read
from kilo_rules.engine.formats.catalog import Catalog, ModelInfo, bundled_catalog
from kilo_rules.engine.frontend.routes import (
    ROUTES_FILE,
    RouteMatch,
    RoutesFile,
    check_routes,
    covers,
    read_routes,
)
from kilo_rules.tools.cli import main


def _model(mid: str, provider: str, family: str) -> ModelInfo:
    return ModelInfo.model_validate(
        {
            "id": mid,
            "provider": provider,
            "family": family,
            "api_id": mid.rsplit("/", 1)[-1],
            "api": "openai-compatible",
            "limits": {"context": 100_000, "output": 8_000},
        }
    )


SONNET = _model("anthropic/claude-sonnet-4-6", "anthropic", "claude")
OPUS = _model("anthropic/claude-opus-4-6", "anthropic", "claude")
OR_CLAUDE = _model("openrouter/anthropic/claude-sonnet-4.5", "openrouter", "claude")
OR_QWEN = _model("openrouter/qwen/qwen3-coder", "openrouter", "qwen")
GPT5 = _model("openai/gpt-5", "openai", "gpt")
GPT5_MINI = _model("openai/gpt-5-mini", "openai", "gpt")
GPT41 = _model("openai/gpt-4.1", "openai", "gpt")
GEMINI = _model("google/gemini-2.5-pro", "google", "gemini")
CATALOG = Catalog(
    as_of="2026-01-01", models=[SONNET, OPUS, OR_CLAUDE, OR_QWEN, GPT5, GPT5_MINI, GPT41, GEMINI]
)

POLICY = "version: 1\nname: team\nextends: kilo-default\n"

ROUTES = """\
version: 1
routes:
  - name: sonnet
    match: {id: anthropic/claude-sonnet-4-6}
    policy: long-run
  - name: openrouter
    match: {provider: openrouter}
    policy: ./team.yaml
  - match: {family: claude}
    policy: cache-max
  - name: gpt-5
    match: {glob: "openai/gpt-5*"}
    policy: team.yaml
default: kilo-default
"""


def _write(root: Path, name: str, text: str) -> Path:
    p = root / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text, encoding="utf-8")
    return p


def _errors(path: Path) -> list[Diagnostic]:
    with pytest.raises(PolicyError) as info:
        load_routes(path)
    return info.value.diagnostics


def _routes(tmp_path: Path, text: str) -> Routes:
    _write(tmp_path, "team.yaml", POLICY)
    return load_routes(_write(tmp_path, ROUTES_FILE, text))


# -- loading --------------------------------------------------------------------------------


def test_valid_file_loads_and_resolves_every_ref(tmp_path: Path) -> None:
    team = _write(tmp_path, "team.yaml", POLICY)
    routes = load_routes(_write(tmp_path, ROUTES_FILE, ROUTES))
    assert ROUTES_FILE == "routes.yaml"
    assert routes.file == tmp_path / ROUTES_FILE
    assert isinstance(routes.spec, RoutesFile)
    assert [r.name for r in routes.spec.routes] == ["sonnet", "openrouter", None, "gpt-5"]
    assert routes.spec.routes[0].match.id == "anthropic/claude-sonnet-4-6"
    assert routes.spec.default == "kilo-default"
    # ./team.yaml and team.yaml are one file: listed once, as its resolved absolute path.
    assert routes.policies() == ["long-run", team.resolve(), "cache-max", "kilo-default"]


def test_policies_follow_file_order_with_default_written_first(tmp_path: Path) -> None:
    text = (
        "version: 1\ndefault: kilo-default\n"
        "routes:\n  - match: {family: gpt}\n    policy: long-run\n"
    )
    routes = _routes(tmp_path, text)
    assert routes.policies() == ["kilo-default", "long-run"]
    assert routes.policy_for(GEMINI).at == Location(str(tmp_path / ROUTES_FILE), 2, 1)


def test_routes_are_optional(tmp_path: Path) -> None:
    routes = _routes(tmp_path, "version: 1\ndefault: long-run\n")
    assert routes.spec.routes == ()
    assert routes.policy_for(SONNET).policy == "long-run"
    assert routes.policies() == ["long-run"]


SCHEMA_ERRORS = {
    "unknown top-level key": (
        "version: 1\ndefault: kilo-default\nroute: []\n",
        ("schema.unknown-key", 3, 1),
    ),
    "unknown match key, with did-you-mean": (
        "version: 1\nroutes:\n  - match: {famly: claude}\n    policy: long-run\ndefault: x\n",
        ("schema.unknown-key", 3, 13),
    ),
    "empty match": (
        "version: 1\nroutes:\n  - match: {}\n    policy: long-run\ndefault: kilo-default\n",
        ("schema.invalid", 3, 12),
    ),
    "missing default": ("version: 1\nroutes: []\n", ("schema.required", 1, 1)),
    "missing policy": (
        "version: 1\nroutes:\n  - match: {family: gpt}\ndefault: kilo-default\n",
        ("schema.required", 3, 5),
    ),
    "wrong version": ("version: 2\ndefault: kilo-default\n", ("schema.const", 1, 10)),
    "policy not a string": (
        "version: 1\nroutes:\n  - match: {family: gpt}\n    policy: [a]\ndefault: kilo-default\n",
        ("schema.type", 4, 13),
    ),
    "routes not a list": ("version: 1\nroutes: {}\ndefault: kilo-default\n", ("schema.type", 2, 9)),
    "bad route name": (
        "version: 1\nroutes:\n  - name: 'a b'\n    match: {family: gpt}\n    policy: long-run\n"
        "default: kilo-default\n",
        ("schema.pattern", 3, 11),
    ),
    "empty default": ("version: 1\ndefault: ''\n", ("schema.invalid", 2, 10)),
}


@pytest.mark.parametrize("case", sorted(SCHEMA_ERRORS))
def test_schema_errors_are_located(tmp_path: Path, case: str) -> None:
    text, (code, line, col) = SCHEMA_ERRORS[case]
    path = _write(tmp_path, ROUTES_FILE, text)
    first = _errors(path)[0]
    assert (first.code, first.location.line, first.location.col) == (code, line, col), first
    assert first.location.file == str(path)


def test_unknown_match_key_suggests_the_right_one(tmp_path: Path) -> None:
    text = SCHEMA_ERRORS["unknown match key, with did-you-mean"][0]
    assert _errors(_write(tmp_path, ROUTES_FILE, text))[0].hint == "did you mean 'family'?"


def test_not_a_mapping(tmp_path: Path) -> None:
    (diag,) = _errors(_write(tmp_path, ROUTES_FILE, "- version: 1\n"))
    assert diag.code == "schema.type" and diag.location.line == 1


def test_yaml_errors_are_policy_errors(tmp_path: Path) -> None:
    (diag,) = _errors(_write(tmp_path, ROUTES_FILE, "version: 1\ndefault: [\n"))
    assert diag.code.startswith("yaml.")
    (missing,) = _errors(tmp_path / "nope.yaml")
    assert missing.code == "io.read"


def test_unknown_policy_name_with_did_you_mean(tmp_path: Path) -> None:
    text = (
        "version: 1\nroutes:\n  - match: {family: gpt}\n    policy: long-runn\n"
        "default: kilo-defualt\n"
    )
    diags = _errors(_write(tmp_path, ROUTES_FILE, text))
    assert [(d.code, d.location.line, d.location.col) for d in diags] == [
        ("routes.unknown-policy", 4, 13),
        ("routes.unknown-policy", 5, 10),
    ]
    assert diags[0].hint is not None and diags[0].hint.startswith("did you mean 'long-run'?")
    assert diags[1].hint is not None and diags[1].hint.startswith("did you mean 'kilo-default'?")


def test_missing_policy_file_with_did_you_mean(tmp_path: Path) -> None:
    _write(tmp_path, "team.yaml", POLICY)
    text = (
        "version: 1\nroutes:\n  - match: {family: gpt}\n    policy: teem.yaml\ndefault: x/y.yaml\n"
    )
    diags = _errors(_write(tmp_path, ROUTES_FILE, text))
    assert [(d.code, d.location.line) for d in diags] == [
        ("routes.missing-policy", 4),
        ("routes.missing-policy", 5),
    ]
    assert diags[0].hint == "did you mean 'team.yaml'?"
    assert diags[1].hint == "paths are relative to the routes file"


@pytest.mark.parametrize("ref", ["../outside.yaml", "sub/../../outside.yaml", "ABSOLUTE"])
def test_path_escaping_the_directory_is_refused(tmp_path: Path, ref: str) -> None:
    outside = _write(tmp_path, "outside.yaml", POLICY)
    ref = str(outside) if ref == "ABSOLUTE" else ref
    routes = _write(tmp_path, f"bundle/{ROUTES_FILE}", f"version: 1\ndefault: {ref}\n")
    (diag,) = _errors(routes)
    assert diag.code == "routes.outside-roots"
    assert (diag.location.line, diag.location.col) == (2, 10)
    assert "--allow-read" in (diag.hint or "")


def test_symlink_leading_out_is_refused(tmp_path: Path) -> None:
    outside = _write(tmp_path, "outside.yaml", POLICY)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    try:
        (bundle / "inside.yaml").symlink_to(outside)
    except OSError:
        pytest.skip("no symlinks here")
    (diag,) = _errors(_write(bundle, ROUTES_FILE, "version: 1\ndefault: inside.yaml\n"))
    assert diag.code == "routes.outside-roots"
    assert "symlink" in diag.message


def test_an_allowed_read_root_lets_a_path_out(tmp_path: Path) -> None:
    outside = _write(tmp_path, "shared/outside.yaml", POLICY)
    routes = _write(
        tmp_path, f"bundle/{ROUTES_FILE}", "version: 1\ndefault: ../shared/outside.yaml\n"
    )
    with allow_read([tmp_path / "shared"]):
        assert load_routes(routes).policies() == [outside.resolve()]
    assert _errors(routes)[0].code == "routes.outside-roots"


def test_a_directory_is_not_a_policy(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (diag,) = _errors(_write(tmp_path, ROUTES_FILE, "version: 1\ndefault: sub/\n"))
    assert diag.code == "routes.not-a-regular-file"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_never_opened(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.yaml")
    (diag,) = _errors(_write(tmp_path, ROUTES_FILE, "version: 1\ndefault: pipe.yaml\n"))
    assert diag.code == "routes.not-a-regular-file"
    os.mkfifo(tmp_path / "routes-fifo.yaml")
    (own,) = _errors(tmp_path / "routes-fifo.yaml")
    assert own.code == "routes.not-a-regular-file"


def test_match_keys_all_null_names_duplicates_and_reserved_names(tmp_path: Path) -> None:
    text = """\
version: 1
routes:
  - match: {id: null}
    policy: long-run
  - name: a
    match: {family: gpt}
    policy: long-run
  - name: a
    match: {family: claude}
    policy: long-run
  - name: default
    match: {family: gemini}
    policy: long-run
default: kilo-default
"""
    diags = _errors(_write(tmp_path, ROUTES_FILE, text))
    assert [(d.code, d.location.line, d.location.col) for d in diags] == [
        ("routes.empty-match", 3, 12),
        ("routes.duplicate-name", 8, 11),
        ("routes.reserved-name", 11, 11),
    ]
    assert diags[1].hint == "first used at line 5; route names are unique"


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    text = "version: 1\nroutes:\n  - match: {family: gpt}\n    policy: nope\ndefault: ../out.yaml\n"
    routes, diags = read_routes(_write(tmp_path, ROUTES_FILE, text))
    assert {d.code for d in diags} == {"routes.unknown-policy", "routes.outside-roots"}
    # The shape is valid, so check can still look at the routes; bad refs stay as written.
    assert routes is not None
    assert routes.policies() == ["nope", "../out.yaml"]


def test_a_match_needs_a_key_in_code_too() -> None:
    with pytest.raises(ValidationError):
        RouteMatch()
    assert RouteMatch(glob="*").given() == {"glob": "*"}


# -- routing --------------------------------------------------------------------------------


def test_first_match_wins_over_id_provider_family_and_glob(tmp_path: Path) -> None:
    team = (tmp_path / "team.yaml").resolve()
    routes = _routes(tmp_path, ROUTES)
    file = str(tmp_path / ROUTES_FILE)
    cases = [
        (SONNET, ("sonnet", "long-run", 3)),  # the id route, before the family one
        (OR_CLAUDE, ("openrouter", team, 6)),  # the provider route, before the family one
        (OR_QWEN, ("openrouter", team, 6)),
        (OPUS, ("routes[2]", "cache-max", 9)),  # unnamed
        (GPT5, ("gpt-5", team, 11)),
        (GPT5_MINI, ("gpt-5", team, 11)),
        (GPT41, ("default", "kilo-default", 14)),  # the glob needs gpt-5
        (GEMINI, ("default", "kilo-default", 14)),
    ]
    for model, (route, policy, line) in cases:
        choice = routes.policy_for(model)
        assert (choice.route, choice.policy, choice.at.line) == (route, policy, line), model.id
        assert choice.at.file == file


def test_every_key_given_must_hold(tmp_path: Path) -> None:
    text = """\
version: 1
routes:
  - match: {provider: openrouter, family: claude}
    policy: long-run
  - match: {family: claude, glob: "anthropic/*-opus-*"}
    policy: cache-max
default: kilo-default
"""
    routes = _routes(tmp_path, text)
    assert routes.policy_for(OR_CLAUDE).policy == "long-run"
    assert routes.policy_for(OR_QWEN).policy == "kilo-default"
    assert routes.policy_for(OPUS).policy == "cache-max"
    assert routes.policy_for(SONNET).policy == "kilo-default"


def test_globs_are_case_sensitive_and_star_crosses_slashes() -> None:
    assert RouteMatch(glob="openrouter/*sonnet*").matches(OR_CLAUDE)
    assert not RouteMatch(glob="OPENAI/*").matches(GPT5)
    assert RouteMatch(glob="openai/gpt-?").matches(GPT5)
    assert RouteMatch(glob="openai/gpt-[45]*").matches(GPT41)


def test_routes_built_from_a_spec_alone(tmp_path: Path) -> None:
    spec = RoutesFile.model_validate(
        {
            "version": 1,
            "routes": [{"match": {"family": "gpt"}, "policy": "sub/team.yaml"}],
            "default": "kilo-default",
        }
    )
    routes = Routes(tmp_path / ROUTES_FILE, spec)
    assert routes.policy_for(GPT5).policy == tmp_path / "sub" / "team.yaml"
    assert routes.policy_for(GEMINI).route == "default"


def test_the_bundled_catalog_routes(tmp_path: Path) -> None:
    routes = _routes(tmp_path, ROUTES)
    model = bundled_catalog().get("anthropic/claude-sonnet-4-6")
    assert routes.policy_for(model).route == "sonnet"


# -- check_routes ---------------------------------------------------------------------------


def _check(tmp_path: Path, routes_text: str) -> list[tuple[str, str, int]]:
    routes = _routes(tmp_path, routes_text)
    return [(d.code, d.severity, d.location.line) for d in check_routes(routes, CATALOG)]


def _file(*routes: str, default: str = "kilo-default") -> str:
    """A routes file whose route ``i`` (one line: ``{match}``) starts at line ``3 + 2 i``."""
    body = "".join(f"  - match: {m}\n    policy: long-run\n" for m in routes)
    return f"version: 1\nroutes:\n{body}default: {default}\n"


@pytest.mark.parametrize(
    ("earlier", "later"),
    [
        ("{family: claude}", "{family: claude}"),  # the same
        ("{family: claude}", "{family: claude, provider: anthropic}"),  # weaker
        ("{provider: openai}", '{provider: openai, glob: "openai/gpt-5*"}'),
        ('{glob: "*"}', "{id: openai/gpt-5}"),  # a catch-all
        ('{glob: "**"}', "{provider: openrouter}"),
        ('{glob: "openai/gpt-5*"}', '{glob: "openai/gpt-5-mini*"}'),  # a covering prefix
        ('{glob: "openai/*"}', "{id: openai/gpt-4.1}"),
        ('{glob: "openai/gpt-?"}', '{glob: "openai/gpt-5"}'),  # a literal glob is an id
        ("{id: openai/gpt-5}", '{glob: "openai/gpt-5"}'),
        ("{family: claude}", "{id: anthropic/claude-opus-4-6}"),  # the catalog knows the id
    ],
)
def test_unreachable_route(tmp_path: Path, earlier: str, later: str) -> None:
    found = _check(tmp_path, _file(earlier, later))
    assert ("routes.unreachable", "error", 5) in found, found


@pytest.mark.parametrize(
    ("earlier", "later"),
    [
        ("{family: claude}", "{provider: anthropic}"),
        ("{family: claude, provider: anthropic}", "{family: claude}"),  # stronger
        ('{glob: "openai/gpt-5-mini*"}', '{glob: "openai/gpt-5*"}'),
        ('{glob: "*mini"}', "{family: gpt}"),
        ('{glob: "openai/*-mini"}', '{glob: "openai/gpt-5*"}'),
        ("{family: claude}", "{id: anthropic/claude-unreleased}"),  # an id the catalog lacks
    ],
)
def test_reachable_route_is_not_reported(tmp_path: Path, earlier: str, later: str) -> None:
    found = _check(tmp_path, _file(earlier, later))
    assert not [f for f in found if f[0] == "routes.unreachable"], found


def test_unreachable_names_the_route_that_shadows_it(tmp_path: Path) -> None:
    text = """\
version: 1
routes:
  - name: claude
    match: {family: claude}
    policy: long-run
  - name: sonnet
    match: {id: anthropic/claude-sonnet-4-6}
    policy: cache-max
default: kilo-default
"""
    routes = _routes(tmp_path, text)
    (diag,) = [d for d in check_routes(routes, CATALOG) if d.code == "routes.unreachable"]
    assert diag.message == (
        "route 'sonnet' is never chosen: route 'claude' before it matches every model it matches"
    )
    assert (diag.location.line, diag.location.col) == (6, 5)
    assert diag.details == {"route": "sonnet", "shadowed_by": "claude"}


def test_covers_is_conservative() -> None:
    assert covers(RouteMatch(glob="*"), RouteMatch(provider="x"))
    assert not covers(RouteMatch(provider="x"), RouteMatch(glob="*"))
    assert not covers(RouteMatch(id="a/b"), RouteMatch(id="a/c"))
    assert covers(RouteMatch(glob="a/*"), RouteMatch(glob="a/b?c"))
    assert not covers(RouteMatch(glob="a/b*"), RouteMatch(glob="a/?bc"))


def test_route_matching_no_catalog_model_is_a_warning(tmp_path: Path) -> None:
    found = _check(tmp_path, _file("{provider: nobody}", "{family: gpt, provider: anthropic}"))
    assert [f for f in found if f[0] == "routes.no-model"] == [
        ("routes.no-model", "warning", 3),
        ("routes.no-model", "warning", 5),
    ]


def test_models_falling_to_the_default_are_listed_once(tmp_path: Path) -> None:
    routes = _routes(tmp_path, _file("{family: claude}", '{glob: "openai/gpt-5*"}'))
    diags = check_routes(routes, CATALOG)
    (diag,) = [d for d in diags if d.code == "routes.default-models"]
    assert diag.severity == "warning"
    assert diag.location.line == 7  # at default:
    assert diag.details["models"] == [
        "openrouter/qwen/qwen3-coder",
        "openai/gpt-4.1",
        "google/gemini-2.5-pro",
    ]
    assert "3 catalog model(s)" in diag.message and "openai/gpt-4.1" in diag.message
    assert all(d.severity == "warning" for d in diags)


def test_no_routes_means_no_default_report(tmp_path: Path) -> None:
    assert _check(tmp_path, "version: 1\ndefault: kilo-default\n") == []


def test_catch_all_route_makes_the_default_unused(tmp_path: Path) -> None:
    found = _check(tmp_path, _file("{family: claude}", '{glob: "*"}'))
    assert found == [("routes.default-unreachable", "warning", 7)]


def test_a_file_routing_every_catalog_model_reports_nothing(tmp_path: Path) -> None:
    found = _check(
        tmp_path,
        _file(
            "{family: claude}", "{provider: openrouter}", '{glob: "openai/*"}', "{family: gemini}"
        ),
    )
    assert found == []


# -- kilo-rules check ------------------------------------------------------------------------


def test_cli_check_clean_routes_file(in_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write(in_tmp, "team.yaml", POLICY)
    _write(
        in_tmp,
        ROUTES_FILE,
        "version: 1\nroutes:\n  - match: {glob: '*'}\n    policy: team.yaml\n"
        "default: kilo-default\n",
    )
    assert main(["check", ROUTES_FILE]) == 0
    out = capsys.readouterr().out
    assert "routes.yaml:5:1: warning[routes.default-unreachable]" in out


def test_cli_check_routes_file_with_errors(
    in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write(
        in_tmp,
        ROUTES_FILE,
        "version: 1\nroutes:\n  - match: {family: gpt}\n    policy: kilo-defualt\n"
        "default: kilo-default\n",
    )
    assert main(["check", ROUTES_FILE]) == 1
    out = capsys.readouterr().out.splitlines()
    assert (
        out[0]
        == "routes.yaml:4:13: error[routes.unknown-policy]: no bundled policy named 'kilo-defualt'"
    )
    assert out[1].endswith("|     policy: kilo-defualt")
    assert out[3].startswith("  hint: did you mean 'kilo-default'?")


def test_cli_check_reports_unreachable_routes_and_routed_policies(
    in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write(in_tmp, "pol/broken.yaml", "version: 1\nname: broken\ncompaction:\n  tail_turn: 3\n")
    _write(
        in_tmp,
        f"pol/{ROUTES_FILE}",
        _file("{family: claude}", "{id: anthropic/claude-opus-4-6}", default="broken.yaml"),
    )
    assert main(["check", "--format", "json", "pol"]) == 1
    found = {
        (d["code"], d["location"]["file"], d["location"]["line"], d["location"]["col"])
        for d in json.loads(capsys.readouterr().out)
    }
    assert ("routes.unreachable", "pol/routes.yaml", 5, 5) in found
    assert ("schema.unknown-key", "pol/broken.yaml", 4, 3) in found
    # broken.yaml is named by the routes file and also checked on its own: reported once.
    assert len([f for f in found if f[1] == "pol/broken.yaml"]) == 1


def test_cli_check_routes_file_schema_error(
    in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write(
        in_tmp,
        ROUTES_FILE,
        "version: 1\nroutes:\n  - match: {famly: claude}\n    policy: long-run\n",
    )
    assert main(["check", "--format", "github", ROUTES_FILE]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("::error file=routes.yaml,line=1,col=1,title=schema.required::")
    assert lines[1].startswith("::error file=routes.yaml,line=3,col=13,title=schema.unknown-key::")


def test_cli_check_never_reads_a_refused_policy(
    in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write(in_tmp, "outside.yaml", "version: 1\nname: x\nnope: 1\n")
    _write(in_tmp, f"bundle/{ROUTES_FILE}", "version: 1\ndefault: ../outside.yaml\n")
    assert main(["check", "--format", "json", f"bundle/{ROUTES_FILE}"]) == 1
    codes = [d["code"] for d in json.loads(capsys.readouterr().out)]
    assert codes == ["routes.outside-roots"]
