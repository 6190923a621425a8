"""Dims the graph relates (``xflow.onnx_io.dim_relations``) and a shape profile that respects them: a decoder
with a KV cache is measured at a decode step and a prefill with ``total_seq = past_seq + seq`` at every point,
optimizes with no options, and a user's sizes that break the relation get one line naming it."""

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

from xflow.cli import main
from xflow.ir.dims import free_symbols, symbol
from xflow.onnx_io import graph_from_model
from xflow.onnx_io.dim_relations import DimRelation, solve_sizes
from xflow.onnx_io.save import to_model_proto
from xflow.onnx_io.shape_profile import model_relations, shape_plan
from xflow.ort import open_session
from xflow.rewrite import apply_match, find_matches
from xflow.rules.io import load_rules
from xflow.zoo.decoder import decoder_feeds, gpt2_decoder, llama_decoder

BUILDERS = {"llama": llama_decoder, "gpt2": gpt2_decoder}
SYMBOLS = ("batch", "seq", "total_seq", "past_seq")


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def decoder(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param) / f"{request.param}.onnx"
    model = BUILDERS[request.param]()
    onnx.save(model, path)
    return request.param, model, str(path)


def test_the_cache_concat_relates_total_to_past_and_new_tokens(decoder):
    _, model, _ = decoder
    found = model_relations(model)
    assert [str(r) for r in found.relations] == ["total_seq = past_seq + seq"]
    assert found.relations[0].where == "output present_key_0 dim 2"
    assert [(c.past, c.new) for c in found.caches] == [("past_seq", "seq")]


@pytest.mark.parametrize(("name", "where"), [("llama", "Or /Or_26"),
                                           ("gpt2", "dims ONNX Runtime's shape inference merges")])
def test_the_mask_meets_the_cache_where_the_outputs_do_not_say_total_seq(name, where):
    """Outputs named per output (as an export without their dynamic axes): the mask's broadcast against the
    cache says it, read from the plain inference (Llama's Or) or from its merges past GPT-2's clamped Slice."""
    model = BUILDERS[name]()
    for vi in model.graph.output:
        if vi.name.startswith("present"):
            vi.type.tensor_type.shape.dim[2].dim_param = f"{vi.name}_dim_2"
    found = model_relations(model)
    assert [(str(r), r.where) for r in found.relations] == [("total_seq = past_seq + seq", where)]


def test_the_default_profile_is_a_decode_step_and_a_prefill_that_keep_the_relation(decoder):
    _, model, _ = decoder
    plan = shape_plan(model, {}, {}, "m.onnx")
    assert plan.points() == [{"batch": 1, "seq": 1, "total_seq": 128, "past_seq": 127},
                             {"batch": 1, "seq": 128, "total_seq": 128, "past_seq": 0}]
    off = list(plan.off_profile())
    for point in plan.points() + off:
        assert point["total_seq"] == point["past_seq"] + point["seq"]
        assert plan.broken_relation(point) is None
    assert {"batch": 2, "seq": 2, "total_seq": 3, "past_seq": 1} in off  # within the position tables
    session = open_session(model.SerializeToString(), "cpu", 1)
    for point in plan.points():
        shapes = plan.shapes_at(point)
        feeds = decoder_feeds(model, point["batch"], point["seq"], point["past_seq"])
        assert {name: a.shape for name, a in feeds.items()} == shapes
        session.run(None, feeds)


def test_a_profile_with_more_batches_takes_both_steps_at_each():
    plan = shape_plan(llama_decoder(), {"batch": (1, 4)}, {}, "m.onnx")
    assert [(p["batch"], p["seq"], p["past_seq"], p["total_seq"]) for p in plan.points()] == \
        [(1, 1, 127, 128), (1, 128, 0, 128), (4, 1, 127, 128), (4, 128, 0, 128)]


def test_sizes_given_for_some_related_dims_derive_the_others():
    """--shape-profile total_seq=64: the cache length is what is left of it (a prefill of 128 would not fit)."""
    plan = shape_plan(llama_decoder(), {"total_seq": (64,)}, {}, "m.onnx")
    assert plan.points() == [{"batch": 1, "seq": 1, "total_seq": 64, "past_seq": 63}]
    derived = solve_sizes([DimRelation("total_seq", symbol("past_seq") + symbol("seq"), "here")], {"seq"}, SYMBOLS)
    assert derived == {"total_seq": symbol("past_seq") + symbol("seq")}
    both = solve_sizes([DimRelation("total_seq", symbol("past_seq") + symbol("seq"), "here")],
                       {"seq", "total_seq"}, SYMBOLS)
    assert both == {"past_seq": symbol("total_seq") - symbol("seq")}


