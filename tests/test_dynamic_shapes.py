"""Dynamic dims: symbols and their predicates, shape profiles, and checks at sizes never measured."""

import numpy as np
import onnx
import pytest
import sympy
from onnx import TensorProto, helper

from xflow.errors import XflowError
from xflow.ir.dims import concrete, dims_of, divides, equal, parse_dim, symbol
from xflow.onnx_io.shape_profile import DEFAULT_BATCH, DEFAULT_SIZE, parse_shape_profile, shape_plan
from xflow.optimize import OptimizeOptions
from xflow.optimize.load import load_source
from xflow.optimize.verify import VerifyFigures, check_other_sizes
from xflow.ort import open_session

batch, seq = symbol("batch"), symbol("seq")


def dynamic_relu(dims=("batch", "seq", 8)) -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(dims))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(dims))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_dims_are_ints_named_symbols_fresh_symbols_and_expressions():
    vi = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", None, "seq+1", 8])
    dims = dims_of(vi)
    assert dims[0] == batch and dims[2] == seq + 1 and dims[3] == 8
    assert isinstance(dims[1], sympy.Symbol) and dims[1].name == "x[1]"
    assert parse_dim("batch*seq") == batch * seq and parse_dim("12") == 12


def test_predicates_hold_for_every_value_of_the_symbols_or_are_false():
    assert equal(batch * seq, seq * batch) and equal(2 * (seq + 1), 2 * seq + 2)
    assert not equal(batch, seq) and not equal(seq, 1)
    assert divides(seq, batch * seq) and divides(2, 4 * seq) and divides(3, 12)
    assert not divides(2, seq)  # true for even seq only: not a match
    assert not divides(seq, batch) and not divides(5, 12)
    assert not divides(2, seq * (seq + 1))  # always true, but not shown: no guess either way
    assert concrete(batch * seq + 1, {"batch": 2, "seq": 3}) == 7
    with pytest.raises(KeyError):
        concrete(batch, {})


def test_profile_defaults_input_shape_and_points():
    model = dynamic_relu()
    plan = shape_plan(model, {}, {}, "m.onnx")
    assert plan.points() == [{"batch": DEFAULT_BATCH, "seq": DEFAULT_SIZE}]
    plan = shape_plan(model, parse_shape_profile(["batch=1,8", "seq=16"]), {}, "m.onnx")
    assert plan.points() == [{"batch": 1, "seq": 16}, {"batch": 8, "seq": 16}]
    assert plan.shapes_at(plan.points()[1]) == {"x": (8, 16, 8)}
    off = next(plan.off_profile())
    assert off["batch"] not in (1, 8) and off["seq"] != 16
    assert shape_plan(model, {}, {"x": (4, 2, 8)}, "m.onnx").points() == [{"batch": 4, "seq": 2}]
    assert not shape_plan(dynamic_relu((2, 3)), {}, {}, "m.onnx").is_dynamic


@pytest.mark.parametrize(("profile", "shapes", "needle"), [
    ({"heads": (2,)}, {}, "'heads', which is not a dynamic dim of the inputs (dynamic dims: batch, seq)"),
    ({"batch": (2,)}, {"x": (4, 2, 8)}, "disagrees with --input-shape"),
])
def test_bad_profiles_name_the_model(profile, shapes, needle):
    with pytest.raises(XflowError, match="m.onnx") as info:
        shape_plan(dynamic_relu(), profile, shapes, "m.onnx")
    assert needle in str(info.value)


@pytest.mark.parametrize("spec", ["batch", "batch=", "batch=0", "batch=1,x", "=3"])
def test_shape_profile_syntax(spec):
    with pytest.raises(XflowError, match="--shape-profile"):
        parse_shape_profile([spec])


