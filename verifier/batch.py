"""Verify many candidates in parallel: for each, the first variant that checks numerically and is proved.

A candidate is a JSON rule with a ``"variants"`` list (most general first, from ``generator.generalize``).
Each variant is parsed (a malformed one is skipped), checked numerically on random shapes (at least
``trials`` valid instances) and then proved with z3 within a resource budget; the first variant passing both is
the candidate's rule, with its provenance filled in. A candidate no variant of which passes is not shipped.
"""

from __future__ import annotations

import itertools
import multiprocessing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from xflow.verifier.numeric import BACKEND_ENV, array_module, numeric_check
from xflow.verifier.prove import DEFAULT_GUARD_S, DEFAULT_RLIMIT, ProofContext, ProofResult, prepare, prove_rule
from xflow.verifier.status import WORST_FIRST, OutcomeStatus
from xflow.verifier.theorem import TheoremKey, same_theorem_groups, theorem_key

from xflow.errors import XflowError
from xflow.rules.model import RuleError, parse_rule
from xflow.tasks import LocalTaskExecutor, TaskExecutor

ATTEMPTS = 500  # random instances drawn per variant to find ``trials`` valid ones
#: Instances drawn per variant by the wider check of a candidate z3 could not settle (``wide_trials`` valid ones).
WIDE_ATTEMPTS = 2000
#: ``generate-rules``' wider check: valid instances per variant of a candidate z3 left unknown (twice as many where
#: the generator's shapes are known: half of them near those). A candidate that holds on the sizes it was found at
#: and fails elsewhere (a kernel of another size that keeps the output's size, a stride of 3) fails early: of the
#: wider check's refutations at 100 (2026-11-27), 108 of 112 on the <= 2-op candidates and 63 of 72 on every 45th
#: <= 3-op one come within 30, at 46% (<= 2 ops) and 39% (<= 3 ops) of its CPU time, which the candidates that pass
#: it (every valid instance drawn) spend; the file is the same (an unknown candidate is not written either way).
WIDE_TRIALS = 30


@dataclass
class Outcome:
    """What became of one candidate: its ``status`` (proved, refuted, unknown, timeout, unsupported or unchecked),
    ``rlimit_used`` the z3 resource count spent on it (machine-independent), ``z3_seconds`` the time;
    ``statuses``: a "status: reason" line per attempt."""

    name: str
    status: OutcomeStatus
    rule: dict[str, Any] | None = None
    variant: int = -1
    variants_tried: int = 0
    z3_seconds: float = 0.0
    rlimit_used: int = 0
    reason: str = ""
    statuses: list[str] = field(default_factory=list)
    #: each parsed variant's final status when the candidate is not proved (refuted, unknown, unchecked, ...)
    variant_statuses: dict[int, OutcomeStatus] = field(default_factory=dict)


