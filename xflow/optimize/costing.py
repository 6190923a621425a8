"""The run's cost model: measured (ORT, SQLite cache) or analytic, averaged over the shape profile's points for
a dynamic model."""

from __future__ import annotations

from xflow.cost import AnalyticCost, GraphCoster
from xflow.cost.base import CostModel
from xflow.cost.cache import CostCache
from xflow.cost.measured import MeasuredCost, in_cache_batch_bytes
from xflow.cost.profile_mean import ProfileCost
from xflow.errors import XflowError
from xflow.ir import Graph
from xflow.onnx_io.shape_profile import ShapePlan
from xflow.optimize.options import CostSettings
from xflow.ort import Sessions


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