def test_a_rewrite_valid_only_at_the_measuring_size_is_caught():
    """A model equal to the original at batch 1 only (a Reshape pinned to it) passes at the measuring
    size and fails at the off-profile one."""
    model = dynamic_relu()
    pinned = dynamic_relu()
    pinned.graph.node[0].output[0] = "r"
    pinned.graph.initializer.append(onnx.numpy_helper.from_array(np.array([1, -1, 8], np.int64), "shape"))
    pinned.graph.node.append(helper.make_node("Reshape", ["r", "shape"], ["y"]))
    options = OptimizeOptions.of(shape_profile={"seq": (4,)})
    source = load_source(model, options.inputs)
    assert source.measuring == {"x": (1, 4, 8)}
    session, candidate = open_session(model), open_session(pinned)
    figures = VerifyFigures()
    failure = check_other_sizes(source, session, candidate, options.inputs.seed, figures)
    assert failure is not None and "batch=2 seq=5" in failure
    assert check_other_sizes(source, session, open_session(model), options.inputs.seed, VerifyFigures()) is None


@pytest.mark.parametrize("name", ["squeezenet", "bert"])
def test_dynamic_twin_finds_the_static_models_rewrites(name):
    """The search runs on a dynamic-batch export as on its static twin (at the default profile, batch 1)."""
    from xflow import zoo
    from xflow.optimize import optimize_model

    options = OptimizeOptions.of(cost="analytic", measure=False, verify=False, budget=40, time_limit=600)  # by budget
    _, static = optimize_model(zoo.build(name, small=True), options)
    written, dynamic = optimize_model(zoo.build(name, small=True, dynamic=True), options)
    assert static.rules_applied and dynamic.rules_applied == static.rules_applied
    assert dynamic.ir_nodes_after == static.ir_nodes_after
    assert written.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"


def test_zoo_dynamic_twins_run_at_any_batch():
    from xflow import zoo
    from xflow.ort import open_session

    for name in zoo.MODELS:
        static, twin = zoo.build(name, small=True), zoo.build(name, small=True, dynamic=True)
        feeds = zoo.random_inputs(static, seed=0)
        expected = open_session(static).run(None, feeds)
        session = open_session(twin)
        for batch in (1, 3):
            got = session.run(None, {k: np.concatenate([v] * batch) for k, v in feeds.items()})
            for e, g in zip(expected, got, strict=True):
                np.testing.assert_allclose(np.concatenate([e] * batch), g, rtol=1e-4, atol=1e-5, err_msg=name)


def test_random_dynamic_batch_models_optimize_to_models_equal_at_every_batch(tmp_path):
    """Random models with a symbolic batch, optimized at the default profile (batch 1) with the engine rules:
    the written model keeps the inputs and outputs exactly and equals the original at batch 1, 2 and 5."""
    from hypothesis import HealthCheck, given, settings

    from tests.strategies import dynamic_batch_models
    from tests.test_fuzz import fuzz_rules
    from xflow.equivalence import check_equivalence
    from xflow.optimize import optimize_file
    from xflow.runtime import random_feeds

    rules = fuzz_rules(str(tmp_path))[0]
    rewritten = []

    @settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
    @given(dynamic_batch_models())
    def check(model: onnx.ModelProto) -> None:
        src, out = str(tmp_path / "in.onnx"), str(tmp_path / "out.onnx")
        onnx.save(model, src)
        # no time limit (as the static fuzz): under load it would cut searches short and fewer be rewritten
        options = OptimizeOptions.of(rules_path=rules, budget=40, time_limit=600.0, cost="analytic", measure=False,
                                  verify=False)
        report = optimize_file(src, out, options, say=lambda _m: None)
        rewritten.append(bool(report.rules_applied))
        written = onnx.load(out)
        assert list(written.graph.input) == list(model.graph.input)
        assert list(written.graph.output) == list(model.graph.output)
        a, b = open_session(src, threads=1), open_session(out, threads=1)
        for k, batch in enumerate((1, 2, 5)):
            shapes = {i.name: (batch, *i.shape[1:]) for i in a.get_inputs()}
            check_equivalence(a, b, random_feeds(a, k, shapes), f"batch {batch}",
                              lambda j, s=shapes: random_feeds(a, 10 + j, s))

    check()
    assert sum(rewritten) >= 3, rewritten  # the strategy draws the rules' patterns: some models are rewritten


