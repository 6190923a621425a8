"""The graph IR: nodes in topological order over named values with static types."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property

import onnx

from xflow.ir.node import Node
from xflow.ir.tensor import Constant
from xflow.ir.types import TensorType


class CycleError(ValueError):
    """Raised when nodes cannot be put in topological order."""


@dataclass(frozen=True, eq=False)
class ModelContext:
    """Everything of the source model that the graph rewrites never touch: opset imports, IR version,
    metadata, functions, the graph's own inputs/outputs protos. Shared by reference between graphs."""

    template: onnx.ModelProto  # the source model with graph.node and graph.initializer emptied
    base_dir: str = ""
    path: str = ""
    external_data: bool = False  # the source kept weights in external files (so its output does too)

    @property
    def opset(self) -> int:
        """The default-domain opset version."""
        for imp in self.template.opset_import:
            if imp.domain in ("", "ai.onnx"):
                return int(imp.version)
        return 1


@dataclass(frozen=True, eq=False)
class Graph:
    """An immutable dataflow graph. Rewrites build new graphs that share unchanged nodes.

    ``types`` holds the type of every value (graph inputs, initializers, node outputs) that is known;
    ``inputs`` are the runtime inputs (not initializers); ``outputs`` the graph outputs in order.
    """

    nodes: tuple[Node, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    types: Mapping[str, TensorType]
    constants: Mapping[str, Constant]
    context: ModelContext | None = None

    # ---- indexes (computed once per graph) -------------------------------------------------
    @cached_property
    def producers(self) -> dict[str, Node]:
        """Value name -> the node that produces it."""
        return {out: n for n in self.nodes for out in n.outputs if out}

    @cached_property
    def users(self) -> dict[str, list[tuple[Node, int]]]:
        """Value name -> (node, input index) pairs that read it, in node order."""
        table: dict[str, list[tuple[Node, int]]] = {}
        for n in self.nodes:
            for i, name in enumerate(n.inputs):
                if name:
                    table.setdefault(name, []).append((n, i))
            for name in n.implicit:
                table.setdefault(name, []).append((n, -1))
        return table

    @cached_property
    def by_op(self) -> dict[str, list[Node]]:
        """Op name -> nodes of that op, in topological order."""
        table: dict[str, list[Node]] = {}
        for n in self.nodes:
            table.setdefault(n.op, []).append(n)
        return table

    @cached_property
    def position(self) -> dict[Node, int]:
        """Node -> its index in ``nodes``."""
        return {n: i for i, n in enumerate(self.nodes)}

    @cached_property
    def output_set(self) -> frozenset[str]:
        """Graph outputs as a set."""
        return frozenset(self.outputs)

    def is_constant(self, name: str) -> bool:
        """True when the value is an initializer."""
        return name in self.constants

    def is_constant_value(self, name: str) -> bool:
        """True for initializers and for values computed from constants alone by op-table nodes
        (those fold into new initializers before the model is written)."""
        memo: dict[str, bool] = self.__dict__.setdefault("_constant_memo", {})
        if name not in memo:
            stack = [name]
            while stack:  # iterative post-order: deep constant chains must not hit the recursion limit
                top = stack[-1]
                if top in memo:
                    stack.pop()
                    continue
                if top in self.constants:
                    memo[top] = True
                    stack.pop()
                    continue
                producer = self.producers.get(top)
                if producer is None or producer.is_opaque:
                    memo[top] = False
                    stack.pop()
                    continue
                pending = [i for i in producer.inputs if i and i not in memo]
                if pending:
                    stack.extend(pending)
                    continue
                memo[top] = all(memo[i] for i in producer.inputs if i)
                stack.pop()
        return memo[name]

    def type_of(self, name: str) -> TensorType | None:
        """The type of a value, or None when unknown."""
        return self.types.get(name)

    # ---- derived graphs ---------------------------------------------------------------------
    def with_nodes(self, nodes: Iterable[Node], types: Mapping[str, TensorType] | None = None,
                   constants: Mapping[str, Constant] | None = None, outputs: tuple[str, ...] | None = None,
                   prune: bool = True) -> Graph:
        """A new graph with these nodes (sorted topologically), extra types/constants merged in,
        and—with ``prune``—values and constants nobody uses any more dropped."""
        ordered = topological_sort(list(nodes), self.inputs, self.constants.keys() | (constants or {}).keys())
        new_types = dict(self.types)
        new_types.update(types or {})
        new_constants = dict(self.constants)
        new_constants.update(constants or {})
        graph = Graph(tuple(ordered), self.inputs, outputs or self.outputs, new_types, new_constants,
                      self.context)
        return graph.pruned() if prune else graph

    def pruned(self) -> Graph:
        """Drop nodes whose outputs nobody needs (only non-opaque ones: opaque nodes may have side
        effects in other domains and are always kept), then unused types and constants."""
        needed = set(self.outputs)
        keep: list[Node] = []
        for n in reversed(self.nodes):
            if n.is_opaque or any(o in needed for o in n.outputs):
                keep.append(n)
                needed.update(i for i in n.inputs if i)
                needed.update(n.implicit)
        keep.reverse()
        used = set(self.inputs) | needed
        for n in keep:
            used.update(n.outputs)
            if n.origin is not None:  # an unchanged node is saved as its original proto, which may read
                used.update(n.origin.proto.input)  # constants the IR node holds as attributes (Reshape's shape)
        types = {k: v for k, v in self.types.items() if k in used}
        constants = {k: v for k, v in self.constants.items() if k in used}
        if len(keep) == len(self.nodes) and len(types) == len(self.types) and len(constants) == len(self.constants):
            return self
        return Graph(tuple(keep), self.inputs, self.outputs, types, constants, self.context)

    # ---- identity ---------------------------------------------------------------------------
    @cached_property
    def hash_sum(self) -> int:
        """Sum of the nodes' local hashes (mod 2**128) plus the outputs: order-independent and
        updated incrementally by ``derive``."""
        total = sum(n.local_hash for n in self.nodes)
        return (total + hash(self.outputs)) % (1 << 128)

    @property
    def structural_hash(self) -> str:
        """The graph's identity as hex: equal for graphs with the same nodes on the same values."""
        return f"{self.hash_sum:032x}"

    def derive(self, removed: Iterable[Node], added: Iterable[Node], types: Mapping[str, TensorType]) -> Graph:
        """A new graph without ``removed`` and with ``added`` (which must be in topological order among
        themselves). Splices them in place when the order allows, else sorts the whole graph; raises
        CycleError when no order exists. The hash is updated, not recomputed."""
        removed = list(removed)
        added = list(added)
        gone = {id(n) for n in removed}
        position = self.position
        new_outputs = {o for n in added for o in n.outputs}
        earliest = len(self.nodes)
        for o in new_outputs:
            for user, _ in self.users.get(o, []):
                if id(user) not in gone:
                    earliest = min(earliest, position[user])
        latest = -1
        for n in added:
            for i in (*n.inputs, *n.implicit):
                producer = self.producers.get(i)
                if producer is not None and id(producer) not in gone and i not in new_outputs:
                    latest = max(latest, position[producer])
        kept = [n for n in self.nodes if id(n) not in gone]
        if latest < earliest:
            cut = sum(1 for n in self.nodes[:latest + 1] if id(n) not in gone)
            nodes = kept[:cut] + added + kept[cut:]
        else:
            nodes = topological_sort(kept + added, self.inputs, self.constants.keys())
        new_types = dict(self.types)
        new_types.update(types)
        graph = Graph(tuple(nodes), self.inputs, self.outputs, new_types, self.constants, self.context)
        if "hash_sum" in self.__dict__:
            delta = sum(n.local_hash for n in added) - sum(n.local_hash for n in removed)
            graph.__dict__["hash_sum"] = (self.hash_sum + delta) % (1 << 128)
        graph.__dict__["last_change"] = (tuple(removed), tuple(added))
        # Names identify computations, so whether a value is constant does not change between derived
        # graphs: share the memo instead of walking every ancestor again in each child.
        graph.__dict__["_constant_memo"] = self.__dict__.setdefault("_constant_memo", {})
        return graph

    def op_counts(self) -> dict[str, int]:
        """How many nodes of each op (opaque ones by ONNX type)."""
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.onnx_type] = counts.get(n.onnx_type, 0) + 1
        return dict(sorted(counts.items()))


