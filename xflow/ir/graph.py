"""The graph IR: nodes in topological order over named values with static types."""

from __future__ import annotations

import hashlib
import heapq
import itertools
from collections import ChainMap, Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NamedTuple

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
    # initializers that are also graph inputs (a caller may feed them): kept in ``Graph.constants`` (decoders
    # read their values, the writer writes them back while they are read), but no constant to a rewrite
    # (``Graph.is_constant``), so none is folded or merged away and the written model keeps them as inputs
    overridable: frozenset[str] = frozenset()

    @property
    def opset(self) -> int:
        """The default-domain opset version."""
        for imp in self.template.opset_import:
            if imp.domain in ("", "ai.onnx"):
                return int(imp.version)
        return 1


class NodeChange(NamedTuple):
    """What made a graph from another: the nodes it no longer has and the nodes it gained."""

    removed: tuple[Node, ...]
    added: tuple[Node, ...]


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
    # the change ``derive`` made to the graph this one was derived from (None for any other graph)
    change: NodeChange | None = field(default=None, compare=False, repr=False)
    # value name -> computed from constants alone (see ``is_constant_value``); names identify
    # computations, so derived graphs share their parent's
    constant_memo: dict[str, bool] = field(default_factory=dict, compare=False, repr=False)

    # ---- indexes (computed once per graph) -------------------------------------------------
    @cached_property
    def producers(self) -> dict[str, Node]:
        """Value name -> the node that produces it."""
        return {out: n for n in self.nodes for out in n.outputs if out}

    @cached_property
    def users(self) -> dict[str, list[tuple[Node, int]]]:
        """Value name -> (node, input index) pairs that read it, in node order."""
        return _users_table(self.nodes)

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

    #: how far ``is_unread`` follows readers: a longer chain counts as read (kept), which is always safe
    UNREAD_DEPTH = 32

    @cached_property
    def unread_memo(self) -> dict[int, bool]:
        """``is_unread``'s answers for this graph, by node id."""
        return {}

    def is_unread(self, node: Node, depth: int = 0) -> bool:
        """True for an opaque standard-ONNX node (no subgraph) whose values nothing else in the graph reads, directly
        or through other such nodes, and that makes no graph output: what is left of a computation the IR no longer
        needs, as the Shape -> Gather -> Concat chain of a Reshape target that decoding resolved (the IR Reshape
        reads only its data; the chain still reads the Reshape's input). A rewrite may drop it with the value it
        reads. Asked per node (chains are short), not computed for the whole graph: the search asks on graph after
        graph."""
        memo = self.unread_memo
        key = id(node)
        if key not in memo:
            outputs = [o for o in node.outputs if o]
            memo[key] = (depth < self.UNREAD_DEPTH and _pure_opaque(node)
                         and not any(o in self.output_set for o in outputs)
                         and all(self.is_unread(u, depth + 1) for o in outputs for u, _ in self.users.get(o, ())))
        return memo[key]

    def is_constant(self, name: str) -> bool:
        """True when the value is an initializer no caller may feed (an overridable one is an input)."""
        return name in self.constants and not (self.context is not None and name in self.context.overridable)

    def is_constant_value(self, name: str) -> bool:
        """True for initializers and for values computed from constants alone by op-table nodes
        (those fold into new initializers before the model is written); never for an overridable initializer
        or what is computed from one."""
        memo = self.constant_memo
        found = memo.get(name)
        if found is None:
            found = _constant_value(name, memo, self.constants, self.producers.get, _overridable(self.context))
        return found

    def type_of(self, name: str) -> TensorType | None:
        """The type of a value, or None when unknown."""
        return self.types.get(name)

    def producer_of(self, name: str) -> Node | None:
        """The node that produces ``name``, None for inputs and constants."""
        return self.producers.get(name)

    def users_of(self, name: str) -> list[tuple[Node, int]]:
        """(node, input index) pairs that read ``name``."""
        return self.users.get(name, [])

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
        updated incrementally by ``derive``; the same in every process (a certificate states it)."""
        total = sum(n.local_hash for n in self.nodes)
        outputs = int.from_bytes(hashlib.blake2b(repr(self.outputs).encode(), digest_size=16).digest(), "little")
        return (total + outputs) % (1 << 128)

    @property
    def structural_hash(self) -> str:
        """The graph's identity as hex: equal for graphs with the same nodes on the same values."""
        return f"{self.hash_sum:032x}"

    def _splice_bounds(self, gone: set[int], added: list[Node] | tuple[Node, ...]) -> tuple[int, int]:
        """(earliest position of a kept reader of an added output, latest position of a kept producer
        of an added input): the added nodes fit in place between them when latest < earliest."""
        position, users, producers = self.position, self.users, self.producers
        new_outputs = {o for n in added for o in n.outputs}
        earliest = len(self.nodes)
        for o in new_outputs:
            for user, _ in users.get(o, ()):  # in node order: the first kept one is the earliest
                if id(user) not in gone:
                    earliest = min(earliest, position[user])
                    break
        latest = -1
        for n in added:
            for names in (n.inputs, n.implicit):
                for i in names:
                    producer = producers.get(i)
                    if producer is not None and id(producer) not in gone and i not in new_outputs:
                        latest = max(latest, position[producer])
        return earliest, latest

    def derive(self, removed: Iterable[Node], added: Iterable[Node], types: Mapping[str, TensorType]) -> Graph:
        """A new graph without ``removed`` and with ``added`` (which must be in topological order among
        themselves). Splices them in place when the order allows, else sorts the whole graph; raises
        CycleError when no order exists. The hash is updated, not recomputed."""
        removed = list(removed)
        added = list(added)
        gone = {id(n) for n in removed}
        earliest, latest = self._splice_bounds(gone, added)
        if latest < earliest:
            nodes = _splice(self.nodes, sorted(self.position[n] for n in removed if n in self.position),
                            latest + 1, added)
        else:
            kept = [n for n in self.nodes if id(n) not in gone]
            nodes = topological_sort(kept + added, self.inputs, self.constants.keys())
        new_types = dict(self.types)
        new_types.update(types)
        # Names identify computations, so whether a value is constant does not change between derived
        # graphs: share the memo instead of walking every ancestor again in each child.
        graph = Graph(tuple(nodes), self.inputs, self.outputs, new_types, self.constants, self.context,
                      NodeChange(tuple(removed), tuple(added)), self.constant_memo)
        if "hash_sum" in self.__dict__:
            graph.__dict__["hash_sum"] = self.derived_hash(removed, added)
        self._derive_indexes(graph, removed, added, gone)
        return graph

    def derived_hash(self, removed: Iterable[Node], added: Iterable[Node]) -> int:
        """``hash_sum`` of the graph ``derive(removed, added, ...)`` makes, without making it."""
        delta = sum(n.local_hash for n in added) - sum(n.local_hash for n in removed)
        return (self.hash_sum + delta) % (1 << 128)

    def _derive_indexes(self, graph: Graph, removed: list[Node], added: list[Node], gone: set[int]) -> None:
        """Give ``graph`` the indexes this graph has computed, updated for the change instead of rebuilt
        (the same lists, in node order; a dict's key order may differ from a fresh build)."""
        mine = self.__dict__
        if "producers" in mine:
            producers = dict(self.producers)
            for n in removed:
                for o in n.outputs:
                    if o and producers.get(o) is n:
                        del producers[o]
            producers.update((o, n) for n in added for o in n.outputs if o)
            graph.__dict__["producers"] = producers
        if "users" in mine:
            reads = _users_table(added)
            touched = {i for n in removed for i in (*n.inputs, *n.implicit) if i} | reads.keys()
            position = graph.position
            users = dict(self.users)
            for value in touched:
                entries = [e for e in self.users.get(value, ()) if id(e[0]) not in gone] + reads.get(value, [])
                if entries:
                    entries.sort(key=lambda e: position[e[0]])
                    users[value] = entries
                else:
                    users.pop(value, None)
            graph.__dict__["users"] = users
        if "by_op" in mine:
            position = graph.position
            by_op = dict(self.by_op)
            for op in {n.op for n in removed} | {n.op for n in added}:
                nodes = [n for n in self.by_op.get(op, ()) if id(n) not in gone] + [n for n in added if n.op == op]
                if nodes:
                    by_op[op] = sorted(nodes, key=position.__getitem__)
                else:
                    by_op.pop(op, None)
            graph.__dict__["by_op"] = by_op

    def fresh(self) -> Graph:
        """The same graph without cached indexes (rebuilt on demand, so their dicts' key order is the
        node order, as for a graph that was never derived)."""
        return Graph(self.nodes, self.inputs, self.outputs, self.types, self.constants, self.context)

    def creates_cycle(self, removed: Iterable[Node], added: Iterable[Node]) -> bool:
        """True when ``derive(removed, added, ...)`` would raise CycleError, found without building the
        graph: a cycle must pass through added nodes, so it is one among them in the small graph whose
        edges are "an output of a reaches an input of b" (directly, or through kept nodes)."""
        added = list(added)
        gone = {id(n) for n in removed}
        earliest, latest = self._splice_bounds(gone, added)
        if latest < earliest:
            return False
        made_by = {o: k for k, n in enumerate(added) for o in n.outputs if o}
        position = self.position
        # kept producers of added inputs (by position), and which added nodes read each
        wanted: dict[int, list[int]] = {}
        edges: list[set[int]] = [set() for _ in added]
        for b, n in enumerate(added):
            for i in (*n.inputs, *n.implicit):
                if not i:
                    continue
                if i in made_by:
                    edges[made_by[i]].add(b)
                    continue
                producer = self.producers.get(i)
                if producer is not None and id(producer) not in gone:
                    wanted.setdefault(position[producer], []).append(b)
        for a, n in enumerate(added):  # kept nodes reachable from a's outputs (descendants come later)
            frontier = [u for o in n.outputs if o for u, _ in self.users.get(o, []) if id(u) not in gone]
            seen: set[int] = set()
            while frontier:
                node = frontier.pop()
                pos = position[node]
                if pos > latest or pos in seen:
                    continue
                seen.add(pos)
                edges[a].update(wanted.get(pos, ()))
                frontier.extend(u for o in node.outputs if o for u, _ in self.users.get(o, []) if id(u) not in gone)
        state = [0] * len(added)  # 0 new, 1 on the stack, 2 done
        for start in range(len(added)):
            if state[start]:
                continue
            stack = [(start, iter(edges[start]))]
            state[start] = 1
            while stack:
                node, it = stack[-1]
                nxt = next(it, None)
                if nxt is None:
                    state[node] = 2
                    stack.pop()
                elif state[nxt] == 1:
                    return True
                elif state[nxt] == 0:
                    state[nxt] = 1
                    stack.append((nxt, iter(edges[nxt])))
        return False

    def pending(self, removed: Iterable[Node], added: Iterable[Node], types: Mapping[str, TensorType],
                hash_sum: int | None = None) -> PendingGraph:
        """``derive(removed, added, types)`` without building it yet (see ``PendingGraph``);
        ``hash_sum`` is ``derived_hash(removed, added)`` where the caller has it already."""
        return PendingGraph(self, tuple(removed), tuple(added), types, hash_sum)

    def opaque_count(self) -> int:
        """How many nodes are outside the algebra (opaque)."""
        return sum(1 for n in self.nodes if n.is_opaque)

    def parameter_only_opaque(self) -> set[int]:
        """Positions of the opaque nodes whose results no node of the IR reads any more and that are no graph
        outputs: shape computations whose values the decoders turned into attributes (a Pad's pads). They stay
        only so that an unrewritten model saves losslessly."""
        readers = Counter(i for n in self.nodes for i in (*n.inputs, *n.implicit))
        outputs = set(self.outputs)
        dead: set[int] = set()
        for k in range(len(self.nodes) - 1, -1, -1):  # readers come after (topological order): one pass
            node = self.nodes[k]
            if not node.is_opaque or any(readers[o] or o in outputs for o in node.outputs if o):
                continue
            dead.add(k)
            for i in (*node.inputs, *node.implicit):
                readers[i] -= 1
        return dead

    def opaque_computing(self) -> list[Node]:
        """The opaque nodes that compute at run time: not ``Constant`` nodes (data the decoders read) and not
        those feeding only folded parameters (``parameter_only_opaque``)."""
        dead = self.parameter_only_opaque()
        return [n for k, n in enumerate(self.nodes) if n.is_opaque and k not in dead and n.onnx_type != "Constant"]

    def op_counts(self) -> dict[str, int]:
        """How many nodes of each op (opaque ones by ONNX type)."""
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.onnx_type] = counts.get(n.onnx_type, 0) + 1
        return dict(sorted(counts.items()))


