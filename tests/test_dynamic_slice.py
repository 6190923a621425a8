"""A Slice that cuts a static axis of a tensor with dynamic dims (rotary's halves of a decoder's head size, beside
its batch and sequence) is in the op table: the axes it leaves whole keep their dims at every size; one that cuts a
dynamic dim stays outside the algebra, carried through."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from xflow.ir.dims import is_static
from xflow.onnx_io import graph_from_model, to_model_proto
from xflow.ops import OPS
from xflow.ops.slice import WHOLE

INT64_MAX = int(np.iinfo(np.int64).max)


def _halves(ends_of_second: int = INT64_MAX, axis: int = 3):  # noqa: ANN202 - an onnx ModelProto
    """x (batch, heads, seq, 8): its first and second halves along the last axis, as transformers' rotate_half."""
    inits = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
             (("zero", [0]), ("half", [4]), ("end", [ends_of_second]), ("axis", [axis]))]
    nodes = [helper.make_node("Slice", ["x", "zero", "half", "axis"], ["x1"]),
             helper.make_node("Slice", ["x", "half", "end", "axis"], ["x2"]),
             helper.make_node("Neg", ["x2"], ["n"]),
             helper.make_node("Concat", ["n", "x1"], ["y"], axis=-1)]
    model = helper.make_model(helper.make_graph(
        nodes, "rotate_half", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2, "seq", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2, "seq", 8])], inits),
        opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_halves_of_a_static_axis_beside_dynamic_ones_are_in_the_algebra_and_run_as_the_original():
    model = _halves()
    graph = graph_from_model(model)
    slices = [n for n in graph.nodes if n.op == "slice"]
    assert len(slices) == 2 and not any(n.is_opaque for n in graph.nodes if n.origin is not None and
                                        n.origin.proto.op_type == "Slice")
    assert slices[0].attrs["stops"] == (WHOLE, 2, WHOLE, 4) and slices[1].attrs["starts"] == (0, 0, 0, 4)
    shape = graph.types[slices[1].outputs[0]].shape
    assert not is_static(shape[0]) and shape[1] == 2 and not is_static(shape[2]) and shape[3] == 4
    x = np.random.default_rng(0).standard_normal((3, 2, 5, 8)).astype(np.float32)
    np.testing.assert_array_equal(OPS["slice"].evaluate(np, [x], slices[1].attrs)[0], x[..., 4:])
    # written anew (not from the original protos) and run at two sizes: the same values as the original
    rewritten = to_model_proto(graph, reuse_protos=False)
    for size in ((1, 2, 1, 8), (4, 2, 7, 8)):
        feeds = {"x": np.random.default_rng(1).standard_normal(size).astype(np.float32)}
        want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
        got = ort.InferenceSession(rewritten.SerializeToString()).run(None, feeds)[0]
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("axis", [0, 2])
def test_a_cut_of_a_dynamic_axis_stays_outside_the_algebra(axis: int):
    graph = graph_from_model(_halves(ends_of_second=6, axis=axis))
    assert not [n for n in graph.nodes if n.op == "slice"]
