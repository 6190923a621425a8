"""Prove rules from the axioms with z3, and check them numerically.

A proof's budget is a z3 resource limit (``rlimit``): z3 counts its own steps, so the same rule and budget
give the same answer and the same count on a quiet machine or a loaded one, on 2 cores or 64. A wall-clock
guard stays only as a last resort against a z3 search that stops checking its limit; when it fires the status
is "timeout", never "unknown", so a load-dependent answer is visible as such.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import z3
from xflow.verifier.axioms import AXIOMS, Axiom, axiom_formulas
from xflow.verifier.encode import Unsupported, encode_rule
from xflow.verifier.numeric import NumericResult, numeric_check
from xflow.verifier.relevance import axioms_for
from xflow.verifier.status import OutcomeStatus

from xflow.rules.model import Rule

#: z3 resource units for one rule (all its outputs together), when the caller does not say. Every shipped rule
#: proves within 6.6 million (98% within 1 million); one spent budget is a few seconds to minutes of z3 (z3
#: slows down as a context's history grows, so units are not seconds).
DEFAULT_RLIMIT = 10_000_000
#: z3 resource units for one candidate in ``xflow generate-rules``: what the proofs of the <= 2-op candidates need
#: (in a sample of 667, 98% under 100 thousand and the median 7 thousand; one of 493 needs more). A candidate
#: the axioms cannot prove spends its whole budget, and at the shipped-file budget those candidates took the run's
#: whole time; a rule file is re-verified (``verify-rules``) at ``DEFAULT_RLIMIT``.
GENERATION_RLIMIT = 150_000
#: Resource units of the first E-matching and model-based attempts; each round doubles them.
FIRST_ATTEMPT_RLIMIT = 100_000
#: The last-resort wall-clock guard of one rule, in seconds (None: no guard).
DEFAULT_GUARD_S = 1200.0

__all__ = ["DEFAULT_GUARD_S", "DEFAULT_RLIMIT", "GENERATION_RLIMIT", "NumericResult", "ProofResult", "VerifyResult",
           "numeric_check", "prove_rule", "vacuous", "verify_rule"]


@dataclass(frozen=True)
class ProofResult:
    """Outcome of a z3 proof attempt: only ``proved`` means the rule follows from the axioms.

    ``status`` (an ``OutcomeStatus``) is "proved", "refuted" (z3 found a model of the axioms where the rule
    fails), "unknown" (the resource budget ran out, or z3 gave up: deterministic), "timeout" (the wall-clock guard
    stopped z3: depends on the machine) or "unsupported" (the rule cannot be encoded). ``rlimit_used`` is the resource
    count z3 spent, the same on every machine."""

    status: OutcomeStatus
    seconds: float
    reason: str = ""
    rlimit_used: int = 0

    @property
    def proved(self) -> bool:
        return self.status == OutcomeStatus.PROVED


@dataclass(frozen=True)
class VerifyResult:
    """A proof attempt and a numeric check together; ``status`` combines them."""

    status: OutcomeStatus
    proof: ProofResult
    numeric: NumericResult

    @property
    def ok(self) -> bool:
        return self.status == OutcomeStatus.PROVED


_FORMULAS: dict[str, z3.BoolRef] = {}


def _formulas(axioms: tuple[Axiom, ...]) -> list[z3.BoolRef]:
    missing = tuple(a for a in axioms if a.name not in _FORMULAS)
    _FORMULAS.update(zip((a.name for a in missing), axiom_formulas(missing), strict=True))
    return [_FORMULAS[a.name] for a in axioms]


def make_solver(formulas: list[z3.BoolRef], mbqi: bool, rlimit: int, ctx: z3.Context | None = None) -> z3.Solver:
    """A solver holding the axioms, limited to ``rlimit`` resource units per check: cheap E-matching only, or
    z3's default model-based instantiation."""
    solver = z3.Solver(ctx=ctx)
    if not mbqi:
        solver.set("auto_config", False)
        solver.set("smt.mbqi", False)
    solver.set("rlimit", max(1, rlimit))
    solver.add(*formulas)
    return solver


