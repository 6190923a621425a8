"""The generation pipeline, end to end: generate (or read saved) candidates, order them, prove and check
them, lift the proved conv rules to the forms models have, drop what floods the search, and write the
rules with their provenance. ``xflow generate-rules`` is a thin front to ``write_rule_file``; with
``generate_only`` it stops once the candidates are saved (the candidate file: ``generator.candidate_file``)."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from xflow.generator.candidate_file import load_candidates, save_candidates


@dataclass(frozen=True)
class RuleFileOptions:
    """What ``xflow generate-rules`` lets a user set (see its ``--help``)."""

    out_path: str = "rules/default.json"
    max_ops: int = 3
    jobs: int = 1
    seed: int = 0
    rlimit: int = 150_000  # z3 resource units per candidate (verifier.prove.GENERATION_RLIMIT)
    guard_s: float = 1200.0  # last-resort wall-clock limit of one proof (reported as "timeout")
    trials: int = 3  # random shape instantiations per rule
    limit: int | None = None  # verify only the first N candidates in priority order
    keep_independent_batching: bool = False
    save_path: str | None = None  # also write the unverified candidates here
    candidates_path: str | None = None  # verify these saved candidates instead of generating
    keep_compositions: bool = False  # also write rules that are compositions of smaller proved rules
    generate_only: bool = False  # stop once the candidates are generated (and saved to ``save_path``)


@dataclass
class RuleFileResult:
    """What was written: how many rules, the (step, count, seconds) table, z3's time, the whole time, and
    the names of candidates that killed their verifier worker."""

    shipped: int
    table: list[tuple[str, int, float]] = field(default_factory=list)
    z3_seconds: float = 0.0
    seconds: float = 0.0
    worker_deaths: list[str] = field(default_factory=list)
    candidates: int = 0  # generated or read


def write_rule_file(options: RuleFileOptions, show: Callable[[str], None] = lambda _t: None,
                    executor: Any | None = None) -> RuleFileResult:
    """Generate, prove, check and write the rule file ``options`` describe; ``show`` gets progress lines.
    Generation and proofs run on ``executor`` (``xflow.tasks``; default: the local pool of ``jobs``)."""
    from xflow.tasks import make_task_executor

    if executor is None:
        engine = make_task_executor("local", options.jobs, None)
        try:
            return write_rule_file(options, show, engine)
        finally:
            engine.close()
    from xflow.generator.generalize import dedupe, final_name, priority
    from xflow.generator.lift import lift_candidates
    from xflow.generator.run import generate
    from xflow.generator.usefulness import match_counts, zoo_graphs
    from xflow.verifier.batch import GENERATION_ROUNDS, WIDE_TRIALS, WORKER_DIED, verify_candidates
    from xflow.verifier.status import TABLE_ORDER, OutcomeStatus

    from xflow.rules import rules_from_json
    from xflow.rules.io import dump_rules

    started = time.perf_counter()
    if options.candidates_path is not None:
        candidates = load_candidates(options.candidates_path, options.max_ops)
        table = [(f"candidates read from {os.path.basename(options.candidates_path)}", len(candidates), 0.0)]
    else:
        generated = generate(options.max_ops, options.seed, executor.jobs,
                             progress=lambda name, count, secs: show(f"{name}: {count} ({secs:.1f} s)"),
                             executor=executor)
        table = list(generated.table)
        candidates = generated.rules  # one per shape-generic key (``generate`` dedupes while it emits)
    if options.save_path is not None:
        save_candidates(options.save_path, candidates, options.max_ops, options.seed)
    if options.generate_only:
        return RuleFileResult(0, table, seconds=time.perf_counter() - started, candidates=len(candidates))
    if options.limit is not None and options.limit < len(candidates):
        # what can fire on the zoo first (in a lifted form too), then the generator's own priority
        t = time.perf_counter()
        show("matching candidates against the zoo")
        fires = match_counts(candidates, zoo_graphs())
        table.append(("candidates matching a zoo model (verified first)", sum(n > 0 for n in fires),
                      round(time.perf_counter() - t, 3)))
        order = sorted(range(len(candidates)), key=lambda i: (fires[i] == 0, priority(candidates[i])))
        candidates = [candidates[i] for i in order[:options.limit]]
        table.append(("verified (--limit, priority order)", len(candidates), 0.0))
    result = RuleFileResult(0, table, candidates=len(candidates))
    counts: Counter[OutcomeStatus] = Counter()

    def verify(batch: list[dict[str, Any]], label: str, wide_trials: int) -> list[Any]:
        t = time.perf_counter()
        counts.clear()

        def on_outcome(done: int, outcome: Any) -> None:
            counts[outcome.status] += 1
            show(f"verifying {label}{done}/{len(batch)}: {counts[OutcomeStatus.PROVED]} proved")

        outcomes = verify_candidates(batch, rlimit=options.rlimit, trials=options.trials, seed=options.seed,
                                     progress=on_outcome, guard_s=options.guard_s, executor=executor,
                                     rounds=GENERATION_ROUNDS, replay=True, wide_trials=wide_trials,
                                     same_theorems=True)
        seconds = round(time.perf_counter() - t, 3)
        result.worker_deaths += [o.name for o in outcomes if o.reason == WORKER_DIED]
        for status in TABLE_ORDER:
            table.append((f"{label}verifier: {status}", counts.get(status, 0),
                          seconds if status == OutcomeStatus.PROVED else 0.0))
        return outcomes

    outcomes = verify(candidates, "", WIDE_TRIALS)
    # Lifts of the proved conv rules to the forms models have (biased convs, conv + BatchNormalization),
    # each verified in turn: a lift of a rule that is not proved is seldom true, so only these are tried.
    t = time.perf_counter()
    show("lifting the proved rules (bias, batchnorm)")
    lifted = lift_candidates([o.rule for o in outcomes if o.rule is not None])
    table.append(("lifts of proved rules (bias, batchnorm)", len(lifted), round(time.perf_counter() - t, 3)))
    # no wider numeric check for lifts: on 150 lifts of the <= 2-op rules it refuted none and cost half as much
    # again as their proofs
    outcomes += verify(lifted, "lifts: ", 0)
    proved = dedupe([o.rule for o in outcomes if o.rule is not None])
    proved, left_out = split_batching(proved, options.keep_independent_batching)
    table.append(("proved, left out: independent batching", len(left_out), 0.0))
    t = time.perf_counter()
    if not options.keep_compositions:
        show(f"leaving out compositions of smaller rules among {len(proved)} proved")
    proved, composed = split_compositions(proved, options.keep_compositions, executor)
    table.append(("proved, left out: compositions of smaller rules", len(composed), round(time.perf_counter() - t, 3)))
    shipped = [{**r, "name": final_name(r, options.max_ops)} for r in proved]
    table.append(("rules shipped", len(shipped), 0.0))
    result.z3_seconds = sum(o.z3_seconds for o in outcomes)
    meta = {"generated_by": f"xflow generate-rules --max-ops {options.max_ops} --seed {options.seed} "
                            f"--rlimit {options.rlimit} --trials {options.trials}"
                            + (f" --limit {options.limit}" if options.limit is not None else ""),
            "generator": {"max_ops": options.max_ops, "seed": options.seed},
            "verifier": {"rlimit": options.rlimit, "trials": options.trials,
                         "rlimit_used": sum(o.rlimit_used for o in outcomes)},
            # counts only: the times (printed by the CLI) would make two runs of the same seed differ
            "table": [[name, count] for name, count, _ in table]}
    if composed:
        meta["left_out_compositions"] = [{"name": final_name(r, options.max_ops), "doc": r["doc"]} for r in composed]
    if left_out:
        meta["left_out_independent_batching"] = [{"name": final_name(r, options.max_ops), "doc": r["doc"]}
                                                 for r in left_out]
    dump_rules(rules_from_json(shipped), options.out_path, meta=meta)
    result.shipped = len(shipped)
    result.seconds = time.perf_counter() - started
    return result


def split_batching(rules: list[dict[str, Any]], keep: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(rules to write, independent-batching rules left out); none left out with ``keep``."""
    from xflow.generator.usefulness import batches_independent_elementwise

    if keep:
        return rules, []
    batching = [batches_independent_elementwise(r) for r in rules]
    return ([r for r, b in zip(rules, batching, strict=True) if not b],
            [r for r, b in zip(rules, batching, strict=True) if b])


def split_compositions(rules: list[dict[str, Any]], keep: bool, executor: Any = None
                       ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(rules to write, rules left out as compositions of smaller ones: TASO's redundancy pruning, see
    ``generator.redundancy``, on ``executor``'s workers); none left out with ``keep``."""
    from xflow.generator.redundancy import drop_compositions

    if keep:
        return rules, []
    kept, composed = drop_compositions(rules, executor=executor)
    return list(kept), list(composed)