class PendingGraph:
    """A graph derived from ``parent`` that is not built yet: it knows its size, structural hash,
    value types and which values are constant, which is all a search needs to dedupe and cost it.
    ``build()`` makes the Graph (``parent.derive``, so the same graph as deriving at once); any other
    Graph attribute builds it first. Check ``parent.creates_cycle`` before: building a graph with a
    cycle raises CycleError."""

    def __init__(self, parent: Graph, removed: tuple[Node, ...], added: tuple[Node, ...],
                 types: Mapping[str, TensorType], hash_sum: int | None = None) -> None:
        self.parent = parent
        self.change_types = types
        self.change = NodeChange(removed, added)  # as ``Graph.change`` of the built graph
        self.hash_sum = parent.derived_hash(removed, added) if hash_sum is None else hash_sum
        self._built: Graph | None = None

    # what the parent has, the child has too (these never build the graph)
    inputs = property(lambda self: self.parent.inputs)
    outputs = property(lambda self: self.parent.outputs)
    constants = property(lambda self: self.parent.constants)
    context = property(lambda self: self.parent.context)

    @cached_property
    def types(self) -> Mapping[str, TensorType]:
        """Types of all values: the parent's and the added nodes' outputs."""
        return ChainMap(self.change_types, self.parent.types)  # type: ignore[arg-type]

    @cached_property
    def size(self) -> int:
        """How many nodes the built graph has."""
        removed, added = self.change
        return len(self.parent.nodes) - len(self._gone) + len(added)

    @cached_property
    def _gone(self) -> set[int]:
        return {id(n) for n in self.change[0]}

    @cached_property
    def _made_by(self) -> dict[str, Node]:
        return {o: n for n in self.change[1] for o in n.outputs if o}

    @property
    def structural_hash(self) -> str:
        """The hash the built graph will have."""
        return f"{self.hash_sum:032x}"

    def build(self) -> Graph:
        """The derived Graph (built once)."""
        if self._built is None:
            removed, added = self.change
            self._built = self.parent.derive(removed, added, self.change_types)
        return self._built

    def is_constant(self, name: str) -> bool:
        """As ``Graph.is_constant``."""
        return name in self.constants and name not in _overridable(self.parent.context)

    def is_constant_value(self, name: str) -> bool:
        """As ``Graph.is_constant_value`` on the built graph (the memo is the parent's, shared)."""
        memo = self.parent.constant_memo
        found = memo.get(name)
        if found is None:
            found = _constant_value(name, memo, self.constants, self._producer, _overridable(self.parent.context))
        return found

    def _producer(self, name: str) -> Node | None:
        made = self._made_by.get(name)
        if made is not None:
            return made
        producer = self.parent.producers.get(name)
        return None if producer is None or id(producer) in self._gone else producer

    def type_of(self, name: str) -> TensorType | None:
        """The type of a value, or None when unknown."""
        return self.types.get(name)

    @property
    def output_set(self) -> frozenset[str]:
        """Graph outputs as a set (the parent's)."""
        return self.parent.output_set

    def producer_of(self, name: str) -> Node | None:
        """As ``Graph.producer_of`` on the built graph, without building it."""
        return self._producer(name)

    @cached_property
    def _added_users(self) -> dict[str, list[tuple[Node, int]]]:
        return _users_table(self.change[1])

    def users_of(self, name: str) -> list[tuple[Node, int]]:
        """As ``Graph.users_of`` on the built graph (not in node order), without building it."""
        gone = self._gone
        kept = [(n, i) for n, i in self.parent.users.get(name, ()) if id(n) not in gone]
        return kept + self._added_users.get(name, [])

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("parent", "_built", "change", "change_types", "hash_sum"):
            raise AttributeError(name)
        return getattr(self.build(), name)


