"""Attention as transformers' exports write it, into one com.microsoft MultiHeadAttention (rules/attention.json):
proved from the op's definition axioms, shipped, applied to an exported-style graph whose written model runs in
ONNX Runtime with the same outputs; a masked attention or a changed one is not matched or not proved."""

from __future__ import annotations

import copy
import os
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper
from xflow.verifier import AXIOMS, prove_rule, verify_rule

from xflow.onnx_io import graph_from_model, to_model_proto
from xflow.ort import session_options
from xflow.rewrite import apply_match, find_matches
from xflow.rules import load_rules, rules_from_json

RULES = os.path.join(os.path.dirname(__file__), "..", "rules")
HEADS, HEAD_SIZE, SEQ, HIDDEN = 2, 4, 6, 8


def _attention_rules() -> list[Any]:
    return load_rules(os.path.join(RULES, "attention.json"))


def _scaled_reshaped() -> Any:
    """The form ViT and Whisper export: Q and K scaled after the heads split, the context reshaped to itself."""
    (rule,) = [r for r in _attention_rules() if len(r.src) == 14]
    return rule


def _computed_target(nodes: list[onnx.NodeProto], of: str, dims: list[int]) -> str:
    """The name of a Reshape target computed as dynamic exports compute it: ``of``'s leading dim (Shape, Gather,
    Unsqueeze) followed by the constant ``dims``, concatenated."""
    nodes += [helper.make_node("Shape", [of], [f"{of}_dims"]),
              helper.make_node("Constant", [], [f"{of}_zero"], value=numpy_helper.from_array(np.array(0))),
              helper.make_node("Gather", [f"{of}_dims", f"{of}_zero"], [f"{of}_lead"], axis=0),
              helper.make_node("Constant", [], [f"{of}_axes"], value=numpy_helper.from_array(np.array([0]))),
              helper.make_node("Unsqueeze", [f"{of}_lead", f"{of}_axes"], [f"{of}_lead1"]),
              helper.make_node("Constant", [], [f"{of}_rest"], value=numpy_helper.from_array(np.array(dims))),
              helper.make_node("Concat", [f"{of}_lead1", f"{of}_rest"], [f"{of}_target"], axis=0)]
    return f"{of}_target"


