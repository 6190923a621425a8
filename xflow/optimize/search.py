"""The search pass: load the rules, make the cost model, run the backtracking search."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from xflow.cost import AnalyticCost, GraphCoster
from xflow.cost.base import CostModel
from xflow.cost.cache import CostCache
from xflow.cost.measured import MeasuredCost, in_cache_batch_bytes
from xflow.cost.profile_mean import ProfileCost
from xflow.errors import XflowError
from xflow.ir import Graph
from xflow.onnx_io.shape_profile import ShapePlan
from xflow.optimize.options import CostSettings
from xflow.optimize.passes import PassResult
from xflow.ort import Sessions
from xflow.rules import Rule, default_rules_path, load_rules
from xflow.search import SearchLimits, SearchReport, StopReason, backtracking_search


def make_cost_model(cost: CostSettings, sessions: Sessions, graph: Graph | None = None) -> CostModel:
    """The cost model ``cost`` asks for; opens (or creates) the cost cache for measured costs. With ``graph``, a
    model whose weights fit in the CPU's last-level cache is measured in the cache."""
    if cost.kind == "analytic":
        return AnalyticCost()
    if cost.kind != "measured":
        raise XflowError(None, f"unknown cost model {cost.kind!r}; choose measured or analytic")
    batch_bytes = in_cache_batch_bytes(graph, sessions.provider) if graph is not None else None
    return MeasuredCost(sessions, CostCache(cost.db), batch_bytes=batch_bytes)


def coster(model: CostModel, plan: ShapePlan | None) -> GraphCoster:
    """The graph coster of the search and finalize on ``model`` (``profile_cost``)."""
    return GraphCoster(profile_cost(model, plan))


def profile_cost(model: CostModel, plan: ShapePlan | None) -> CostModel:
    """The cost model the search uses: ``model`` itself for a static model; for a dynamic one, the mean of
    ``model``'s costs at the shape profile's points (``xflow.cost.profile_mean``)."""
    return ProfileCost(model, plan.points()) if plan is not None and plan.is_dynamic else model


@dataclass(kw_only=True)
class Searched(PassResult):
    """The search pass's result: the best graph, the search's own report, and the rules and coster it used
    (finalize applies them again)."""

    report: SearchReport
    rules: list[Rule]
    rules_file: str
    coster: GraphCoster


def rule_file(rules_path: str | None) -> tuple[str, list[Rule]]:
    """The rule file the run uses (``rules_path``, or the shipped one) and its rules."""
    return rules_path or str(default_rules_path()), load_rules(rules_path)


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
