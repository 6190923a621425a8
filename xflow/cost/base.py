"""The cost-model interface: a graph's cost is the sum of its nodes' costs."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from xflow.ir import Graph, Node, TensorType
from xflow.ops import OPS


def node_key(graph: Graph, node: Node) -> tuple:
    """What a node's cost depends on: op (or opaque proto), attributes, input and output types, and
    which inputs are constant when the model runs (initializers, or values folded into new ones)."""
    ins = tuple(graph.types.get(i) if i else None for i in node.inputs)
    outs = tuple(graph.types.get(o) if o else None for o in node.outputs)
    consts = tuple(bool(i) and graph.is_constant_value(i) for i in node.inputs)
    return (node.signature(), ins, outs, consts)


def is_folded(graph: Graph, node: Node) -> bool:
    """True for op-table nodes that ``fold_constants`` turns into initializers: they cost nothing."""
    if node.is_opaque:
        return False
    return OPS[node.op].weights_only or all(graph.is_constant_value(i) for i in node.inputs if i)


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
        self.keys: dict[Node, tuple] = {}  # a node's key is the same in every graph it is in (names identify values)
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

    def _key(self, graph: Graph, node: Node) -> tuple:
        key = self.keys.get(node)
        if key is None:
            key = self.keys[node] = node_key(graph, node)
        return key

    def prefetch(self, changes: Sequence[tuple[Graph, Sequence[Node]]]) -> None:
        """Cost the new nodes of many derived graphs at once (one measuring batch for all of them)."""
        missing: dict[tuple, tuple[Graph, Node]] = {}
        for graph, nodes in changes:
            for n in nodes:
                k = self._key(graph, n)
                if k not in self.memo:
                    missing.setdefault(k, (graph, n))
        if not missing:
            return
        costs_of = getattr(self.model, "costs_of", None)
        if costs_of is not None:
            costs = costs_of(list(missing.values()))
        else:
            costs = [self.model.node_costs(g, [n])[0] for g, n in missing.values()]
        self.memo.update(zip(missing, costs, strict=True))

    def _costs(self, graph: Graph, nodes: Sequence[Node]) -> list[float]:
        keys = [self._key(graph, n) for n in nodes]
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