def _exported_attention(batch: int | str = 1, mask: bool = False, scale: float = HEAD_SIZE ** -0.25,
                        context_reshaped: bool = True, dtype: Any = np.float32,
                        computed: bool = False) -> onnx.ModelProto:
    """Self-attention over x (batch, SEQ, HIDDEN) as the exports write it: Q, K, V projected, Reshape to heads
    (a -1 in the target, a 0 for a symbolic batch), Transpose (K straight to Kᵀ), Q and K each times a scalar,
    MatMul, Softmax over the last axis (after adding a mask, where ``mask``), MatMul with V, the context reshaped
    to its own shape, Transpose back, Reshape to (batch, SEQ, HIDDEN), an output projection. With ``computed`` the
    last two Reshapes' targets are computed from their inputs' shapes, as dynamic exports compute them."""
    rng = np.random.default_rng(0)
    lead = 0 if isinstance(batch, str) else batch
    inits = [numpy_helper.from_array(rng.uniform(-0.5, 0.5, (HIDDEN, HIDDEN)).astype(dtype), f"w{p}")
             for p in "qkvo"]
    inits += [numpy_helper.from_array(np.array(v, dtype=np.int64), n) for n, v in (
        ("heads_shape", [lead, SEQ, -1, HEAD_SIZE]), ("context_shape", [lead, HEADS, -1, HEAD_SIZE]),
        ("merged_shape", [lead, SEQ, -1]))]
    inits.append(numpy_helper.from_array(np.array(scale, dtype=dtype), "scale"))
    nodes = [helper.make_node("MatMul", ["x", f"w{p}"], [p]) for p in "qkv"]
    for p, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        nodes += [helper.make_node("Reshape", [p, "heads_shape"], [f"{p}_heads"]),
                  helper.make_node("Transpose", [f"{p}_heads"], [f"{p}_t"], perm=perm)]
    nodes += [helper.make_node("Mul", ["q_t", "scale"], ["q_s"]), helper.make_node("Mul", ["k_t", "scale"], ["k_s"]),
              helper.make_node("MatMul", ["q_s", "k_s"], ["scores"])]
    if mask:
        inits.append(numpy_helper.from_array(np.triu(np.full((SEQ, SEQ), -1e4, dtype), 1), "mask"))
        nodes.append(helper.make_node("Add", ["scores", "mask"], ["masked"]))
    nodes += [helper.make_node("Softmax", ["masked" if mask else "scores"], ["probs"], axis=-1),
              helper.make_node("MatMul", ["probs", "v_t"], ["context"])]
    if context_reshaped:
        target = _computed_target(nodes, "context", [HEADS, -1, HEAD_SIZE]) if computed else "context_shape"
        nodes.append(helper.make_node("Reshape", ["context", target], ["context_same"]))
    nodes.append(helper.make_node("Transpose", ["context_same" if context_reshaped else "context"], ["merged_t"],
                                  perm=[0, 2, 1, 3]))
    target = _computed_target(nodes, "merged_t", [SEQ, -1]) if computed else "merged_shape"
    nodes += [helper.make_node("Reshape", ["merged_t", target], ["merged"]),
              helper.make_node("MatMul", ["merged", "wo"], ["y"])]
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info("x", elem, (batch, SEQ, HIDDEN))],
                              [helper.make_tensor_value_info("y", elem, (batch, SEQ, HIDDEN))], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _run(model: onnx.ModelProto, batch: int = 1, dtype: Any = np.float32) -> np.ndarray:
    x = np.random.default_rng(1).standard_normal((batch, SEQ, HIDDEN)).astype(dtype)
    session = ort.InferenceSession(model.SerializeToString(), session_options(1), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def _fused(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """The model with the first match of any attention rule rewritten, None when none matches."""
    graph = graph_from_model(model)
    for rule in _attention_rules():
        match = next(find_matches(graph, rule), None)
        if match is not None:
            rewritten = apply_match(graph, match)
            assert rewritten is not None
            return to_model_proto(rewritten)
    return None


def test_the_rules_are_shipped_and_proved_from_the_definition() -> None:
    rules = _attention_rules()
    assert len(rules) == 4
    shipped = {r.name for r in load_rules(os.path.join(RULES, "default.json"))}
    without = tuple(a for a in AXIOMS if not a.name.startswith("mha_def"))
    for rule in rules:
        assert rule.name in shipped
        assert verify_rule(rule).status == "proved", rule.doc
        # proved in under 10,000 z3 units with it; not in 20 times as many without
        assert prove_rule(rule, rlimit=200_000, axioms=without).status != "proved", rule.doc
    assert _scaled_reshaped().readable_name == "fuse-reshape-transpose-matmul-softmax-into-mha"


def _changed(rule: Any, change: str) -> Any:
    raw = copy.deepcopy(rule.to_json())
    transposes = [n for n in raw["src"] if n["op"] == "transpose"]
    if change == "key not transposed":
        transposes[1]["attrs"]["perm"] = [0, 2, 1, 3]
    elif change == "softmax over the queries":
        next(n for n in raw["src"] if n["op"] == "softmax")["attrs"]["axis"] = 2
    elif change == "scales dropped":
        raw["dst"] = [{**raw["dst"][-1], "in": ["q", "k", "v"]}]
    elif change == "query and key swapped":
        raw["dst"][-1]["in"] = [raw["dst"][1]["out"][0], raw["dst"][0]["out"][0], "v"]
    (changed,) = rules_from_json([raw])
    return changed


@pytest.mark.parametrize("change", ["key not transposed", "softmax over the queries", "scales dropped",
                                   "query and key swapped"])
def test_a_changed_attention_is_not_proved(change: str) -> None:
    assert verify_rule(_changed(_scaled_reshaped(), change)).status != "proved"


@pytest.mark.parametrize("context_reshaped", [True, False])
def test_an_exported_attention_becomes_one_multiheadattention(context_reshaped: bool) -> None:
    model = _exported_attention(context_reshaped=context_reshaped)
    fused = _fused(model)
    assert fused is not None
    ops = [n.op_type for n in fused.graph.node]
    assert ops.count("MultiHeadAttention") == 1 and "Softmax" not in ops and "Transpose" not in ops
    assert [(i.name, i.type) for i in fused.graph.input] == [(i.name, i.type) for i in model.graph.input]
    assert [(o.name, o.type) for o in fused.graph.output] == [(o.name, o.type) for o in model.graph.output]
    np.testing.assert_allclose(_run(fused), _run(model), rtol=1e-5, atol=1e-5)


def test_a_symbolic_batch_is_fused_for_every_batch() -> None:
    model = _exported_attention(batch="batch")
    fused = _fused(model)
    assert fused is not None and "MultiHeadAttention" in {n.op_type for n in fused.graph.node}
    assert fused.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    for batch in (1, 3):
        np.testing.assert_allclose(_run(fused, batch), _run(model, batch), rtol=1e-5, atol=1e-5)


def test_reshape_targets_computed_from_shapes_do_not_block_the_fusion() -> None:
    """A dynamic export computes the context's Reshape targets from the context's own Shape: decoding resolves
    them, and the Shape chains left reading the context go with it; the written model runs at every batch."""
    model = _exported_attention(batch="batch", computed=True)
    fused = _fused(model)
    assert fused is not None
    ops = [n.op_type for n in fused.graph.node]
    assert "MultiHeadAttention" in ops and "Shape" not in ops and "Softmax" not in ops
    onnx.checker.check_model(fused, full_check=True)
    for batch in (1, 3):
        np.testing.assert_allclose(_run(fused, batch), _run(model, batch), rtol=1e-5, atol=1e-5)


def test_a_kept_reshape_whose_target_read_the_fused_context_is_written_anew() -> None:
    """A Reshape outside the attention whose target was computed from the context's Shape: the chain goes with
    the context, so that Reshape is written from its resolved target instead of as its original node."""
    model = _exported_attention(batch="batch", computed=True)
    model.graph.output[0].name = "y2"
    nodes = list(model.graph.node)
    nodes += [helper.make_node("Shape", ["context"], ["outer_dims"]),
              helper.make_node("Constant", [], ["outer_zero"], value=numpy_helper.from_array(np.array([0]))),
              helper.make_node("Gather", ["outer_dims", "outer_zero"], ["outer_lead"], axis=0),
              helper.make_node("Constant", [], ["outer_rest"], value=numpy_helper.from_array(np.array([SEQ, -1]))),
              helper.make_node("Concat", ["outer_lead", "outer_rest"], ["outer_target"], axis=0),
              helper.make_node("Reshape", ["y", "outer_target"], ["y2"])]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    fused = _fused(model)
    assert fused is not None and "MultiHeadAttention" in {n.op_type for n in fused.graph.node}
    onnx.checker.check_model(fused, full_check=True)
    for batch in (1, 3):
        np.testing.assert_allclose(_run(fused, batch), _run(model, batch), rtol=1e-5, atol=1e-5)


def test_a_shape_chain_something_reads_blocks_the_fusion() -> None:
    """Where the context's shape is itself an output of the model, the context must stay: no match."""
    model = _exported_attention(batch="batch", computed=True)
    model.graph.output.append(helper.make_tensor_value_info("context_dims", onnx.TensorProto.INT64, (4,)))
    assert _fused(model) is None


def test_a_masked_attention_is_not_matched() -> None:
    """A mask added to the scores (causal here) is another function than MultiHeadAttention without one."""
    assert _fused(_exported_attention(mask=True)) is None


def test_a_type_without_an_ort_kernel_is_not_fused() -> None:
    """ONNX Runtime's MultiHeadAttention runs float (float16 through the casts ORT inserts around it), never double:
    a double model keeps its decomposition, float16 is fused and runs."""
    assert _fused(_exported_attention(dtype=np.float64)) is None
    half = _exported_attention(dtype=np.float16)
    fused = _fused(half)
    assert fused is not None and "MultiHeadAttention" in {n.op_type for n in fused.graph.node}
    np.testing.assert_allclose(_run(fused, dtype=np.float16).astype(np.float32),
                               _run(half, dtype=np.float16).astype(np.float32), atol=1e-2)
