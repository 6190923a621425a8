"""The sub operator: added as one file of xflow/ops plus its axioms, and every stage picks it up."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from xflow.generator.enumerate import MENU_OPS
from xflow.verifier import AXIOMS, check_consistency, prove_rule
from xflow.verifier.encode import ATTR_LAYOUT

from xflow.onnx_io import graph_from_model
from xflow.onnx_io.save import to_model_proto
from xflow.ops import OPS, ShapeError
from xflow.ort import open_session
from xflow.placement.features import _FAMILY, OP_FAMILIES
from xflow.rules import parse_rule

SUB_AXIOMS = [a for a in AXIOMS if "ewsub" in a.name]


def test_sub_is_in_the_table_with_broadcasting():
    sub = OPS["sub"]
    a, b = np.arange(6.0).reshape(2, 3), np.array([1.0, 2.0, 3.0])
    assert sub.infer([(2, 3), (3,)], sub.normalize_attrs({})) == [(2, 3)]
    np.testing.assert_array_equal(sub.evaluate(np, [a, b], sub.normalize_attrs({}))[0], a - b)
    with pytest.raises(ShapeError):
        sub.infer([(2, 3), (2,)], sub.normalize_attrs({}))
    assert not sub.commutative


def test_every_stage_sees_sub_through_the_table():
    assert "sub" in ATTR_LAYOUT and "sub" in MENU_OPS
    assert _FAMILY["sub"] == OP_FAMILIES.index("elementwise")


def test_onnx_sub_decodes_and_writes_back_the_same_outputs():
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Sub", ["x", "b"], ["y"]), helper.make_node("Relu", ["y"], ["z"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 3])],
        [onnx.numpy_helper.from_array(np.array([0.5, -1.0, 2.0], dtype=np.float32), "b")]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    graph = graph_from_model(model)
    assert [n.op for n in graph.nodes] == ["sub", "relu"]
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    before = open_session(model).run(None, {"x": x})[0]
    after = open_session(to_model_proto(graph)).run(None, {"x": x})[0]
    np.testing.assert_array_equal(before, after)


@pytest.mark.parametrize("axiom", SUB_AXIOMS, ids=lambda a: a.name)
def test_sub_axioms_hold_on_the_kernels(axiom):
    rng = np.random.default_rng(0)
    for _ in range(20):
        assert axiom.check(rng) < 1e-9


def test_axioms_with_sub_stay_consistent():
    assert len(SUB_AXIOMS) >= 8
    assert check_consistency(rlimit=300_000).consistent


def _rule(src, dst, name):
    return parse_rule({"name": name, "inputs": {"x": "any", "y": "any", "z": "any"}, "src": src, "dst": dst,
                       "outputs": {"o": "p"}})


def test_a_rule_over_sub_proves_and_its_swap_does_not():
    distrib = _rule([{"op": "sub", "in": ["x", "y"], "out": ["d"]}, {"op": "mul", "in": ["d", "z"], "out": ["o"]}],
                    [{"op": "mul", "in": ["x", "z"], "out": ["a"]}, {"op": "mul", "in": ["y", "z"], "out": ["b"]},
                     {"op": "sub", "in": ["a", "b"], "out": ["p"]}], "sub_distrib")
    swapped = _rule([{"op": "sub", "in": ["x", "y"], "out": ["d"]}, {"op": "mul", "in": ["d", "z"], "out": ["o"]}],
                    [{"op": "sub", "in": ["y", "x"], "out": ["e"]}, {"op": "mul", "in": ["e", "z"], "out": ["p"]}],
                    "sub_swapped")
    assert prove_rule(distrib, rlimit=20_000_000).proved
    assert not prove_rule(swapped, rlimit=6_000_000).proved
