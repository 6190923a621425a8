"""Large models: weights in external data are loaded lazily, optimized and written back as external
data without a second in-memory copy of the weights.

Protobuf cannot hold more than 2 GB, so large models keep their weights in external files. The
threshold above which xflow writes external data by itself (``EXTERNAL_THRESHOLD``, 1 GB) is set low
here so that small generated models take the same path; a real > 2 GB run is in docs/RESULTS.md.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.rulebook import MATMUL_MERGE, SPLIT_SPLIT_MERGE
from xflow.cost import AnalyticCost
from xflow.onnx_io import load
from xflow.optimize import OptimizeOptions, optimize_file

SAVE_MODULE = importlib.import_module("xflow.onnx_io.save")
ROOT = Path(__file__).resolve().parents[1]
# Per-kernel overhead of a GPU launch: merging the three MatMuls (and their splits) then pays off.
LAUNCH_BOUND = AnalyticCost(overhead_seconds=1e-3)


def parallel_matmuls(n: int, k: int = 3) -> onnx.ModelProto:
    """x [1, n] -> k MatMuls with n x n weights: merged by the rules into one MatMul on new weights."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", f"W{i}"], [f"y{i}"]) for i in range(k)]
    inits = [numpy_helper.from_array((rng.standard_normal((n, n)) * 0.05).astype(np.float32), f"W{i}")
             for i in range(k)]
    graph = helper.make_graph(nodes, "big", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
                              [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [1, n]) for i in range(k)],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.fixture
def rules(tmp_path) -> str:
    path = tmp_path / "rules.json"
    path.write_text(json.dumps({"format": "xflow.rules/1", "rules": [MATMUL_MERGE, SPLIT_SPLIT_MERGE]}))
    return str(path)


def optimize(src: Path, out: Path, rules: str) -> None:
    options = OptimizeOptions.of(rules_path=rules, cost="analytic", measure=False, verify=True, budget=30)
    report = optimize_file(str(src), str(out), options, cost_model=LAUNCH_BOUND, say=lambda _m: None)
    assert report.decision == "optimized" and report.verified
    assert report.rules_applied == {"matmul_merge_shared_lhs": 2, "split_split_merge": 1}


def same_outputs(a: Path, b: Path, n: int) -> None:
    x = np.random.default_rng(1).standard_normal((1, n)).astype(np.float32)
    for p, q in zip(ort.InferenceSession(str(a)).run(None, {"x": x}), ort.InferenceSession(str(b)).run(None, {"x": x}),
                    strict=True):
        np.testing.assert_allclose(p, q, rtol=1e-4, atol=1e-5)


def external_initializers(model: onnx.ModelProto) -> tuple[set[str], set[str]]:
    """(names of external initializers, names of inline ones of at least MIN_EXTERNAL_TENSOR bytes)."""
    external = {t.name for t in model.graph.initializer if t.data_location == TensorProto.EXTERNAL}
    big_inline = {t.name for t in model.graph.initializer
                  if t.data_location != TensorProto.EXTERNAL and len(t.raw_data) >= SAVE_MODULE.MIN_EXTERNAL_TENSOR}
    return external, big_inline


def test_inline_weights_over_the_threshold_are_written_as_external_data(tmp_path, rules, monkeypatch):
    monkeypatch.setattr(SAVE_MODULE, "EXTERNAL_THRESHOLD", 128 << 10)  # the model has 3 x 64 KB of weights
    src, out = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(parallel_matmuls(128), src)
    optimize(src, out, rules)
    written = onnx.load(str(out), load_external_data=False)
    external, big_inline = external_initializers(written)
    assert external and not big_inline and os.path.getsize(out) < 8 << 10
    assert os.path.getsize(str(out) + ".data") >= 3 * 128 * 128 * 4
    same_outputs(src, out, 128)
    assert sorted(os.listdir(tmp_path)) == ["m.onnx", "out.onnx", "out.onnx.data", "rules.json"]


