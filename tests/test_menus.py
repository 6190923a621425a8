"""The generator's menus for today's operators: what it enumerates and the identities it finds with them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from xflow.generator.enumerate import INPUTS, MENU_OPS, WEIGHT_INPUT
from xflow.generator.fingerprint import Buckets, candidate_pairs, canonical_text
from xflow.generator.walk import enumerate_graphs

from xflow.ops import OPS

RULES = Path(__file__).resolve().parent.parent / "rules" / "new-menus.json"


@pytest.fixture(scope="module")
def pair_texts() -> str:
    _, pairs = candidate_pairs(Buckets().extend(enumerate_graphs(2, seed=0)))
    return "\n".join(f"{canonical_text(p.a)} => {canonical_text(p.b)}" for p in pairs)


def test_the_new_operators_real_exports_rewrite_are_enumerated():
    assert {"pad", "div", "neg", "reciprocal", "sqrt", "exp", "erf", "pow"} <= set(MENU_OPS)


def test_a_pad_before_an_unpadded_conv_is_found_equal_to_the_padded_conv(pair_texts: str):
    pad = "pad[pads=(0, 0, 1, 1, 0, 0, 1, 1),value=0.0](i1)"
    assert (f"conv[act=none,group=1,pads=(0, 0, 0, 0),strides=(1, 1)]({pad},k33) => "
            "conv[act=none,group=1,pads=(1, 1, 1, 1),strides=(1, 1)](i1,k33)") in pair_texts
    end = "pad[pads=(0, 0, 0, 0, 0, 0, 1, 1),value=0.0](i1)"
    assert (f"conv[act=none,group=1,pads=(0, 0, 0, 0),strides=(2, 2)]({end},k33) => "
            "conv[act=none,group=1,pads=(0, 0, 1, 1),strides=(2, 2)](i1,k33)") in pair_texts


def test_activation_only_ops_never_apply_to_a_weight():
    # a pad or an erf of a constant is folded at load: a rule about it could never fire
    only_activations = {op for op in MENU_OPS if OPS[op].menu.activations_only}
    assert {"pad", "erf", "div"} <= only_activations
    applied = 0
    for visit in enumerate_graphs(1, seed=0):
        for op, _, operands in visit.graph:
            if op in only_activations:
                applied += 1
                assert not (operands[0] < len(INPUTS) and WEIGHT_INPUT[operands[0]]), visit.graph
    assert applied > 0


def test_pad_is_enumerated_on_images_only():
    ranks = {len(INPUTS[operands[0]][3]) for visit in enumerate_graphs(1, seed=0)
             for op, _, operands in visit.graph if op == "pad"}
    assert ranks == {4}


def _conv_rule(dst_kernel: str) -> dict:
    conv = {"act": "none", "group": 4, "pads": [0, 0, 0, 0], "strides": "?cs"}
    return {"inputs": {"i1": "any", "kd": "const", "kd2": "const"},
            "src": [{"op": "pad", "in": ["i1"], "out": ["s0"], "attrs": {"pads": [0, 0, 1, 1, 0, 0, 1, 1]}},
                    {"op": "conv", "in": ["s0", "kd"], "out": ["s1"], "attrs": conv}],
            "dst": [{"op": "conv", "in": ["i1", dst_kernel], "out": ["d0"], "attrs": {**conv, "pads": [1, 1, 1, 1]}}]}


def test_a_conv_group_becomes_a_variable_only_where_every_conv_reads_one_kernel():
    from xflow.generator.group_variable import GROUP_VAR, with_group_variable

    one_kernel = with_group_variable([_conv_rule("kd")])
    assert len(one_kernel) == 2 and one_kernel[1] == _conv_rule("kd")
    assert {n["attrs"]["group"] for n in one_kernel[0]["src"] + one_kernel[0]["dst"] if n["op"] == "conv"} == {
        GROUP_VAR}
    assert with_group_variable([_conv_rule("kd2")]) == [_conv_rule("kd2")]


def _padded_depthwise_model() -> onnx.ModelProto:
    """TF-style padding made explicit, as MobileNet and EfficientNet exports write it: a Pad that adds one
    row and column at the end, then a stride-2 depthwise Conv without padding; and a Pad of zeros."""
    rng = np.random.default_rng(0)
    weight = onnx.numpy_helper.from_array(rng.standard_normal((8, 1, 3, 3)).astype(np.float32), "w")
    pads = onnx.numpy_helper.from_array(np.array([0, 0, 0, 0, 0, 0, 1, 1], np.int64), "pads")
    zeros = onnx.numpy_helper.from_array(np.zeros(8, np.int64), "zeros")
    nodes = [onnx.helper.make_node("Pad", ["x", "zeros"], ["x0"]),
             onnx.helper.make_node("Pad", ["x0", "pads"], ["p"]),
             onnx.helper.make_node("Conv", ["p", "w"], ["y"], group=8, strides=[2, 2], kernel_shape=[3, 3])]
    graph = onnx.helper.make_graph(
        nodes, "padded", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8, 16, 16])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 8, 8, 8])], [weight, pads, zeros])
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])


def test_shipped_menu_rules_fold_an_export_s_pads_into_its_depthwise_conv():
    import onnxruntime as ort

    import xflow

    model = _padded_depthwise_model()
    out = xflow.optimize(model, rules_path=str(RULES), cost="analytic", keep_if_slower=True)
    assert [n.op_type for n in out.graph.node if n.op_type != "Constant"] == ["Conv"]
    x = np.random.default_rng(1).standard_normal((1, 8, 16, 16)).astype(np.float32)
    ref, got = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
                for m in (model, out))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
