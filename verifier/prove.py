"""Prove rules from the axioms with z3, and check them numerically."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import z3

from verifier.axioms import AXIOMS, Axiom, axiom_formulas
from verifier.encode import Unsupported, encode_rule
from verifier.numeric import NumericResult, numeric_check
from xflow.rules.model import Rule

#: How long past its deadline a proof may run before the watchdog interrupts z3.
WATCHDOG_GRACE_S = 1.0

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
FIRST_ATTEMPT_MS = 100  # length of the first E-matching and model-based attempts; each round doubles it


def _formulas(axioms: tuple[Axiom, ...]) -> list[z3.BoolRef]:
    key = tuple(a.name for a in axioms)
    if key not in _FORMULAS:
        _FORMULAS[key] = axiom_formulas(axioms)
    return _FORMULAS[key]


def make_solver(formulas: list[z3.BoolRef], mbqi: bool, timeout_ms: int, ctx: z3.Context | None = None
                ) -> z3.Solver:
    """A solver holding the axioms: cheap E-matching only, or z3's default model-based instantiation."""
    solver = z3.Solver(ctx=ctx)
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
    # A fresh context per rule: z3's search depends on the terms its context already holds (their ids order
    # the instantiations), so in a shared context whether a rule is proved within the timeout would depend on
    # which rules were proved before it.
    ctx = z3.Context()
    # z3 overruns its own timeout in some quantifier searches (minutes on a 2 s budget at 4 ops): a watchdog
    # interrupts the context past the deadline, so the check returns "unknown" instead of hanging.
    watchdog = threading.Timer(timeout_ms / 1000 + WATCHDOG_GRACE_S, ctx.interrupt)
    watchdog.daemon = True
    watchdog.start()
    try:
        return _prove_goals(enc, ctx, axioms, start, timeout_ms)
    finally:
        watchdog.cancel()


def _prove_goals(enc: Any, ctx: Any, axioms: tuple[Axiom, ...], start: float, timeout_ms: int) -> ProofResult:
    formulas = [f.translate(ctx) for f in _formulas(axioms)]
    hypotheses = [h.translate(ctx) for h in enc.hypotheses]
    deadline = start + timeout_ms / 1000
    for index, (s, d, src, dst) in enumerate(enc.goals):
        # Each output gets an equal share of what is left, spent on attempts of doubling length that
        # alternate cheap E-matching and model-based instantiation. A longer timeout repeats the attempts
        # of a shorter one before trying longer ones, so it never proves less.
        goal_end = time.monotonic() + (deadline - time.monotonic()) / (len(enc.goals) - index)
        answer, solver, step_ms = z3.unknown, None, FIRST_ATTEMPT_MS
        differ = (src != dst).translate(ctx)
        while answer == z3.unknown:
            for mbqi in (False, True):
                left_ms = int(1000 * (goal_end - time.monotonic()))
                if left_ms <= 0:
                    break
                solver = make_solver(formulas, mbqi, min(step_ms, left_ms), ctx)
                solver.add(*hypotheses)
                solver.add(differ)
                try:
                    answer = solver.check()
                except z3.Z3Exception as exc:  # e.g. z3's memory limit in a verifier worker
                    return ProofResult("unknown", time.monotonic() - start, f"output {s} -> {d}: z3 failed: {exc}")
                if answer == z3.sat and not mbqi:
                    answer = z3.unknown  # E-matching alone does not instantiate enough to refute
                if answer != z3.unknown:
                    break
            if goal_end <= time.monotonic():
                break
            step_ms *= 2
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