def test_inputs_npz_set_the_measuring_shapes_of_a_dynamic_model(tmp_path):
    npz = tmp_path / "in.npz"
    np.savez(npz, x=np.zeros((3, 5, 8), np.float32))
    source = load_source(dynamic_relu(), OptimizeOptions.of(inputs_npz=str(npz)).inputs)
    assert source.measuring == {"x": (3, 5, 8)}
    assert [n.op for n in source.graph.nodes] == ["relu"]


@pytest.mark.parametrize(("op", "shapes", "attrs", "expected"), [
    ("relu", [(batch, seq, 8)], {}, (batch, seq, 8)),
    ("add", [(batch, seq, 8), (8,)], {}, (batch, seq, 8)),
    ("add", [(batch, 1, 8), (1, seq, 8)], {}, (batch, seq, 8)),
    ("matmul", [(batch, seq, 8), (8, 4)], {}, (batch, seq, 4)),
    ("concat", [(batch, seq, 8), (batch, seq, 4)], {"axis": 2}, (batch, seq, 12)),
    ("concat", [(batch, seq, 8), (batch, 2 * seq, 8)], {"axis": 1}, (batch, 3 * seq, 8)),
    ("transpose", [(batch, seq, 8)], {"perm": (1, 0, 2)}, (seq, batch, 8)),
    ("reshape", [(batch, seq, 8)], {"shape": (batch * seq, 2, 4)}, (batch * seq, 2, 4)),
    ("reshape", [(batch, seq, 8)], {"shape": (batch, seq, 2, 4)}, (batch, seq, 2, 4)),
    # two symbolic dims not copied from the input: written with a target computed at run time
    ("reshape", [(batch * seq, 8)], {"shape": (batch, seq, 2, 4)}, (batch, seq, 2, 4)),
    ("reshape", [(batch * (seq + 1), 8)], {"shape": (batch, seq + 1, 8)}, (batch, seq + 1, 8)),
    ("expand", [(batch, 1, 8)], {"shape": (1, 4, 8)}, (batch, 4, 8)),
    ("expand", [(1,)], {"shape": (seq, seq)}, (seq, seq)),
    # attention over a key of another length, and a hidden size over a symbol that the heads divide
    ("mha", [(batch, seq, 8), (batch, 2 * seq, 8), (batch, 2 * seq, 4)], {"num_heads": 2}, (batch, seq, 4)),
    ("groupnorm", [(batch, 2 * seq, 5), (2 * seq,), (2 * seq,)], {"num_groups": 2}, (batch, 2 * seq, 5)),
    ("mha", [(batch, seq, 4 * seq), (batch, seq, 4 * seq), (batch, seq, 2 * seq)], {"num_heads": 2},
     (batch, seq, 2 * seq)),
    # the packed projection of a dynamic batch and sequence: thirds, and sizes given with Ev unlike Eq
    ("attention", [(batch, seq, 4), (4, 24), (24,)], {"num_heads": 2}, (batch, seq, 8)),
    ("attention", [(batch, seq, 4), (4, 20), (20,)], {"num_heads": 2, "qkv_hidden_sizes": (8, 8, 4)},
     (batch, seq, 4)),
    ("attention", [(batch, seq, 4 * seq), (4 * seq, 12 * seq), (12 * seq,)], {"num_heads": 2},
     (batch, seq, 4 * seq)),
])
def test_op_table_shape_rules_work_on_symbols(op, shapes, attrs, expected):
    from xflow.ops import OPS

    entry = OPS[op]
    assert entry.infer(shapes, entry.normalize_attrs(attrs))[0] == expected


