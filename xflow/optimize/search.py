"""The search pass: load the rules and run the backtracking search on the run's coster (``costing`` makes it)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from xflow.cost import GraphCoster
from xflow.ir import Graph
from xflow.optimize.passes import PassResult
from xflow.rules import Rule, default_rules_path, load_rules
from xflow.rules.proof import refuse_stale_proofs
from xflow.search import SearchLimits, SearchReport, StopReason, backtracking_search


@dataclass(kw_only=True)
class Searched(PassResult):
    """The search pass's result: the best graph, the search's own report, and the rules and coster it used
    (finalize applies them again)."""

    report: SearchReport
    rules: list[Rule]
    rules_file: str
    coster: GraphCoster


def rule_file(rules_path: str | None, given: Sequence[Rule] | None = None) -> tuple[str, list[Rule]]:
    """The rule file the run uses (``rules_path``, or the shipped one) and its rules (``given``: the caller's,
    already loaded and proved); a rule whose recorded proof is for other content is refused."""
    name = rules_path or str(default_rules_path())
    rules = list(given) if given is not None else load_rules(rules_path)
    refuse_stale_proofs(rules, name)
    return name, rules


def search(graph: Graph, rules: tuple[str, list[Rule]], coster: GraphCoster, limits: SearchLimits,
           progress: Callable[[SearchReport], None] | None = None) -> Searched:
    """The search pass on ``rules`` (``rule_file``'s file and rules); with no rules, nothing is searched nor
    costed: nobody would compare the cost."""
    rules_file, loaded = rules
    if not loaded:
        report = SearchReport(graph, 0.0, 0.0, (), StopReason.NO_RULES, 0, 0, 0.0)
    else:
        report = backtracking_search(graph, loaded, coster, limits, progress)
    return Searched(graph=report.graph, modified=bool(report.steps), report=report, rules=loaded,
                    rules_file=rules_file, coster=coster)