def rlimit_count(solver: z3.Solver) -> int:
    """The resource count of ``solver``'s context so far (z3 counts per context, across its solvers)."""
    stats = solver.statistics()
    return int(stats.get_key_value("rlimit count")) if "rlimit count" in stats.keys() else 0


@dataclass
class ProofContext:
    """The z3 context of one candidate's proofs (every variant, round and axiom set of it), each axiom translated
    into it once. z3's search depends on the terms its context already holds (their ids order the
    instantiations), so a context shared with other candidates would make whether a rule is proved depend on which
    rules were proved before it in that process; one per candidate makes the answer depend on the candidate alone,
    and spares the context's creation (a few ms, as long as a small proof) for each of its attempts."""

    ctx: z3.Context = field(default_factory=z3.Context)
    translated: dict[str, z3.BoolRef] = field(default_factory=dict)
    #: the context's resource count so far (z3 counts per context, across its solvers)
    count: int = 0
    #: a solver holding each axiom set, per instantiation mode: the attempts push their goal onto it and pop it
    solvers: dict[tuple[tuple[str, ...], bool], z3.Solver] = field(default_factory=dict)

    def renew(self) -> None:
        """A fresh context in place of this one: after the wall-clock guard stopped a proof, what the context holds
        depends on how far z3 got, so the candidate's later proofs must not see it."""
        self.ctx, self.translated, self.count, self.solvers = z3.Context(), {}, 0, {}

    def solver(self, axioms: tuple[Axiom, ...], mbqi: bool) -> z3.Solver:
        """The solver holding ``axioms`` in this context for ``mbqi``, made at the first call. z3 internalizes the
        axioms once, at the first ``push``: that work (a few thousand units) is counted in the context's resource
        count but lies outside every check's ``rlimit``, so an attempt's budget goes to its search alone. A fresh
        solver per attempt paid it inside each attempt's budget (and again for each instantiation mode): on the
        <= 3-op candidates a proof now needs about half the units, and a few need a twentieth."""
        key = (tuple(a.name for a in axioms), mbqi)
        if key not in self.solvers:
            self.solvers[key] = make_solver(self.formulas(axioms), mbqi, 1, self.ctx)
        return self.solvers[key]

    def formulas(self, axioms: tuple[Axiom, ...]) -> list[z3.BoolRef]:
        """``axioms`` in this context, in their order."""
        missing = tuple(a for a in axioms if a.name not in self.translated)
        for axiom, formula in zip(missing, _formulas(missing), strict=True):
            self.translated[axiom.name] = formula.translate(self.ctx)
        return [self.translated[a.name] for a in axioms]


@dataclass(frozen=True)
class Prepared:
    """A rule's z3 encoding and relevant axioms (in the global context), or why it cannot be encoded: computed
    once and reused by every proof attempt of the rule (the attempts themselves run in fresh contexts)."""

    enc: Any
    relevant: tuple[Axiom, ...] | None
    unsupported: str = ""


def prepare(rule: Rule, axioms: tuple[Axiom, ...] = AXIOMS) -> Prepared:
    """What ``prove_rule`` needs of ``rule`` before it calls z3, for reuse across attempts."""
    try:
        enc = encode_rule(rule)
    except Unsupported as exc:
        return Prepared(None, None, str(exc))
    return Prepared(enc, axioms_for(rule, axioms))


