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
from xflow.optimize.remembered import remembered
from xflow.ort import Sessions
from xflow.search import SearchReport


@dataclass
class _Run:
    """What the chain made before anything is written: the graph to write (None: the original), the report
    (the write pass's figures still to fill) and the placement, if asked for."""

    chosen: Finalist | None
    report: report.OptimizeReport
    placement: Any = None


def run_passes(source: load.Source, output_label: str, options: OptimizeOptions, cost_model: CostModel | None,
               sessions: Sessions, say: Callable[[str], None], progress: Callable[[SearchReport], None] | None,
               place_request: PlaceRequest | None) -> _Run:
    """The passes up to write on ``source`` (the load pass's result); ``cost_model`` None: the one the options ask
    for."""
    checks = options.checks
    rules = search.rule_file(options.rules_path, options.rules)
    model = cost_model or costing.make_cost_model(options.cost, sessions, source.graph)
    coster = costing.coster(model, source.shapes)
    memo = remembered(model)  # the measured decisions the cost cache keeps (the same cache, the same model)
    searched = search.search(source.graph, rules, coster, options.search, progress)
    ran = load.try_original(source, options.inputs, sessions) \
        if checks.measure or (searched.modified and checks.verify) else None
    probe = finalize.denormal_probe(ran, sessions)
    finalized = finalize.finalize(searched, checks.measure, probe)
    selected = select.select(finalized.finalists, ran, sessions, memo)
    _say_why_nothing(searched, selected, source, say)
    checked = verify.Checked(source, ran, selected.chosen, checks, options.inputs, no_rules=not searched.rules,
                             memo=memo)
    verified = verify.verify(checked, sessions, say, output_label)
    passes = report.Passes(source, searched, finalized, selected, verified,
                           frozenset(probe.held) if probe is not None else frozenset())
    run = _Run(selected.chosen if verified.graph is not None else None, report.assemble(passes, output_label))
    if memo is not None:
        run.report.decisions_from_cache, run.report.decisions_timed = list(memo.read), list(memo.measured)
    if place_request is not None:
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
