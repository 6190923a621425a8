"""The place pass (``--place``): plan device placement of the graph written."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from xflow.cost.base import CostModel
from xflow.cost.profile_mean import graph_at
from xflow.ir import Graph
from xflow.onnx_io.shape_profile import ShapePlan
from xflow.optimize.passes import PassResult


@dataclass
class PlaceRequest:
    """``--place``: the topology to plan the optimized model on, the placement options, where the plan
    goes, and how to show it (the CLI prints the baselines beside RL)."""

    topology: Any  # xflow.placement.topology.Topology
    options: Any  # xflow.placement.place.PlaceOptions
    plan_path: str
    progress: Callable[[int, float], None] | None = None
    show: Callable[[Any], None] | None = None


@dataclass(kw_only=True)
class Placed(PassResult):
    """The place pass's result: the graph planned (unchanged) and the placement (a PlacementResult: its plan, the
    baselines beside it)."""

    placement: Any


def place(graph: Graph, plan: ShapePlan | None, request: PlaceRequest, cost_model: CostModel, name: str) -> Placed:
    """The place pass: plan ``graph`` (the one written; a dynamic one at the profile's first point) on the
    topology with the run's own cost model (same provider and cost cache as the search)."""
    from xflow.placement.place import place as place_model

    placed = graph_at(graph, plan.points()[0]) if plan is not None and plan.is_dynamic else graph
    return Placed(graph=graph, placement=place_model(placed, cost_model, request.topology, request.options, name,
                                                     request.progress))
