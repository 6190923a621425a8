"""Reshape and Expand targets that one constant cannot say (GPT-2's Conv1D: ``[batch*seq, 768]`` back to
``[batch, seq, 768]``; its causal mask ``[seq, seq]``): in the algebra, written with targets computed at run
time from the graph inputs' dims; a target over a symbol no graph input has stays opaque."""

import collections

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.test_ops import DecodeCtx
from xflow.ir.dims import SymbolSource, integer_terms, symbol, symbol_sources
from xflow.onnx_io import graph_from_model, save, to_model_proto
from xflow.ops._runtime_dims import runtime_shape
from xflow.ort import open_session
from xflow.rewrite import apply_match, find_matches
from xflow.rules import parse_rule

batch, seq = symbol("batch"), symbol("seq")
WIDTH = 768

#: relu(reshape(x)) -> reshape(relu(x)): the reshape the rewrite writes is a new node (no original proto)
RELU_BEFORE_RESHAPE = {
    "name": "relu-before-reshape", "inputs": {"x": "any"},
    "src": [{"op": "reshape", "in": ["x"], "out": ["s0"], "attrs": {"shape": "?s"}},
            {"op": "relu", "in": ["s0"], "out": ["s1"]}],
    "dst": [{"op": "relu", "in": ["x"], "out": ["d0"]},
            {"op": "reshape", "in": ["d0"], "out": ["d1"], "attrs": {"shape": "?s"}}],
    "outputs": {"s1": "d1"}}


def _int64(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(value, np.int64), name)