@pytest.mark.parametrize(("op", "shapes", "attrs"), [
    ("add", [(batch, seq, 8), (3, 1, 8)], {}),  # broadcasts only when batch is 3 or 1
    ("matmul", [(batch, seq), (4, 2)], {}),  # inner dims equal only when seq is 4
    ("concat", [(batch, seq, 8), (batch, 4, 8)], {"axis": 2}),
    ("split", [(batch, seq, 8)], {"axis": 1, "split": (4, 4)}),  # seq = 8 only
    ("reshape", [(batch, seq, 8)], {"shape": (batch, 16)}),
    ("reshape", [(batch * seq, 4)], {"shape": (batch / 2, seq, 8)}),  # batch/2: no run-time target computes it
    ("reshape", [(batch * seq, 0)], {"shape": (batch, seq, 0)}),  # a computed 0 would copy a dim
    ("expand", [(1,)], {"shape": (seq / 2, 4)}),
    ("expand", [(batch, 1, 8)], {"shape": (3, 4, 8)}),  # batch 3 or 1 only
    ("split", [(batch, 8)], {"axis": 0, "split": (batch - 1, 1)}),  # a size of a symbol is no constant attribute
    ("mha", [(batch, seq, 8), (3, seq, 8), (3, seq, 8)], {"num_heads": 2}),  # batch 3 only
    ("groupnorm", [(batch, seq, 5), (seq,), (seq,)], {"num_groups": 2}),  # 2 groups divide even channels only
    ("mha", [(batch, seq, seq), (batch, seq, seq), (batch, seq, 8)], {"num_heads": 2}),  # heads divide even seqs only
    ("attention", [(batch, seq, 4), (seq, 24), (24,)], {"num_heads": 2}),  # seq = 4 only
    ("attention", [(batch, seq, seq), (seq, 3 * seq), (3 * seq,)], {"num_heads": 2}),  # heads divide even seqs only
    ("attention", [(batch, seq, 4), (4, seq), (seq,)], {"num_heads": 1}),  # thirds of seq for multiples of 3 only
])
def test_shape_conditions_that_hold_for_some_sizes_only_are_no_match(op, shapes, attrs):
    from xflow.ops import OPS, ShapeError

    entry = OPS[op]
    with pytest.raises(ShapeError):
        entry.infer(shapes, entry.normalize_attrs(attrs))


def test_the_ir_carries_dynamic_dims_as_symbols():
    from xflow.onnx_io import graph_from_model

    graph = graph_from_model(dynamic_relu(("batch", "seq+1", None)))
    assert graph.types["x"].shape == (batch, seq + 1, symbol("x[2]"))
    assert str(graph.types["x"]) == "float[batch,seq + 1,x[2]]"
    assert graph_from_model(dynamic_relu(), input_shapes={"x": (2, 3, 8)}).types["y"].shape == (2, 3, 8)


def test_costs_are_keyed_by_the_profiles_concrete_shapes():
    """The graph keeps its symbols; the cost cache key of a node names the sizes it was measured at: another
    profile point is another entry."""
    from xflow.cost.measured import MeasuredCost
    from xflow.cost.profile_mean import GraphAtPoint

    graph = load_source(dynamic_relu(), OptimizeOptions.of(shape_profile={"batch": (1, 8), "seq": (4,)}).inputs).graph
    (relu,) = graph.nodes
    assert graph.types["y"].shape == (batch, seq, 8)
    coster = MeasuredCost()
    keys = {size: coster.cache_key(GraphAtPoint(graph, {"batch": size, "seq": 4}, {}), relu) for size in (1, 8)}
    assert keys[1] != keys[8]


def test_the_cost_of_a_dynamic_graph_is_its_mean_cost_at_the_profile_points():
    from xflow.cost import AnalyticCost, GraphCoster
    from xflow.onnx_io import graph_from_model
    from xflow.optimize.costing import profile_cost

    source = load_source(dynamic_relu(), OptimizeOptions.of(shape_profile={"batch": (1, 8), "seq": (4,)}).inputs)
    dynamic = GraphCoster(profile_cost(AnalyticCost(), source.shapes)).cost(source.graph)
    at = [GraphCoster(AnalyticCost()).cost(graph_from_model(dynamic_relu((b, 4, 8)))) for b in (1, 8)]
    assert dynamic == pytest.approx(sum(at) / 2) and at[0] < at[1]


