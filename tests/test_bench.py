"""``xflow bench`` end to end on a small zoo model: table, markdown rows, JSON, chart."""

from __future__ import annotations

import json
import sys

import numpy as np
from click.testing import CliRunner

from tests.rulebook import CONV_RELU_FOLD, MATMUL_MERGE
from xflow.bench import BenchSettings, format_table, run_bench
from xflow.cli import main


def test_bench_writes_table_json_and_chart(tmp_path):
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"format": "xflow.rules/1", "rules": [MATMUL_MERGE, CONV_RELU_FOLD]}))
    out, data, chart = tmp_path / "rows.md", tmp_path / "rows.json", tmp_path / "chart.png"
    result = CliRunner().invoke(main, ["bench", "squeezenet", "--small", "--rules", str(rules), "--seconds", "0.2",
                                       "--budget", "5", "--out", str(out), "--json", str(data), "--chart", str(chart)],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "| squeezenet (small) | 65 → " in result.output and "geomean" in result.output
    table = out.read_text()
    assert table.startswith("`xflow bench squeezenet") or "ONNX Runtime" in table
    assert "| model | nodes before → after |" in table
    (row,) = json.loads(data.read_text())
    assert row["model"] == "squeezenet (small)" and row["runs"] >= 10
    assert row["latency_ms"]["original"] > 0 and row["speedup"]["xflow"] > 0
    assert row["search_cold_s"] > 0 and row["search_warm_s"] >= 0
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_says_when_onnxsim_is_missing(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxsim", None)  # import onnxsim now raises ImportError
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"format": "xflow.rules/1", "rules": [CONV_RELU_FOLD]}))
    settings = BenchSettings(rules_path=str(rules), small=True, budget=2, seconds_per_model=0.1, min_runs=3)
    (row,) = run_bench(["squeezenet"], settings, say=lambda _m: None)
    assert "onnxsim" not in row.speedup
    assert "onnxsim not installed (pip install 'xflow[bench]')" in format_table([row], settings, "xflow bench")


def test_a_model_xflow_leaves_unchanged_is_one_x_not_timed_against_itself(tmp_path):
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"format": "xflow.rules/1", "rules": [MATMUL_MERGE]}))  # squeezenet has no MatMul
    settings = BenchSettings(rules_path=str(rules), small=True, budget=2, seconds_per_model=0.1, min_runs=3)
    (row,) = run_bench(["squeezenet"], settings, say=lambda _m: None)
    assert row.decision.startswith("copied")
    assert row.speedup["xflow"] == 1.0 and row.latency_ms["xflow"] == row.latency_ms["original"]
    assert any("1.000x by construction" in n for n in row.notes)


def test_a_peer_that_changes_the_outputs_is_flagged_and_counts_as_one_x(tmp_path):
    from onnx import TensorProto, helper

    from xflow.bench import ONNXSLIM, ORIGINAL, XFLOW, BenchRow, counted_speedup, format_row, output_drift
    from xflow.runtime import make_session

    def model(op):
        return helper.make_model(helper.make_graph(
            [helper.make_node(op, ["x"], ["y"])], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])]),
            opset_imports=[helper.make_opsetid("", 17)], ir_version=8)

    sessions = {ORIGINAL: make_session(model("Relu")), XFLOW: make_session(model("Relu")),
                ONNXSLIM: make_session(model("Neg"))}
    feeds = {"x": np.array([-1.0, 0.5, 2.0, -3.0], np.float32)}
    drift = output_drift(sessions, feeds)
    assert list(drift) == [ONNXSLIM] and "differs" in drift[ONNXSLIM]
    row = BenchRow("m", 1, 1, {}, 0.1, 0.1, "optimized", speedup={XFLOW: 1.0, ONNXSLIM: 1.3},
                   latency_ms={ORIGINAL: 1.0, XFLOW: 1.0, ONNXSLIM: 0.77}, drifted=[ONNXSLIM])
    assert counted_speedup(row, ONNXSLIM) == 1.0 and counted_speedup(row, XFLOW) == 1.0
    assert "1.300× (outputs differ)" in format_row(row)
