"""A missing optional extra ends every command the same way: one line,
``kilo-rules X needs the 'Y' extra: pip install 'kilo-rules[Y]'``, exit 2 (usage). The
import failing is simulated by a ``None`` in ``sys.modules``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kilo_rules.engine.base.errors import Diagnostic, KiloRulesError
from kilo_rules.tools.cli import EXIT_USAGE, main
from kilo_rules.tools.cli._runner import EXTRAS, extra_message, guarded

SWE_AGENT = (
    Path(__file__).resolve().parents[1] / "examples/sessions/swe-agent-gpt4-pydicom-1458.traj"
)
MODEL = ["--model", "anthropic/claude-sonnet-4-5"]


def _without(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)


def _line(prog: str, extra: str) -> str:
    return f"{prog} needs the '{extra}' extra: pip install 'kilo-rules[{extra}]'\n"


def test_the_message_shape() -> None:
    assert extra_message("kilo-rules serve", "serve") == (
        "kilo-rules serve needs the 'serve' extra: pip install 'kilo-rules[serve]'"
    )


@pytest.mark.parametrize("module", EXTRAS["serve"])
def test_serve(
    module: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _without(monkeypatch, module)
    assert main(["serve", "--openapi"]) == EXIT_USAGE
    out = capsys.readouterr()
    assert (out.out, out.err) == ("", _line("kilo-rules serve", "serve"))


@pytest.mark.parametrize(
    "argv",
    [
        ["bundle", "keygen", "--out-dir", "keys"],
        ["bundle", "sign", "b.tar.gz", "--key", "keys/bundle.key"],
    ],
)
def test_bundle_sign_and_keygen(
    argv: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    _without(monkeypatch, "cryptography")
    assert main(argv) == EXIT_USAGE
    assert capsys.readouterr().err == _line("kilo-rules bundle", "bundle")
    assert not (tmp_path / "keys").exists()


def test_bundle_verify_of_a_signed_bundle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``verify`` needs the extra only when the bundle is signed: the library says so, and
    the command says it in the same words."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pol").mkdir()
    (tmp_path / "pol" / "p.yaml").write_text(
        "version: 1\nname: p\nextends: kilo-default\n", encoding="utf-8"
    )
    (tmp_path / "pol" / "routes.yaml").write_text(
        "version: 1\ndefault: ./p.yaml\n", encoding="utf-8"
    )
    assert main(["bundle", "build", "pol", "-o", "b.tar.gz"]) == 0
    assert main(["bundle", "keygen", "--out-dir", "keys"]) == 0
    assert main(["bundle", "sign", "b.tar.gz", "--key", "keys/bundle.key"]) == 0
    capsys.readouterr()
    _without(monkeypatch, "cryptography")
    assert main(["bundle", "verify", "b.tar.gz", "--pubkey", "keys/bundle.pub"]) == EXIT_USAGE
    assert capsys.readouterr().err == _line("kilo-rules bundle", "bundle")


@pytest.mark.parametrize("module", EXTRAS["distributed"])
@pytest.mark.parametrize("how", [["--executor", "dask"], ["--scheduler", "tcp://127.0.0.1:1"]])
def test_simulate_and_tune_on_dask(
    module: str,
    how: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _without(monkeypatch, module)
    argv = ["simulate", *MODEL, "--session", str(SWE_AGENT), *how]
    assert main(argv) == EXIT_USAGE
    assert capsys.readouterr().err == _line("kilo-rules simulate", "distributed")
    assert main(["tune", str(tmp_path / "tune.yaml"), *how]) == EXIT_USAGE
    assert capsys.readouterr().err == _line("kilo-rules tune", "distributed")


def test_the_library_saying_an_extra_is_missing_reads_the_same(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A command that reaches the library's own diagnostic (``fleet`` without Dask) prints
    the same line."""

    def fails() -> int:
        raise KiloRulesError(Diagnostic("simulate.distributed-missing", "no dask"))

    assert guarded(fails, "kilo-rules simulate") == EXIT_USAGE
    assert capsys.readouterr().err == _line("kilo-rules simulate", "distributed")


def test_an_extra_module_missing_deep_in_a_command_reads_the_same(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def fails() -> int:
        raise ModuleNotFoundError("No module named 'uvicorn'", name="uvicorn")

    assert guarded(fails, "kilo-rules serve") == EXIT_USAGE
    assert capsys.readouterr().err == _line("kilo-rules serve", "serve")

    def other() -> int:
        raise ModuleNotFoundError("No module named 'nothing_of_ours'", name="nothing_of_ours")

    with pytest.raises(ModuleNotFoundError):
        guarded(other)
