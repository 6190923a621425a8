"""``xflow bench`` end to end on a small zoo model: table, markdown rows, JSON, chart."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tests.rulebook import CONV_RELU_FOLD, MATMUL_MERGE
from xflow.bench import BenchSettings, format_table, run_bench
from xflow.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_bench_writes_table_json_and_chart(tmp_path):
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"format": "xflow.rules/1", "rules": [MATMUL_MERGE, CONV_RELU_FOLD]}))
    out, data, chart = tmp_path / "rows.md", tmp_path / "rows.json", tmp_path / "chart.png"
    result = CliRunner().invoke(main, ["bench", "squeezenet", "--small", "--rules", str(rules), "--seconds", "0.2",
                                       "--budget", "5", "--out", str(out), "--json", str(data), "--chart", str(chart)],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "| squeezenet (small) | 65 → " in result.output and "geomean" in result.output
    printed = result.output.splitlines()
    header = next(i for i, line in enumerate(printed) if line.startswith("| model |"))
    assert printed[header + 1].count("---") == printed[header].count("|") - 1  # a markdown table as printed
    table = out.read_text()
    assert table.startswith("`xflow bench squeezenet") or "ONNX Runtime" in table
    assert "| model | nodes before → after |" in table
    (row,) = json.loads(data.read_text())
    assert row["model"] == "squeezenet (small)" and row["runs"] >= 10
    assert set(row["latency_ms"]) >= {"original", "xflow"}
    assert row["speedup"]["xflow"] == row["latency_ms"]["original"] / row["latency_ms"]["xflow"]
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_says_when_onnxsim_is_missing(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxsim", None)  # import onnxsim now raises ImportError
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"format": "xflow.rules/1", "rules": [CONV_RELU_FOLD]}))
    settings = BenchSettings(rules_path=str(rules), small=True, budget=2, seconds_per_model=0.1, min_runs=3)
    (row,) = run_bench(["squeezenet"], settings, say=lambda _m: None)
    assert "onnxsim" not in row.speedup
    assert "onnxsim not installed (pip install 'xflow-opt[bench]')" in format_table([row], settings, "xflow bench")


def test_a_model_xflow_leaves_unchanged_is_timed_like_every_column(tmp_path, monkeypatch):
    """No 1.000x "by construction": xflow's written model is timed in the same rounds as the others, by sessions
    of its own, even when it is the original."""
    import xflow.bench as bench

    rounds = []
    measure = bench.measure_interleaved

    def recorded(timed, *args, **kwargs):  # the real measurement, its sessions noted
        rounds.append(dict(timed))
        return measure(timed, *args, **kwargs)

    monkeypatch.setattr(bench, "measure_interleaved", recorded)
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"format": "xflow.rules/1", "rules": [MATMUL_MERGE]}))  # squeezenet has no MatMul
    settings = BenchSettings(rules_path=str(rules), small=True, budget=2, seconds_per_model=0.1, min_runs=3)
    (row,) = run_bench(["squeezenet"], settings, say=lambda _m: None)
    assert row.decision.startswith("copied")
    (timed,) = rounds
    xflow_sessions = [s for (name, _), s in timed.items() if name == "xflow"]
    original_sessions = [s for (name, _), s in timed.items() if name == "original"]
    # in the same interleaved rounds, as many sessions as the original's and none of them the original's
    assert len(xflow_sessions) == len(original_sessions) == settings.sessions_per_variant
    assert not {id(s) for s in xflow_sessions} & {id(s) for s in original_sessions}
    assert row.speedup["xflow"] == row.latency_ms["original"] / row.latency_ms["xflow"]
    assert any("xflow wrote the original back (timed as written" in n for n in row.notes)


def test_ort_transformer_optimizer_column_on_bert(tmp_path):
    """With the bench extra installed, ORT's transformer optimizer runs on the zoo BERT and its model is
    timed; without what it needs, the row says exactly what is missing."""
    pytest.importorskip("sympy", reason="the bench extra (pip install 'xflow-opt[bench]') is not installed")
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"format": "xflow.rules/1", "rules": [MATMUL_MERGE]}))
    settings = BenchSettings(rules_path=str(rules), small=True, budget=2, seconds_per_model=0.1, min_runs=3)
    (row,) = run_bench(["bert"], settings, say=lambda _m: None)
    assert "ort-transformers" in row.speedup, row.notes


BENCH_WITHOUT_ORT_TRANSFORMERS = """
import json, sys
sys.modules["onnxruntime.transformers"] = None  # an ORT build without its transformers tools: the import fails
from xflow.bench import BenchSettings, run_bench
(row,) = run_bench(["bert"], BenchSettings(rules_path=sys.argv[1], small=True, budget=2, seconds_per_model=0.1,
                                           min_runs=3), say=lambda _m: None)
