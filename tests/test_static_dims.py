"""A dynamic-batch export whose shape arithmetic reads static dims beside the dynamic one (Swin's windows: the
padding to a multiple of the window computed with Mod from the image's height, a Reshape to ``-1`` windows):
the static dims fold, the Pad and the Reshapes after it enter the algebra, and the written model still computes
what the original does at every batch; a dim that depends on the batch never folds."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.test_dynamic_reshapes import RELU_BEFORE_RESHAPE, computing_opaque
from xflow.ir import TensorType
from xflow.ir.dims import dims_of, symbol
from xflow.onnx_io import graph_from_model, save, to_model_proto
from xflow.onnx_io.known_values import known_values
from xflow.ops.shape_ops import resolved_target
from xflow.ort import open_session
from xflow.rewrite import apply_match, find_matches
from xflow.rules import parse_rule

WINDOW, SIDE, CHANNELS = 4, 6, 8  # a 6x6 map padded to 8x8: four 4x4 windows per image


def _int64(name: str, value) -> onnx.TensorProto:  # noqa: ANN001
    return numpy_helper.from_array(np.array(value, np.int64), name)


def window_block() -> onnx.ModelProto:
    """``x: [batch, 6, 6, 8]`` padded at the end of H and W to a multiple of 4 (pads from ``Shape -> Gather ->
    Mod`` of the static dims), cut into ``[-1, 16, 8]`` windows (a target of constants and a Gather of the
    static channels), a Relu and a MatMul, and the windows put back with a target that reads the batch."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i1"], ["h"], axis=0),
        helper.make_node("Gather", ["s", "i2"], ["w"], axis=0),
        helper.make_node("Gather", ["s", "i3"], ["c"], axis=0),
        helper.make_node("Gather", ["s", "i0"], ["b"], axis=0),
        # (window - h % window) % window, as torch writes the padding to a multiple of the window
        helper.make_node("Mod", ["h", "win"], ["hm"]), helper.make_node("Sub", ["win", "hm"], ["hs"]),
        helper.make_node("Mod", ["hs", "win"], ["ph"]),
        helper.make_node("Mod", ["w", "win"], ["wm"]), helper.make_node("Sub", ["win", "wm"], ["ws"]),
        helper.make_node("Mod", ["ws", "win"], ["pw"]),
        helper.make_node("Unsqueeze", ["ph", "zero"], ["ph1"]), helper.make_node("Unsqueeze", ["pw", "zero"], ["pw1"]),
        helper.make_node("Concat", ["zeros3", "ph1", "pw1", "zero"], ["pads"], axis=0),
        helper.make_node("Pad", ["x", "pads"], ["p"]),
        helper.make_node("Unsqueeze", ["c", "zero"], ["c1"]),
        helper.make_node("Concat", ["minus1", "area", "c1"], ["target"], axis=0),
        helper.make_node("Reshape", ["p", "target"], ["windows"]),
        helper.make_node("Relu", ["windows"], ["r"]),
        helper.make_node("MatMul", ["r", "W"], ["m"]),
        helper.make_node("Unsqueeze", ["b", "zero"], ["b1"]),
        helper.make_node("Concat", ["b1", "minus1", "c1"], ["back"], axis=0),
        helper.make_node("Reshape", ["m", "back"], ["y"]),
    ]
    inits = [_int64("i0", 0), _int64("i1", 1), _int64("i2", 2), _int64("i3", 3), _int64("win", WINDOW),
             _int64("zero", [0]), _int64("zeros3", [0, 0, 0, 0, 0]), _int64("minus1", [-1]),
             _int64("area", [WINDOW * WINDOW]),
             numpy_helper.from_array((rng.standard_normal((CHANNELS, CHANNELS)) / 3).astype(np.float32), "W")]
    graph = helper.make_graph(
        nodes, "window_block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", SIDE, SIDE, CHANNELS])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", None, CHANNELS])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def test_static_dims_of_a_dynamic_export_fold_and_the_window_ops_enter_the_algebra() -> None:
    graph = graph_from_model(window_block())
    ops = {n.op for n in graph.nodes if not n.is_opaque}
    assert {"pad", "reshape", "matmul", "relu"} <= ops, ops
    windows = {n.outputs[0]: n for n in graph.nodes}["windows"]
    batch = symbol("batch")
    # 8x8 padded map of 16-pixel windows: 4 windows per image, over the batch
    assert tuple(windows.attrs["shape"]) == (4 * batch, WINDOW * WINDOW, CHANNELS)
    pad = {n.outputs[0]: n for n in graph.nodes}["p"]
    assert pad.attrs["pads"] == (0, 0, 0, 0, 0, 2, 2, 0)
    # nothing computes outside the algebra: the batch the last target reads is the input's own dim
    assert computing_opaque(graph) == []
    back = {n.outputs[0]: n for n in graph.nodes}["y"]
    assert tuple(back.attrs["shape"]) == (batch, 4 * WINDOW * WINDOW, CHANNELS)