def gpt2_block() -> onnx.ModelProto:
    """GPT-2's Conv1D as the TorchScript exporter writes it on a dynamic export: flatten ``[batch, seq, 768]``
    to ``[-1, 768]`` (a target computed from Shape), Gemm, reshape back to ``[batch, seq, 768]`` with a target
    Shape -> Gather -> Unsqueeze -> Concat computes, then Relu."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i0"], ["b"], axis=0),
        helper.make_node("Gather", ["s", "i1"], ["q"], axis=0),
        helper.make_node("Slice", ["s", "minus1", "big", "zero"], ["last"]),
        helper.make_node("Concat", ["minus1", "last"], ["flat"], axis=0),
        helper.make_node("Reshape", ["x", "flat"], ["f"]),
        helper.make_node("Gemm", ["f", "W", "B"], ["m"]),
        helper.make_node("Unsqueeze", ["b", "zero"], ["b1"]),
        helper.make_node("Unsqueeze", ["q", "zero"], ["q1"]),
        helper.make_node("Concat", ["b1", "q1", "width"], ["target"], axis=0),
        helper.make_node("Reshape", ["m", "target"], ["r"]),
        helper.make_node("Relu", ["r"], ["y"]),
    ]
    inits = [_int64("i0", 0), _int64("i1", 1), _int64("zero", [0]), _int64("minus1", [-1]),
             _int64("big", [2**62]), _int64("width", [WIDTH]),
             numpy_helper.from_array((rng.standard_normal((WIDTH, WIDTH)) / 30).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal(WIDTH).astype(np.float32), "B")]
    graph = helper.make_graph(nodes, "gpt2_block",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", WIDTH])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", WIDTH])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def computing_opaque(graph) -> list[str]:  # noqa: ANN001
    """The ONNX types of the opaque nodes whose results an op-table node or a graph output reads, directly or
    through other opaque nodes (what computes at run time outside the algebra)."""
    producers = {o: n for n in graph.nodes for o in n.outputs if o}
    needed = [i for n in graph.nodes if not n.is_opaque for i in n.inputs] + list(graph.outputs)
    seen: set[int] = set()
    found = []
    while needed:
        node = producers.get(needed.pop())
        if node is None or not node.is_opaque or id(node) in seen:
            continue
        seen.add(id(node))
        found.append(node.onnx_type)
        needed.extend(node.inputs)
    return found


def _run_everywhere(original: onnx.ModelProto, written: onnx.ModelProto) -> None:
    a, b = open_session(original), open_session(written)
    rng = np.random.default_rng(1)
    for n in (1, 4):
        for length in (3, 7):
            feeds = {"x": rng.standard_normal((n, length, WIDTH)).astype(np.float32)}
            expected, got = a.run(None, feeds)[0], b.run(None, feeds)[0]
            assert got.shape == (n, length, WIDTH)
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_gpt2_block_decodes_with_no_computing_opaque_node_and_saves_as_it_was():
    model = gpt2_block()
    graph = graph_from_model(model)
    ops = {n.outputs[0]: n.op for n in graph.nodes}
    assert ops["f"] == ops["r"] == "reshape" and ops["y"] == "relu"
    reshapes = {n.outputs[0]: n.attrs["shape"] for n in graph.nodes if n.op == "reshape"}
    assert reshapes == {"f": (batch * seq, WIDTH), "r": (batch, seq, WIDTH)}
    assert computing_opaque(graph) == []
    # unchanged: written as it was, node for node (the original computed targets, not new ones)
    assert to_model_proto(graph).graph.SerializeToString() == model.graph.SerializeToString()


def test_a_rule_rewrites_around_the_gpt2_block_and_the_written_model_runs_at_any_size(tmp_path):
    model = gpt2_block()
    graph = graph_from_model(model)
    rule = parse_rule(RELU_BEFORE_RESHAPE)
    (match,) = list(find_matches(graph, rule))
    rewritten = apply_match(graph, match)
    assert rewritten is not None
    new_reshape = next(n for n in rewritten.nodes if n.op == "reshape" and n.outputs == ("y",))
    assert new_reshape.origin is None and new_reshape.attrs["shape"] == (batch, seq, WIDTH)
    path = str(tmp_path / "out.onnx")
    save(rewritten, path)
    written = onnx.load(path)
    onnx.checker.check_model(written)
    # the target is computed from the input's Shape: no constant pins a size
    computed = [n for n in written.graph.node if n.output[0] == "y"][0].input[1]
    assert computed not in {t.name for t in written.graph.initializer}
    assert [vi.SerializeToString() for vi in written.graph.input] == \
        [vi.SerializeToString() for vi in model.graph.input]
    assert [vi.SerializeToString() for vi in written.graph.output] == \
        [vi.SerializeToString() for vi in model.graph.output]
    _run_everywhere(model, written)


def test_every_op_table_node_re_encoded_gives_the_same_outputs_at_any_size():
    model = gpt2_block()
    written = to_model_proto(graph_from_model(model), reuse_protos=False)
    onnx.checker.check_model(written)
    _run_everywhere(model, written)


def causal_mask() -> onnx.ModelProto:
    """The causal mask of a dynamic GPT-2 export: a one expanded to ``[seq, seq]`` from two Slices of a
    Shape, multiplied into ``x``."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Slice", ["s", "one", "two"], ["a"]),
             helper.make_node("Slice", ["s", "two", "three"], ["c"]),
             helper.make_node("Concat", ["a", "c"], ["target"], axis=0),
             helper.make_node("Expand", ["ones", "target"], ["mask"]),
             helper.make_node("Mul", ["x", "mask"], ["y"])]
    inits = [_int64("one", [1]), _int64("two", [2]), _int64("three", [3]),
             numpy_helper.from_array(np.array([2.0], np.float32), "ones")]
    graph = helper.make_graph(nodes, "mask",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", "seq"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", "seq"])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_an_expand_to_a_computed_symbolic_shape_is_in_the_algebra():
    model = causal_mask()
    graph = graph_from_model(model)
    (expand,) = [n for n in graph.nodes if n.op == "expand"]
    assert expand.attrs["shape"] == (seq, seq) and computing_opaque(graph) == []
    written = to_model_proto(graph, reuse_protos=False)
    onnx.checker.check_model(written)
    a, b = open_session(model), open_session(written)
    for shape in ((1, 3, 3), (4, 7, 7)):
        feeds = {"x": np.random.default_rng(2).standard_normal(shape).astype(np.float32)}
        np.testing.assert_array_equal(a.run(None, feeds)[0], b.run(None, feeds)[0])