def prove_rule(rule: Rule, rlimit: int = DEFAULT_RLIMIT, axioms: tuple[Axiom, ...] = AXIOMS,
               guard_s: float | None = DEFAULT_GUARD_S, relevant_only: bool = True,
               prepared: Prepared | None = None, context: ProofContext | None = None) -> ProofResult:
    """Prove every mapped output of ``rule`` equal under the axioms and the rule's where conditions.

    With ``relevant_only`` z3 gets the axioms relevant to the rule (``verifier.relevance``) first, and all of
    ``axioms`` again, on a fresh budget, before a refutation is reported. For each output, ``src != dst`` must
    be unsat within
    ``rlimit`` z3 resource units (shared by all outputs). ``sat`` gives "refuted" (a model of the axioms where
    the rule fails: usually only a sign that an axiom is missing); a spent budget gives "unknown"; the
    wall-clock ``guard_s`` gives "timeout". ``rlimit_used`` counts every attempt. ``prepared`` (from
    ``prepare(rule, axioms)``) skips the encoding; the answer is the same. ``context`` is the candidate's z3
    context (default: a fresh one): the answer depends on the proofs made in it before, never on others.
    """
    start = time.monotonic()
    if prepared is None:
        prepared = prepare(rule, axioms)
    if prepared.relevant is None:
        return ProofResult(OutcomeStatus.UNSUPPORTED, time.monotonic() - start, prepared.unsupported)
    enc = prepared.enc
    relevant = prepared.relevant if relevant_only else axioms
    context = ProofContext() if context is None else context
    first = _prove_with(enc, rlimit, relevant, guard_s, start, context)
    if first.status != OutcomeStatus.REFUTED or len(relevant) == len(axioms):
        return first
    # a model of some axioms need not be one of all of them: only the full set may refute
    again = _prove_with(enc, rlimit, axioms, guard_s, start, context)
    return ProofResult(again.status, again.seconds, f"{again.reason} (with every axiom: the {len(relevant)} "
                       f"relevant ones gave a countermodel)", first.rlimit_used + again.rlimit_used)


def vacuous(rule: Rule, rlimit: int = 200_000, prepared: Prepared | None = None) -> bool:
    """Whether ``rule``'s hypotheses (its ops' shape facts, where conditions and kept output types) are
    inconsistent with its relevant axioms within ``rlimit`` units: z3 then proves anything of it, so its proof
    says nothing (contradictory where conditions, or axioms that contradict each other on its terms)."""
    prepared = prepare(rule) if prepared is None else prepared
    if prepared.relevant is None:
        return False
    context = ProofContext()
    formulas = context.formulas(prepared.relevant)
    hypotheses = [h.translate(context.ctx) for h in prepared.enc.hypotheses]
    for mbqi in (False, True):
        solver = make_solver(formulas, mbqi, rlimit, context.ctx)
        solver.add(*hypotheses)
        if solver.check() == z3.unsat:
            return True
    return False


def _prove_with(enc: Any, rlimit: int, axioms: tuple[Axiom, ...], guard_s: float | None,
                start: float, context: ProofContext) -> ProofResult:
    ctx = context.ctx
    fired = threading.Event()

    def interrupt() -> None:
        fired.set()
        ctx.interrupt()

    watchdog = threading.Timer(guard_s, interrupt) if guard_s is not None else None
    if watchdog is not None:
        watchdog.daemon = True
        watchdog.start()
    try:
        result = _prove_goals(enc, context, axioms, start, rlimit, fired)
    finally:
        if watchdog is not None:
            watchdog.cancel()
    if fired.is_set():
        context.renew()
        if not result.proved:
            return ProofResult(OutcomeStatus.TIMEOUT, result.seconds,
                               f"wall-clock guard ({guard_s:g} s) stopped z3 after "
                               f"{result.rlimit_used} of {rlimit} resource units", result.rlimit_used)
    return result


