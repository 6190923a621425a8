"""Softmax probabilities scaled by 2**64 before the matmul reading them, the other operand by 2**-64
(rules/denormal-lifts.json): proved, written so that ONNX Runtime keeps the scale on the operand, left out of the
search (costs measured on random inputs cannot see its gain) and offered to the end-to-end timing instead."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from xflow.verifier import verify_rule

from xflow.cost import AnalyticCost, GraphCoster
from xflow.onnx_io import graph_from_model, to_model_proto
from xflow.optimize.denormal_probe import denormal_values
from xflow.optimize.finalize import finalists
from xflow.ort import Sessions, session_options
from xflow.rewrite import apply_match, find_matches
from xflow.rules import load_rules
from xflow.search import SearchReport, StopReason

RULES = os.path.join(os.path.dirname(__file__), "..", "rules", "denormal-lifts.json")
WINDOW = 49  # Swin's 7x7 windows


def _masked_attention(dtype: int = TensorProto.FLOAT, masked: float = -100.0) -> onnx.ModelProto:
    """Scores plus a window mask of 0 and ``masked`` (-100: Swin's shifted windows), softmax, times the values."""
    rng = np.random.default_rng(0)
    mask = np.where(rng.random((1, 1, WINDOW, WINDOW)) < 0.5, masked, 0.0)
    np.fill_diagonal(mask[0, 0], 0.0)
    shape = (2, 3, WINDOW, WINDOW)
    nodes = [helper.make_node("Add", ["s", "mask"], ["a"]), helper.make_node("Softmax", ["a"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    np_type = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    graph = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info("s", dtype, shape),
                                                   helper.make_tensor_value_info("v", dtype, (2, 3, WINDOW, 32))],
                              [helper.make_tensor_value_info("y", dtype, (2, 3, WINDOW, 32))],
                              [numpy_helper.from_array(mask.astype(np_type), "mask")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _feeds() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {"s": rng.uniform(-1, 1, (2, 3, WINDOW, WINDOW)).astype(np.float32),
            "v": rng.uniform(-1, 1, (2, 3, WINDOW, 32)).astype(np.float32)}


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), session_options(1), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def test_the_rule_is_proved_and_unequal_exponents_are_not() -> None:
    (rule,) = load_rules(RULES)
    assert verify_rule(rule).status == "proved"
    wrong = dataclasses.replace(rule, dst=tuple(
        dataclasses.replace(n, attrs={"exponent": -63}) if n.attrs.get("exponent") == -64 else n for n in rule.dst))
    assert verify_rule(wrong).status != "proved"
    assert rule.gain_in_values and rule.readable_name == "lift-denormals-before-matmul"


def test_the_lift_keeps_the_scale_on_the_probabilities_and_the_outputs() -> None:
    """The probabilities masked by -100 are float32 denormals; written, the upward scale is a Mul by a vector
    (ONNX Runtime would fold a scalar into the MatMul's alpha, leaving them denormal) and the downward one a
    scalar; the outputs are the original's bit for bit on these inputs."""
    model = _masked_attention()
    graph = graph_from_model(model)
    (rule,) = load_rules(RULES)
    lifted = apply_match(graph, next(find_matches(graph, rule)))
    assert lifted is not None
    written = to_model_proto(lifted)
    factors = sorted((float(f.flat[0]), f.size) for init in written.graph.initializer if init.name != "mask"
                     for f in [numpy_helper.to_array(init)])
    assert factors == [(2.0 ** -64, 1), (2.0 ** 64, WINDOW)]  # down: one element; up: one per probability column
    feeds = _feeds()
    probabilities = np.exp(feeds["s"] - 100.0 - feeds["s"].max()) / WINDOW
    assert ((probabilities > 0) & (probabilities < np.finfo(np.float32).tiny)).any()  # the case at hand
    assert (probabilities[probabilities > 0] * np.float32(2.0 ** 64) >= np.finfo(np.float32).tiny).all()
    np.testing.assert_array_equal(_run(written, feeds), _run(model, feeds))


def _finalists(model: onnx.ModelProto, measure: bool = True, probe=None) -> list:  # noqa: ANN001
    graph = graph_from_model(model)
    coster = GraphCoster(AnalyticCost())
    cost = coster.cost(graph)
    nothing = SearchReport(graph, cost, cost, (), StopReason.NO_RULES, 0, 0, 0.0)
    return finalists(nothing, measure, coster, load_rules(RULES), probe)


def test_finalize_offers_the_lift_to_the_end_to_end_timing() -> None:
    (lifted,) = _finalists(_masked_attention())
    assert sorted(n.op for n in lifted.simplified.graph.nodes).count("pow2_scale") == 2
    assert lifted.completed
    assert _finalists(_masked_attention(), measure=False) == []  # nothing would time it
    assert _finalists(_masked_attention(TensorProto.FLOAT16)) == []  # 2**64 overflows float16


def test_the_lift_goes_only_where_the_run_holds_denormals(tmp_path) -> None:  # noqa: ANN001
    """A run of the graph on the original's inputs tells which values hold denormals: the masked softmax's output
    does, the scores and values do not, and with a mask of -10 nothing does; finalize lifts only matches reading
    such a value (and all of them where nothing is known)."""
    sessions = Sessions(threads=1, scratch=str(tmp_path))
    graph = graph_from_model(_masked_attention())
    probabilities = next(n.outputs[0] for n in graph.nodes if n.op == "softmax")
    assert denormal_values(graph, [probabilities, "s", "v", "a"], _feeds(), sessions) == {probabilities}
    calm = graph_from_model(_masked_attention(masked=-10.0))
    assert denormal_values(calm, [probabilities, "s", "v"], _feeds(), sessions) == frozenset()
    assert _finalists(_masked_attention(), probe=lambda g, names: frozenset()) == []
    (lifted,) = _finalists(_masked_attention(), probe=lambda g, names: frozenset({probabilities}))
    assert lifted.completed
    assert len(_finalists(_masked_attention(), probe=lambda g, names: None)) == 1  # unknown: offered anyway


def test_optimize_says_which_values_hold_denormals(tmp_path) -> None:  # noqa: ANN001
    """The run that decides where to lift also tells the user: the report lists the values, the summary says so
    and points at ``xflow denormals``; on a mask of -10 it says nothing."""
    import json
    import subprocess
    import sys

    for masked, expected in ((-100.0, ["p"]), (-10.0, [])):
        onnx.save(_masked_attention(masked=masked), tmp_path / "m.onnx")
        run = subprocess.run([sys.executable, "-m", "xflow.cli", "optimize", str(tmp_path / "m.onnx"),
                              str(tmp_path / "out.onnx"), "--threads", "1", "--cost-db", str(tmp_path / "c.sqlite"),
                              "--report", str(tmp_path / "r.json")], capture_output=True, text=True, check=False,
                             timeout=300)
        assert run.returncode == 0, run.stderr
        assert json.loads((tmp_path / "r.json").read_text())["values_with_denormals"] == expected
        assert ("hold float denormals" in run.stdout) == bool(expected)
