"""Prove rules from the axioms with z3, and check them numerically."""

from __future__ import annotations

import time
from dataclasses import dataclass

import z3

from verifier.axioms import AXIOMS, Axiom, axiom_formulas
from verifier.encode import Unsupported, encode_rule
from verifier.numeric import NumericResult, numeric_check
from xflow.rules.model import Rule

__all__ = ["ProofResult", "VerifyResult", "NumericResult", "numeric_check", "prove_rule", "verify_rule"]


@dataclass(frozen=True)
class ProofResult:
    """Outcome of a z3 proof attempt: only ``proved`` means the rule follows from the axioms."""

    status: str  # "proved" | "refuted" | "unknown" | "unsupported"
    seconds: float
    reason: str = ""

    @property
    def proved(self) -> bool:
        return self.status == "proved"


@dataclass(frozen=True)
class VerifyResult:
    """A proof attempt and a numeric check together; ``status`` combines them."""

    status: str
    proof: ProofResult
    numeric: NumericResult

    @property
    def ok(self) -> bool:
        return self.status == "proved"


_FORMULAS: dict[tuple[str, ...], list[z3.BoolRef]] = {}


def _formulas(axioms: tuple[Axiom, ...]) -> list[z3.BoolRef]:
    key = tuple(a.name for a in axioms)
    if key not in _FORMULAS:
        _FORMULAS[key] = axiom_formulas(axioms)
    return _FORMULAS[key]


def make_solver(formulas: list[z3.BoolRef], mbqi: bool, timeout_ms: int) -> z3.Solver:
    """A solver holding the axioms: cheap E-matching only, or z3's default model-based instantiation."""
    solver = z3.Solver()
    if not mbqi:
        solver.set("auto_config", False)
        solver.set("smt.mbqi", False)
    solver.set("timeout", timeout_ms)
    solver.add(*formulas)
    return solver


def prove_rule(rule: Rule, timeout_ms: int = 10000, axioms: tuple[Axiom, ...] = AXIOMS) -> ProofResult:
    """Prove every mapped output of ``rule`` equal under the axioms and the rule's where conditions.

    For each output, ``src != dst`` must be unsat within ``timeout_ms`` (the budget is shared by all
    outputs). ``sat`` gives "refuted" (a model of the axioms where the rule fails: usually only a
    sign that an axiom is missing); ``unknown``/timeout gives "unknown": not proved.
    """
    start = time.monotonic()
    try:
        enc = encode_rule(rule)
    except Unsupported as exc:
        return ProofResult("unsupported", time.monotonic() - start, str(exc))
    formulas = _formulas(axioms)
    for s, d, src, dst in enc.goals:
        answer, solver = z3.unknown, None
        for mbqi in (False, True):  # cheap E-matching first, then model-based instantiation
            left_ms = int(timeout_ms - 1000 * (time.monotonic() - start))
            if left_ms <= 0:
                break
            # E-matching alone gets a quarter of what is left: given all of it, it could spend the budget
            # of later outputs and of model-based instantiation, so a longer timeout would prove less.
            phase_ms = left_ms if mbqi else max(min(left_ms, 200), left_ms // 4)
            solver = make_solver(formulas, mbqi, phase_ms)
            solver.add(*enc.hypotheses)
            solver.add(src != dst)
            answer = solver.check()
            if answer == z3.unsat or (answer == z3.sat and mbqi):
                break
        if solver is None:
            return ProofResult("unknown", time.monotonic() - start, f"timeout before output {s}")
        if answer == z3.sat:
            return ProofResult("refuted", time.monotonic() - start, f"output {s} -> {d}: z3 found a countermodel")
        if answer != z3.unsat:
            return ProofResult("unknown", time.monotonic() - start,
                               f"output {s} -> {d}: {solver.reason_unknown() or 'unknown'}")
    return ProofResult("proved", time.monotonic() - start, f"{len(enc.goals)} output(s) proved")


def verify_rule(rule: Rule, timeout_ms: int = 10000, trials: int = 3, seed: int = 0) -> VerifyResult:
    """Numeric check first (a counterexample refutes the rule whatever z3 says), then the proof."""
    numeric = numeric_check(rule, trials=trials, seed=seed)
    if numeric.trials_run and not numeric.ok:
        return VerifyResult("refuted", ProofResult("unknown", 0.0, "not attempted: numeric counterexample"),
                            numeric)
    proof = prove_rule(rule, timeout_ms)
    return VerifyResult(proof.status, proof, numeric)