def _prove_goals(enc: Any, context: ProofContext, axioms: tuple[Axiom, ...], start: float, rlimit: int,
                 guard_fired: threading.Event) -> ProofResult:
    ctx = context.ctx
    hypotheses = [h.translate(ctx) for h in enc.hypotheses]
    base, used = context.count, 0  # the context's count before this proof, and what this proof spent

    def result(status: OutcomeStatus, reason: str) -> ProofResult:
        return ProofResult(status, time.monotonic() - start, reason, used)

    for index, (s, d, src, dst) in enumerate(enc.goals):
        # Each output gets an equal share of what is left, spent on attempts of doubling size that alternate
        # cheap E-matching and model-based instantiation. A larger budget repeats the attempts of a smaller
        # one before trying larger ones, so it never proves less.
        goal_end = used + (rlimit - used) // (len(enc.goals) - index)
        answer, solver, step, why = z3.unknown, None, FIRST_ATTEMPT_RLIMIT, ""
        differ = (src != dst).translate(ctx)
        while answer == z3.unknown and used < goal_end:
            for mbqi in (False, True):
                if used >= goal_end:
                    break
                try:
                    # the axioms stay asserted in the context's solver; the goal is pushed and popped
                    solver = context.solver(axioms, mbqi)
                    solver.set("rlimit", max(1, min(step, goal_end - used)))
                    solver.push()
                    solver.add(*hypotheses)
                    solver.add(differ)
                    answer = solver.check()
                    why = solver.reason_unknown() if answer == z3.unknown else ""
                    context.count = max(context.count, rlimit_count(solver))
                    solver.pop()
                except z3.Z3Exception as exc:  # the guard's interrupt, or e.g. z3's memory limit in a worker
                    # the solver may still hold this goal: the candidate's later proofs get a fresh context
                    context.renew()
                    if guard_fired.is_set():
                        return result(OutcomeStatus.UNKNOWN, f"output {s} -> {d}: interrupted")
                    return result(OutcomeStatus.UNKNOWN, f"output {s} -> {d}: z3 failed: {exc}")
                used = context.count - base
                if answer == z3.sat and not mbqi:
                    answer = z3.unknown  # E-matching alone does not instantiate enough to refute
                if answer != z3.unknown or guard_fired.is_set():
                    break
            if guard_fired.is_set():
                return result(OutcomeStatus.UNKNOWN, f"output {s} -> {d}: interrupted")
            step *= 2
        if solver is None:
            return result(OutcomeStatus.UNKNOWN, f"budget spent before output {s}")
        if answer == z3.sat:
            return result(OutcomeStatus.REFUTED, f"output {s} -> {d}: z3 found a countermodel")
        if answer != z3.unsat:
            # z3 says "canceled" or "max. resource limit exceeded" for a spent budget, depending on where it stops
            why = why or "unknown"
            if used >= goal_end or why == "canceled" or "resource limit" in why:
                why = f"resource limit spent ({used} of {rlimit} units)"
            return result(OutcomeStatus.UNKNOWN, f"output {s} -> {d}: {why}")
    return result(OutcomeStatus.PROVED, f"{len(enc.goals)} output(s) proved in {used} resource units")


def verify_rule(rule: Rule, rlimit: int = DEFAULT_RLIMIT, trials: int = 3, seed: int = 0) -> VerifyResult:
    """Numeric check first (a counterexample refutes the rule whatever z3 says), then the proof. A proof
    without ``trials`` numeric instances is "unchecked", as in ``verify-rules``: a rule whose sides never
    type-check together is proved vacuously (its shape facts are contradictory) and must not pass."""
    numeric = numeric_check(rule, trials=trials, seed=seed, found_on=rule.provenance.get("found_on"))
    if numeric.trials_run and not numeric.ok:
        return VerifyResult(OutcomeStatus.REFUTED,
                            ProofResult(OutcomeStatus.UNKNOWN, 0.0, "not attempted: numeric counterexample"),
                            numeric)
    proof = prove_rule(rule, rlimit)
    if proof.status == OutcomeStatus.PROVED and numeric.trials_run < trials:
        return VerifyResult(OutcomeStatus.UNCHECKED, proof, numeric)
    return VerifyResult(proof.status, proof, numeric)