def test_external_data_is_loaded_lazily_and_written_back_external(tmp_path, rules):
    src, out = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(parallel_matmuls(128), src, save_as_external_data=True, location="weights.bin", size_threshold=1024)
    graph = load(str(src))
    assert all(c.is_external and not c.proto.raw_data and c.array is None for c in graph.constants.values())
    optimize(src, out, rules)
    written = onnx.load(str(out), load_external_data=False)
    external, big_inline = external_initializers(written)
    assert len(external) == 1 and not big_inline  # the merged weight, new, written as external data
    locations = {e.value for t in written.graph.initializer for e in t.external_data if e.key == "location"}
    assert locations == {"out.onnx.data"}
    same_outputs(src, out, 128)


# The peak comes from VmHWM (this process's own high-water mark): ru_maxrss would carry over the RSS of
# the pytest process that forked it, since Linux keeps it across execve.
PEAK_SCRIPT = textwrap.dedent("""
    import json, sys
    from xflow.cost import AnalyticCost
    from xflow.optimize import OptimizeOptions, optimize_file
    def status_mb(key):
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) / 1024 for line in f if line.startswith(key + ":"))
    src, out, rules = sys.argv[1:4]
    base = status_mb("VmRSS")
    options = OptimizeOptions.of(rules_path=rules, cost="analytic", measure=False, verify=False, budget=30)
    report = optimize_file(src, out, options, cost_model=AnalyticCost(overhead_seconds=1e-3), say=lambda m: None)
    print(json.dumps({"growth_mb": status_mb("VmHWM") - base, "decision": report.decision}))
""")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the RSS high-water mark from /proc")
@pytest.mark.parametrize("merge", [True, False], ids=["merged", "copied"])
def test_peak_memory_holds_weights_at_most_once(tmp_path, rules, merge):
    """Three 16 MB external weights. Merged into one new 48 MB weight, the process grows by the fold
    (inputs and result, ~2x the new weight), not by copies made while the model is written (before
    deferred writes: ~4x). Copied through, the weights are streamed through one 8 MB buffer (before:
    whole tensors read, two at a time)."""
    n = 2048
    src, out = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(parallel_matmuls(n), src, save_as_external_data=True, location="m.onnx.data", size_threshold=1024)
    if not merge:
        Path(rules).write_text(json.dumps({"format": "xflow.rules/1", "rules": []}))
    weights_mb = 3 * n * n * 4 / 2**20
    proc = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, str(src), str(out), rules], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    # external weights: the original is written again with its own data file, which is not a byte copy
    assert result["decision"] == ("optimized" if merge else "original re-encoded (no rules)")
    assert result["growth_mb"] < (2.6 * weights_mb if merge else 16), result
    assert os.path.getsize(str(out) + ".data") == 3 * n * n * 4
    same_outputs(src, out, n)


def test_shape_tensors_stay_inline_in_external_data_models(tmp_path, rules):
    """A Split into 200 pieces has 1.6 KB of sizes: written to external data (as every tensor of at
    least 1 KB used to be), neither shape inference nor ONNX Runtime could read it. 1-D integer
    tensors stay in the model."""
    pieces = 200
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Split", ["h", "sizes"], [f"p{i}" for i in range(pieces)], axis=1)]
    inits = [numpy_helper.from_array(np.ones((pieces, pieces), np.float32), "w"),
             numpy_helper.from_array(np.ones(pieces, np.int64), "sizes")]
    outputs = [helper.make_tensor_value_info(f"p{i}", TensorProto.FLOAT, [1, 1]) for i in range(pieces)]
    graph = helper.make_graph(nodes, "split", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, pieces])],
                              outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    src, out = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(model, src)  # inline; the output is made external below
    graph_ir = load(str(src))
    SAVE_MODULE.save(graph_ir, str(out), external_data=True)
    written = onnx.load(str(out), load_external_data=False)
    external = {t.name for t in written.graph.initializer if t.data_location == TensorProto.EXTERNAL}
    assert external == {"w"}
    x = np.random.default_rng(0).standard_normal((1, pieces)).astype(np.float32)
    for p, q in zip(ort.InferenceSession(str(src)).run(None, {"x": x}),
                    ort.InferenceSession(str(out)).run(None, {"x": x}), strict=True):
        np.testing.assert_array_equal(p, q)