def topological_sort(nodes: list[Node], inputs: Iterable[str], constants: Iterable[str]) -> list[Node]:
    """Order nodes so each comes after the producers of its inputs; stable for already-sorted input.
    Raises CycleError when the nodes form a cycle."""
    producer: dict[str, int] = {}
    for idx, n in enumerate(nodes):
        for out in n.outputs:
            if out:
                producer[out] = idx
    pending = [0] * len(nodes)
    consumers: list[list[int]] = [[] for _ in nodes]
    for idx, n in enumerate(nodes):
        deps = {producer[i] for i in (*n.inputs, *n.implicit) if i in producer}
        deps.discard(idx)
        if any(producer.get(i) == idx for i in n.inputs):
            raise CycleError(f"node {n!r} reads its own output")
        pending[idx] = len(deps)
        for d in deps:
            consumers[d].append(idx)
    ready = [i for i, c in enumerate(pending) if c == 0]
    heapq.heapify(ready)
    order: list[Node] = []
    while ready:
        idx = heapq.heappop(ready)
        order.append(nodes[idx])
        for c in consumers[idx]:
            pending[c] -= 1
            if pending[c] == 0:
                heapq.heappush(ready, c)
    if len(order) != len(nodes):
        raise CycleError(f"graph has a cycle through {len(nodes) - len(order)} nodes")
    return order
