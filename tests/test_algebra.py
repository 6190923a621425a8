"""The algebra of today's models (issue 20): transformer, mobile and shape ops decode into the op table,
constants and shape computations fold at load, variants the kernels do not cover stay opaque, and the
nodes left outside the algebra are counted."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from xflow.cli import main
from xflow.ir import OPAQUE
from xflow.onnx_io import graph_from_model
from xflow.onnx_io.save import to_model_proto
from xflow.ort import open_session

FLOAT, INT64 = TensorProto.FLOAT, TensorProto.INT64


def _model(nodes, inputs, outputs, initializers=(), opset=17):
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, list(initializers)),
                              opset_imports=[helper.make_opsetid("", opset)], ir_version=8 if opset <= 17 else 10)
    onnx.checker.check_model(model)
    return model


def _const(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def transformer_block(opset: int = 17) -> onnx.ModelProto:
    """An embedding lookup, a masked single-head attention and an erf-GELU MLP, as exporters write them."""
    rng = np.random.default_rng(0)
    d, vocab = 8, 11
    w = {n: rng.standard_normal(s).astype(np.float32) * 0.3 for n, s in
         (("emb", (vocab, d)), ("wq", (d, d)), ("wk", (d, d)), ("wv", (d, d)), ("w1", (d, 2 * d)), ("w2", (2 * d, d)),
          ("ln_s", (d,)), ("ln_b", (d,)))}
    nodes = [
        helper.make_node("Gather", ["emb", "ids"], ["x"], axis=0),
        helper.make_node("LayerNormalization", ["x", "ln_s", "ln_b"], ["h"], axis=-1, epsilon=1e-5),
        *(helper.make_node("MatMul", ["h", f"w{k}"], [k]) for k in "qkv"),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Div", ["s", "scale"], ["ss"]),
        helper.make_node("Cast", ["mask"], ["m0"], to=TensorProto.BOOL),
        helper.make_node("Unsqueeze", ["m0", "one"], ["mb"]),
        helper.make_node("Where", ["mb", "ss", "neg"], ["sm"]),
        helper.make_node("Softmax", ["sm"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["a"]),
        helper.make_node("Add", ["a", "x"], ["r"]),
        helper.make_node("MatMul", ["r", "w1"], ["f"]),
        helper.make_node("Div", ["f", "sqrt2"], ["fd"]),
        helper.make_node("Erf", ["fd"], ["fe"]),
        helper.make_node("Add", ["fe", "one_f"], ["fa"]),
        helper.make_node("Mul", ["f", "fa"], ["fm"]),
        helper.make_node("Mul", ["fm", "half"], ["g"]),
        helper.make_node("MatMul", ["g", "w2"], ["o"]),
        helper.make_node("Pow", ["o", "two"], ["o2"]),
        helper.make_node("ReduceMean", ["o2"], ["ms"], axes=[-1]),
        helper.make_node("Sqrt", ["ms"], ["rms"]),
        helper.make_node("Div", ["o", "rms"], ["y"]),
    ]
    inits = [_const(n, a) for n, a in w.items()] + [
        _const("scale", np.float32(np.sqrt(d))), _const("one", np.array([1], np.int64)),
        _const("neg", np.float32(-1e4)), _const("sqrt2", np.float32(np.sqrt(2))), _const("one_f", np.float32(1)),
        _const("half", np.float32(0.5)), _const("two", np.float32(2))]
    return _model(nodes, [helper.make_tensor_value_info("ids", INT64, [2, 5]),
                          helper.make_tensor_value_info("mask", INT64, [2, 5])],
                  [helper.make_tensor_value_info("y", FLOAT, [2, 5, d])], inits, opset)


def _feeds():
    rng = np.random.default_rng(1)
    return {"ids": rng.integers(0, 11, size=(2, 5)).astype(np.int64),
            "mask": (rng.random((2, 5)) < 0.7).astype(np.int64)}


def test_a_transformer_block_is_wholly_in_the_algebra_and_writes_back_the_same_outputs():
    model = transformer_block()
    graph = graph_from_model(model)
    assert graph.opaque_count() == 0, [n.onnx_type for n in graph.nodes if n.op == OPAQUE]
    ops = {n.op for n in graph.nodes}
    assert {"gather", "layernorm", "div", "unsqueeze", "cast", "where", "softmax", "erf", "pow", "reducemean",
            "sqrt"} <= ops
    before = open_session(model).run(None, _feeds())[0]
    after = open_session(to_model_proto(graph)).run(None, _feeds())[0]
    np.testing.assert_allclose(after, before, rtol=1e-6, atol=1e-6)


def _shape_chain_model() -> onnx.ModelProto:
    """x [2, 3, 4] reshaped to [batch, -1] by a Shape -> Gather -> Unsqueeze -> Concat chain, and divided by a
    ConstantOfShape tensor."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Constant", [], ["i"], value=helper.make_tensor("i", INT64, [], [0])),
             helper.make_node("Gather", ["s", "i"], ["b"], axis=0),
             helper.make_node("Unsqueeze", ["b", "zero"], ["bu"]),
             helper.make_node("Constant", [], ["m1"], value_ints=[-1]),
             helper.make_node("Concat", ["bu", "m1"], ["shape"], axis=0),
             helper.make_node("Reshape", ["x", "shape"], ["r"]),
             helper.make_node("ConstantOfShape", ["cs"], ["twos"], value=helper.make_tensor("v", FLOAT, [1], [2.0])),
             helper.make_node("Div", ["r", "twos"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", FLOAT, [2, 3, 4])],
                  [helper.make_tensor_value_info("y", FLOAT, [2, 12])],
                  [_const("zero", np.array([0], np.int64)), _const("cs", np.array([2, 12], np.int64))])


def test_constants_and_shape_computations_on_fixed_dims_are_known_to_the_decoders():
    model = _shape_chain_model()
    graph = graph_from_model(model)
    decoded = [n for n in graph.nodes if not n.is_opaque]
    assert [n.op for n in decoded] == ["reshape", "div"]
    assert decoded[0].attrs["shape"] == (2, 12) and decoded[0].inputs == ("x",)  # the computed target, folded
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_array_equal(open_session(to_model_proto(graph)).run(None, {"x": x})[0],
                                  open_session(model).run(None, {"x": x})[0])
    # loading and saving stays lossless: the constant nodes are written back as they were
    assert to_model_proto(graph, reuse_protos=True).SerializeToString(deterministic=True) == \
        model.SerializeToString(deterministic=True)


def test_dims_set_only_for_measuring_never_fold():
    model = _shape_chain_model()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    graph = graph_from_model(model, input_shapes={"x": (2, 3, 4)})
    assert [n.op for n in graph.nodes if not n.is_opaque] == ["div"]  # the Reshape's target is read at run time


OPAQUE_VARIANTS = [
    pytest.param(helper.make_node("Pad", ["x", "pads"], ["y"], mode="reflect"), id="pad-reflect"),
    pytest.param(helper.make_node("Softmax", ["x"], ["y"], axis=1), id="softmax-opset11-flattening"),
    pytest.param(helper.make_node("LayerNormalization", ["x", "s"], ["y"], stash_type=0), id="layernorm-stash0"),
    pytest.param(helper.make_node("Clip", ["x", "lo"], ["y"]), id="clip-runtime-bound"),
    pytest.param(helper.make_node("Cast", ["x"], ["y"], to=INT64), id="cast-to-int"),
    pytest.param(helper.make_node("ReduceSum", ["x"], ["y"], noop_with_empty_axes=1), id="reducesum-noop"),
    pytest.param(helper.make_node("Pow", ["x", "lo"], ["y"]), id="pow-tensor-exponent"),
]


@pytest.mark.parametrize("node", OPAQUE_VARIANTS)
def test_variants_the_kernels_do_not_cover_stay_opaque(node):
    opset = 11 if node.op_type == "Softmax" else 17
    out_type = INT64 if node.op_type == "Cast" else FLOAT
    out_shape = {"Pad": [2, 5, 4], "ReduceSum": [2, 3, 4]}.get(node.op_type, [2, 3, 4])
    inputs = [helper.make_tensor_value_info("x", FLOAT, [2, 3, 4])]
    if node.op_type in ("Clip", "Pow"):
        inputs.append(helper.make_tensor_value_info("lo", FLOAT, [2, 3, 4]))
    model = _model([node], inputs, [helper.make_tensor_value_info("y", out_type, out_shape)],
                   [_const("pads", np.array([0, 1, 0, 0, 1, 0], np.int64)), _const("s", np.ones(4, np.float32))],
                   opset)
    graph = graph_from_model(model)
    assert [n.op for n in graph.nodes] == [OPAQUE]


def test_optimize_counts_the_nodes_outside_the_algebra(tmp_path):
    model = transformer_block()
    extra = helper.make_node("Softplus", ["y"], ["z"])  # an op outside the algebra
    model.graph.node.append(extra)
    model.graph.output[0].name = "z"
    src, out, report = tmp_path / "m.onnx", tmp_path / "o.onnx", tmp_path / "r.json"
    onnx.save(model, src)
    args = ["optimize", str(src), str(out), "--cost", "analytic", "--budget", "5", "--report", str(report), "-v"]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    figures = json.loads(report.read_text())
    assert figures["nodes_opaque"] == 1
    assert f"{figures['nodes_before'] - 1} of {figures['nodes_before']} nodes in the algebra" in result.output


def test_constant_nodes_are_constants_or_opaque_nodes_that_do_not_compute_at_run_time(tmp_path):
    """A Constant node something reads is a constant, as an initializer is (no node of the IR); one nothing
    reads stays an opaque node (so that an unrewritten model saves losslessly), which the report tells from the
    nodes computing outside the algebra."""
    model = transformer_block()
    scale = helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.float32(2.0)))
    unread = helper.make_node("Constant", [], ["u"], value=numpy_helper.from_array(np.float32(3.0)))
    model.graph.node.extend([helper.make_node("Softplus", ["y"], ["z"]), scale, unread,
                             helper.make_node("Mul", ["z", "c"], ["w"])])
    model.graph.output[0].name = "w"
    src, out, report = tmp_path / "m.onnx", tmp_path / "o.onnx", tmp_path / "r.json"
    onnx.save(model, src)
    args = ["optimize", str(src), str(out), "--cost", "analytic", "--budget", "5", "--report", str(report), "-v"]
    assert CliRunner().invoke(main, args, catch_exceptions=False).exit_code == 0
    figures = json.loads(report.read_text())
    assert figures["nodes_opaque"] == 2 and figures["nodes_opaque_computing"] == 1
