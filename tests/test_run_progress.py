"""``xflow optimize``'s progress: on a terminal, one stderr line rewritten in place that names every phase of the
run (search, the original's run, finalists, verification and the A/B, certify, write) and is erased before the
summary; nothing at all when stderr is a pipe."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import click
import onnx
import pytest
from click.testing import CliRunner

from tests.test_keep_simpler import transpose_pair_model
from xflow.cli import main
from xflow.cli.logs import configure_logging
from xflow.cli.progress import RunProgress

ROOT = Path(__file__).resolve().parents[1]


def _command(folder: Path) -> list[str]:
    src = folder / "in.onnx"
    onnx.save(transpose_pair_model(), src)
    return [sys.executable, "-m", "xflow.cli", "optimize", str(src), str(folder / "out.onnx"), "--cost", "analytic"]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100"}


def test_every_phase_shows_on_a_terminal_and_the_line_is_erased(tmp_path):
    pty = pytest.importorskip("pty", reason="pseudo-terminals are POSIX only")
    parent, child = pty.openpty()
    run = subprocess.Popen(_command(tmp_path), stdout=subprocess.PIPE, stderr=child, env=_env())
    os.close(child)
    chunks = []
    while True:
        try:
            chunk = os.read(parent, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(parent)
    stdout = run.communicate(timeout=120)[0].decode()
    assert run.returncode == 0, stdout
    err = b"".join(chunks).decode()
    shown = [line.strip() for line in err.split("\r") if line.strip()]
    for phase in ("search", "running the original", "finalists:", "verify: comparing outputs, then the A/B",
                  "certify", "write"):
        assert any(line.startswith(phase) for line in shown), (phase, shown)
    assert shown[0].startswith("search") and shown[-1].startswith("write")
    assert err.endswith("\r") and not err.rstrip(" \r").endswith(")\n")  # erased, not left above the summary
    assert "\n" not in err.replace("\r\n", "")  # one line, rewritten in place
    assert "\r" not in stdout and stdout.splitlines()[-1].startswith("wrote ")


def test_nothing_is_shown_in_a_pipe(tmp_path):
    """stderr not a terminal (click's runner gives a pipe-like stream, as a pipeline or a log file would)."""
    result = CliRunner().invoke(main, _command(tmp_path)[3:], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert result.stderr == "" and "\r" not in result.stdout


def test_a_log_message_is_written_on_a_line_of_its_own(capsys):
    progress = RunProgress(tick_s=60)
    configure_logging(around=progress.paused)
    try:
        progress.phase("timing 3 finalists end to end")
        logging.getLogger("xflow.optimize.run").info("a note from the library")
        click.echo("", err=True, nl=False)
        progress.close()
    finally:
        configure_logging()
    err = capsys.readouterr().err
    before, _, after = err.partition("a note from the library\n")
    assert before.startswith("\rtiming 3 finalists end to end (0 s)") and before.endswith(" \r")
    assert after.startswith("\rtiming 3 finalists") and after.endswith(" \r")
