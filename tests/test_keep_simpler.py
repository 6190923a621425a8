"""A rewrite that removes nodes or bytes and is not slower is written ("simpler, not slower"): a non-inferiority
test over the A/B's session pairs (at most ``NON_INFERIORITY_MARGIN`` slower, one-sided signed-rank, p < 0.01),
beside the unchanged test of "faster". ``--require-faster`` asks for faster alone."""

from __future__ import annotations

import json

import onnx
import pytest
from onnx import TensorProto, helper

import xflow.runtime as runtime
from tests.test_decision import RELU_ON_A_DOUBLED_COPY, CopiesLookFree, _relu_model
from xflow.optimize import Decision, OptimizeOptions, optimize_file
from xflow.optimize.size import ModelSize, model_size
from xflow.runtime import NON_INFERIORITY_MARGIN, ABResult, decide_ab


def transpose_pair_model() -> onnx.ModelProto:
    """Seven nodes, as an exporter writes them: a Transpose and its inverse cancelling, and a one-input Concat;
    onnxslim and onnxsim write the four that compute (Relu, Sigmoid, Mul, Add)."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t1"], perm=[1, 0]),
             helper.make_node("Transpose", ["t1"], ["t2"], perm=[1, 0]),
             helper.make_node("Concat", ["t2"], ["c"], axis=0),
             helper.make_node("Sigmoid", ["c"], ["s"]),
             helper.make_node("Mul", ["s", "r"], ["m"]),
             helper.make_node("Add", ["m", "x"], ["y"])]
    graph = helper.make_graph(nodes, "transpose_pair",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [256, 512])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [256, 512])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _script(monkeypatch: pytest.MonkeyPatch, ratios: str) -> None:
    """Each pair's A/B as given: B's median ``r`` percent faster than A's (negative: slower)."""
    script = iter(float(r) for r in ratios.split())
    monkeypatch.setattr(runtime, "measure_ab", lambda a, b, feeds, **timing: (
        ABResult(1.0, 1.0 / (1.0 + next(script) / 100), 10, 5)))


@pytest.mark.parametrize(("ratios", "faster", "not_slower", "pairs"), [
    ("+5 +5 +5 +5 +5 +5 +5 +5", True, True, 8),
    ("+0.2 -0.3 +0.1 -0.1 +0.4 -0.2 0 +0.3", False, True, 8),  # a wash: within 2% in every pair
    ("-1 -1 -1 -1 -1 -1 -1 -1", False, True, 8),  # 1% slower: inside the margin
    ("-4 -4 -4 -4 -4 -4 -4 -4", False, False, 3),  # 4% slower: both ruled out after three pairs
    ("-1 -1 -1 -1 -1 -1 -1 -2.4", False, True, 8),  # one pair past the margin, by the least
    ("-1 -1 -4 -4 -1 -1 -1 -1", False, False, 4)])  # two pairs 4% slower outrank the others: stop
def test_not_slower_is_a_non_inferiority_test_over_the_pairs(monkeypatch, ratios, faster, not_slower, pairs):
    _script(monkeypatch, ratios)
    result = decide_ab(None, None, {}, lambda side: None, min_pairs=8, max_pairs=8, margin=NON_INFERIORITY_MARGIN)
    assert (result.b_is_faster(), result.b_is_not_slower(), result.pairs) == (faster, not_slower, pairs)


def test_without_a_margin_nothing_is_not_slower_and_faster_is_decided_as_before(monkeypatch):
    """The superiority test is the same with a margin: an identical copy (every pair a tie) is not faster, and
    without a margin the decision stops as soon as "faster" is ruled out."""
    _script(monkeypatch, "0 0 0 0 0 0 0 0")
    plain = decide_ab(None, None, {}, lambda side: None, min_pairs=8, max_pairs=8)
    assert not plain.b_is_faster() and not plain.b_is_not_slower() and plain.pairs == 2
    assert plain.not_slower_p is None
    _script(monkeypatch, "0 0 0 0 0 0 0 0")
    tested = decide_ab(None, None, {}, lambda side: None, min_pairs=8, max_pairs=8, margin=NON_INFERIORITY_MARGIN)
    assert not tested.b_is_faster() and tested.p_value == pytest.approx(1.0)
    assert tested.b_is_not_slower() and tested.pairs == 8


def test_simpler_means_fewer_nodes_or_bytes_and_no_more_of_the_other():
    model = transpose_pair_model()
    size = model_size(model)
    assert size.nodes == 7 and size.ops == {"Add": 1, "Concat": 1, "Mul": 1, "Relu": 1, "Sigmoid": 1, "Transpose": 2}
    smaller = onnx.ModelProto()
    smaller.CopyFrom(model)
    del smaller.graph.node[1]
    assert model_size(smaller).is_simpler_than(size) and not size.is_simpler_than(model_size(smaller))
    assert not size.is_simpler_than(size)  # an identical copy is not simpler