def _users_table(nodes: Iterable[Node]) -> dict[str, list[tuple[Node, int]]]:
    """Value name -> (node, input index) pairs of ``nodes`` that read it (-1 for a subgraph capture)."""
    table: dict[str, list[tuple[Node, int]]] = {}
    for n in nodes:
        for i, name in enumerate(n.inputs):
            if name:
                table.setdefault(name, []).append((n, i))
        for name in n.implicit:
            table.setdefault(name, []).append((n, -1))
    return table


def _overridable(context: ModelContext | None) -> frozenset[str]:
    return context.overridable if context is not None else frozenset()


def _constant_value(name: str, memo: dict[str, bool], constants: Mapping[str, Constant],
                    producer_of: Callable[[str], Node | None], overridable: frozenset[str] = frozenset()) -> bool:
    """Whether ``name`` is an initializer or computed from constants alone by op-table nodes; fills
    ``memo`` for it and the values it depends on. Iterative: deep constant chains must not hit the
    recursion limit."""
    stack = [name]
    while stack:
        top = stack[-1]
        if top in memo:
            stack.pop()
            continue
        if top in constants:
            memo[top] = top not in overridable
            stack.pop()
            continue
        producer = producer_of(top)
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


def _splice(nodes: tuple[Node, ...], gone: list[int], at: int, added: list[Node]) -> list[Node]:
    """``nodes`` without the (sorted) positions ``gone``, with ``added`` inserted before position ``at``,
    built from slices."""
    pieces: list[Sequence[Node]] = []
    start = 0
    inserted = False
    for p in gone:
        if not inserted and at <= p:
            pieces += (nodes[start:at], added)
            start, inserted = at, True
        pieces.append(nodes[start:p])
        start = p + 1
    if not inserted:
        at = max(at, start)
        pieces += (nodes[start:at], added)
        start = at
    pieces.append(nodes[start:])
    return list(itertools.chain.from_iterable(pieces))


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


def _pure_opaque(node: Node) -> bool:
    """An opaque node of the standard ONNX domain without subgraphs: it computes its outputs from its inputs and
    nothing else, so where nothing reads them it can go."""
    if not node.is_opaque or node.origin is None or node.implicit:
        return False
    proto = node.origin.proto
    return proto.domain in ("", "ai.onnx") and not any(
        a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in proto.attribute)
