"""The chain of passes before write: load's result -> search -> finalize -> select -> verify -> place, in memory."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from xflow.cost.base import CostModel
from xflow.optimize import costing, finalize, load, report, search, select, verify
from xflow.optimize.finalize import Finalist
from xflow.optimize.options import OptimizeOptions
from xflow.optimize.place import PlaceRequest, place
from xflow.optimize.progress import Progress, enter
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
    coster = costing.coster(cost_model or costing.make_cost_model(options.cost, sessions, source.graph), source.shapes)
    searched = search.search(source.graph, rules, coster, options.search,
                             progress.search if progress is not None else None)
    run_original = checks.measure or (searched.modified and checks.verify)
    if run_original:
        enter(progress, "running the original")
    ran = load.try_original(source, options.inputs, sessions) if run_original else None
    probe = finalize.denormal_probe(ran, sessions)
    if searched.modified:
        enter(progress, "finalists: completing, folding constants")
    finalized = finalize.finalize(searched, checks.measure, probe)
    if len(finalized.finalists) > 1 and checks.measure:
        enter(progress, f"timing {len(finalized.finalists)} finalists end to end")
    selected = select.select(finalized.finalists, ran, sessions)
    _say_why_nothing(searched, selected, source, say)
    checked = verify.Checked(source, ran, selected.chosen, checks, options.inputs, no_rules=not searched.rules)
    if selected.chosen is not None:
        enter(progress, "verify: comparing outputs, then the A/B" if checks.verify else "the A/B")
    elif checks.measure:
        enter(progress, "timing the original")
    verified = verify.verify(checked, sessions, say, output_label)
    passes = report.Passes(source, searched, finalized, selected, verified,
                           frozenset(probe.held) if probe is not None else frozenset())
    run = _Run(selected.chosen if verified.graph is not None else None, report.assemble(passes, output_label))
    if place_request is not None:
        enter(progress, "placement")
        written = verified.graph if verified.graph is not None else source.graph
        run.placement = place(written, source.shapes, place_request, coster.model,
                              os.path.basename(output_label)).placement
        run.report.plan_output = place_request.plan_path
        run.report.placement_chosen, run.report.placement_step_ms = run.placement.plan.chosen, \
            run.placement.plan.seconds * 1e3
    return run


def _say_why_nothing(searched: search.Searched, selected: select.Selected, source: load.Source,
                     say: Callable[[str], None]) -> None:
    if not searched.rules:
        say(f"no rules in {searched.rules_file}: the model is {source.kept_as}")
    elif selected.chosen is None:
        say(f"no rewrite lowers the cost ({len(searched.rules)} rules, {searched.report.explored} graphs explored): "
            f"the model is {source.kept_as}")