def _optimize(tmp_path, model: onnx.ModelProto, **options):  # noqa: ANN001, ANN003, ANN202
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(model, src)
    said: list[str] = []
    report = optimize_file(str(src), str(out), OptimizeOptions.of(**options), say=said.append)
    return report, said, onnx.load(str(out))


def test_the_transpose_pair_is_written_seven_nodes_to_four(tmp_path):
    """Real timing: the four-node model is faster or, at worst, not slower; either way it is written."""
    report, said, written = _optimize(tmp_path, transpose_pair_model(), cost="analytic")
    assert [n.op_type for n in written.graph.node] == ["Relu", "Sigmoid", "Mul", "Add"], said
    assert report.nodes_before == 7 and report.nodes_after == 4 and report.simpler
    assert Decision(report.outcome).writes_optimized


def test_a_simpler_model_timed_a_wash_is_written_simpler_not_slower(tmp_path, monkeypatch):
    _script(monkeypatch, " ".join(["+0.1", "-0.1"] * 6))
    report, _, written = _optimize(tmp_path, transpose_pair_model(), cost="analytic")
    assert report.outcome == "simpler-not-slower" and report.decision == "simpler, not slower"
    assert len(written.graph.node) == 4 and report.not_slower_p is not None
    assert report.not_slower_p < runtime.NON_INFERIORITY_LEVEL


def test_require_faster_keeps_the_original_when_the_simpler_model_is_only_not_slower(tmp_path, monkeypatch):
    _script(monkeypatch, " ".join(["+0.1", "-0.1"] * 6))
    report, said, written = _optimize(tmp_path, transpose_pair_model(), cost="analytic", require_faster=True)
    assert report.outcome == "kept-original-not-faster" and report.copied
    assert len(written.graph.node) == 7 and report.not_slower_p is None
    assert any(line.startswith("the optimized model was not measurably faster") for line in said), said


def test_a_rewrite_that_adds_work_is_not_kept_for_timing_a_wash(tmp_path, monkeypatch):
    """Not simpler (more nodes): "not slower" is not asked of it, and a wash keeps the original."""
    _script(monkeypatch, " ".join(["+0.1", "-0.1"] * 6))
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"format": "xflow.rules/1", "rules": [RELU_ON_A_DOUBLED_COPY]}))
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(_relu_model(), src)
    options = OptimizeOptions.of(rules_path=str(rules), budget=4, branches=0)
    report = optimize_file(str(src), str(out), options, cost_model=CopiesLookFree(), say=lambda _m: None)
    assert report.rules_applied and not report.simpler and report.outcome == "kept-original-not-faster"
    assert [n.op_type for n in onnx.load(str(out)).graph.node] == ["Relu"]


def _dynamic_transpose_pair() -> onnx.ModelProto:
    model = transpose_pair_model()
    for value in (model.graph.input[0], model.graph.output[0]):
        value.type.tensor_type.shape.dim[0].dim_param = "batch"
    return model


@pytest.mark.parametrize(("require_faster", "outcome", "nodes"), [
    (False, "simpler-not-slower", 4), (True, "kept-original-not-faster-at-every-point", 7)])
def test_at_several_profile_points_each_must_be_faster_or_not_slower(tmp_path, monkeypatch, require_faster, outcome,
                                                                     nodes):
    """Faster at batch=1, a wash at batch=8: simpler and not slower at each point, which is enough by default and
    not with --require-faster."""
    _script(monkeypatch, " ".join(["+5"] * 12 + ["+0.1", "-0.1"] * 6))
    report, _, written = _optimize(tmp_path, _dynamic_transpose_pair(), cost="analytic",
                                   shape_profile={"batch": (1, 8)}, require_faster=require_faster)
    assert report.outcome == outcome and len(written.graph.node) == nodes
    assert [p["verdict"] for p in report.profile_points] == ["faster", "not-slower" if not require_faster else "slower"]


def test_fewer_nodes_that_leave_small_folded_constants_are_simpler():
    """Folding a computed Pad's pads or a shape into a constant adds a few bytes of int64 weights where it removes
    nodes: simpler. Many more weights than that are not, nor are more nodes for fewer weights."""
    size = ModelSize(nodes=1051, ops={}, bytes=9_009_324, weight_bytes=8_827_264)
    assert ModelSize(214, {}, 8_878_010, 8_830_272).is_simpler_than(size)  # 837 nodes fewer, 3 KB of pads
    assert not ModelSize(214, {}, 9_900_000, 8_827_264 + (1 << 20)).is_simpler_than(size)
    assert not ModelSize(1052, {}, 8_000_000, 8_000_000).is_simpler_than(size)
    assert ModelSize(1051, {}, 8_000_000, 8_000_000).is_simpler_than(size)
    # Constant nodes written as initializers remove no work: the same computing nodes, the same weights
    exported = ModelSize(nodes=1051, ops={"Constant": 538}, bytes=9_009_324, weight_bytes=8_827_264)
    assert not ModelSize(513, {}, 9_000_000, 8_827_264).is_simpler_than(exported)
    assert ModelSize(144, {}, 8_878_010, 8_830_272).is_simpler_than(exported)
