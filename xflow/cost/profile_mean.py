"""Costs of a graph with dynamic dims: the mean of its costs at the shape profile's points.

The search runs on the graph as loaded, dims over symbols (``xflow.ir.dims``), so that rules match where
they hold for every size. A kernel's time needs sizes: ``ProfileCost`` gives the cost model the graph seen
at each profile point (``GraphAtPoint``: every type, and every attribute that holds dims, at that point's
sizes) and averages. The cost cache is then keyed by concrete shapes, as for a static model, and a
profile of one point costs exactly what the static twin at that size costs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from xflow.cost.base import CostModel
from xflow.ir import Attrs, Graph, Node, TensorType
from xflow.ir.dims import concrete, has_symbols

Point = Mapping[str, int]


def concrete_type(t: TensorType, point: Point) -> TensorType:
    """``t`` at the point's sizes; ``t`` itself when it is static or names a symbol the point does not
    size (a dim only a run can tell: it stays symbolic, and such a node is estimated, not measured)."""
    if t.shape is None or all(type(d) is int for d in t.shape):
        return t
    try:
        return TensorType(t.dtype, tuple(d if d is None else concrete(d, point) for d in t.shape))
    except (KeyError, TypeError, ValueError):
        return t


def concrete_value(value: Any, point: Point) -> Any:
    """An attribute value with its dims (nested tuples too) at the point's sizes."""
    if isinstance(value, tuple):
        return tuple(concrete_value(v, point) for v in value)
    return concrete(value, point) if has_symbols(value) else value


def node_at(node: Node, point: Point) -> Node:
    """The node with the attributes that hold dims (a reshape's target) at the point's sizes; the node
    itself when it has none."""
    if node.is_opaque or not any(has_symbols(v) for v in node.attrs.values()):
        return node
    return dataclasses.replace(node, attrs=Attrs({k: concrete_value(v, point) for k, v in node.attrs.items()}))


class _TypesAt(Mapping[str, TensorType]):
    """A graph's types at one point, each made once (``memo`` is shared by every graph at that point)."""

    def __init__(self, types: Mapping[str, TensorType], point: Point, memo: dict[TensorType, TensorType]) -> None:
        self.types, self.point, self.memo = types, point, memo

    def __getitem__(self, name: str) -> TensorType:
        t = self.types[name]
        found = self.memo.get(t)
        if found is None:
            found = self.memo[t] = concrete_type(t, self.point)
        return found

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self.types else default

    def __contains__(self, name: object) -> bool:
        return name in self.types

    def __iter__(self) -> Iterator[str]:
        return iter(self.types)

    def __len__(self) -> int:
        return len(self.types)


class GraphAtPoint:
    """A graph (or a view the search makes of one) seen at one profile point: its types at the point's
    sizes; nodes, constants and indexes are the graph's own."""

    def __init__(self, graph: Any, point: Point, memo: dict[TensorType, TensorType]) -> None:
        self.graph = graph
        self.types = _TypesAt(graph.types, point, memo)

    def type_of(self, name: str) -> TensorType | None:
        """The type of a value at the point, None when unknown."""
        return self.types.get(name)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "graph":
            raise AttributeError(name)
        return getattr(self.graph, name)


@dataclasses.dataclass
class ProfileCost:
    """A CostModel over graphs with dynamic dims: a node's (or a fused group's) cost is the mean of what
    ``model`` gives for it at each of ``points`` (the shape profile's points, ``ShapePlan.points``)."""

    model: CostModel
    points: Sequence[Point]
    _types: list[dict[TensorType, TensorType]] = dataclasses.field(default_factory=list, repr=False)
    _nodes: list[dict[Node, Node]] = dataclasses.field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if not self.points:
            raise ValueError("a shape profile has at least one point")
        self._types = [{} for _ in self.points]
        self._nodes = [{} for _ in self.points]

    @property
    def name(self) -> str:
        """The inner model's name (what reports print)."""
        return self.model.name

    @property
    def fuses(self) -> bool:
        """Whether the inner model costs fused groups (the grouping is made on the symbolic graph)."""
        return bool(getattr(self.model, "fuses", False))

    def _node_at(self, node: Node, k: int) -> Node:
        """The node with the attributes that hold dims (a reshape's target) at point ``k``'s sizes."""
        memo = self._nodes[k]
        found = memo.get(node)
        if found is None:
            found = memo[node] = node_at(node, self.points[k])
        return found

    def node_costs(self, graph: Graph, nodes: Iterable[Node]) -> list[float]:
        """The mean over the points of each node's cost there."""
        nodes = list(nodes)
        totals = [0.0] * len(nodes)
        for k, point in enumerate(self.points):
            view = GraphAtPoint(graph, point, self._types[k])
            costs = self.model.node_costs(view, [self._node_at(n, k) for n in nodes])  # type: ignore[arg-type]
            totals = [t + c for t, c in zip(totals, costs, strict=True)]
        return [t / len(self.points) for t in totals]

    def group_costs(self, items: Sequence[tuple[Graph, tuple[Node, ...]]]) -> list[float]:
        """The mean over the points of each group's cost there (all groups of a point in one batch)."""
        totals = [0.0] * len(items)
        for k, point in enumerate(self.points):
            at = [(GraphAtPoint(graph, point, self._types[k]), tuple(self._node_at(n, k) for n in group))
                  for graph, group in items]
            costs = self.model.group_costs(at)  # type: ignore[arg-type]
            totals = [t + c for t, c in zip(totals, costs, strict=True)]
        return [t / len(self.points) for t in totals]


def graph_at(graph: Graph, point: Point) -> Graph:
    """A Graph of its own at the point's sizes (for stages that need every dim, such as placement)."""
    types = {name: concrete_type(t, point) for name, t in graph.types.items()}
    return Graph(tuple(node_at(n, point) for n in graph.nodes), graph.inputs, graph.outputs, types,
                 graph.constants, graph.context)
