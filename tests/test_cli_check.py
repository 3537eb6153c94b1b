"""`kilo-rules check` as CI uses it: exit codes, output formats, path expansion."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kilo_rules.tools.cli import main

BAD = "version: 1\nname: p\ncompaction:\n  tail_turn: 3\n"
GOOD = "version: 1\nname: good\nextends: kilo-default\nprune:\n  reasons:\n    normal: true\n"


def _write(root: Path, name: str, text: str) -> Path:
    p = root / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text, encoding="utf-8")
    return p


def test_bundled_policies_are_clean(capsys: pytest.CaptureFixture[str]) -> None:
    root = Path(__file__).resolve().parent.parent / "policies"
    assert main(["check", str(root)]) == 0
    err = capsys.readouterr().err
    assert "0 error(s)" in err
    assert "checked 6 file(s)" in err


def test_clean_file_exits_zero(in_tmp: Path) -> None:
    _write(in_tmp, "good.yaml", GOOD)
    assert main(["check", "good.yaml"]) == 0


def test_text_format_has_location_source_line_caret_and_hint(
    in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write(in_tmp, "bad.yaml", BAD)
    assert main(["check", "bad.yaml"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert (
        out[0] == "bad.yaml:4:3: error[schema.unknown-key]: unknown key 'tail_turn' in compaction"
    )
    assert out[1].endswith("|   tail_turn: 3")
    assert out[2].endswith("|   ^^^^^^^^^") or out[2].endswith("|   ^")
    assert out[3] == "  hint: did you mean 'tail_turns'?"


def test_json_format(in_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write(in_tmp, "bad.yaml", BAD)
    assert main(["check", "--format", "json", "bad.yaml"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data == [
        {
            "code": "schema.unknown-key",
            "severity": "error",
            "message": "unknown key 'tail_turn' in compaction",
            "location": {"file": "bad.yaml", "line": 4, "col": 3},
            "details": data[0]["details"],
            "hint": "did you mean 'tail_turns'?",
        }
    ]
    assert data[0]["details"]["key"] == "tail_turn"


def test_github_format(in_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write(in_tmp, "bad.yaml", BAD)
    assert main(["check", "--format", "github", "bad.yaml"]) == 1
    line = capsys.readouterr().out.strip()
    assert line.startswith("::error file=bad.yaml,line=4,col=3,title=schema.unknown-key::")
    assert "did you mean 'tail_turns'?" in line
    assert "\n" not in line


def test_directory_and_glob_expansion(in_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write(in_tmp, "pol/a.yaml", GOOD)
    _write(in_tmp, "pol/sub/b.yml", BAD)
    _write(in_tmp, "pol/readme.txt", "not yaml")
    assert main(["check", "pol"]) == 1
    assert "checked 2 file(s): 1 error(s)" in capsys.readouterr().err
    assert main(["check", "pol/*.yaml"]) == 0


def test_missing_path_is_a_usage_error(in_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "nope.yaml"]) == 2
    assert "nope.yaml: no such file or directory" in capsys.readouterr().err
    assert main(["check", "*.nothing"]) == 2


def test_no_arguments_is_a_usage_error() -> None:
    assert main(["check"]) == 2
    assert main([]) == 2


def test_all_errors_of_all_files_are_reported(
    in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write(in_tmp, "a.yaml", BAD)
    _write(in_tmp, "b.yaml", "version: 1\nname: b\nprune:\n  protect_turns: x\n")
    assert main(["check", "--format", "json", "a.yaml", "b.yaml"]) == 1
    codes = [d["code"] for d in json.loads(capsys.readouterr().out)]
    assert codes == ["schema.unknown-key", "schema.type"]


def test_warnings_do_not_fail(in_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write(in_tmp, "w.yaml", "version: 1\nname: w\ncache:\n  rule: none\n  ttl: 1h\n")
    assert main(["check", "w.yaml"]) == 0
    assert "warning[policy.contradiction]" in capsys.readouterr().out


def test_catalog_file_is_checked_as_catalog(
    in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write(
        in_tmp,
        "models.yaml",
        "version: 1\nas_of: '2026-01-01'\nmodels:\n"
        "  - {id: a/b, provider: x, family: f, api_id: b, api: openai,\n"
        "     limits: {context: 10, input: 20}}\n"
        "  - {id: a/b, provider: x, family: f, api_id: b, api: openai, limits: {context: 10}}\n",
    )
    assert main(["check", "--format", "json", "models.yaml"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert [d["code"] for d in data] == ["catalog.limits", "catalog.duplicate-id"]
    assert data[1]["location"]["line"] == 6


def test_provider_typo_in_an_expression_is_a_located_warning(
    in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write(
        in_tmp,
        "w.yaml",
        "version: 1\nname: w\nextends: kilo-default\ncache:\n"
        "  when: 'model.provider == \"antropic\"'\n",
    )
    assert main(["check", "--format", "json", "w.yaml"]) == 0
    (d,) = json.loads(capsys.readouterr().out)
    assert (d["code"], d["severity"], d["location"]["line"], d["location"]["col"]) == (
        "expr.unknown-value",
        "warning",
        5,
        28,
    )
    assert d["hint"] == "did you mean 'anthropic'?"


def test_diagnostics_do_not_depend_on_key_order(in_tmp: Path) -> None:
    from kilo_rules.tools.checking.check import check_paths

    a = (
        "version: 1\nname: p\nprune:\n  protect_turns: x\n  protect_tokn: 3\n"
        "compaction:\n  tail_turns: -1\n  auto: maybe\n"
    )
    b = (
        "compaction:\n  auto: maybe\n  tail_turns: -1\nprune:\n  protect_tokn: 3\n"
        "  protect_turns: x\nname: p\nversion: 1\n"
    )
    _write(in_tmp, "a.yaml", a)
    _write(in_tmp, "b.yaml", b)
    got_a = sorted((d.code, d.message) for d in check_paths(["a.yaml"]).diagnostics)
    got_b = sorted((d.code, d.message) for d in check_paths(["b.yaml"]).diagnostics)
    assert got_a == got_b and len(got_a) == 4
    # and within one file they come out in source order
    lines = [d.location.line for d in check_paths(["b.yaml"]).diagnostics]
    assert lines == sorted(lines)


def test_control_bytes_are_located_and_the_other_files_still_checked(
    in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (in_tmp / "a.yaml").write_bytes(b"version: 1\nname: a\ndescription: x\x00y\n")
    (in_tmp / "b.yaml").write_bytes(b"version: 1\nname: b\nprompts:\n  soul: \x1b[1m\n")
    _write(in_tmp, "c.yaml", BAD)
    assert main(["check", "--format", "json", "a.yaml", "b.yaml", "c.yaml"]) == 1
    found = {
        (d["location"]["file"], d["location"]["line"], d["location"]["col"], d["code"])
        for d in json.loads(capsys.readouterr().out)
    }
    assert found == {
        ("a.yaml", 3, 15, "yaml.character"),
        ("b.yaml", 4, 9, "yaml.character"),
        ("c.yaml", 4, 3, "schema.unknown-key"),
    }


def test_every_unknown_key_and_every_expression_error_in_one_run(
    in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write(
        in_tmp,
        "p.yaml",
        "version: 1\nname: p\nextends: kilo-default\n"
        "prune:\n  enabledd: true\n  protect_turnz: 2\n  protect_turns: two\n"
        "budget:\n  usable: 'model.limits.context -'\n"
        "output:\n  max_tokens: 'prune.protect_turns * 2'\n"
        "  send: 'model.limit.context > 1'\n",
    )
    assert main(["check", "--format", "json", "p.yaml"]) == 1
    got = [(d["code"], d["location"]["line"]) for d in json.loads(capsys.readouterr().out)]
    assert got == [
        ("schema.unknown-key", 5),
        ("schema.unknown-key", 6),
        ("schema.type", 7),
        ("expr.syntax", 9),
        # prune.protect_turns * 2 is not blamed for the refused value it reads.
        ("expr.unknown-name", 12),
    ]


def test_expressions_use_the_base_names_when_the_file_fails_the_schema(
    in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write(in_tmp, "base.yaml", "version: 1\nname: base\nbudget:\n  usable: 1000\n")
    _write(
        in_tmp,
        "child.yaml",
        "version: 1\nname: child\nextends: base.yaml\nbogus: 1\n"
        "output:\n  max_tokens: 'budget.usable // 2 + budget.nope'\n",
    )
    assert main(["check", "--format", "json", "child.yaml"]) == 1
    got = [(d["code"], d["message"]) for d in json.loads(capsys.readouterr().out)]
    assert got == [
        ("schema.unknown-key", "unknown key 'bogus'"),
        ("expr.unknown-name", "unknown name budget.nope"),
    ]


def test_tokenizer_encodings_are_checked(in_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kilo_rules.engine.frontend.checks import offline_encodings

    assert "cl100k_base" in offline_encodings()
    # tiktoken's own plugin downloads its files: its names are not offered.
    assert "o200k_base" not in offline_encodings()
    _write(in_tmp, "ok.yaml", "version: 1\nname: ok\ntokens:\n  counter: tiktoken:cl100k_base\n")
    assert main(["check", "ok.yaml"]) == 0
    _write(in_tmp, "bad.yaml", "version: 1\nname: bad\ntokens:\n  counter: tiktoken:o200k_base\n")
    capsys.readouterr()
    assert main(["check", "--format", "json", "bad.yaml"]) == 1
    (d,) = json.loads(capsys.readouterr().out)
    assert d["code"] == "policy.unknown-tokenizer"
    assert (d["location"]["line"], d["location"]["col"]) == (4, 12)
    assert "available: tiktoken:cl100k_base" in d["message"]
    assert d["details"]["available"] == offline_encodings()


def test_check_files_names_the_files_as_shown_and_refuses_a_name_that_climbs_out() -> None:
    from kilo_rules.engine.base import safefs
    from kilo_rules.tools.checking.check import check_files

    report = check_files({"p.yaml": b"version: 1\nname: p\nbogus: 1\n"}, "b.tar.gz!/")
    assert report.files == ["b.tar.gz!/p.yaml"]
    assert report.errors and all(d.location.file == "b.tar.gz!/p.yaml" for d in report.errors)
    with pytest.raises(safefs.ReadRefused):
        check_files({"../p.yaml": b"version: 1\n"}, "b.tar.gz!/")