def test_a_target_over_a_symbol_no_graph_input_has_stays_opaque():
    """The input's only dynamic dim is ``n*m``: neither n nor m can be read at run time, so a reshape to
    ``[n, m, 8]`` (declared, its target a runtime input) is no op-table node, and neither is anything over
    n or m."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]), helper.make_node("Relu", ["r"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n*m", 8]),
                     helper.make_tensor_value_info("shape", TensorProto.INT64, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "m", 8])],
        value_info=[helper.make_tensor_value_info("r", TensorProto.FLOAT, ["n", "m", 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    loaded = graph_from_model(model)
    assert loaded.types["r"].shape == (symbol("n"), symbol("m"), 8)
    assert all(n.is_opaque for n in loaded.nodes)
    assert to_model_proto(loaded).graph.SerializeToString() == model.graph.SerializeToString()


class _Ctx(DecodeCtx):
    """An EncodeContext whose graph inputs give ``sources``."""

    def __init__(self, sources: dict[str, SymbolSource]) -> None:
        super().__init__({}, opset=17)
        self.sources = sources

    def symbol_source(self, name: str) -> SymbolSource | None:
        return self.sources.get(name)


def _evaluate(pieces, sources, inputs: dict[str, tuple[int, ...]]) -> list[int]:
    """The shape ``runtime_shape`` writes, evaluated by ONNX Runtime with graph inputs of these dims."""
    ctx = _Ctx(sources)
    protos, out = runtime_shape(pieces, "t", ctx)
    graph = helper.make_graph(
        protos, "g", [helper.make_tensor_value_info(k, TensorProto.FLOAT, [None] * len(v)) for k, v in inputs.items()],
        [helper.make_tensor_value_info(out, TensorProto.INT64, [None])],
        [numpy_helper.from_array(v, k) for k, v in ctx.constants.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {k: np.zeros(v, np.float32) for k, v in inputs.items()}
    return open_session(model).run(None, feeds)[0].tolist()


def test_symbols_are_read_from_the_inputs_dims_and_polynomials_computed():
    sources = symbol_sources([("x", (batch * seq, 8)), ("ids", (batch, seq + 1)), ("z", (2 * seq - 1,))])
    assert sources == {"batch": SymbolSource("ids", 0), "seq": SymbolSource("ids", 1, 1, 1)}
    # seq read from (2*seq - 1) alone when nothing else has it
    assert symbol_sources([("z", (2 * seq - 1,))]) == {"seq": SymbolSource("z", 0, 2, -1)}
    assert symbol_sources([("x", (batch * seq, 8))]) == {}
    assert integer_terms(batch / 2) is None and integer_terms(batch * seq + 3) == [(1, (("batch", 1), ("seq", 1))),
                                                                                  (3, ())]
    inputs = {"ids": (3, 6), "z": (9,)}  # batch 3, seq 5
    got = _evaluate([-1, 2 * batch * seq + 1, seq * seq, 7, seq + 1], sources, inputs)
    assert got == [-1, 31, 25, 7, 6]
    assert _evaluate([seq, 4], symbol_sources([("z", (2 * seq - 1,))]), {"z": (9,)}) == [5, 4]


def test_a_symbol_with_no_source_is_an_error_when_written():
    with pytest.raises(ValueError, match="no graph input has the dim seq"):
        runtime_shape([batch, seq], "t", _Ctx({"batch": SymbolSource("x", 0)}))
    with pytest.raises(ValueError, match="not an integer polynomial"):
        runtime_shape([batch / 2], "t", _Ctx({"batch": SymbolSource("x", 0)}))


def test_dynamic_gpt2_style_coverage_counts_no_shape_chain():
    """The shape chains stay in the written model but no op-table node reads them any more."""
    graph = graph_from_model(gpt2_block())
    kinds = collections.Counter(n.onnx_type for n in graph.nodes if n.is_opaque)
    assert kinds == {"Shape": 1, "Gather": 2, "Slice": 1, "Concat": 2, "Unsqueeze": 2}
