"""Split trees left by pairwise rules are folded after the search; the model computes the same."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from xflow.onnx_io import graph_from_model, to_model_proto
from xflow.rewrite.simplify import simplify_splits


def model_of(nodes: list[onnx.NodeProto], inputs: dict[str, list[int]], outputs: dict[str, list[int]]
             ) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])  # split sizes as attributes
    model.ir_version = 8
    return model


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run([o.name for o in model.graph.output], feeds)


def assert_same(model: onnx.ModelProto, simplified: onnx.ModelProto) -> None:
    rng = np.random.default_rng(0)
    feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in model.graph.input}
    for want, got in zip(run(model, feeds), run(simplified, feeds), strict=True):
        np.testing.assert_array_equal(want, got)


def test_a_split_of_a_piece_of_a_split_becomes_one_split():
    model = model_of([helper.make_node("Split", ["x"], ["p", "q"], axis=1, split=[4, 4]),
                      helper.make_node("Split", ["p"], ["y0", "y1"], axis=1, split=[1, 3]),
                      helper.make_node("Split", ["q"], ["y2", "y3"], axis=1, split=[2, 2])],
                     {"x": [2, 8]}, {"y0": [2, 1], "y1": [2, 3], "y2": [2, 2], "y3": [2, 2]})
    done = simplify_splits(graph_from_model(model))
    assert done.nested_splits == 2
    (split,) = done.graph.nodes
    assert split.attrs["split"] == (1, 3, 2, 2)
    assert_same(model, to_model_proto(done.graph))


def test_splits_along_other_axes_or_with_other_readers_are_kept():
    model = model_of([helper.make_node("Split", ["x"], ["p", "q"], axis=1, split=[4, 4]),
                      helper.make_node("Split", ["p"], ["y0", "y1"], axis=0, split=[1, 1]),
                      helper.make_node("Split", ["q"], ["y2", "y3"], axis=1, split=[2, 2]),
                      helper.make_node("Relu", ["q"], ["r"])],
                     {"x": [2, 8]}, {"y0": [1, 4], "y1": [1, 4], "y2": [2, 2], "y3": [2, 2], "r": [2, 4]})
    done = simplify_splits(graph_from_model(model))
    assert done.nested_splits == 0 and len(done.graph.nodes) == 4


def test_an_elementwise_op_on_every_matching_piece_is_applied_once_before_the_split():
    model = model_of([helper.make_node("Split", ["a"], ["a0", "a1", "a2"], axis=1, split=[2, 3, 3]),
                      helper.make_node("Split", ["b"], ["b0", "b1", "b2"], axis=1, split=[2, 3, 3]),
                      *[helper.make_node("Add", [f"a{i}", f"b{i}"], [f"s{i}"]) for i in range(3)],
                      *[helper.make_node("Tanh", [f"s{i}"], [f"y{i}"]) for i in range(3)]],
                     {"a": [1, 8], "b": [1, 8]}, {"y0": [1, 2], "y1": [1, 3], "y2": [1, 3]})
    done = simplify_splits(graph_from_model(model))
    assert done.elementwise_hoisted == 2  # the add, then the tanh on the add's pieces
    assert done.graph.op_counts() == {"add": 1, "tanh": 1, "split": 1}
    assert_same(model, to_model_proto(done.graph))


def _halves_then(*nodes: onnx.NodeProto, extra_outputs: tuple[str, ...] = ()) -> onnx.ModelProto:
    """a and b [1, 8] each split in halves a0, a1 / b0, b1, then ``nodes`` making y0, y1 (and more)."""
    return model_of([helper.make_node("Split", ["a"], ["a0", "a1"], axis=1, split=[4, 4]),
                     helper.make_node("Split", ["b"], ["b0", "b1"], axis=1, split=[4, 4]), *nodes],
                    {"a": [1, 8], "b": [1, 8]}, {o: [1, 4] for o in ("y0", "y1", *extra_outputs)})


def test_pieces_that_do_not_line_up_are_left_alone():
    crossed = _halves_then(helper.make_node("Add", ["a0", "b1"], ["y0"]), helper.make_node("Add", ["a1", "b0"], ["y1"]))
    partial = _halves_then(helper.make_node("Add", ["a0", "b0"], ["y0"]), helper.make_node("Mul", ["a1", "b1"], ["y1"]))
    read_elsewhere = _halves_then(helper.make_node("Add", ["a0", "b0"], ["y0"]),
                                  helper.make_node("Add", ["a1", "b1"], ["y1"]),
                                  helper.make_node("Relu", ["b1"], ["y2"]), extra_outputs=("y2",))
    for model in (crossed, partial, read_elsewhere):
        assert simplify_splits(graph_from_model(model)).elementwise_hoisted == 0
    lined_up = _halves_then(helper.make_node("Add", ["a0", "b0"], ["y0"]),
                            helper.make_node("Add", ["a1", "b1"], ["y1"]))
    assert simplify_splits(graph_from_model(lined_up)).elementwise_hoisted == 1


def test_pieces_in_another_order_are_put_in_order_by_a_concat_when_that_saves_kernels():
    """Two merge trees that paired four gates differently: add(a_i, b_perm(i)). One add before one split
    with b's pieces concatenated in a's order: 4 kernels instead of 6."""
    perm = [1, 0, 3, 2]
    model = model_of([helper.make_node("Split", ["a"], [f"a{i}" for i in range(4)], axis=1, split=[2, 2, 2, 2]),
                      helper.make_node("Split", ["b"], [f"b{i}" for i in range(4)], axis=1, split=[2, 2, 2, 2]),
                      *[helper.make_node("Add", [f"a{i}", f"b{perm[i]}"], [f"y{i}"]) for i in range(4)]],
                     {"a": [1, 8], "b": [1, 8]}, {f"y{i}": [1, 2] for i in range(4)})
    done = simplify_splits(graph_from_model(model))
    assert done.elementwise_hoisted == 1
    assert done.graph.op_counts() == {"split": 2, "concat": 1, "add": 1}
    assert_same(model, to_model_proto(done.graph))


def _with_weight(model: onnx.ModelProto, name: str, array: np.ndarray) -> onnx.ModelProto:
    model.graph.initializer.append(numpy_helper.from_array(array, name))
    return model


def test_pieces_of_a_matmul_in_another_order_are_put_in_order_by_permuting_its_weight():
    """add(a_i, (h @ W)_perm(i)): W's column blocks are permuted instead, so no concat is needed: one matmul,
    one add, one split instead of a matmul, two splits and four adds."""
    perm = [2, 0, 3, 1]
    weight = np.random.default_rng(3).standard_normal((5, 8)).astype(np.float32)
    model = _with_weight(model_of(
        [helper.make_node("MatMul", ["h", "W"], ["m"]),
         helper.make_node("Split", ["m"], [f"m{i}" for i in range(4)], axis=1, split=[2, 2, 2, 2]),
         helper.make_node("Split", ["a"], [f"a{i}" for i in range(4)], axis=1, split=[2, 2, 2, 2]),
         *[helper.make_node("Add", [f"a{i}", f"m{perm[i]}"], [f"y{i}"]) for i in range(4)]],
        {"a": [1, 8], "h": [1, 5]}, {f"y{i}": [1, 2] for i in range(4)}), "W", weight)
    done = simplify_splits(graph_from_model(model))
    assert done.elementwise_hoisted == 1 and done.weights_permuted == 1
    assert done.graph.op_counts() == {"matmul": 1, "add": 1, "split": 1}
    (permuted,) = [c for c in done.graph.constants.values() if c.type.shape == (5, 8)]
    expected = np.concatenate([weight[:, 2 * k:2 * k + 2] for k in perm], axis=1)
    np.testing.assert_array_equal(permuted.value(), expected)
    assert_same(model, to_model_proto(done.graph))


def test_a_grid_of_splits_is_cut_rows_first_when_that_lets_each_row_be_added_once():
    """x [4,6] cut by columns (two halves) and then by rows, each row's pieces added to the pieces of y_t:
    cut rows first, each row is added to y_t once before one split (9 nodes instead of 15)."""
    nodes = [helper.make_node("Split", ["x"], ["xa", "xb"], axis=1, split=[3, 3]),
             helper.make_node("Split", ["xa"], [f"xa{t}" for t in range(4)], axis=0, split=[1, 1, 1, 1]),
             helper.make_node("Split", ["xb"], [f"xb{t}" for t in range(4)], axis=0, split=[1, 1, 1, 1])]
    for t in range(4):
        nodes += [helper.make_node("Split", [f"y{t}"], [f"y{t}a", f"y{t}b"], axis=1, split=[3, 3]),
                  helper.make_node("Add", [f"xa{t}", f"y{t}a"], [f"s{t}a"]),
                  helper.make_node("Add", [f"xb{t}", f"y{t}b"], [f"s{t}b"])]
    model = model_of(nodes, {"x": [4, 6], **{f"y{t}": [1, 6] for t in range(4)}},
                     {f"s{t}{h}": [1, 3] for t in range(4) for h in "ab"})
    done = simplify_splits(graph_from_model(model))
    assert done.regridded == 1 and done.elementwise_hoisted == 4
    assert done.graph.op_counts() == {"split": 5, "add": 4}
    assert_same(model, to_model_proto(done.graph))


def test_a_grid_cut_the_other_way_that_saves_nothing_is_left_alone():
    """The same grid whose pieces are read one by one (no adds to line up): cutting it rows first would
    make 1 + 4 splits out of 1 + 2, so it stays as it is."""
    model = model_of([helper.make_node("Split", ["x"], ["xa", "xb"], axis=1, split=[3, 3]),
                      helper.make_node("Split", ["xa"], [f"xa{t}" for t in range(4)], axis=0, split=[1, 1, 1, 1]),
                      helper.make_node("Split", ["xb"], [f"xb{t}" for t in range(4)], axis=0, split=[1, 1, 1, 1])],
                     {"x": [4, 6]}, {f"x{h}{t}": [1, 3] for t in range(4) for h in "ab"})
    done = simplify_splits(graph_from_model(model))
    assert done.regridded == 0 and len(done.graph.nodes) == 3


BN_PARAMS = ("scale", "bias", "mean", "var")


def _split_then_batchnorms(epsilons: tuple[float, float]) -> onnx.ModelProto:
    """x [1,8,4,4] split along the channels into 3 + 5, each piece batch-normalized with its own params."""
    rng = np.random.default_rng(5)
    model = model_of([helper.make_node("Split", ["x"], ["p0", "p1"], axis=1, split=[3, 5]),
                      *[helper.make_node("BatchNormalization", [f"p{i}", *(f"{n}{i}" for n in BN_PARAMS)],
                                         [f"y{i}"], epsilon=epsilons[i]) for i in range(2)]],
                     {"x": [1, 8, 4, 4]}, {"y0": [1, 3, 4, 4], "y1": [1, 5, 4, 4]})
    for i, channels in enumerate((3, 5)):
        for name in ("scale", "bias", "mean"):
            _with_weight(model, f"{name}{i}", rng.standard_normal(channels).astype(np.float32))
        _with_weight(model, f"var{i}", rng.uniform(0.5, 2.0, channels).astype(np.float32))
    return model


def test_a_batchnorm_on_every_piece_of_a_channel_split_is_applied_once_before_it():
    """What pairwise conv merges leave: conv -> split -> a batchnorm per piece, which ORT cannot fuse into
    the conv. One batchnorm with the pieces' params concatenated, then the split."""
    model = _split_then_batchnorms((1e-5, 1e-5))
    done = simplify_splits(graph_from_model(model))
    assert done.channelwise_hoisted == 1
    assert done.graph.op_counts() == {"batchnorm": 1, "split": 1}
    x = np.random.default_rng(0).standard_normal((1, 8, 4, 4)).astype(np.float32)
    for want, got in zip(run(model, {"x": x}), run(to_model_proto(done.graph), {"x": x}), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    differing = _split_then_batchnorms((1e-5, 1e-3))  # not the same op on every piece: left alone
    assert simplify_splits(graph_from_model(differing)).channelwise_hoisted == 0
