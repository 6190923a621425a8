"""Shape arithmetic over symbolic dims (``xflow.rewrite.shapes``): a decoder's per-layer ``Shape -> Gather ->
Unsqueeze -> Concat`` folded, shared and deleted, the outputs the same at every size tried, the interface kept,
and the step certified: ``xflow check`` re-derives it and refuses a tampered one."""

from __future__ import annotations

import collections
import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

from xflow.check.certificate import KEY, carried
from xflow.check.replay import StepRefused, replay
from xflow.cli import main
from xflow.onnx_io import graph_from_model, to_model_proto
from xflow.ort import open_session
from xflow.rewrite.shapes import evaluate, shape_node_count, share_shapes
from xflow.zoo.decoder import DecoderConfig, decoder_feeds, gpt2_decoder, llama_decoder

ANALYTIC = ("--cost", "analytic", "--keep-if-slower", "--budget", "10", "-q")
SHAPE_OPS = ("Shape", "Gather", "Unsqueeze", "Concat")


def _counts(model: onnx.ModelProto) -> collections.Counter[str]:
    return collections.Counter(n.op_type for n in model.graph.node)


def _outputs_equal(a: onnx.ModelProto, b: onnx.ModelProto, exact: bool = True) -> None:
    """Equal outputs at batch 1 and 4, past 0, 1 and 127: bit for bit where only shape arithmetic changed; within
    float32 rounding where rules also fused kernels (RMSNorm into SimplifiedLayerNormalization)."""
    sa, sb = open_session(a.SerializeToString()), open_session(b.SerializeToString())
    for batch in (1, 4):
        for past in (0, 1, 127):
            feeds = decoder_feeds(a, batch, 1, past)
            for x, y in zip(sa.run(None, feeds), sb.run(None, feeds), strict=True):
                if exact:
                    assert np.array_equal(x, y), (batch, past)
                else:
                    np.testing.assert_allclose(y, x, rtol=1e-4, atol=1e-5, err_msg=f"batch {batch}, past {past}")


def _interface(model: onnx.ModelProto) -> list[bytes]:
    return [vi.SerializeToString(deterministic=True) for vi in (*model.graph.input, *model.graph.output)]


@pytest.mark.parametrize("make", [llama_decoder, gpt2_decoder])
def test_a_decoders_shape_arithmetic_is_folded_shared_and_deleted(make):
    model = make(DecoderConfig(layers=2, kv_heads=2 if make is llama_decoder else 4, max_positions=256))
    graph = graph_from_model(model)
    step = share_shapes(graph)
    assert step is not None
    written = to_model_proto(step.graph)
    before, after = _counts(model), _counts(written)
    # one Shape read per graph input the sizes come from (input_ids, the cache), not one per layer; the
    # Llama's causal-mask Expand, written anew from the IR, reads the batch once more for its own target
    assert after["Shape"] <= 3 < before["Shape"]
    assert sum(after[op] for op in SHAPE_OPS) < sum(before[op] for op in SHAPE_OPS) / 3
    assert shape_node_count(step.graph) <= shape_node_count(graph) // 5
    assert _interface(written) == _interface(model)
    _outputs_equal(model, written)


def test_values_are_stated_over_the_dims():
    graph = graph_from_model(llama_decoder(DecoderConfig(layers=1)))
    values = evaluate(graph)
    past_key_dims = next(v for name, v in values.items() if graph.producers.get(name) is not None
                         and graph.producers[name].onnx_type == "Shape"
                         and graph.producers[name].inputs == ("past_key_0",))
    assert [str(e) for e in past_key_dims.elems] == ["batch", "2", "past_seq", "8"]
    # the cache's total length, read again from each layer's present key, is the one past + new computed first
    totals = [name for name, v in values.items() if [str(e) for e in v.elems] == ["past_seq + seq"]]
    assert len(totals) >= 2


