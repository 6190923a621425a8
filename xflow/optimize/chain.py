"""The chain of passes before write: load's result -> search -> finalize -> select -> verify -> place, in memory."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from xflow import heap
from xflow.cost.base import CostModel
from xflow.optimize import costing, finalize, load, report, search, select, verify
from xflow.optimize.decision import Decision
from xflow.optimize.finalize import Finalist
from xflow.optimize.options import OptimizeOptions
from xflow.optimize.place import PlaceRequest, place
from xflow.optimize.progress import Progress, enter
from xflow.optimize.remembered import remembered
from xflow.ort import Sessions


@dataclass
class _Run:
    """What the chain made before anything is written: the graph to write (None: the original), the report
    (the write pass's figures still to fill) and the placement, if asked for."""

    chosen: Finalist | None
    report: report.OptimizeReport
    placement: Any = None


def run_passes(source: load.Source, output_label: str, options: OptimizeOptions, cost_model: CostModel | None,
               sessions: Sessions, say: Callable[[str], None], progress: Progress | None,
               place_request: PlaceRequest | None) -> _Run:
    """The passes up to write on ``source`` (the load pass's result); ``cost_model`` None: the one the options ask
    for; ``progress`` is told each phase as it starts."""
    checks = options.checks
    enter(progress, "search")
    rules = search.rule_file(options.rules_path, options.rules)
    model = cost_model or costing.make_cost_model(options.cost, sessions, source.graph)
    coster = costing.coster(model, source.shapes)
    memo = remembered(model)  # the measured decisions the cost cache keeps (the same cache, the same model)
    searched = search.search(source.graph, rules, coster, options.search,
                             progress.search if progress is not None else None)
    heap.trim()  # each pass hands back what it freed: the next one's sessions need not stand on top of it
    run_original = checks.measure or (searched.modified and checks.verify)
    if run_original:
        enter(progress, "running the original")
    ran = load.try_original(source, options.inputs, sessions) if run_original else None
    probe = finalize.denormal_probe(ran, sessions)
    if searched.modified:
        enter(progress, "finalists: completing, folding constants")
    finalized = finalize.finalize(searched, checks.measure, probe)
    heap.trim()
    if len(finalized.finalists) > 1 and checks.measure:
        enter(progress, f"timing {len(finalized.finalists)} finalists end to end")
        if isinstance(ran, load.OriginalRun):
            ran.release()  # select needs its inputs only: its finalists' sessions do not stand beside the original's
            heap.trim()
    selected = select.select(finalized.finalists, ran, sessions, memo)
    heap.trim()
    _say_why_nothing(searched, selected, source, say)
    checked = verify.Checked(source, ran, selected.chosen, checks, options.inputs, no_rules=not searched.rules,
                             memo=memo)
    if selected.chosen is not None:
        enter(progress, "verify: comparing outputs, then the A/B" if checks.verify else "the A/B")
    elif checks.measure:
        enter(progress, "timing the original")
    said: list[str] = []  # what verify says of the finalist whose decision stands
    verified = verify.verify(checked, sessions, said.append, output_label)
    for tried, runner_up in enumerate(runners_up(selected, finalized.finalists, verified.decision), 1):
        # faster at the first profile point but not at another (a decode step and a prefill): the next finalist
        # by the end-to-end timing, whose rewrites may not cost the other point what the first's did
        enter(progress, "verify: the next finalist")
        again: list[str] = []
        retried = verify.verify(dataclasses.replace(checked, chosen=runner_up), sessions, again.append, output_label)
        if retried.decision.writes_optimized:
            said = [f"the fastest finalist was not faster at every profile point; finalist {tried + 1} by end-to-end "
                    "time was, and is written", *again]
            selected = dataclasses.replace(selected, chosen=runner_up, graph=runner_up.graph)
            verified = retried
            break
    for line in said:
        say(line)
    passes = report.Passes(source, searched, finalized, selected, verified,
                           frozenset(probe.held) if probe is not None else frozenset())
    run = _Run(selected.chosen if verified.graph is not None else None, report.assemble(passes, output_label))
    if memo is not None:
        run.report.decisions_from_cache, run.report.decisions_timed = list(memo.read), list(memo.measured)
    if place_request is not None:
        enter(progress, "placement")
        written = verified.graph if verified.graph is not None else source.graph
        run.placement = place(written, source.shapes, place_request, coster.model,
                              os.path.basename(output_label)).placement
        run.report.plan_output = place_request.plan_path
        run.report.placement_chosen, run.report.placement_step_ms = run.placement.plan.chosen, \
            run.placement.plan.seconds * 1e3
    return run


#: Finalists after the chosen one verified and timed when the chosen one was faster at the first profile point only.
RUNNERS_UP = 2


def runners_up(selected: select.Selected, finalists: list[Finalist], decision: Decision) -> list[Finalist]:
    """The finalists to try after the chosen one, fastest first by the end-to-end timing (at most ``RUNNERS_UP``):
    only when the chosen one was faster at the first profile point and not at another, and only finalists that timing
    ran (graphs other than the chosen one's)."""
    picked = selected.picked
    if decision is not Decision.NOT_FASTER_AT_EVERY_POINT or picked is None or selected.chosen is None:
        return []
    chosen_hash = selected.chosen.graph.structural_hash
    timed = sorted((m, i) for i, m in enumerate(picked.medians) if m is not None and i != picked.index)
    others = [finalists[i] for _, i in timed if finalists[i].graph.structural_hash != chosen_hash]
    return others[:RUNNERS_UP]


def _say_why_nothing(searched: search.Searched, selected: select.Selected, source: load.Source,
                     say: Callable[[str], None]) -> None:
    if not searched.rules:
        say(f"no rules in {searched.rules_file}: the model is {source.kept_as}")
    elif selected.chosen is None:
        say(f"no rewrite lowers the cost ({len(searched.rules)} rules, {searched.report.explored} graphs explored): "
            f"the model is {source.kept_as}")
