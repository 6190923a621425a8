"""The decoder block's fusions (issue #60): RMSNorm as transformers' Llama exports write it, proved into
SimplifiedLayerNormalization with its epsilon read from the constant the export adds (``value(e)``), and the zoo's
Llama decoder optimized with the shipped rules: fused, equal outputs at decode and prefill sizes, a certificate
that checks."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper
from xflow.verifier import AXIOMS, prove_rule, verify_rule

import xflow
from xflow.cli import main
from xflow.errors import XflowError
from xflow.onnx_io import graph_from_model, read_model
from xflow.ort import open_session
from xflow.rewrite import find_matches
from xflow.rules import load_rules, rules_from_json
from xflow.rules.expr import Expr, ExprError, ShapeEnv
from xflow.zoo.decoder import DecoderConfig, decoder_feeds, llama_decoder

RULES = Path(__file__).resolve().parents[1] / "rules"


def _rms_rules():
    return load_rules(str(RULES / "rmsnorm.json"))


def _form(rules, op: str):
    return next(r for r in rules if any(n.op == op for n in r.src))


def test_the_rules_are_shipped_and_proved_from_the_definition() -> None:
    rules = _rms_rules()
    assert len(rules) == 6  # reciprocal, div, div of one: each with and without the cast back
    shipped = {r.name for r in load_rules(str(RULES / "default.json"))}
    without = tuple(a for a in AXIOMS if not a.name.startswith("rmsnorm_def"))
    for rule in rules:
        assert rule.name in shipped
        assert verify_rule(rule).status == "proved", rule.doc
        assert prove_rule(rule, rlimit=200_000, axioms=without).status != "proved", rule.doc


def _changed(change: str):
    raw = copy.deepcopy(next(r for r in _rms_rules() if any(n.op == "reciprocal" for n in r.src)
                             and not any(n.op == "cast" for n in r.src)).to_json())
    fused = raw["dst"][-1]
    if change == "epsilon literal":
        fused["attrs"]["epsilon"] = 1e-5
    elif change == "no square":
        next(n for n in raw["src"] if n["op"] == "pow")["attrs"]["exponent"] = 3.0
    elif change == "mean over the first axis":
        raw["where"] = ["ax == (0,)", "rank(e) == 0"]
    elif change == "scale dropped":
        raw["src"][-1]["op"] = "add"
    (changed,) = rules_from_json([raw])
    return changed


@pytest.mark.parametrize("change", ["epsilon literal", "no square", "mean over the first axis", "scale dropped"])
def test_a_changed_rmsnorm_is_not_proved(change: str) -> None:
    assert verify_rule(_changed(change)).status != "proved"


@pytest.mark.parametrize("change", ["a two for the one", "a cast to another type"])
def test_a_changed_legacy_rmsnorm_is_not_proved(change: str) -> None:
    raw = copy.deepcopy(next(r for r in _rms_rules() if any(n.op == "cast" for n in r.src)
                             and "o" in r.inputs).to_json())
    if change == "a two for the one":
        raw["where"] = [w.replace("value(o) == 1", "value(o) == 2") for w in raw["where"]]
    else:
        raw["where"] = [w for w in raw["where"] if not w.startswith("dtype(")]
    (changed,) = rules_from_json([raw])
    assert prove_rule(changed, rlimit=200_000).status != "proved"


def test_value_reads_one_float_and_nothing_else() -> None:
    expr = Expr("value(e)")
    assert expr.valued == {"e"} and expr.tensors == {"e"}
    assert expr.evaluate(ShapeEnv({}, {}, {"e": np.array(1e-6, np.float32)})) == 1e-6
    for bad in (np.ones(2, np.float32), np.array(3, np.int64)):
        with pytest.raises(ExprError):
            expr.evaluate(ShapeEnv({}, {}, {"e": bad}))
    with pytest.raises(ExprError):  # no constant bound to it
        expr.evaluate(ShapeEnv({}, {}, {}))
    with pytest.raises(ExprError):
        Expr("value(e, 1)").tree  # noqa: B018 - parsing is the check


def _norm_model(eps_as_input: bool = False, eps_shape: tuple[int, ...] = (), legacy: bool = False,
                one: float = 1.0) -> onnx.ModelProto:
    """Llama's RMSNorm on x [batch, 3, 8] as the zoo writes it, or (``legacy``) as transformers' legacy export
    does: a Cast to float first, torch's rsqrt as Div(1, Sqrt), a Cast back before the weight (its scalars as
    initializers: the export's Constant nodes are no constants to a rule yet)."""
    make = helper.make_node
    if legacy:
        nodes = [make("Cast", ["x"], ["xc"], to=TensorProto.FLOAT), make("Pow", ["xc", "two"], ["sq"]),
                 make("ReduceMean", ["sq"], ["ms"], axes=[-1]),
                 make("Add", ["ms", "eps"], ["mse"]), make("Sqrt", ["mse"], ["rms"]),
                 make("Div", ["one", "rms"], ["inv"]), make("Mul", ["xc", "inv"], ["n"]),
                 make("Cast", ["n"], ["nc"], to=TensorProto.FLOAT), make("Mul", ["w", "nc"], ["y"])]
    else:
        nodes = [make("Pow", ["x", "two"], ["sq"]), make("ReduceMean", ["sq"], ["ms"], axes=[-1]),
                 make("Add", ["ms", "eps"], ["mse"]), make("Sqrt", ["mse"], ["rms"]),
                 make("Reciprocal", ["rms"], ["inv"]), make("Mul", ["x", "inv"], ["n"]), make("Mul", ["w", "n"], ["y"])]
    inits = [numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.linspace(0.5, 1.5, 8).astype(np.float32), "w"),
             *([numpy_helper.from_array(np.array(one, np.float32), "one")] if legacy else [])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8])]
    if eps_as_input:
        inputs.append(helper.make_tensor_value_info("eps", TensorProto.FLOAT, list(eps_shape)))
    else:
        inits.append(numpy_helper.from_array(np.full(eps_shape, 1e-6, np.float32), "eps"))
    graph = helper.make_graph(nodes, "rms", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                                   ["batch", 3, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _matches(model: onnx.ModelProto) -> list:
    graph = graph_from_model(model)
    return [m for r in _rms_rules() for m in find_matches(graph, r)]


def test_the_epsilon_comes_from_the_constant() -> None:
    (match,) = _matches(_norm_model())
    assert match.dst_attrs[-1]["epsilon"] == 1e-6 and match.dst_attrs[-1]["axis"] == 2


def test_the_legacy_exports_form_is_fused_and_computes_the_same() -> None:
    from xflow.onnx_io import to_model_proto
    from xflow.rewrite import apply_match

    model = _norm_model(legacy=True)
    graph = graph_from_model(model)
    (match,) = [m for r in _rms_rules() for m in find_matches(graph, r)]
    fused = to_model_proto(apply_match(graph, match))
    assert [n.op_type for n in fused.graph.node] == ["Cast", "SimplifiedLayerNormalization"]
    x = np.random.default_rng(0).standard_normal((2, 3, 8)).astype(np.float32)
    want = open_session(model.SerializeToString(), "cpu", 1).run(None, {"x": x})[0]
    got = open_session(fused.SerializeToString(), "cpu", 1).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert _matches(_norm_model(legacy=True, one=2.0)) == []  # Div(2, ·) is not the reciprocal


@pytest.mark.parametrize(("as_input", "shape"), [(True, ()), (False, (1,)), (False, (8,))])
def test_an_epsilon_fed_at_run_time_or_not_a_scalar_is_not_fused(as_input: bool, shape: tuple[int, ...]) -> None:
    assert _matches(_norm_model(as_input, shape)) == []


# ---- the zoo's Llama decoder ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama_run(tmp_path_factory):
    """The zoo's Llama decoder (2 layers) optimized with the shipped rules (analytic costs, written even where
    it does not measure faster: what is checked here is the rewrite, not the timing)."""
    folder = tmp_path_factory.mktemp("llama")
    src = str(folder / "llama.onnx")
    onnx.save(llama_decoder(DecoderConfig(layers=2), seed=0), src)
    out = folder / "out.onnx"
    onnx.save(xflow.optimize(src, cost="analytic", keep_if_slower=True, budget=30), str(out))
    return src, str(out)


def test_the_decoder_norms_are_fused(llama_run) -> None:
    src, out = llama_run
    ops = [n.op_type for n in onnx.load(out).graph.node]
    assert ops.count("SimplifiedLayerNormalization") == 5  # two per layer and the final one
    assert "ReduceMean" not in ops and "Reciprocal" not in ops and "Pow" not in ops
    original, written = onnx.load(src), onnx.load(out)
    assert [(i.name, i.type) for i in written.graph.input] == [(i.name, i.type) for i in original.graph.input]
    assert [(o.name, o.type) for o in written.graph.output] == [(o.name, o.type) for o in original.graph.output]


@pytest.mark.parametrize(("batch", "seq", "past"), [(1, 1, 127), (4, 1, 127), (1, 1, 1), (4, 1, 1), (1, 8, 0),
                                                    (4, 8, 0)])
def test_the_fused_decoder_computes_what_the_original_does(llama_run, batch: int, seq: int, past: int) -> None:
    src, out = llama_run
    feeds = decoder_feeds(onnx.load(src), batch, seq, past, seed=batch + past)
    before = open_session(onnx.load(src).SerializeToString(), "cpu", 1).run(None, feeds)
    after = open_session(onnx.load(out).SerializeToString(), "cpu", 1).run(None, feeds)
    for a, b in zip(before, after, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)


def test_the_fused_decoder_checks(llama_run) -> None:
    """``xflow check IN OUT``: every step re-established and every rule re-proved."""
    src, out = llama_run
    result = CliRunner().invoke(main, ["check", src, out], catch_exceptions=False)
    assert result.exit_code == 0, result.output


def test_a_model_holding_simplified_layer_normalization_is_read(tmp_path) -> None:
    """ONNX Runtime registers SimplifiedLayerNormalization in the standard domain, which ONNX's checker does not
    know: a model holding it (xflow's own output) is read, and still checked otherwise."""
    model = _norm_model()
    fused = helper.make_graph([helper.make_node("SimplifiedLayerNormalization", ["x", "w"], ["y"], axis=-1,
                                                epsilon=1e-6)], "rms", list(model.graph.input),
                              list(model.graph.output), [i for i in model.graph.initializer if i.name == "w"])
    path = str(tmp_path / "fused.onnx")
    onnx.save(helper.make_model(fused, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    assert read_model(path).graph.node[0].op_type == "SimplifiedLayerNormalization"
    broken = helper.make_graph([*fused.node, helper.make_node("Relu", ["nowhere"], ["z"])], "rms",
                               list(fused.input), list(fused.output), list(fused.initializer))
    onnx.save(helper.make_model(broken, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    with pytest.raises(XflowError, match="invalid ONNX model"):
        read_model(path)



# ---- rotary ----------------------------------------------------------------------------------------------------


def _rotary_candidates() -> dict:
    import json
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "rot.json")
        subprocess.run([sys.executable, str(RULES.parent / "benchmarks" / "fusion_candidates.py"), "--rotaries",
                        "--out", out], check=True, capture_output=True, cwd=RULES.parent,
                       env={**os.environ, "PYTHONPATH": str(RULES.parent)})
        raw = json.loads(Path(out).read_text())["candidates"]
    return {c["name"]: rule for c, rule in zip(raw, rules_from_json(raw), strict=True)}


def test_rotary_with_halved_tables_is_proved_and_the_zoos_tables_are_refuted() -> None:
    (rule,) = load_rules(str(RULES / "rotary.json"))
    assert verify_rule(rule).status == "proved"
    without = tuple(a for a in AXIOMS if a.name != "rotary_def")
    assert prove_rule(rule, rlimit=200_000, axioms=without).status != "proved"
    # each table one constant of the head's width (the legacy export, the zoo): true only where its halves are
    # equal, which no rule condition can state
    assert verify_rule(_rotary_candidates()["fuse_rotary_tables"]).status == "refuted"


def _rotary_model(batch: int = 2, heads: int = 3, seq: int = 4, size: int = 8, rows: int = 16) -> onnx.ModelProto:
    """Rotate-half rotary over tables written as concat(cache, cache), static dims."""
    make, half = helper.make_node, size // 2
    rng = np.random.default_rng(0)
    ints = {"zero": [0], "half": [half], "end": [np.iinfo(np.int64).max], "last": [-1], "one": [1], "axis1": [1]}
    inits = [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in ints.items()]
    inits += [numpy_helper.from_array(rng.standard_normal((rows, half)).astype(np.float32), n) for n in ("c", "s")]
    nodes = [make("Concat", ["c", "c"], ["tc"], axis=1), make("Concat", ["s", "s"], ["ts"], axis=1),
             make("Gather", ["tc", "pos"], ["gc"], axis=0), make("Unsqueeze", ["gc", "axis1"], ["cos"]),
             make("Gather", ["ts", "pos"], ["gs"], axis=0), make("Unsqueeze", ["gs", "axis1"], ["sin"]),
             make("Slice", ["x", "zero", "half", "last", "one"], ["x1"]),
             make("Slice", ["x", "half", "end", "last", "one"], ["x2"]), make("Neg", ["x2"], ["nx2"]),
             make("Concat", ["nx2", "x1"], ["rot"], axis=-1), make("Mul", ["x", "cos"], ["xc"]),
             make("Mul", ["rot", "sin"], ["rs"]), make("Add", ["xc", "rs"], ["y"])]
    graph = helper.make_graph(nodes, "rotary", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, heads, seq, size]),
        helper.make_tensor_value_info("pos", TensorProto.INT64, [batch, seq])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, heads, seq, size])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_rotary_over_halved_tables_becomes_one_rotaryembedding() -> None:
    from xflow.onnx_io import to_model_proto
    from xflow.rewrite import apply_match

    model = _rotary_model()
    graph = graph_from_model(model)
    (rule,) = load_rules(str(RULES / "rotary.json"))
    (match,) = find_matches(graph, rule)
    fused = to_model_proto(apply_match(graph, match))
    assert [n.op_type for n in fused.graph.node if n.op_type not in ("Concat",)] == ["RotaryEmbedding"]
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal((2, 3, 4, 8)).astype(np.float32),
             "pos": rng.integers(0, 16, size=(2, 4)).astype(np.int64)}
    got = open_session(fused.SerializeToString(), "cpu", 1).run(None, feeds)[0]
    want = open_session(model.SerializeToString(), "cpu", 1).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