def test_optimize_with_no_options_runs_the_decoder(decoder, tmp_path):
    """``xflow optimize IN OUT``: the original runs at the default sizes; where the search found a rewrite (the
    measured costs decide), outputs are checked at the prefill and an off-profile point too; the written model's
    interface is the input's, byte for byte."""
    _, model, path = decoder
    out = tmp_path / "out.onnx"
    result = CliRunner().invoke(main, ["optimize", path, str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "cannot run" not in result.output and "cannot be verified" not in result.output
    if "copied (no improving rewrite)" not in result.output:
        assert "outputs match at other sizes too: batch=1 seq=128 total_seq=128 past_seq=0; " \
               "batch=2 seq=2 total_seq=3 past_seq=1" in result.output
    written = onnx.load(out)
    for field in ("input", "output"):
        assert [v.SerializeToString() for v in getattr(written.graph, field)] == \
            [v.SerializeToString() for v in getattr(model.graph, field)]


def test_sizes_that_break_the_relation_get_one_line_naming_it(decoder, tmp_path):
    _, _, path = decoder
    out = tmp_path / "out.onnx"
    result = CliRunner().invoke(main, ["optimize", path, str(out), "--cost", "analytic",
                                       "--shape-profile", "seq=1 past_seq=128 total_seq=128"])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "break total_seq = past_seq + seq (output present_key_0 dim 2): total_seq=128, " \
                                "but past_seq + seq = 128 + 1 = 129" in lines[0], lines
    assert not out.exists()


def rewritten(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """The model with every shipped rule applied where it matches (each up to 12 times, in the rule file's
    order), whatever it costs: the rewrites a search may choose, over the graph's symbolic dims."""
    graph, applied = graph_from_model(model), 0
    for rule in load_rules():
        for _ in range(12):
            match = next(find_matches(graph, rule), None)
            new = apply_match(graph, match) if match is not None else None
            if new is None:
                break
            graph, applied = new, applied + 1
    return to_model_proto(graph), applied


def test_the_rewritten_decoder_equals_the_original_at_every_cache_length(decoder):
    """The rules that match a decoder keep its outputs at batch 1 and 4 over a cache of 0, 1 and 127 (one new
    token, and a prefill of 8 over no cache), left-padded where there is a cache."""
    name, model, _ = decoder
    changed, applied = rewritten(model)
    assert applied > 0
    original = open_session(model.SerializeToString(), "cpu", 1)
    optimized = open_session(changed.SerializeToString(), "cpu", 1)
    for batch in (1, 4):
        for seq, past in ((1, 0), (1, 1), (1, 127), (8, 0)):
            feeds = decoder_feeds(model, batch, seq, past, seed=batch + past, padded=1 if past else 0)
            for want, got in zip(original.run(None, feeds), optimized.run(None, feeds), strict=True):
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"{name} {batch} {seq} {past}")


def test_input_shapes_or_inputs_that_break_the_relation_name_it(tmp_path):
    """``--input-shape`` and ``--inputs`` sizes are the profile point: where they break the relation, the one
    line names it (and the file the sizes came from); nothing is written."""
    model = llama_decoder()
    path, out = str(tmp_path / "llama.onnx"), tmp_path / "out.onnx"
    onnx.save(model, path)
    shapes = ["--input-shape", "input_ids=1x1", "--input-shape", "attention_mask=1x128",
              "--input-shape", "past_key_0=1x2x128x8"]
    result = CliRunner().invoke(main, ["optimize", path, str(out), "--cost", "analytic", *shapes])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert f"{path}: the sizes given break total_seq = past_seq + seq" in result.output
    feeds = decoder_feeds(model, 1, 1, 128)
    feeds["attention_mask"] = feeds["attention_mask"][:, :128]
    npz = str(tmp_path / "inputs.npz")
    np.savez(npz, **feeds)
    result = CliRunner().invoke(main, ["optimize", path, str(out), "--cost", "analytic", "--inputs", npz])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert f"{npz}: ONNX Runtime cannot run {path} on these inputs: they break total_seq = past_seq + seq" \
        in result.output
    assert not out.exists()


def test_the_loader_checks_merged_types_at_sizes_that_keep_the_relation():
    """ORT's merged inference is checked by two runs of the model; made at sizes where total_seq = past_seq +
    seq, they run, so the types past GPT-2's clamped causal Slice are known and its matmuls, norms and
    elementwise ops are in the algebra (at unrelated sizes both runs failed and all of them stayed opaque)."""
    graph = graph_from_model(gpt2_decoder())
    opaque = {n.onnx_type for n in graph.opaque_computing()}
    assert not opaque & {"MatMul", "LayerNormalization", "Mul", "Transpose", "Reshape", "Softmax"}, opaque


def _two_input_model(node: onnx.NodeProto, x: list, y: list, out: list) -> onnx.ModelProto:
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x),
                                            helper.make_tensor_value_info("y", TensorProto.FLOAT, y)],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, out)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_independent_dims_stay_independent_and_a_broadcast_relates_its_operands():
    """Cross attention's two lengths are not related (a MatMul over them contracts neither); an Add of
    [batch, seq] and [batch, other] is: other = seq, the later symbol derived, at the size the default gives."""
    cross = _two_input_model(helper.make_node("MatMul", ["x", "y"], ["z"]), ["batch", "seq", 8],
                             ["batch", 8, "enc_seq"], ["batch", "seq", "enc_seq"])
    assert model_relations(cross).relations == ()
    assert shape_plan(cross, {}, {}, "m.onnx").points() == [{"batch": 1, "seq": 128, "enc_seq": 128}]
    added = _two_input_model(helper.make_node("Add", ["x", "y"], ["z"]), ["batch", "seq"], ["batch", "other"],
                             ["batch", "seq"])
    assert [str(r) for r in model_relations(added).relations] == ["other = seq"]
    plan = shape_plan(added, {"seq": (8, 16)}, {}, "m.onnx")
    assert plan.points() == [{"batch": 1, "seq": 8, "other": 8}, {"batch": 1, "seq": 16, "other": 16}]


