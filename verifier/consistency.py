"""Check that the axiom set does not collapse tensors (TASO's "concat is associative" trap)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import z3
from xflow.verifier.axioms import AXIOMS, Axiom, Z3Env, axiom_formulas, eval_z3
from xflow.verifier.encode import T
from xflow.verifier.prove import make_solver


@dataclass(frozen=True)
class ConsistencyResult:
    """``consistent`` is True when z3 could prove neither False nor ``x == y`` within the resource budget."""

    consistent: bool
    answers: dict[str, str]
    seconds: float


def probe_terms(axioms: tuple[Axiom, ...], tensors: tuple[z3.ExprRef, ...]) -> list[z3.ExprRef]:
    """Ground instances of every axiom's sides over the given tensors (so E-matching has terms to use):
    each axiom's tensor variables become those tensors in turn, its parameters shared Int constants."""
    out: list[z3.ExprRef] = []
    for a in axioms:
        for shift in range(len(tensors)):
            values: dict[str, Any] = {t: tensors[(i + shift) % len(tensors)] for i, t in enumerate(a.tensors)}
            values.update({p: z3.Int(f"probe_{p}") for p in a.params})
            env = Z3Env(values)
            for side in (a.lhs, a.rhs):
                term = eval_z3(side, env)
                if isinstance(term, z3.ExprRef) and term.sort() == T:
                    out.append(term)
    return out


def check_consistency(axioms: tuple[Axiom, ...] = AXIOMS, rlimit: int = 1_000_000) -> ConsistencyResult:
    """Ask z3 (1) whether the axioms alone are unsat and (2) whether they force two free tensors equal."""
    start = time.monotonic()
    formulas = axiom_formulas(axioms)
    answers: dict[str, str] = {}
    x, y = z3.Consts("cx cy", T)
    probes = probe_terms(axioms, (x, y))
    seen = z3.Function("probe", T, z3.BoolSort())
    seeded = [seen(t) for t in probes]
    for label, extra in (("false", []), ("x==y", [x != y])):
        for mbqi in (False, True):
            solver = make_solver(formulas, mbqi, rlimit)
            solver.add(*seeded)
            solver.add(*extra)
            answer = str(solver.check())
            answers[f"{label} ({'mbqi' if mbqi else 'e-matching'})"] = answer
            if answer == "unsat":
                break
    return ConsistencyResult(all(a != "unsat" for a in answers.values()), answers, time.monotonic() - start)
