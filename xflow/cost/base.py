"""The cost-model interface: a graph's cost is the sum of its nodes' costs, or, for a model that
``fuses``, of its groups' costs (a head and the epilogues ORT fuses into it, see ``fusion``)."""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from xflow.cost.fusion import FusionMemo, chain, groups, head_of, is_folded, neighbourhood
from xflow.ir import Graph, Node, NodeChange, TensorType

__all__ = ["CostModel", "GraphCoster", "changed_values", "group_key", "is_folded", "node_key", "value_bytes"]


def node_key(graph: Graph, node: Node) -> tuple:
    """What a node's cost depends on: op (or opaque proto), attributes, input and output types, and
    which inputs are constant when the model runs (initializers, or values folded into new ones)."""
    ins = tuple(graph.types.get(i) if i else None for i in node.inputs)
    outs = tuple(graph.types.get(o) if o else None for o in node.outputs)
    consts = tuple(bool(i) and graph.is_constant_value(i) for i in node.inputs)
    return (node.signature(), ins, outs, consts)


class CostModel(Protocol):
    """Estimates or measures node costs in seconds."""

    name: str

    def node_costs(self, graph: Graph, nodes: Iterable[Node]) -> list[float]:
        """Costs of these nodes of ``graph`` (batched so a measuring model can time many at once)."""
        ...

    def group_costs(self, items: Sequence[tuple[Graph, tuple[Node, ...]]]) -> list[float]:
        """Costs of (graph, group) pairs, a group being a head and its fused epilogues or one node
        (only groups of one for a model whose ``fuses`` attribute is false), batched like node_costs."""
        ...


def group_key(graph: Graph, nodes: Sequence[Node], key_of: Callable[[Graph, Node], tuple]) -> tuple:
    """What a group's cost depends on: its nodes' keys and at which input each epilogue reads the
    value before it. A group of one has its node's key (so cached node costs stay valid)."""
    if len(nodes) == 1:
        return key_of(graph, nodes[0])
    links = tuple(n.inputs.index(next(o for o in prev.outputs if o)) for prev, n in itertools.pairwise(nodes))
    return ("fused", tuple(key_of(graph, n) for n in nodes), links)


def changed_values(removed: Iterable[Node], added: Iterable[Node]) -> set[str]:
    """Every value a change's removed or added nodes read or write."""
    return {v for n in (*removed, *added) for v in (*n.inputs, *n.outputs, *n.implicit) if v}