print(json.dumps({"speedup": row.speedup, "notes": row.notes}))
"""


def test_a_failing_tool_is_named_with_its_reason(tmp_path):
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"format": "xflow.rules/1", "rules": [MATMUL_MERGE]}))
    proc = subprocess.run([sys.executable, "-c", BENCH_WITHOUT_ORT_TRANSFORMERS, str(rules)], capture_output=True,
                          text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "ort-transformers" not in row["speedup"]
    (note,) = [n for n in row["notes"] if n.startswith("ORT transformer optimizer failed")]
    assert "onnxruntime.transformers" in note, note


def test_a_peer_that_changes_the_outputs_is_flagged_and_counts_as_one_x(tmp_path):
    from onnx import TensorProto, helper

    from xflow.bench import ONNXSLIM, ORIGINAL, XFLOW, BenchRow, counted_speedup, format_row, output_drift
    from xflow.ort import open_session

    def model(op):
        return helper.make_model(helper.make_graph(
            [helper.make_node(op, ["x"], ["y"])], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])]),
            opset_imports=[helper.make_opsetid("", 17)], ir_version=8)

    sessions = {ORIGINAL: open_session(model("Relu")), XFLOW: open_session(model("Relu")),
                ONNXSLIM: open_session(model("Neg"))}
    feeds = {"x": np.array([-1.0, 0.5, 2.0, -3.0], np.float32)}
    drift = output_drift(sessions, feeds)
    assert list(drift) == [ONNXSLIM] and "differs" in drift[ONNXSLIM]
    row = BenchRow("m", 1, 1, {}, 0.1, 0.1, "optimized", speedup={XFLOW: 1.0, ONNXSLIM: 1.3},
                   latency_ms={ORIGINAL: 1.0, XFLOW: 1.0, ONNXSLIM: 0.77}, drifted=[ONNXSLIM])
    assert counted_speedup(row, ONNXSLIM) == 1.0 and counted_speedup(row, XFLOW) == 1.0
    assert "1.300× (outputs differ)" in format_row(row)


def test_each_variant_is_timed_on_several_sessions(tmp_path, monkeypatch):
    """One session's luck lasts its life, so each column is the median over ``sessions_per_variant`` sessions,
    all in the same interleaved rounds."""
    import xflow.bench as bench

    made: list[str] = []
    real = bench.open_session
    monkeypatch.setattr(bench, "open_session", lambda path, *a, **k: (made.append(path), real(path, *a, **k))[1])
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"format": "xflow.rules/1", "rules": [CONV_RELU_FOLD]}))
    settings = BenchSettings(rules_path=str(rules), small=True, budget=2, seconds_per_model=0.1, min_runs=3,
                             sessions_per_variant=3)
    (row,) = run_bench(["squeezenet"], settings, say=lambda _m: None)
    assert len(made) == 3 * len(row.latency_ms) and all(made.count(path) == 3 for path in made)
    assert row.runs >= 3 and set(row.speedup) == set(row.latency_ms) - {"original"}
    assert "3 sessions per variant" in format_table([row], settings, "xflow bench")
