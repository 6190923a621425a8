"""The cost-model interface: a graph's cost is the sum of its nodes' costs."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from xflow.ir import Graph, Node, TensorType


def node_key(graph: Graph, node: Node) -> tuple:
    """What a node's cost depends on: op (or opaque proto), attributes, input and output types."""
    ins = tuple(graph.types.get(i) if i else None for i in node.inputs)
    outs = tuple(graph.types.get(o) if o else None for o in node.outputs)
    consts = tuple(bool(i) and graph.is_constant(i) for i in node.inputs)
    return (node.signature(), ins, outs, consts)


class CostModel(Protocol):
    """Estimates or measures node costs in seconds."""

    name: str

    def node_costs(self, graph: Graph, nodes: Iterable[Node]) -> list[float]:
        """Costs of these nodes of ``graph`` (batched so a measuring model can time many at once)."""
        ...


class GraphCoster:
    """Sums node costs with a memo by node key, so derived graphs only cost their new nodes."""

    def __init__(self, model: CostModel) -> None:
        self.model = model
        self.memo: dict[tuple, float] = {}
        self.lookups = 0
        self.hits = 0

    def cost(self, graph: Graph) -> float:
        """Total cost of the graph."""
        return sum(self._costs(graph, graph.nodes))

    def derived_cost(self, parent: Graph, parent_cost: float, child: Graph) -> float:
        """Cost of a graph made by ``Graph.derive`` from ``parent``: only changed nodes are costed."""
        change = child.__dict__.get("last_change")
        if change is None:
            return self.cost(child)
        removed, added = change
        return parent_cost - sum(self._costs(parent, removed)) + sum(self._costs(child, added))

    def _costs(self, graph: Graph, nodes: Sequence[Node]) -> list[float]:
        keys = [node_key(graph, n) for n in nodes]
        missing = [(k, n) for k, n in zip(keys, nodes, strict=True) if k not in self.memo]
        self.lookups += len(keys)
        self.hits += len(keys) - len(missing)
        if missing:
            unique: dict[tuple, Node] = {}
            for k, n in missing:
                unique.setdefault(k, n)
            for k, c in zip(unique, self.model.node_costs(graph, unique.values()), strict=True):
                self.memo[k] = c
        return [self.memo[k] for k in keys]


def value_bytes(t: TensorType | None) -> int:
    """Bytes of a value with static type, 0 when unknown."""
    if t is None or not t.is_static:
        return 0
    return t.size * t.np_dtype.itemsize