def _run_at_every_batch(original: onnx.ModelProto, written: onnx.ModelProto) -> None:
    a, b = open_session(original), open_session(written)
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, SIDE, SIDE, CHANNELS)).astype(np.float32)
        expected, got = a.run(None, {"x": x})[0], b.run(None, {"x": x})[0]
        assert got.shape == expected.shape == (batch, 4 * WINDOW * WINDOW, CHANNELS)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_a_rule_rewrites_the_windows_and_the_written_model_runs_at_every_batch(tmp_path) -> None:
    model = window_block()
    graph = graph_from_model(model)
    (match,) = list(find_matches(graph, parse_rule(RELU_BEFORE_RESHAPE)))
    rewritten = apply_match(graph, match)
    assert rewritten is not None
    path = str(tmp_path / "out.onnx")
    save(rewritten, path)
    written = onnx.load(path)
    onnx.checker.check_model(written)
    assert [vi.SerializeToString() for vi in written.graph.input] == \
        [vi.SerializeToString() for vi in model.graph.input]
    _run_at_every_batch(model, written)


def test_every_op_table_node_of_the_windows_re_encoded_gives_the_same_outputs_at_every_batch() -> None:
    model = window_block()
    written = to_model_proto(graph_from_model(model), reuse_protos=False)
    onnx.checker.check_model(written)
    _run_at_every_batch(model, written)


def test_resolved_target_copies_zeros_and_divides_the_rest() -> None:
    batch = symbol("batch")
    assert resolved_target((batch, 8, 8, 4, 4, 96), [-1, 4, 4, 96]) == (64 * batch, 4, 4, 96)
    assert resolved_target((batch, 6, 5), [0, -1]) == (batch, 30)
    assert resolved_target((batch, 6), [5, -1]) is None  # 6*batch/5 is not a dim for every batch
    assert resolved_target((batch, 6), [-1, -1]) is None


def _folded(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto]) -> dict[str, np.ndarray]:
    """The values ``known_values`` finds in a model of ``x: [batch, 6, 5, 8]`` with these nodes (each output
    read by a Reshape's target, so that folding it is wanted)."""
    graph = helper.make_graph(
        [*nodes, *[helper.make_node("Reshape", ["x", n.output[0]], [f"r{k}"]) for k, n in enumerate(nodes)]],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", SIDE, 5, CHANNELS])],
        [helper.make_tensor_value_info(f"r{k}", TensorProto.FLOAT, None) for k in range(len(nodes))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {vi.name: TensorType(vi.type.tensor_type.elem_type, dims_of(vi))
             for vi in [*inferred.graph.input, *inferred.graph.value_info]}
    known = {t.name: numpy_helper.to_array(t) for t in inits}
    return known_values(model, types, known, True, {"Reshape"})


def test_only_static_dims_of_a_shape_fold() -> None:
    shape = helper.make_node("Shape", ["x"], ["s"])
    tail = helper.make_node("Shape", ["x"], ["t"], start=1)
    folded = _folded(
        [shape, tail,
         helper.make_node("Gather", ["s", "last"], ["g_last"], axis=0),            # -1: the static 8
         helper.make_node("Gather", ["s", "first"], ["g_batch"], axis=0),          # the batch: never
         helper.make_node("Slice", ["s", "one", "three"], ["hw"]),                 # [6, 5]
         helper.make_node("Slice", ["s", "zero", "two"], ["bh"]),                  # reads the batch: never
         helper.make_node("Gather", ["t", "first"], ["t0"], axis=0)],              # Shape(start=1)[0]: 6
        [_int64("last", -1), _int64("first", 0), _int64("zero", [0]), _int64("one", [1]), _int64("two", [2]),
         _int64("three", [3])])
    assert folded["g_last"].tolist() == CHANNELS and folded["hw"].tolist() == [SIDE, 5]
    assert folded["t0"].tolist() == SIDE
    assert "g_batch" not in folded and "bh" not in folded and "s" not in folded and "t" not in folded
