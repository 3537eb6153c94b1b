"""Outputs are written whole or not at all: ``kilo-rules simulate --html OUT`` killed with
SIGKILL at any moment leaves OUT as it was or as the whole new report, never empty or torn.

Each round starts the real command over an existing OUT and kills it: some rounds the
moment the write begins (a temporary file appears beside OUT, or OUT itself changes),
the others after a random delay over the run. Nothing is monkeypatched."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OLD = b"<!doctype html><p>the previous report</p>\n"
SESSION = (
    '{"version": 1, "id": "s", "messages": ['
    '{"id": "m1", "role": "user", "parts": [{"type": "text", "id": "p1", "text": "Fix it."}]},'
    '{"id": "m2", "role": "assistant", "finish": "stop", "tokens": {"input": 1200},'
    ' "parts": [{"type": "text", "id": "p2", "text": "Done."}]}]}'
)
ROUNDS = 8
CONCURRENT = 2


def _command(session: Path, out: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "kilo_rules",
        "simulate",
        "--model",
        "anthropic/claude-sonnet-4-5",
        "--session",
        str(session),
        "--html",
        str(out),
    ]


def _writing(out: Path) -> bool:
    """The write has begun: a temporary file beside OUT, or OUT no longer the old one."""
    try:
        if any(p.name.startswith(f".{out.name}.") for p in out.parent.iterdir()):
            return True
        return out.read_bytes() != OLD
    except OSError:
        return True


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_simulate_html_killed_at_any_moment_is_old_or_whole(tmp_path: Path) -> None:
    session = tmp_path / "s.json"
    session.write_text(SESSION, encoding="utf-8")
    reference = tmp_path / "reference.html"
    started = time.monotonic()
    subprocess.run(_command(session, reference), check=True, capture_output=True, cwd=ROOT)
    full = time.monotonic() - started  # only to spread the random kills over a run
    whole = reference.read_bytes()
    assert whole.rstrip().endswith(b"</html>")

    rng = random.Random(23)
    # (round, kill as the write begins, else after this delay, and then after this slack)
    plans = [
        (i, i % 2 == 0, rng.uniform(0.0, full * 1.3), rng.choice([0.0, 0.0, 0.0002, 0.001]))
        for i in range(ROUNDS)
    ]
    for batch in range(0, ROUNDS, CONCURRENT):
        live = []
        for i, at_write, delay, slack in plans[batch : batch + CONCURRENT]:
            out = tmp_path / f"round{i}" / "out.html"
            out.parent.mkdir()
            out.write_bytes(OLD)
            proc = subprocess.Popen(
                _command(session, out),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd=ROOT,
            )
            live.append((proc, out, at_write, time.monotonic() + delay, slack))
        while any(p.poll() is None for p, *_ in live):
            for proc, out, at_write, deadline, slack in live:
                if proc.poll() is not None:
                    continue
                if (at_write and _writing(out)) or (not at_write and time.monotonic() >= deadline):
                    time.sleep(slack)
                    proc.send_signal(signal.SIGKILL)
                    proc.wait()
            time.sleep(0.0005)
        for _, out, *_ in live:
            content = out.read_bytes()
            assert content in (OLD, whole), (out, len(content))