def test_derived_dims_through_a_shape_subgraph_come_from_symbolic_inference():
    """Shape -> Gather -> Mul -> Unsqueeze -> Concat -> Reshape: the reshaped value's dims are expressions
    over the inputs' symbols (ONNX's own inference leaves them unnamed)."""
    from xflow.onnx_io import graph_from_model

    def const(name, value):
        return onnx.numpy_helper.from_array(np.array(value, np.int64), name)

    nodes = [helper.make_node("Concat", ["x", "x"], ["c"], axis=1), helper.make_node("Shape", ["c"], ["s"]),
             helper.make_node("Gather", ["s", "i0"], ["b"], axis=0), helper.make_node("Gather", ["s", "i1"], ["q"]),
             helper.make_node("Mul", ["b", "q"], ["bq"]), helper.make_node("Unsqueeze", ["bq", "axis"], ["bq1"]),
             helper.make_node("Concat", ["bq1", "last"], ["target"], axis=0),
             helper.make_node("Reshape", ["c", "target"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [const("i0", 0), const("i1", 1), const("axis", [0]), const("last", [8])])
    ir = graph_from_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert ir.types["c"].shape == (batch, 2 * seq, 8)
    assert ir.types["y"].shape == (2 * batch * seq, 8)


def test_a_model_that_cannot_run_at_the_profile_says_which_sizes(tmp_path):
    """seq must be 4 here (a weight of 4 rows is added to it): the default seq=128 cannot run, and the run
    names the sizes it tried and the option that sets others, then copies the model."""
    from xflow.optimize import optimize_file

    model = dynamic_relu(("batch", "seq"))
    model.graph.node[0].output[0] = "r"
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.ones((1, 4), np.float32), "w"))
    model.graph.node.append(helper.make_node("Add", ["r", "w"], ["y"]))
    src = str(tmp_path / "m.onnx")
    onnx.save(model, src)
    said = []
    report = optimize_file(src, str(tmp_path / "o.onnx"), OptimizeOptions.of(cost="analytic"), say=said.append)
    assert report.copied
    assert any("at batch=1 seq=128; --shape-profile sets other sizes" in line for line in said), said


def test_symbolic_inference_writes_nothing(tmp_path, monkeypatch):
    """ORT's own infer_shapes saves sym_shape_infer_temp.onnx in the working directory when it cannot infer
    every value (here the output of an op of another domain): loading must leave the directory as it was."""
    from xflow.onnx_io import graph_from_model

    monkeypatch.chdir(tmp_path)
    graph = helper.make_graph([helper.make_node("Foo", ["x"], ["r"], domain="com.example"),
                               helper.make_node("Relu", ["x"], ["y"])],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("r", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    ir = graph_from_model(model)
    assert ir.types["y"].shape == (batch, 8)
    assert list(tmp_path.iterdir()) == []


def _transpose_model(dims) -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Transpose", ["x"], ["y"], perm=[1, 0, 2])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(dims))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [dims[1], dims[0], dims[2]])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("condition", ["dim(x, 0) == 1", "dim(x, 0) < 2", "not dim(x, 0) != 1",
                                       "shape(x)[0] in (1, 2)", "dim(x, 0) * dim(x, 1) == dim(x, 1)"])
