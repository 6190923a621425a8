"""The command line as a user meets it: end-to-end optimize, bad input, help."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from tests.rulebook import CONV_RELU_FOLD, MATMUL_MERGE
from xflow.cli import main


def write_rules(path, rules) -> str:
    path.write_text(json.dumps({"format": "xflow.rules/1", "rules": rules}))
    return str(path)


def qkv_model(path, hidden: int = 256, seq: int = 64) -> str:
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", f"W{k}"], [k]) for k in "qkv"]
    inits = [numpy_helper.from_array(rng.standard_normal((hidden, hidden)).astype(np.float32) * 0.05, f"W{k}")
             for k in "qkv"]
    graph = helper.make_graph(nodes, "qkv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, hidden])],
                              [helper.make_tensor_value_info(k, TensorProto.FLOAT, [1, seq, hidden]) for k in "qkv"],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return str(path)


def invoke(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def conv_relu_model(path) -> str:
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    inits = [numpy_helper.from_array(rng.standard_normal((8, 4, 3, 3)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal((8,)).astype(np.float32), "B")]
    graph = helper.make_graph(nodes, "cr", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return str(path)


CONV_BIAS_RELU_FOLD = {**CONV_RELU_FOLD, "name": "conv_bias_relu_fold", "inputs": {"x": "any", "w": "any", "b": "any"},
                       "src": [{**CONV_RELU_FOLD["src"][0], "in": ["x", "w", "b"]}, CONV_RELU_FOLD["src"][1]],
                       "dst": [{**CONV_RELU_FOLD["dst"][0], "in": ["x", "w", "b"]}]}


def test_optimize_end_to_end_writes_equivalent_model(tmp_path):
    src = conv_relu_model(tmp_path / "m.onnx")
    out = tmp_path / "out.onnx"
    report = tmp_path / "r.json"
    rules = write_rules(tmp_path / "rules.json", [MATMUL_MERGE, CONV_BIAS_RELU_FOLD])
    result = invoke("optimize", src, str(out), "--rules", rules, "--report", str(report), "--keep-if-slower",
                    "--cost", "analytic")
    assert result.exit_code == 0, result.output
    # the summary names the rule by what it does; the report keeps its id
    assert "fuse-relu-into-conv x1" in result.output and "measured latency" in result.output
    data = json.loads(report.read_text())
    assert data["rules_applied"] == {"conv_bias_relu_fold": 1}
    assert data["rule_names"] == {"conv_bias_relu_fold": "fuse-relu-into-conv"}
    assert data["verified"] and data["latency_before_ms"] > 0 and data["decision"] == "optimized"
    assert data["cost_after_ms"] < data["cost_before_ms"]
    optimized = onnx.load(str(out))
    onnx.checker.check_model(optimized)
    x = np.random.default_rng(1).standard_normal((1, 4, 16, 16)).astype(np.float32)
    a = ort.InferenceSession(src).run(None, {"x": x})
    b = ort.InferenceSession(str(out)).run(None, {"x": x})
    np.testing.assert_allclose(a[0], b[0], rtol=1e-5, atol=1e-5)
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]  # no scratch files left


def test_empty_rule_set_copies_the_model_and_says_so(tmp_path):
    src = qkv_model(tmp_path / "m.onnx", hidden=8, seq=4)
    out = tmp_path / "out.onnx"
    rules = write_rules(tmp_path / "rules.json", [])
    result = invoke("optimize", src, str(out), "--rules", rules)
    assert result.exit_code == 0
    assert "no rules" in result.output and "copied through unchanged" in result.output
    assert onnx.load(str(out)).graph == onnx.load(src).graph


def _bad_inputs(tmp_path):
    good = qkv_model(tmp_path / "good.onnx", hidden=8, seq=4)
    (tmp_path / "empty.onnx").write_bytes(b"")
    (tmp_path / "random.onnx").write_bytes(np.random.default_rng(0).bytes(300))
    data = open(good, "rb").read()
    (tmp_path / "truncated.onnx").write_bytes(data[: len(data) // 2])
    (tmp_path / "adir").mkdir()
    return good


@pytest.mark.parametrize("case, needle", [
    ("missing", "no such file"),
    ("adir", "directory"),
    ("empty", "empty file"),
    ("random", "not an ONNX model"),
    ("truncated", "ONNX"),
    ("same", "output is the input"),
    ("unwritable", "output directory"),
    ("badrules", "not a JSON rule file"),
])
def test_bad_input_one_line_exit_2_nothing_written(tmp_path, case, needle):
    good = _bad_inputs(tmp_path)
    src, out, extra = str(tmp_path / f"{case}.onnx"), str(tmp_path / "out.onnx"), []
    if case == "adir":
        src = str(tmp_path / "adir")
    if case == "same":
        src, out = good, good
    if case == "unwritable":
        src, out = good, str(tmp_path / "no" / "such" / "dir" / "out.onnx")
    if case == "badrules":
        (tmp_path / "bad.json").write_text("{not json")
        src, extra = good, ["--rules", str(tmp_path / "bad.json")]
    before = {p: (tmp_path / p).stat().st_mtime_ns for p in os.listdir(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "xflow.cli", "optimize", src, out, *extra],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    if case not in ("same",):
        assert not os.path.exists(tmp_path / "out.onnx")
    after = {p: (tmp_path / p).stat().st_mtime_ns for p in os.listdir(tmp_path)}
    assert after == before  # input untouched, nothing new


@pytest.mark.parametrize("command", [[], ["optimize"], ["zoo"]])
def test_help_reads_well(command):
    result = invoke(*command, "--help")
    assert result.exit_code == 0
    assert "Usage:" in result.output and len(result.output.splitlines()) > 3


def test_zoo_writes_a_runnable_model(tmp_path):
    out = tmp_path / "sq.onnx"
    result = invoke("zoo", "squeezenet", str(out), "--small")
    assert result.exit_code == 0
    onnx.checker.check_model(str(out))
    unknown = subprocess.run([sys.executable, "-m", "xflow.cli", "zoo", "nope", str(tmp_path / "x.onnx")],
                             capture_output=True, text=True)
    assert unknown.returncode == 2 and "unknown zoo model" in unknown.stderr


def test_the_optimize_flags_default_to_the_one_place_defaults_are_written():
    """The CLI, the bench and the search read one set of defaults (``xflow.optimize.DEFAULTS``)."""
    from xflow.bench import BenchSettings
    from xflow.optimize import DEFAULTS
    from xflow.search import SearchLimits

    params = {p.name: p for p in main.commands["optimize"].params}
    assert (params["budget"].default, params["patience"].default, params["branches"].default) == (300, 10, 2)
    assert params["budget"].default == DEFAULTS.search.budget == BenchSettings().budget == SearchLimits().budget
    assert params["patience"].default == DEFAULTS.search.patience == BenchSettings().patience
    assert params["alpha"].default == DEFAULTS.search.alpha and params["seed"].default == DEFAULTS.inputs.seed
    assert params["time_limit"].default == DEFAULTS.search.time_limit == BenchSettings().time_limit
    assert params["cost_kind"].default == DEFAULTS.cost.kind and params["provider"].default == DEFAULTS.runtime.provider
    assert params["alternatives"].hidden and not params["branches"].hidden  # the former name, still accepted


def test_alternatives_is_still_accepted_as_the_former_name_of_branches(tmp_path):
    src = conv_relu_model(tmp_path / "m.onnx")
    rules = write_rules(tmp_path / "rules.json", [CONV_BIAS_RELU_FOLD])
    for flag in ("--alternatives", "--branches"):
        result = invoke("optimize", src, str(tmp_path / f"out{flag}.onnx"), "--rules", rules, flag, "0",
                        "--keep-if-slower", "--cost", "analytic", "-q")
        assert result.exit_code == 0, result.output
    assert invoke("optimize", src, str(tmp_path / "o.onnx"), "--alternatives", "-1").exit_code == 2
