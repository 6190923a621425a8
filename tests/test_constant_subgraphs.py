"""The source's own constant subgraphs evaluated once (``xflow.rewrite.evaluate``): a causal mask built from
constants (Whisper's decoder: ConstantOfShape, Trilu, Equal, Where) becomes one initializer, the outputs stay bit for
bit the same, the interface is kept, the step is certified and ``xflow check`` recomputes it and refuses a tampered
one; inexact ops, large values, graph outputs and overridable initializers stay computed."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from xflow.check.certificate import carried
from xflow.check.replay import StepRefused, replay
from xflow.cli import main
from xflow.onnx_io import graph_from_model, to_model_proto
from xflow.ort import open_session
from xflow.rewrite.evaluate import KIND, MAX_BYTES, evaluate_constants

N = 16


def _masked(extra_nodes: tuple = (), extra_outputs: tuple = (), n: int = N, mask_op: str = "Trilu") -> onnx.ModelProto:
    """``scores + mask`` with the causal mask computed from constants as Whisper's export computes it."""
    nodes = [helper.make_node("ConstantOfShape", ["size"], ["ones"],
                              value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])),
             helper.make_node(mask_op, ["ones"], ["upper"], **({"upper": 1} if mask_op == "Trilu" else {})),
             helper.make_node("Equal", ["upper", "zero"], ["keep"]),
             helper.make_node("Where", ["keep", "zero", "minus"], ["mask"]),
             helper.make_node("Add", ["scores", "mask"], ["y"]), *extra_nodes]
    inits = [numpy_helper.from_array(np.array([n, n], np.int64), "size"),
             numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
             numpy_helper.from_array(np.array(-1e9, np.float32), "minus")]
    graph = helper.make_graph(nodes, "masked", [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [2, n, n])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, n, n]), *extra_outputs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _same_outputs(a: onnx.ModelProto, b: onnx.ModelProto) -> None:
    feeds = {"scores": np.random.default_rng(0).standard_normal((2, N, N)).astype(np.float32)}
    for x, y in zip(open_session(a.SerializeToString()).run(None, feeds),
                    open_session(b.SerializeToString()).run(None, feeds), strict=True):
        assert np.array_equal(x, y)


def test_a_causal_mask_of_constants_becomes_one_initializer():
    model = _masked()
    graph = graph_from_model(model)
    step = evaluate_constants(graph)
    assert step is not None and list(step.values) == ["mask"]
    assert len(step.removed) == 4
    written = to_model_proto(step.graph, constant_nodes=False)
    assert [n.op_type for n in written.graph.node] == ["Add"]
    expected = np.where(np.triu(np.ones((N, N), np.float32)) == 0, 0.0, -1e9).astype(np.float32)
    assert np.array_equal(step.values["mask"], expected)
    _same_outputs(model, written)


def test_the_step_replays_and_a_tampered_one_is_refused():
    graph = graph_from_model(_masked())
    step = evaluate_constants(graph)
    record = step.record()
    certificate = {"input": {"graph": graph.structural_hash}, "steps": [record],
                   "output": {"graph": step.graph.structural_hash}}
    assert replay(graph, certificate, {}).graph.structural_hash == step.graph.structural_hash
    record["values"]["mask"]["sha256"] = "0" * 64
    with pytest.raises(StepRefused, match="constant subgraphs: mask recomputed differs"):
        replay(graph, certificate, {})
    record = step.record()
    record["removed"] = record["removed"][1:]
    with pytest.raises(StepRefused, match="constant subgraphs"):
        replay(graph, {**certificate, "steps": [record]}, {})


def test_an_op_whose_value_is_the_kernels_stays():
    """Exp of a constant: its value is the kernel's, not ONNX's, so it is not computed here (ORT folds it at load)."""
    model = _masked()
    model.graph.node[3].input[2] = "e"
    model.graph.node.insert(0, helper.make_node("Exp", ["minus"], ["e"]))
    step = evaluate_constants(graph_from_model(model))
    assert step is not None and list(step.values) == ["keep"]  # the mask up to the Where, which reads the Exp
    written = to_model_proto(step.graph, constant_nodes=False)
    assert [n.op_type for n in written.graph.node] == ["Exp", "Where", "Add"]
    _same_outputs(model, written)


def test_large_values_graph_outputs_and_overridable_initializers_stay():
    big = int(np.sqrt(MAX_BYTES // 4)) + 1  # a float32 mask over MAX_BYTES
    assert evaluate_constants(graph_from_model(_masked(n=big))) is None
    as_output = _masked(extra_outputs=(helper.make_tensor_value_info("mask", TensorProto.FLOAT, [N, N]),))
    assert evaluate_constants(graph_from_model(as_output)) is None
    overridable = _masked()
    overridable.graph.input.append(helper.make_tensor_value_info("size", TensorProto.INT64, [2]))
    overridable.ir_version = 8  # an initializer listed as an input: a caller may feed another size
    assert evaluate_constants(graph_from_model(overridable)) is None


def test_optimize_writes_the_mask_as_a_value_and_check_recomputes_it(tmp_path):
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    model = _masked()
    onnx.save(model, str(src))
    report = tmp_path / "report.json"
    result = CliRunner().invoke(main, ["optimize", str(src), str(out), "--cost", "analytic", "--keep-if-slower",
                                       "--report", str(report)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "constant subgraphs: 1 values computed once (ONNX Runtime), 4 nodes deleted" in result.output
    figures = json.loads(report.read_text())
    assert (figures["constants_evaluated"], figures["constant_nodes_deleted"]) == (1, 4)
    written = onnx.load(str(out))
    assert [n.op_type for n in written.graph.node] == ["Add"]
    assert written.graph.input == model.graph.input and written.graph.output == model.graph.output
    _same_outputs(model, written)
    assert json.loads(carried(written))["steps"][-1]["kind"] == KIND
    checked = CliRunner().invoke(main, ["check", str(src), str(out)], catch_exceptions=False)
    assert checked.exit_code == 0, checked.output


def test_a_scalar_stays_a_scalar():
    """``Range`` takes scalars: a Squeeze of a one-element constant evaluated is written of rank 0 (the ONNX suite's
    expanded Attention functions compute their Range bounds so)."""
    nodes = [helper.make_node("Squeeze", ["one_v", "axes"], ["one"]),
             helper.make_node("Range", ["zero", "n", "one"], ["r"]),
             helper.make_node("Cast", ["r"], ["rf"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["x", "rf"], ["y"])]
    inits = [numpy_helper.from_array(np.array([1], np.int64), "one_v"),
             numpy_helper.from_array(np.array([0], np.int64), "axes"),
             numpy_helper.from_array(np.array(0, np.int64), "zero")]
    graph = helper.make_graph(nodes, "range", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
                                               helper.make_tensor_value_info("n", TensorProto.INT64, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    step = evaluate_constants(graph_from_model(model))
    assert step is not None and step.values["one"].shape == ()
    written = to_model_proto(step.graph, constant_nodes=False)
    (one,) = [t for t in written.graph.initializer if t.name == "one"]
    assert list(one.dims) == []
    feeds = {"x": np.zeros(4, np.float32), "n": np.array(4, np.int64)}
    assert np.array_equal(open_session(written.SerializeToString()).run(None, feeds)[0], np.arange(4.0))
