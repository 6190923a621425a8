"""A standard-domain ``Constant`` node's value is a graph constant, as an initializer of the same value is (issue
#60: exporters write a norm's scalars as Constant nodes): the shipped RMSNorm rules fuse the legacy export's form
with them, the written model computes the same and its certificate checks; a model nothing rewrites is written
back byte for byte, its Constant nodes where they were."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

import xflow
from xflow.cli import main
from xflow.onnx_io import graph_from_model, to_model_proto
from xflow.onnx_io.load import check_proto
from xflow.ort import open_session

FLOAT = TensorProto.FLOAT
make = helper.make_node


def _const(name: str, value, form: str = "value") -> onnx.NodeProto:
    if form == "value":
        return make("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value, np.float32)))
    return make("Constant", [], [name], **{form: value})


def _legacy_norms(form: str = "value") -> onnx.ModelProto:
    """Two RMSNorms in transformers' legacy export form (Cast, Pow(·, 2), ReduceMean, Add(eps), Sqrt,
    Div(1, ·), Mul, Cast, Mul(w, ·)) on x [batch, 3, 8], the second on the first's output, their scalars
    Constant nodes as TorchScript writes them, each just before its reader; the epsilon one node both read."""
    nodes = [_const("eps", 1e-6, form)]
    for k in (1, 2):
        x = "x" if k == 1 else "y1"
        nodes += [make("Cast", [x], [f"xc{k}"], to=FLOAT), _const(f"two{k}", 2.0, form),
                  make("Pow", [f"xc{k}", f"two{k}"], [f"sq{k}"]),
                  make("ReduceMean", [f"sq{k}"], [f"ms{k}"], axes=[-1]),
                  make("Add", [f"ms{k}", "eps"], [f"mse{k}"]), make("Sqrt", [f"mse{k}"], [f"rms{k}"]),
                  _const(f"one{k}", 1.0, form), make("Div", [f"one{k}", f"rms{k}"], [f"inv{k}"]),
                  make("Mul", [f"xc{k}", f"inv{k}"], [f"n{k}"]), make("Cast", [f"n{k}"], [f"nc{k}"], to=FLOAT),
                  make("Mul", [f"w{k}", f"nc{k}"], [f"y{k}"])]
    weights = [numpy_helper.from_array(np.linspace(0.5, 1.5 * k, 8).astype(np.float32), f"w{k}") for k in (1, 2)]
    graph = helper.make_graph(nodes, "norms", [helper.make_tensor_value_info("x", FLOAT, ["batch", 3, 8])],
                              [helper.make_tensor_value_info("y2", FLOAT, ["batch", 3, 8])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("form", ["value", "value_float"])
def test_constant_node_scalars_are_constants_to_the_rules(form: str) -> None:
    graph = graph_from_model(_legacy_norms(form))
    assert not any(n.onnx_type == "Constant" for n in graph.nodes)
    for name in ("eps", "two1", "one1", "two2", "one2"):
        assert graph.is_constant(name) and graph.constants[name].value() in np.float32([1e-6, 2.0, 1.0])
        assert graph.constants[name].type.shape == ()


@pytest.fixture(scope="module")
def fused_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("constnodes")
    src, out = str(folder / "norms.onnx"), str(folder / "out.onnx")
    onnx.save(_legacy_norms(), src)
    onnx.save(xflow.optimize(src, cost="analytic", keep_if_slower=True, budget=20), out)
    return src, out


def test_the_legacy_norms_fuse_and_compute_the_same(fused_run) -> None:
    src, out = fused_run
    written = onnx.load(out)
    check_proto(written, out)
    ops = [n.op_type for n in written.graph.node]
    assert ops.count("SimplifiedLayerNormalization") == 2
    assert not {"Pow", "ReduceMean", "Sqrt", "Div"} & set(ops)
    assert "Constant" not in ops  # nothing reads the scalars any more: neither nodes nor initializers are left
    assert {t.name for t in written.graph.initializer} == {"w1", "w2"}
    x = np.random.default_rng(0).standard_normal((2, 3, 8)).astype(np.float32)
    want = open_session(onnx.load(src).SerializeToString(), "cpu", 1).run(None, {"x": x})[0]
    got = open_session(written.SerializeToString(), "cpu", 1).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_the_fused_model_checks(fused_run) -> None:
    src, out = fused_run
    result = CliRunner().invoke(main, ["check", src, out], catch_exceptions=False)
    assert result.exit_code == 0, result.output


def test_a_constant_node_still_read_is_written_back_as_the_node() -> None:
    """One norm fused, the other not: the epsilon the unfused one still reads stays its Constant node, before it."""
    from xflow.rewrite import apply_match, find_matches
    from xflow.rules import load_rules

    model = _legacy_norms()
    graph = graph_from_model(model)
    rules = load_rules(str(Path(__file__).resolve().parents[1] / "rules" / "rmsnorm.json"))
    first = next(m for r in rules for m in find_matches(graph, r) if any("y1" in n.outputs for n in m.nodes))
    written = to_model_proto(apply_match(graph, first))
    check_proto(written, "written")
    ops = [n.op_type for n in written.graph.node]
    assert ops.count("SimplifiedLayerNormalization") == 1 and ops.count("Pow") == 1
    constants = [n for n in written.graph.node if n.op_type == "Constant"]
    assert sorted(n.output[0] for n in constants) == ["eps", "one2", "two2"]
    assert all(n in model.graph.node for n in constants)  # the very nodes, not initializers
    assert not {t.name for t in written.graph.initializer} & {"eps", "one2", "two2"}
    x = np.random.default_rng(1).standard_normal((1, 3, 8)).astype(np.float32)
    want = open_session(model.SerializeToString(), "cpu", 1).run(None, {"x": x})[0]
    got = open_session(written.SerializeToString(), "cpu", 1).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_rewritten_model_writes_its_constant_nodes_as_initializers(tmp_path) -> None:
    """A rewritten model is written as onnxsim and onnxslim write one: a Constant node still read after the
    rewrites (a scale after the second norm) becomes an initializer of the same name and value; the model
    computes the same, keeps its interface and checks; the report counts no Constant node after."""
    model = _legacy_norms()
    model.graph.node.extend([_const("scale", 0.5), make("Mul", ["y2", "scale"], ["z"])])
    model.graph.output[0].name = "z"
    src, out = str(tmp_path / "in.onnx"), str(tmp_path / "out.onnx")
    onnx.save(model, src)
    result = CliRunner().invoke(main, ["optimize", src, out, "--cost", "analytic", "--keep-if-slower",
                                       "--report", str(tmp_path / "r.json")], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    written = onnx.load(out)
    assert "Constant" not in [n.op_type for n in written.graph.node]
    scale = {t.name: t for t in written.graph.initializer}["scale"]
    assert numpy_helper.to_array(scale).tolist() == 0.5
    assert [o.name for o in written.graph.output] == ["z"] and written.graph.input == model.graph.input
    x = np.random.default_rng(2).standard_normal((2, 3, 8)).astype(np.float32)
    want = open_session(model.SerializeToString(), "cpu", 1).run(None, {"x": x})[0]
    got = open_session(written.SerializeToString(), "cpu", 1).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    checked = CliRunner().invoke(main, ["check", src, out], catch_exceptions=False)
    assert checked.exit_code == 0, checked.output


def _constants_everywhere() -> onnx.ModelProto:
    """Constant nodes in each form, read and unread, one a graph output, one read only inside an If's branch,
    one inside the branch, with value_info for some; a Reshape whose shape is a Constant node."""
    branch = helper.make_graph([make("Constant", [], ["inner"], value_float=3.0),
                                make("Mul", ["captured", "inner"], ["t"]), make("Mul", ["r", "t"], ["b_out"])],
                               "then", [],
                               [helper.make_tensor_value_info("b_out", FLOAT, [2, 3])])
    other = helper.make_graph([make("Identity", ["r"], ["e_out"])], "else", [],
                              [helper.make_tensor_value_info("e_out", FLOAT, [2, 3])])
    nodes = [_const("unread", 7.0), make("Relu", ["x"], ["r"]), _const("half", 0.5),
             make("Mul", ["r", "half"], ["m"]), make("Constant", [], ["k"], value_floats=[1.0, 2.0, 3.0]),
             make("Add", ["m", "k"], ["a"]), make("Constant", [], ["shape"], value_ints=[3, 2]),
             make("Reshape", ["a", "shape"], ["rs"]), make("Constant", [], ["captured"], value_float=2.0),
             make("If", ["c"], ["br"], then_branch=branch, else_branch=other),
             make("Constant", [], ["out_const"], value_int=5), make("Sigmoid", ["rs"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", FLOAT, [2, 3]),
                                           helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", FLOAT, [3, 2]),
                               helper.make_tensor_value_info("br", FLOAT, [2, 3]),
                               helper.make_tensor_value_info("out_const", TensorProto.INT64, [])],
                              value_info=[helper.make_tensor_value_info("half", FLOAT, []),
                                          helper.make_tensor_value_info("m", FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("reuse_protos", [True, False])
def test_a_model_nothing_rewrites_round_trips(reuse_protos: bool) -> None:
    model = _constants_everywhere()
    graph = graph_from_model(model)
    for name in ("half", "k", "captured"):
        assert graph.is_constant(name)
    # unread, a graph output: still nodes (an unread constant would not be written back)
    assert {n.outputs[0] for n in graph.nodes if n.onnx_type == "Constant"} == {"unread", "out_const"}
    written = to_model_proto(graph, reuse_protos=reuse_protos)
    if reuse_protos:
        assert written.SerializeToString() == model.SerializeToString()
    else:  # op-table nodes encoded anew (the Reshape's target now its encoder's): the other Constant nodes at
        # their places
        kept = [n for n in model.graph.node if n.output[0] != "shape"]
        assert [n.op_type for n in written.graph.node] == [n.op_type for n in kept]
        assert [n for n in written.graph.node if n.op_type == "Constant"] == \
            [n for n in kept if n.op_type == "Constant"]
    onnx.checker.check_model(written, full_check=True)
    feeds = {"x": np.arange(-3, 3, dtype=np.float32).reshape(2, 3), "c": np.array(True)}
    want = open_session(model.SerializeToString(), "cpu", 1).run(None, feeds)
    got = open_session(written.SerializeToString(), "cpu", 1).run(None, feeds)
    for a, b in zip(want, got, strict=True):
        np.testing.assert_array_equal(a, b)
