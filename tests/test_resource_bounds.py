"""Resource bounds a user relies on in a pipeline: ``--time-limit`` and ``--memory-limit`` stop the
search with the best graph so far, and Ctrl-C (KeyboardInterrupt) at any point leaves no partial output."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import time

import onnx
import pytest
from click.testing import CliRunner

from tests.test_bad_input import SAVE_MODULE, failing_open, snapshot
from tests.test_determinism import ROOT, rule_file
from xflow.cli import main
from xflow.optimize import OptimizeOptions, optimize_file

BACKTRACK = importlib.import_module("xflow.search.backtrack")


@pytest.fixture(scope="module")
def zoo_model(tmp_path_factory):
    """(model path, rule file): a small Inception, on which the rules keep the search busy."""
    folder = tmp_path_factory.mktemp("zoo")
    src = folder / "inception.onnx"
    result = CliRunner().invoke(main, ["zoo", "inception_v3", str(src), "--small"], catch_exceptions=False)
    assert result.exit_code == 0
    return src, rule_file(folder / "rules.json")


def optimize(src, out, rules: str, *extra: str):  # noqa: ANN001
    return CliRunner().invoke(main, ["optimize", str(src), str(out), "--rules", rules, "--trust-rules", "--cost",
                                     "analytic", "--keep-if-slower", *extra], catch_exceptions=False)


def test_time_limit_returns_the_best_graph_so_far(zoo_model, tmp_path):
    src, rules = zoo_model
    out, report = tmp_path / "out.onnx", tmp_path / "r.json"
    result = optimize(src, out, rules, "--budget", "100000", "--patience", "0", "--time-limit", "0.5",
                      "--report", str(report))
    assert result.exit_code == 0, result.stderr
    data = json.loads(report.read_text())
    # How far past the limit it stops is load-dependent: benchmarks/resource_bounds.py measures it.
    assert data["search_stop"] == "time" and data["search_ms"] >= 500, data
    assert data["decision"] == "optimized" and data["verified"] and data["cost_after_ms"] < data["cost_before_ms"]
    onnx.checker.check_model(str(out))


def test_memory_limit_below_current_use_stops_at_once(zoo_model, tmp_path):
    src, rules = zoo_model
    out, report = tmp_path / "out.onnx", tmp_path / "r.json"
    result = optimize(src, out, rules, "--memory-limit", "1", "--report", str(report))
    assert result.exit_code == 0, result.stderr
    data = json.loads(report.read_text())
    assert data["search_stop"] == "memory" and data["graphs_explored"] == 0
    assert onnx.load(str(out)).graph == onnx.load(str(src)).graph  # nothing found: the original, unchanged


def test_memory_limit_reached_mid_search_keeps_the_best_so_far(zoo_model, tmp_path, monkeypatch):
    """RSS grows by 10 MB per expansion (the process's real use, stood in for so the test is exact):
    the search stops after the expansions that fit and the improvements found by then are written."""
    src, rules = zoo_model
    calls = iter(range(10**6))
    monkeypatch.setattr(BACKTRACK, "rss_mb", lambda: 100.0 + 10.0 * next(calls))
    options = OptimizeOptions.of(rules_path=rules, cost="analytic", measure=False, budget=100000, time_limit=600,
                              memory_limit=145)
    report = optimize_file(str(src), str(tmp_path / "out.onnx"), options, say=lambda _m: None)
    assert report.search_stop == "memory" and report.graphs_explored == 5
    assert report.decision == "optimized" and report.cost_after_ms < report.cost_before_ms


def interrupt(*_args: object, **_kwargs: object) -> None:
    raise KeyboardInterrupt


@pytest.mark.parametrize("where", ["search", "model-write", "data-write"])
def test_ctrl_c_leaves_no_partial_output(zoo_model, tmp_path, monkeypatch, where):
    src, rules = zoo_model
    work = tmp_path / "work"
    work.mkdir()
    out = work / "out.onnx"
    out.write_bytes(b"a previous output, kept as it was")
    before = snapshot(work)
    src_before = snapshot(src.parent)
    if where == "search":
        monkeypatch.setattr(BACKTRACK, "apply_match", interrupt)
    else:
        target = "out.onnx" if where == "model-write" else "out.onnx.data"
        monkeypatch.setattr(SAVE_MODULE, "open", failing_open(1000, KeyboardInterrupt(), target), raising=False)
        monkeypatch.setattr(SAVE_MODULE, "EXTERNAL_THRESHOLD", 1 if where == "data-write" else 1 << 30)
    result = optimize(src, out, rules)
    assert result.exit_code == 130, (result.output, result.stderr)
    assert result.stderr.strip().splitlines() == ["xflow: error: interrupted; nothing written"]
    assert snapshot(work) == before and snapshot(src.parent) == src_before


def handler_installed(pid: int, signum: int, proc: subprocess.Popen, timeout: float = 300.0) -> bool:
    """Wait until process ``pid`` catches ``signum`` (its SigCgt mask in /proc), however slow its imports are
    on a loaded machine; False if it exits or the timeout passes first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        with open(f"/proc/{pid}/status") as f:
            caught = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
        if caught >> (signum - 1) & 1:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the caught-signal mask from /proc")
def test_sigterm_unwinds_like_ctrl_c(tmp_path):
    """A pipeline's timeout sends SIGTERM: the run stops with one line and exit 130, leaving no output,
    scratch copy or temp file (Python's default would die on the spot and leave them)."""
    src = tmp_path / "nasrnn.onnx"
    assert CliRunner().invoke(main, ["zoo", "nasrnn", str(src), "--small"]).exit_code == 0
    work = tmp_path / "work"
    work.mkdir()
    rules = rule_file(tmp_path / "rules.json")
    before = snapshot(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "xflow.cli", "optimize", str(src), str(work / "out.onnx"),
                             "--rules", rules, "--trust-rules", "--cost", "analytic", "--budget", "1000000",
                             "--patience", "0",
                             "--time-limit", "600"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    assert handler_installed(proc.pid, signal.SIGTERM, proc), "xflow never installed its SIGTERM handler"
    time.sleep(1)  # into the load or the search (which runs for minutes); any point must unwind the same way
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert stderr.strip().splitlines() == ["xflow: error: interrupted; nothing written"]
    assert snapshot(tmp_path) == before
