"""Shapes ONNX inference leaves symbolic are taken from one ORT run, unless a shape could depend on values."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from xflow.ir.dims import is_static
from xflow.onnx_io import graph_from_model


def _model(shape_from_input: bool) -> onnx.ModelProto:
    """x [2,3,4] -> Reshape(x, t) -> Relu. ``t`` is Abs(Shape(x)), which ONNX's data propagation does not
    follow, or (``shape_from_input``) a graph input whose values set the shape."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    inputs = [x]
    if shape_from_input:
        inputs.append(helper.make_tensor_value_info("t", TensorProto.INT64, [3]))
        chain = []
    else:
        chain = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Abs", ["s"], ["t"])]
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 5], np.ones(20, np.float32))
    nodes = [*chain, helper.make_node("Reshape", ["x", "t"], ["r"]), helper.make_node("Relu", ["r"], ["h"]),
             helper.make_node("MatMul", ["h", "w"], ["y"])]
    graph = helper.make_graph(nodes, "g", inputs, [y], initializer=[w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_symbolic_dims_are_filled_from_a_run_of_the_static_model():
    graph = graph_from_model(_model(shape_from_input=False))
    ops = [n.op for n in graph.nodes]
    assert "relu" in ops and "matmul" in ops, ops
    assert graph.type_of("r").static_shape == (2, 3, 4)
    assert graph.type_of("y").static_shape == (2, 3, 5)


def test_a_shape_set_by_input_values_stays_unknown():
    graph = graph_from_model(_model(shape_from_input=True))
    # their dims are sizes only a run can tell (no input has them): reshape, relu and matmul stay opaque
    assert [n.op for n in graph.nodes].count("opaque") == 3
    r = graph.type_of("r")  # its dtype is known; its three dims are not, and no run may pin them
    assert r is not None and not r.is_static and len(r.shape) == 3 and not any(is_static(d) for d in r.shape), r
