"""Conformance: ``xflow optimize`` on every ONNX node-test-suite case that ONNX Runtime can run.

Each case's model is written to a file and put through the optimize pipeline (``optimize_file``:
load, search with the shipped rules or, while none are shipped, the engine test rules, fold, ORT
equivalence check, save) with analytic costs and timing off. The written model is run in ORT on the
suite's inputs and compared with the suite's expected outputs, with the suite's tolerances. A case
whose original model passes must pass after optimization; a refusal (a one-line XflowError, nothing
written) is allowed only where the model itself is the problem, never for a rewrite found unequal.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import pytest

from tests.rulebook import CONCAT_SPLIT_CANCEL, CONV_RELU_FOLD, MATMUL_MERGE, SPLIT_SPLIT_MERGE
from tests.test_node_suite import run_ort, suite
from xflow.equivalence import EquivalenceError
from xflow.errors import XflowError
from xflow.optimize import OptimizeOptions, optimize_file
from xflow.rules import default_rules_path, load_rules

pytestmark = pytest.mark.slow
PIPELINE = importlib.import_module("xflow.optimize.search")

MIN_CASES = 1000
MIN_REWRITTEN = 1  # with the shipped rules (1 of 1,526 cases on 2026-11-23)


@dataclass
class Outcome:
    """What happened to one case."""

    original_passes: bool
    optimized_passes: bool | None  # None: refused (nothing written)
    rewritten: bool
    problem: str = ""


def rules_file(tmp_dir: str) -> str:
    """The shipped rules when they exist, else the engine test rules written to a file."""
    shipped = default_rules_path()
    if shipped.exists():
        return str(shipped)
    path = os.path.join(tmp_dir, "rulebook.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"format": "xflow.rules/1",
                   "rules": [MATMUL_MERGE, CONV_RELU_FOLD, CONCAT_SPLIT_CANCEL, SPLIT_SPLIT_MERGE]}, f)
    return path


def suite_expected() -> dict[str, tuple[list[Any], float, float]]:
    """The suite's own expected outputs and tolerances, by case name."""
    from onnx.backend.test import loader

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = loader.load_node_model_tests()
    return {c.name: (list(c.data_sets[0][1]), c.rtol, c.atol) for c in cases if c.data_sets}


def agrees(expected: Any, got: Any, rtol: float, atol: float) -> bool:
    """Outputs equal within the suite's tolerance (sequences element-wise, NaN equal to NaN)."""
    if isinstance(expected, list | tuple):
        return (isinstance(got, list | tuple) and len(got) == len(expected)
                and all(agrees(e, g, rtol, atol) for e, g in zip(expected, got, strict=True)))
    if expected is None or got is None:
        return expected is got
    e, g = np.asarray(expected), np.asarray(got)
    if e.shape != g.shape:
        return False
    if e.dtype.kind in "fc" and g.dtype.kind in "fc":
        return bool(np.allclose(g.astype(np.float64), e.astype(np.float64), rtol=rtol, atol=atol, equal_nan=True))
    return bool(np.array_equal(e, g))


def all_agree(expected: list[Any], got: list[Any], rtol: float, atol: float) -> bool:
    return len(expected) == len(got) and all(agrees(e, g, rtol, atol) for e, g in zip(expected, got, strict=True))


def run_case(case: Any, expected: list[Any], rtol: float, atol: float, rules: str, tmp_dir: str) -> Outcome:
    src = os.path.join(tmp_dir, f"{case.name}.onnx")
    out = os.path.join(tmp_dir, f"{case.name}.out.onnx")
    onnx.save(case.model, src)
    before = open(src, "rb").read()
    outcome = Outcome(all_agree(expected, case.expected, rtol, atol), None, False)
    options = OptimizeOptions.of(rules_path=rules, budget=50, time_limit=600.0, cost="analytic", measure=False,
                              verify=True)  # no time limit: under load it would cut the searches short
    try:
        report = optimize_file(src, out, options, say=lambda _m: None)
    except EquivalenceError as exc:
        outcome.problem = f"refused as not equivalent: {exc}"
        return outcome
    except XflowError as exc:
        outcome.problem = f"refused: {exc}"
        return outcome
    finally:
        if open(src, "rb").read() != before:
            outcome.problem = "input file changed"
    outcome.rewritten = report.decision == "optimized"
    try:
        got = run_ort(onnx.load(out), case.feeds)
    except Exception as exc:  # noqa: BLE001 - ORT refusing the written model is the failure reported
        outcome.optimized_passes = False
        outcome.problem = f"ORT cannot run the optimized model: {str(exc).splitlines()[0][:200]}"
        return outcome
    outcome.optimized_passes = all_agree(expected, got, rtol, atol)
    if not outcome.optimized_passes:
        outcome.problem = "outputs differ from the suite's expected outputs"
    return outcome


def test_optimize_keeps_every_node_suite_case_passing(tmp_path, monkeypatch):
    monkeypatch.setattr(PIPELINE, "load_rules", functools.cache(load_rules))  # parsed once, not per case
    cases, counts = suite()
    expected = suite_expected()
    rules = rules_file(str(tmp_path))
    outcomes: dict[str, Outcome] = {}
    for case in cases:
        exp, rtol, atol = expected[case.name]
        try:
            outcomes[case.name] = run_case(case, exp, rtol, atol, rules, str(tmp_path))
        except Exception as exc:  # a crash is a failure of that case, reported with the others
            outcomes[case.name] = Outcome(True, False, False, f"crash: {type(exc).__name__}: {exc}")
        for leftover in os.listdir(tmp_path):
            if leftover.startswith(".") or leftover.endswith(".xflow-tmp"):
                outcomes[case.name].problem += f"; left {leftover}"
        for name in (f"{case.name}.onnx", f"{case.name}.out.onnx", f"{case.name}.out.onnx.data"):
            if os.path.exists(tmp_path / name):
                os.remove(tmp_path / name)
    passing = [n for n, o in outcomes.items() if o.original_passes]
    failures = [f"{n}: {o.problem}" for n, o in outcomes.items()
                if (o.original_passes and o.optimized_passes is False) or "crash" in o.problem
                or "not equivalent" in o.problem or "left " in o.problem or "input file changed" in o.problem]
    refused = [f"{n}: {o.problem}" for n, o in outcomes.items() if o.optimized_passes is None]
    rewritten = sum(o.rewritten for o in outcomes.values())
    after = sum(bool(o.optimized_passes) for n, o in outcomes.items() if o.original_passes)
    print(f"\nconformance ({os.path.basename(rules)}): {len(cases)} cases ORT runs, {len(passing)} pass on the "
          f"original, {after} pass after optimize, {rewritten} rewritten, {len(refused)} refused, "
          f"{len(failures)} failures; suite counts {counts}")
    for line in refused:
        print("  refused", line)
    assert not failures, f"{len(failures)} cases fail after optimize:\n" + "\n".join(failures)
    assert len(cases) >= MIN_CASES
    # Every case ORT runs must go through optimize: a refusal of a valid model is a failure too.
    assert not refused, f"{len(refused)} valid models refused:\n" + "\n".join(refused)
    # Single-node models leave the rules little to match, but some must be rewritten and still pass.
    assert rewritten >= MIN_REWRITTEN, rewritten