def test_a_rule_that_holds_at_batch_1_only_does_not_match_a_dynamic_batch_graph(condition):
    """Swapping a dim of size 1 with another is a reshape; with a symbolic batch the condition is decided for
    every batch (false: no match), never at the first profile point, whatever form it is written in."""
    from xflow.onnx_io import graph_from_model
    from xflow.rewrite import find_matches
    from xflow.rules import rules_from_json

    (rule,) = rules_from_json([{
        "name": "transpose_of_a_unit_dim", "doc": "transpose(x) -> reshape(x) where the moved dim is 1",
        "inputs": {"x": "any"},
        "src": [{"op": "transpose", "in": ["x"], "out": ["y"], "attrs": {"perm": [1, 0, 2]}}],
        "dst": [{"op": "reshape", "in": ["x"], "out": ["z"],
                 "attrs": {"shape": "=(dim(x, 1), dim(x, 0), dim(x, 2))"}}],
        "outputs": {"y": "z"}, "where": [condition]}])
    static = graph_from_model(_transpose_model((1, 4, 8)))
    assert len(list(find_matches(static, rule))) == 1
    dynamic = graph_from_model(_transpose_model(("batch", 4, 8)))
    assert dynamic.nodes[0].op == "transpose" and dynamic.types["y"].shape == (4, batch, 8)
    assert list(find_matches(dynamic, rule)) == []
    source = load_source(_transpose_model(("batch", 4, 8)), OptimizeOptions.of().inputs)  # the profile's batch is 1
    assert list(find_matches(source.graph, rule)) == []


def _attention_heads(positions: bool) -> onnx.ModelProto:
    """x [batch, seq, 8] @ W, reshaped to 2 heads of 4 by a target computed from Shape(x) (Shape -> Gather ->
    Unsqueeze -> Concat, as a dynamic export writes it), then transposed to [batch, 2, seq, 4]. With
    ``positions``, a learned position table sliced to seq is added first (symbolic inference without merging
    cannot tell that slice's length is seq, and stops there)."""
    def const(name, value, dtype=np.int64):
        return onnx.numpy_helper.from_array(np.array(value, dtype), name)

    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "i0"], ["b"], axis=0), helper.make_node("Gather", ["s", "i1"], ["q"]),
             helper.make_node("Unsqueeze", ["b", "zero"], ["b1"]), helper.make_node("Unsqueeze", ["q", "zero"], ["q1"]),
             helper.make_node("Concat", ["b1", "q1", "heads"], ["target"], axis=0)]
    if positions:
        nodes += [helper.make_node("Slice", ["P", "zero", "q1", "one"], ["p"]),
                  helper.make_node("Add", ["m", "p"], ["h"])]
    nodes += [helper.make_node("Reshape", ["h" if positions else "m", "target"], ["r"]),
              helper.make_node("Transpose", ["r"], ["y"], perm=[0, 2, 1, 3])]
    inits = [const("W", rng.standard_normal((8, 8)), np.float32), const("i0", 0), const("i1", 1), const("zero", [0]),
             const("one", [1]), const("heads", [2, 4]), const("P", rng.standard_normal((1, 16, 8)), np.float32)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2, "seq", 4])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("positions", [False, True])
def test_head_reshapes_with_computed_targets_are_in_the_algebra(tmp_path, positions):
    """The reshape whose target a Shape chain computes, and the transpose after it, are op-table nodes with dims
    over the symbols; re-encoded, the reshape's target is a constant with 0 for the copied dims, and the model
    gives the original's outputs at other batches and lengths."""
    from xflow.onnx_io import graph_from_model, to_model_proto

    model = _attention_heads(positions)
    graph = graph_from_model(model)
    ops = {n.outputs[0]: n.op for n in graph.nodes}
    assert ops["r"] == "reshape" and ops["y"] == "transpose" and ops["m"] == "matmul"
    assert graph.types["y"].shape == (batch, 2, seq, 4)
    (reshape,) = [n for n in graph.nodes if n.op == "reshape"]
    assert reshape.inputs == ("h" if positions else "m",) and reshape.attrs["shape"] == (batch, seq, 2, 4)
    written = to_model_proto(graph, reuse_protos=False)
    onnx.checker.check_model(written)
    a, b = open_session(model), open_session(written)
    for shape in ((1, 5, 8), (3, 7, 8)):
        feeds = {"x": np.random.default_rng(1).standard_normal(shape).astype(np.float32)}
        np.testing.assert_allclose(a.run(None, feeds)[0], b.run(None, feeds)[0], rtol=1e-6, atol=1e-6)