class GraphCoster:
    """Sums node (or group) costs with a memo by key, so derived graphs only cost their new nodes
    (and, with fusion, the groups around them)."""

    def __init__(self, model: CostModel) -> None:
        self.model = model
        self.fusion = bool(getattr(model, "fuses", False))
        # a group's cost by its nodes (a key is the same in every graph, see below; Nodes hash by
        # identity, where a key tuple of types and attributes is hashed anew on every lookup)
        self.by_nodes: dict[tuple[Node, ...], float] = {}
        self.memo: dict[tuple, float] = {}
        self.keys: dict[Node, tuple] = {}  # a node's key is the same in every graph it is in (names identify values)
        self.lookups = 0
        self.hits = 0
        # per graph (or pending graph), while it lives: the fusion grouping's memo, and the groups its
        # change unmade and made (asked for once when prefetching and again when costing)
        self._fusion_memos: weakref.WeakKeyDictionary[Any, FusionMemo] = weakref.WeakKeyDictionary()
        self._change_groups_of: weakref.WeakKeyDictionary[Any, tuple[list[tuple[Node, ...]],
                                                                    list[tuple[Node, ...]]]] = \
            weakref.WeakKeyDictionary()

    def fusion_memo(self, graph: Any) -> FusionMemo:
        """The memo of ``graph``'s fusion grouping (see ``xflow.cost.fusion``), kept while it lives."""
        memo = self._fusion_memos.get(graph)
        if memo is None:
            memo = self._fusion_memos[graph] = {}
        return memo

    def cost(self, graph: Graph) -> float:
        """Total cost of the graph."""
        if self.fusion:
            memo = self.fusion_memo(graph)
            return sum(self._group_costs(graph, [chain(graph, n, memo) for n in graph.nodes
                                                 if head_of(graph, n, memo) is None]))
        return sum(self._costs(graph, graph.nodes))

    def derived_cost(self, parent: Graph, parent_cost: float, child: Graph) -> float:
        """Cost of a graph made by ``Graph.derive`` from ``parent`` (its ``change``): only changed nodes
        are costed (with fusion: the groups of the changed nodes and of their neighbours, in both graphs)."""
        change = child.change
        if change is None:
            return self.cost(child)
        removed, added = change
        if self.fusion:
            before, after = self._change_groups(parent, child, change)
            return parent_cost - sum(self._group_costs(parent, before)) + sum(self._group_costs(child, after))
        return parent_cost - sum(self._costs(parent, removed)) + sum(self._costs(child, added))

    def _change_groups(self, parent: Graph, child: Graph, change: NodeChange
                       ) -> tuple[list[tuple[Node, ...]], list[tuple[Node, ...]]]:
        """The groups a change can have unmade (in ``parent``) and made (in ``child``): those of the
        changed nodes and of every unchanged node near the change in either graph."""
        found = self._change_groups_of.get(child)
        if found is not None:
            return found
        removed, added = change
        values = changed_values(removed, added)
        changed = {id(n) for n in (*removed, *added)}
        near: dict[int, Node] = {}
        parent_memo, child_memo = self.fusion_memo(parent), self.fusion_memo(child)
        for graph, memo in ((parent, parent_memo), (child, child_memo)):
            near.update((id(n), n) for n in neighbourhood(graph, values, memo) if id(n) not in changed)
        found = (groups(parent, [*removed, *near.values()], parent_memo),
                 groups(child, [*added, *near.values()], child_memo))
        self._change_groups_of[child] = found
        return found

    def _key(self, graph: Graph, node: Node) -> tuple:
        key = self.keys.get(node)
        if key is None:
            key = self.keys[node] = node_key(graph, node)
        return key

    def prefetch(self, changes: Sequence[tuple[Graph, Sequence[Node]]]) -> None:
        """Cost the new nodes of many derived graphs at once (one measuring batch for all of them);
        with fusion, the groups their changes made."""
        wanted: dict[tuple, tuple[Graph, tuple[Node, ...]]] = {}
        for graph, nodes in changes:
            if self.fusion:
                parent = getattr(graph, "parent", None)  # a PendingGraph knows it; others are costed later
                found = self._change_groups(parent, graph, graph.change)[1] if parent is not None else []
            else:
                found = [(n,) for n in nodes]
            for group in found:
                k = self._group_key(graph, group)
                if k not in self.memo:
                    wanted.setdefault(k, (graph, group))
        if wanted:
            self.memo.update(zip(wanted, self.model.group_costs(list(wanted.values())), strict=True))

    def _group_key(self, graph: Graph, group: tuple[Node, ...]) -> tuple:
        return group_key(graph, group, self._key)

    def _group_costs(self, graph: Graph, found: Sequence[tuple[Node, ...]]) -> list[float]:
        by_nodes = self.by_nodes
        self.lookups += len(found)
        todo = [g for g in found if g not in by_nodes]
        if todo:
            keys = [self._group_key(graph, g) for g in todo]
            missing: dict[tuple, tuple[Graph, tuple[Node, ...]]] = {}
            for k, g in zip(keys, todo, strict=True):
                if k not in self.memo:
                    missing.setdefault(k, (graph, g))
            if missing:
                self.memo.update(zip(missing, self.model.group_costs(list(missing.values())),
                                     strict=True))
            by_nodes.update((g, self.memo[k]) for g, k in zip(todo, keys, strict=True))
            self.hits += len(found) - len(missing)
        else:
            self.hits += len(found)
        return [by_nodes[g] for g in found]

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