@pytest.fixture(scope="module")
def optimized(tmp_path_factory):
    folder = tmp_path_factory.mktemp("decoder")
    src, out = folder / "in.onnx", folder / "out.onnx"
    onnx.save(llama_decoder(DecoderConfig(layers=2)), str(src))
    report = folder / "report.json"
    result = CliRunner().invoke(main, ["optimize", str(src), str(out), "--report", str(report), *ANALYTIC],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    figures = json.loads(report.read_text())
    assert figures["shapes_shared"] > 0 and figures["shapes_deleted"] > 0
    return folder, src, out


def test_the_optimized_decoder_checks_and_keeps_its_interface(optimized):
    _folder, src, out = optimized
    model, written = onnx.load(str(src)), onnx.load(str(out))
    certificate = json.loads(carried(written))
    kinds = [s["kind"] for s in certificate["steps"]]
    assert kinds[-1] == "shapes"
    assert _counts(written)["Shape"] <= 3 < _counts(model)["Shape"]
    assert _interface(written) == _interface(model)
    _outputs_equal(model, written, exact="rule" not in kinds)  # the shipped rules fuse the RMSNorms too
    result = CliRunner().invoke(main, ["check", str(src), str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "for every input at every size" in result.output


def test_replaying_the_decoders_certificate_writes_its_bytes(optimized, tmp_path):
    _folder, src, out = optimized
    again = tmp_path / "again.onnx"
    result = CliRunner().invoke(main, ["optimize", str(src), str(again), "--replay", str(out), "-q"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert again.read_bytes() == out.read_bytes()


def _tamper(step: dict, how: str) -> None:
    if how == "share":  # a value said equal to another that is not (the batch for the new tokens' count)
        values = sorted(set(step["shared"].values()))
        name = next(iter(step["shared"]))
        step["shared"][name] = next(v for v in values if v != step["shared"][name])
    elif how == "fold":
        name = next(iter(step["constants"]))
        step["constants"][name]["values"][0] += 1
    elif how == "delete":
        step["removed"] = step["removed"][1:]


def _static_width() -> onnx.ModelProto:
    """``x + range(width)`` with the width read from ``x``'s static dim beside a dynamic batch."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "one"], ["width"], axis=0),
             helper.make_node("Range", ["zero", "width", "one"], ["r"]),
             helper.make_node("Cast", ["r"], ["rf"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["x", "rf"], ["y"])]
    graph = helper.make_graph(
        nodes, "static_width", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor("one", TensorProto.INT64, [], [1]), helper.make_tensor("zero", TensorProto.INT64, [], [0])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_static_dim_beside_a_dynamic_one_folds():
    model = _static_width()
    step = share_shapes(graph_from_model(model))
    assert step is not None and [v.array().tolist() for v in step.constants.values()] == [8]
    written = to_model_proto(step.graph)
    assert "Shape" not in _counts(written) and "Gather" not in _counts(written)
    x = np.ones((3, 8), dtype=np.float32)
    assert np.array_equal(open_session(written.SerializeToString()).run(None, {"x": x})[0], x + np.arange(8))


@pytest.mark.parametrize("how", ["share", "fold", "delete"])
def test_a_tampered_shape_step_is_refused(how):
    model = _static_width() if how == "fold" else llama_decoder(DecoderConfig(layers=2))
    graph = graph_from_model(model)
    step = share_shapes(graph)
    assert step is not None
    record = step.record()
    certificate = {"input": {"graph": graph.structural_hash}, "steps": [record],
                   "output": {"graph": step.graph.structural_hash}}
    assert replay(graph, certificate, {}).graph.structural_hash == step.graph.structural_hash
    _tamper(record, how)
    with pytest.raises(StepRefused, match="shape arithmetic"):
        replay(graph, certificate, {})


def test_a_tampered_shape_step_in_the_written_model_is_refused(optimized, tmp_path):
    _folder, src, out = optimized
    written = onnx.load(str(out))
    certificate = json.loads(carried(written))
    _tamper(certificate["steps"][-1], "share")
    for p in written.metadata_props:
        if p.key == KEY:
            p.value = json.dumps(certificate)
    bad = tmp_path / "bad.onnx"
    onnx.save(written, str(bad))
    result = CliRunner().invoke(main, ["check", str(src), str(bad)], catch_exceptions=False)
    assert result.exit_code == 1
    assert "shape arithmetic" in result.output


def _unresolved(again: bool = False) -> onnx.ModelProto:
    """A Reshape target over a dim no input states (NonZero's count): nothing in it folds. ``again``: the
    target's second dim read again by a second Shape -> Gather -> Unsqueeze, as exporters write it."""
    second = "n1"
    nodes = [helper.make_node("NonZero", ["x"], ["nz"]),
             helper.make_node("Shape", ["nz"], ["s"]),
             helper.make_node("Gather", ["s", "one"], ["n"], axis=0),
             helper.make_node("Unsqueeze", ["n", "zero"], ["n1"])]
    if again:
        nodes += [helper.make_node("Shape", ["nz"], ["s2"]),
                  helper.make_node("Gather", ["s2", "one"], ["m"], axis=0),
                  helper.make_node("Unsqueeze", ["m", "zero"], ["m1"])]
        second = "m1"
    nodes += [helper.make_node("Concat", ["n1", second], ["target"], axis=0),
              helper.make_node("Reshape", ["y", "target"], ["z"])]
    graph = helper.make_graph(
        nodes, "unresolved",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, ["k"])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [helper.make_tensor("one", TensorProto.INT64, [], [1]),
         helper.make_tensor("zero", TensorProto.INT64, [1], [0])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(model: onnx.ModelProto) -> np.ndarray:
    x, y = np.array([1, 0, 2, 3], dtype=np.float32), np.arange(9, dtype=np.float32)
    return open_session(model.SerializeToString()).run(None, {"x": x, "y": y})[0]


def test_shape_arithmetic_that_cannot_be_resolved_is_carried_through_untouched():
    model = _unresolved()
    graph = graph_from_model(model)
    assert evaluate(graph).keys() <= {"one", "zero"}
    assert share_shapes(graph) is None
    assert [n.SerializeToString() for n in to_model_proto(graph).graph.node] == \
        [n.SerializeToString() for n in model.graph.node]


def test_a_dim_read_twice_is_read_once_even_where_its_size_is_unknown():
    model = _unresolved(again=True)
    graph = graph_from_model(model)
    step = share_shapes(graph)  # equal nodes on equal inputs compute one value, whatever it is
    assert step is not None and set(step.shared) == {"s2", "m", "m1"}
    written = to_model_proto(step.graph)
    assert _counts(written) == _counts(_unresolved())
    assert np.array_equal(_run(model), _run(written))


def test_with_control_flow_nothing_folds():
    model = _static_width()
    branch = helper.make_graph([helper.make_node("Identity", ["one"], ["b"])], "branch", [],
                               [helper.make_tensor_value_info("b", TensorProto.INT64, [])])
    model.graph.node.append(helper.make_node("If", ["flag"], ["picked"], then_branch=branch, else_branch=branch))
    model.graph.input.append(helper.make_tensor_value_info("flag", TensorProto.BOOL, []))
    model.graph.output.append(helper.make_tensor_value_info("picked", TensorProto.INT64, []))
    step = share_shapes(graph_from_model(model))
    assert step is None or not step.constants



def test_two_nodes_said_equal_that_are_not_are_refused():
    graph = graph_from_model(_unresolved(again=True))
    step = share_shapes(graph)
    assert step is not None
    record = step.record()
    certificate = {"input": {"graph": graph.structural_hash}, "steps": [record],
                   "output": {"graph": step.graph.structural_hash}}
    record["shared"]["s2"] = "nz"  # the second Shape said to be the NonZero it reads
    with pytest.raises(StepRefused, match="not the same op on the same inputs"):
        replay(graph, certificate, {})


def test_folded_values_are_written_in_one_order_whatever_order_they_are_found_in():
    """A replay reads the folded values from the certificate (sorted by name) where the run found them in graph
    order: both must write the model's initializers alike, or ``--replay`` is not byte-identical."""
    from xflow.rewrite.shapes import apply_step

    model = llama_decoder(DecoderConfig(layers=1))
    sizes = {"batch": 1, "seq": 1, "past_seq": 3, "total_seq": 4}
    for vi in (*model.graph.input, *model.graph.output):  # every dim fixed: the shape values fold
        for dim in vi.type.tensor_type.shape.dim:
            if dim.dim_param:
                dim.dim_value = sizes[dim.dim_param]
    graph = graph_from_model(model)
    step = share_shapes(graph)
    assert step is not None and len(step.constants) >= 2
    forward = apply_step(graph, dict(step.constants), step.shared)[0]
    backward = apply_step(graph, dict(reversed(list(step.constants.items()))), step.shared)[0]
    assert list(forward.constants) == list(backward.constants)
    assert to_model_proto(forward).SerializeToString() == to_model_proto(backward).SerializeToString()