def test_the_loader_states_every_type_over_the_free_symbols(decoder):
    """total_seq is past_seq + seq in every value's type (the mask, the cache's present_*, the scores), with no
    dim ORT made up for it, so the attention MatMuls and Softmax see one dim where the graph has one and are in
    the algebra; the written interface is still the input's, byte for byte."""
    name, model, _ = decoder
    graph = graph_from_model(model)
    total = symbol("past_seq") + symbol("seq")
    assert {s for t in graph.types.values() if t.shape is not None for s in free_symbols(t.shape)} == \
        {"batch", "seq", "past_seq"}
    assert graph.types["attention_mask"].shape == (symbol("batch"), total)
    assert graph.types["present_key_0"].shape[2] == total
    if name == "llama":
        assert not {n.onnx_type for n in graph.opaque_computing()} & {"MatMul", "Softmax"}
    written = to_model_proto(graph)
    for field in ("input", "output", "value_info"):
        assert [v.SerializeToString() for v in getattr(written.graph, field)] == \
            [v.SerializeToString() for v in getattr(model.graph, field)]


def test_a_broadcast_relation_states_the_derived_dim_as_the_free_one():
    """An Add of [batch, seq] and [batch, other]: other = seq, so y's type is [batch, seq] in the IR."""
    added = _two_input_model(helper.make_node("Add", ["x", "y"], ["z"]), ["batch", "seq"], ["batch", "other"],
                             ["batch", "seq"])
    graph = graph_from_model(added)
    assert graph.types["y"].shape == graph.types["x"].shape == (symbol("batch"), symbol("seq"))
    assert [d.dim_param for d in to_model_proto(graph).graph.input[1].type.tensor_type.shape.dim] == \
        ["batch", "other"]


def test_the_loader_given_the_profiles_relations_builds_the_same_graph(decoder):
    """The pipeline hands the loader the relations its profile found (and the inference they were read from,
    reused where nothing is derived): the graph is the one the loader builds alone."""
    _, model, _ = decoder
    cross = _two_input_model(helper.make_node("MatMul", ["x", "y"], ["z"]), ["batch", "seq", 8],
                             ["batch", 8, "enc_seq"], ["batch", "seq", "enc_seq"])
    for m in (model, cross):
        alone, given = graph_from_model(m), graph_from_model(m, relations=model_relations(m))
        assert given.types == alone.types
        assert [(n.op, n.inputs, n.outputs) for n in given.nodes] == [(n.op, n.inputs, n.outputs) for n in alone.nodes]