#: The budgets (z3 resource units) every numerically checked variant of a candidate is tried on in turn before
#: the last round: each variant gets a cheap attempt before any gets an expensive one, so a pinned variant z3
#: settles at once is not kept waiting behind a general one it cannot settle. Absolute, not fractions of the
#: candidate's budget: at the shipped file's budget (10M) they are its 1% and 10% as always, and at the smaller
#: generation budget the first round is still large enough for most proofs (98% of the <= 2-op candidates'
#: proofs need under 100k), so a proved variant is encoded and solved once, not once per round. A round as
#: large as the whole budget is skipped (the last round spends what is left).
ESCALATION = (DEFAULT_RLIMIT // 100, DEFAULT_RLIMIT // 10)
#: The rounds of ``generate-rules`` (budget ``GENERATION_RLIMIT``): 98% of the <= 2-op candidates' proofs need
#: under 40k units and all but two are of the most general variant, so every variant first gets 20k (a pinned
#: variant z3 settles at once is found there), then 100k.
GENERATION_ROUNDS = (20_000, 100_000)


def verify_candidate(candidate: dict[str, Any], rlimit: int = DEFAULT_RLIMIT, trials: int = 3,
                     seed: int = 0, guard_s: float | None = DEFAULT_GUARD_S,
                     rounds: tuple[int, ...] = ESCALATION, replay: bool = False, wide_trials: int = 0,
                     same_theorems: dict[TheoremKey, tuple[str, str]] | None = None,
                     last_round: bool = True) -> Outcome:
    """The first variant of ``candidate`` that is checked numerically on ``trials`` shapes and proved.

    A variant is checked numerically before z3 first sees it (a counterexample settles it for nothing), and only
    then: a candidate whose most general variant is proved in the first round costs one numeric check, not one
    per variant. The checked ones are proved in rounds of growing z3 budgets (``rounds``, then what is left),
    in variant order within a round; the first proved wins. ``rlimit`` is the z3 resource budget of the whole
    candidate, shared by its variants and rounds: in the last round (every variant checked by then) each
    variant but the last gets half of what is left. ``guard_s`` is the last-resort wall-clock guard of each
    proof. The same candidate and budget give the same outcome on any machine.

    With ``replay`` (``generate-rules``: a small budget and other ``rounds``) a variant proved by a call larger
    than verify-rules' first round (z3's model-based instantiation then ran at a limit verify-rules' schedule
    never uses, and z3's search is not monotone in it), or by a call after others in the candidate's context
    (their terms are still there, and z3's search follows the terms' order: such a proof may not repeat from a
    fresh context, ``test_a_proof_after_a_failed_call_in_its_context_is_checked_on_verify_rules_schedule``), is
    proved again as ``verify-rules`` would in its first rounds (``_replays``), and is the candidate's rule only
    when that proves it too: a generated file re-verifies. With ``wide_trials`` a candidate z3 leaves unknown is
    checked on that many more shapes per variant (``_wider_check``) once its first round has not settled it: a
    counterexample for every variant still open refutes it there, before the later rounds spend the budget.

    ``same_theorems`` maps a variant's ``theorem_key`` to the status (refuted or unknown) and name of an earlier
    variant stating the same theorem (a candidate's reverse, ``verify_group``): such a variant is settled with that
    status, neither checked nor proved again. Only what is not proved is taken over, so a written rule is always
    proved in its own right.

    Without ``last_round`` only ``rounds`` are tried: a prefix of the full schedule, so a proof found there is the
    full schedule's proof too."""
    outcome = Outcome(candidate["name"], OutcomeStatus.UNCHECKED)
    parsed = _parsed_variants(candidate, outcome)
    numerics: dict[int, Any] = {}  # variant -> its numeric result when it passed, None when it did not
    final = outcome.variant_statuses

    def passes(index: int, raw: dict[str, Any], rule: Any) -> bool:
        if index not in numerics:
            numerics[index] = _checked(rule, raw, trials, seed, outcome)
            if numerics[index] is None:
                final[index] = OutcomeStatus.of_line(outcome.statuses[-1])
        return numerics[index] is not None

    settled: set[int] = set()
    # a variant left unknown elsewhere: the wider check cannot refute the candidate
    taken_over_unknown = _take_over(parsed, same_theorems or {}, outcome, settled)
    encoded: dict[int, Any] = {}  # each variant encoded once, whatever the number of rounds it takes part in
    context: ProofContext | None = None  # one z3 context for all the candidate's proofs, made at the first
    wider: dict[int, Any] = {}  # variant -> its wider numeric check, run at most once

    def refute_wider(when: str) -> bool:
        """Whether every variant still open (checked, not settled) has a counterexample on the wider check;
        if so, ``outcome`` says it was refuted there."""
        still_open = [(index, raw, rule) for index, raw, rule in parsed
                      if numerics.get(index) is not None and index not in settled]
        for index, raw, rule in still_open:
            if index not in wider:
                wider[index] = _wider_check(rule, raw, wide_trials, seed)
            if wider[index].ok or not wider[index].trials_run:
                return False
        if not still_open:
            return False
        _refuted_wider(outcome, [index for index, _, _ in still_open], wider[still_open[0][0]].reason, when)
        return True

    steps = (*(s for s in rounds if s < rlimit), *((None,) if last_round else ()))
    for round_index, step in enumerate(steps):
        # z3 did not settle the candidate in its first round: the wider numeric check, due anyway when the budget
        # runs out unproved, refutes most of what is false before the later rounds spend the budget
        if round_index and wide_trials and not taken_over_unknown and refute_wider("after z3's first round"):
            return outcome
        if step is None:  # the last round splits what is left among the checked variants: check them all
            open_ = [p for p in parsed if p[0] not in settled and passes(*p)]
        else:
            open_ = [p for p in parsed if p[0] not in settled]
        for position, (index, raw, rule) in enumerate(open_):
            if not passes(index, raw, rule):
                continue
            left = rlimit - outcome.rlimit_used
            if left <= 0:
                outcome.statuses.append(f"{OutcomeStatus.UNKNOWN}: z3 budget spent on earlier variants")
                break
            if step is not None:
                budget = min(left, step)
            else:  # half of what is left while others remain: a general variant must not starve the pinned one
                budget = left if position == len(open_) - 1 else max(1, left // 2)
            if index not in encoded:
                encoded[index] = prepare(rule)
            first_call = context is None  # no earlier attempt has left its terms in the context
            context = ProofContext() if context is None else context
            proof = prove_rule(rule, budget, guard_s=guard_s, prepared=encoded[index], context=context)
            outcome.z3_seconds += proof.seconds
            outcome.rlimit_used += proof.rlimit_used
            outcome.statuses.append(f"{proof.status}: {proof.reason}")
            if proof.status in (OutcomeStatus.REFUTED, OutcomeStatus.UNSUPPORTED):
                settled.add(index)
                final[index] = proof.status
            if proof.proved and replay and (budget > ESCALATION[0] or not first_call) \
                    and not _replays(raw, trials, seed, guard_s, outcome):
                settled.add(index)  # proved on a schedule verify-rules does not repeat: not written
                continue
            if proof.proved:
                outcome.rule = _proved_rule(raw, index, proof, numerics[index], rlimit)
                outcome.status, outcome.variant = OutcomeStatus.PROVED, index
                return outcome
        else:
            continue
        break
    outcome.status = _worst(outcome.statuses)
    outcome.reason = outcome.statuses[-1] if outcome.statuses else "no variant"
    for index, _, _ in parsed:
        # tried within the whole budget, or never reached before it was spent
        final.setdefault(index, OutcomeStatus.UNKNOWN)
    if outcome.status == OutcomeStatus.UNKNOWN and wide_trials and not taken_over_unknown:
        refute_wider("after z3 spent its budget")
    return outcome


def _parsed_variants(candidate: dict[str, Any], outcome: Outcome) -> list[tuple[int, dict[str, Any], Any]]:
    """(index, raw JSON, parsed rule) of each variant of ``candidate`` that parses; a "malformed" line in
    ``outcome`` for each that does not."""
    parsed: list[tuple[int, dict[str, Any], Any]] = []
    for index, raw in enumerate(candidate.get("variants") or [candidate]):
        raw = {k: v for k, v in raw.items() if k != "variants"}
        try:
            parsed.append((index, raw, parse_rule(raw)))
        except RuleError as exc:
            outcome.statuses.append(f"{OutcomeStatus.MALFORMED}: {exc}")
    return parsed


def _take_over(parsed: list[tuple[int, dict[str, Any], Any]], same_theorems: dict[TheoremKey, tuple[str, str]],
               outcome: Outcome, settled: set[int]) -> bool:
    """Settle each variant stating the theorem of an earlier variant that was not proved (``same_theorems``) with
    that variant's status, in ``outcome`` and ``settled``; whether one of them was unknown."""
    taken_over_unknown = False
    for index, raw, _ in parsed if same_theorems else ():
        earlier = same_theorems.get(theorem_key(raw))
        if earlier is not None:
            status, source = OutcomeStatus(earlier[0]), earlier[1]
            settled.add(index)
            outcome.variant_statuses[index] = status
            outcome.statuses.append(f"{status}: the same theorem as {source}, {status} there")
            taken_over_unknown |= status == OutcomeStatus.UNKNOWN
    return taken_over_unknown


def _proved_rule(raw: dict[str, Any], index: int, proof: ProofResult, numeric: Any, rlimit: int) -> dict[str, Any]:
    """The rule of a proved variant: ``raw`` with its provenance (the proof's budget and units, the numeric
    check's error, trials and shapes)."""
    provenance = dict(raw.get("provenance", {}))
    # resource units, not seconds: the provenance must not depend on the machine that proved it; the word itself
    # (``.value``), as JSON data is plain
    provenance["z3"] = {"status": OutcomeStatus.PROVED.value, "rlimit": rlimit, "rlimit_used": proof.rlimit_used,
                        "variant": index}
    provenance["numeric"] = {"max_abs_err": numeric.max_abs_err, "trials": numeric.trials_run,
                             "backend": array_module().__name__, "dtype": "float64",
                             "shapes": [{k: list(v) for k, v in s.items()} for s in numeric.shapes]}
    return {**raw, "provenance": provenance}


def _refuted_wider(outcome: Outcome, variants: list[int], reason: str, when: str) -> None:
    """``outcome`` refuted by the wider numeric check: every one of ``variants`` has a counterexample there."""
    outcome.status = OutcomeStatus.REFUTED
    outcome.reason = f"{OutcomeStatus.REFUTED}: {reason} (wider numeric check {when})"
    outcome.statuses.append(outcome.reason)
    outcome.variant_statuses.update(dict.fromkeys(variants, OutcomeStatus.REFUTED))


def verify_group(group: Sequence[dict[str, Any]], rlimit: int = DEFAULT_RLIMIT, trials: int = 3, seed: int = 0,
                 guard_s: float | None = DEFAULT_GUARD_S, rounds: tuple[int, ...] = ESCALATION,
                 replay: bool = False, wide_trials: int = 0) -> list[Outcome]:
    """``verify_candidate`` of each candidate of ``group`` (candidates stating the same theorem, a rule and its
    reverse: ``same_theorem_groups``) in turn; a variant that an earlier candidate of the group, not proved, left
    refuted or unknown is taken over instead of verified again. A refutation holds for the same theorem either
    way round; an unknown is a bet: z3's search follows the order terms reach it, so the other direction could
    be proved within the budget, but seldom is, and trying costs the whole budget again."""
    known: dict[TheoremKey, tuple[OutcomeStatus, str]] = {}
    outcomes = []
    for candidate in group:
        outcome = verify_candidate(candidate, rlimit, trials, seed, guard_s, rounds, replay, wide_trials, known)
        outcomes.append(outcome)
        if outcome.status == OutcomeStatus.PROVED:
            continue  # its variants before the proved one were not given the whole budget
        variants = candidate.get("variants") or [candidate]
        for index, status in outcome.variant_statuses.items():
            if status in (OutcomeStatus.REFUTED, OutcomeStatus.UNKNOWN):
                known.setdefault(theorem_key(variants[index]), (status, f"{candidate['name']}'s variant {index}"))
    return outcomes


def _wider_check(rule: Any, raw: dict[str, Any], trials: int, seed: int) -> Any:
    """One variant of a candidate z3 has not settled, checked numerically on ``trials`` more shapes and attributes
    from the wider domains (``numeric_check(wide=True)``; half the draws are still shapes near the ones the
    candidate was found on). A candidate is refuted when every variant z3 tried has a counterexample here (a rule
    holding only on the few sizes the first check drew, such as a conv pair that commutes for 1x1 kernels only,
    or only at the strides the generator tried, such as an enlarged kernel's pads at stride 3). The wider
    domains contain the usual ones, so a second pass over those alone would only repeat draws."""
    return numeric_check(rule, trials=trials, seed=seed + 1, attempts=WIDE_ATTEMPTS,
                         found_on=raw.get("provenance", {}).get("found_on"), wide=True)


def _replays(raw: dict[str, Any], trials: int, seed: int, guard_s: float | None, outcome: Outcome) -> bool:
    """Whether ``verify-rules`` (the default budget and rounds) proves the variant ``raw`` in its first rounds
    (``ESCALATION``: 1.1M units); its units and status are added to ``outcome``. Its last round (the rest of
    the 10M) is not tried: a replay that fails there spends all of it, and one that succeeds there names a rule
    that costs verify-rules seconds each time it checks the file (on the <= 2-op run, two batchnorm lifts took
    half of the lifts' CPU time, 28 s, one proved at 8.7M, one not at all); such a rule is not written."""
    again = verify_candidate(raw, DEFAULT_RLIMIT, trials, seed, guard_s, last_round=False)
    outcome.z3_seconds += again.z3_seconds
    outcome.rlimit_used += again.rlimit_used
    if again.status != OutcomeStatus.PROVED:
        outcome.statuses.append(f"{OutcomeStatus.UNKNOWN}: proved, but not again on verify-rules' schedule "
                                f"({again.reason})")
    return again.status == OutcomeStatus.PROVED


def _checked(rule: Any, raw: dict[str, Any], trials: int, seed: int, outcome: Outcome) -> Any:
    """``rule``'s numeric check when it passed on ``trials`` shapes, else None (the reason in ``outcome``)."""
    outcome.variants_tried += 1
    try:
        found_on = raw.get("provenance", {}).get("found_on")
        numeric = numeric_check(rule, trials=trials, seed=seed, attempts=ATTEMPTS, found_on=found_on)
        if numeric.ok and 0 < numeric.trials_run < trials:
            # instantiable but seldom valid (a conv output multiplied by a kernel as a matrix is valid at few
            # sizes): drawn as long as verify-rules draws (numeric_check's default), not left unchecked (the same
            # seed: the first draws repeat)
            numeric = numeric_check(rule, trials=trials, seed=seed, found_on=found_on)
    except MemoryError:
        outcome.statuses.append(f"{OutcomeStatus.UNKNOWN}: out of memory in the numeric check")
        return None
    if not numeric.ok or numeric.trials_run < trials:
        status = OutcomeStatus.REFUTED if numeric.trials_run and not numeric.ok else OutcomeStatus.UNCHECKED
        outcome.statuses.append(f"{status}: {numeric.reason}")
        return None
    return numeric


def _worst(statuses: list[str]) -> OutcomeStatus:
    """The status of a candidate no variant of which is proved, from its "status: reason" lines (``WORST_FIRST``)."""
    kinds = {OutcomeStatus.of_line(s) for s in statuses}
    for kind in WORST_FIRST:
        if kind in kinds:
            return kind
    return OutcomeStatus.UNCHECKED


Work = tuple[tuple[dict[str, Any], ...], int, int, int, float | None, tuple[int, ...], bool, int]


def _work(args: Work) -> list[Outcome]:
    return verify_group(*args)


#: Address-space limit of a verifier worker: a candidate whose proof search or numeric check grows past it
#: fails in that worker (z3 stops at half of it) instead of taking the machine's memory.
WORKER_MEMORY_BYTES = 4 * 2**30


def _limit_memory(limit_bytes: int) -> None:
    import resource

    import z3

    resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))
    z3.set_param("memory_max_size", limit_bytes // 2**21)  # in MB: half the limit


#: The reason of a candidate whose worker process died while verifying it.
WORKER_DIED = f"{OutcomeStatus.UNKNOWN}: its worker died (memory limit or crash)"


def _died(candidate: dict[str, Any]) -> Outcome:
    return Outcome(candidate["name"], OutcomeStatus.UNKNOWN, reason=WORKER_DIED, statuses=[WORKER_DIED])


#: Items ``run_guarded`` keeps submitted per worker; more than the 2 per worker + 1 its suspect rule assumes were
#: handed out, so that the culprit of a broken pool is always among the submitted ones.
SUBMIT_AHEAD = 4


def run_guarded(fn: Callable[[Any], Any], work: Sequence[Any], indices: list[int], jobs: int,
                one_per_process: bool, on_result: Callable[[int, Any], None]) -> None:
    """``fn(work[i])`` for every i of ``indices`` in memory-limited worker processes, calling
    ``on_result(i, result)`` as each finishes. A worker that dies (killed for memory, a crash in z3) breaks
    the pool: the items it may have been running are retried alone, and an item that kills its process
    again gets ``on_result(i, None)``; the others go on in a fresh pool."""
    from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    ctx = multiprocessing.get_context("spawn")
    left = list(indices)
    while left:
        suspects: list[int] = []
        with ProcessPoolExecutor(min(jobs, len(left)), mp_context=ctx, initializer=_limit_memory,
                                 initargs=(WORKER_MEMORY_BYTES,),
                                 max_tasks_per_child=1 if one_per_process else None) as pool:
            # a few items ahead of the workers, not all of them: a pending item holds its work (every candidate
            # of a million-candidate run would be in memory at once)
            queue = iter(left)
            running: dict[Future[Any], int] = {pool.submit(fn, work[i]): i
                                               for i in itertools.islice(queue, SUBMIT_AHEAD * jobs)}
            done: set[int] = set()
            try:
                while running:
                    finished, _ = wait(running, return_when=FIRST_COMPLETED)
                    for future in finished:
                        i = running.pop(future)
                        on_result(i, future.result())
                        done.add(i)
                    running.update({pool.submit(fn, work[i]): i for i in itertools.islice(queue, len(finished))})
            except BrokenProcessPool:
                # work is handed out in submission order, at most one running and one queued per worker
                # plus one: the culprit is among the first 2 * jobs + 1 unfinished
                suspects = [i for i in left if i not in done][:2 * jobs + 1]
        left = [i for i in left if i not in done and i not in suspects]
        for i in suspects:  # alone in a process each: the culprit breaks only its own pool
            if len(indices) == 1:
                on_result(i, None)
                continue
            run_guarded(fn, work, [i], 1, True, on_result)


def _work_at(args: tuple[int, Work]) -> tuple[int, list[Outcome]]:
    return args[0], _work(args[1])


def check_backend(executor: TaskExecutor | None, jobs: int = 1) -> None:
    """Fail at once, with one line, when the numeric check's backend (``XFLOW_NUMERIC_BACKEND``) cannot be had or
    cannot run in the local worker processes ``executor`` (or, without one, ``jobs``) would start; commands call
    it before any work."""
    xp = array_module()
    if executor is not None:
        jobs = executor.jobs if isinstance(executor, LocalTaskExecutor) else 1
    if jobs > 1 and xp is not np:
        raise XflowError(None, f"{BACKEND_ENV}={xp.__name__} needs --jobs 1: local worker processes run under an "
                         f"address-space limit of {WORKER_MEMORY_BYTES // 2**30} GiB, too small for CUDA to start in")


class _GroupWork(Sequence[Work]):
    """The tasks of ``verify_candidates``, one per group of candidate indices, each built when it is read: the
    candidates of a group and the verifier's settings (``Work``)."""

    def __init__(self, candidates: Sequence[dict[str, Any]], groups: Sequence[tuple[int, ...]],
                 settings: tuple[Any, ...]) -> None:
        self._candidates, self._groups, self._settings = candidates, groups, settings

    def __len__(self) -> int:
        return len(self._groups)

    def __getitem__(self, g: int) -> Work:  # type: ignore[override]  # no slices
        return (tuple(self._candidates[i] for i in self._groups[g]), *self._settings)


def verify_candidates(candidates: Iterable[dict[str, Any]], jobs: int = 1, rlimit: int = DEFAULT_RLIMIT,
                      trials: int = 3, seed: int = 0,
                      progress: Callable[[int, Outcome], None] | None = None,
                      guard_s: float | None = DEFAULT_GUARD_S, executor: TaskExecutor | None = None,
                      rounds: tuple[int, ...] = ESCALATION, replay: bool = False,
                      wide_trials: int = 0, same_theorems: bool = False) -> list[Outcome]:
    """Outcomes in the candidates' order. With ``jobs`` > 1 the work runs in local worker processes, each
    limited to ``WORKER_MEMORY_BYTES``; on a cluster ``executor`` each proof is a task declaring that much
    memory, rerun by the cluster when its worker is lost. A candidate whose worker dies (for good) is "unknown"
    (reason ``WORKER_DIED``). With ``same_theorems`` the candidates stating one theorem (a rule and its reverse)
    are verified in one task, one after the other (``verify_group``); the groups depend on the candidates alone,
    so the outcomes do not depend on ``jobs`` or the executor."""
    check_backend(executor, jobs)
    # a sequence is indexed, not copied: the generator's candidates are packed and unpacked one task at a time
    candidates = candidates if isinstance(candidates, Sequence) else list(candidates)
    groups = same_theorem_groups(candidates) if same_theorems else [(i,) for i in range(len(candidates))]
    work = _GroupWork(candidates, groups, (rlimit, trials, seed, guard_s, rounds, replay, wide_trials))
    outcomes: dict[int, Outcome] = {}

    def record(g: int, result: list[Outcome] | None) -> None:
        results = result if result is not None else [_died(candidates[i]) for i in groups[g]]
        for i, outcome in zip(groups[g], results, strict=True):
            outcomes[i] = outcome
            if progress is not None:
                progress(len(outcomes), outcomes[i])

    if executor is not None and not isinstance(executor, LocalTaskExecutor):
        for g, result in executor.imap_unordered(_work_at, [(g, work[g]) for g in range(len(work))],
                                                 memory_bytes=WORKER_MEMORY_BYTES,
                                                 failed=lambda item: (item[0], None)):
            record(g, result)
    elif (executor.jobs if executor is not None else jobs) <= 1:
        for g in range(len(work)):
            record(g, _work(work[g]))
    else:
        run_guarded(_work, work, list(range(len(work))), executor.jobs if executor is not None else jobs, False,
                    record)
    return [outcomes[i] for i in range(len(candidates))]
