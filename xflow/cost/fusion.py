"""Which nodes ORT runs as one kernel: a head (Conv, MatMul, Gemm) and the chain of epilogues after it
(BatchNormalization folded into the weights, an activation, a bias or residual Add, a scale) that ORT's
graph optimizer fuses into it. A cost model that measures nodes one at a time charges each epilogue a
pass over memory the real model never makes (Inception-v3: 115 ms summed, 80 ms measured), and cannot
see that a rewrite which puts a Split between a Conv and its Relu loses the fusion.

Nodes are costed by **group**: a head with its chain is measured as one subgraph, an absorbed
epilogue costs nothing on its own, every other node is a group of one. Whether ORT really fuses a
given chain does not matter for correctness: a chain it does not fuse measures as the sum of its
kernels. The chain rules only decide which nodes are measured together.

A chain continues from a value to its reader when the value has that one reader (and is not a graph
output), the reader is an epilogue the head's kind takes, reads the value once and at its *link*
input: the lowest input computed at run time whose producer has the reader as its sole reader. So every epilogue belongs
to at most one chain, and which one depends only on the nodes around it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from xflow.ir import Node
from xflow.ops import OPS

_ACTIVATIONS = frozenset({"Relu", "Clip", "Sigmoid", "Tanh", "LeakyRelu", "HardSigmoid"})
#: head ONNX type -> the epilogue ONNX types ORT's CPU optimizer folds or fuses into it
#: (ConvBNFusion, ConvAddFusion, ConvMulFusion, ConvActivationFusion and the NCHWc Conv+Sum+Relu;
#: MatMulAddFusion, MatMulScaleFusion; GemmActivationFusion; SkipLayerNormFusion). SkipLayerNormFusion
#: fuses an Add (a residual sum, with a bias Add before it) and the LayerNormalization reading it into one
#: SkipLayerNormalization kernel: a LayerNormalization joins a chain only right after an Add
#: (``AFTER_ADD``), and an Add that no other chain absorbs heads one of its own, so the two are measured in
#: one session as ORT runs them. Add is then both a head and an epilogue kind: it heads a chain only where
#: it is no other head's epilogue.
FUSES: dict[str, frozenset[str]] = {
    "Conv": frozenset({"BatchNormalization", "Add", "Mul"}) | _ACTIVATIONS,
    "MatMul": frozenset({"Add", "Mul", "Div", "LayerNormalization"}),
    "Gemm": _ACTIVATIONS,
    "Add": frozenset({"LayerNormalization"}),
}
#: epilogue ONNX type -> the ONNX type the chain's previous node must have for it to join
AFTER_ADD: dict[str, str] = {"LayerNormalization": "Add"}
MAX_EPILOGUES = 3
_EPILOGUES = frozenset().union(*FUSES.values())
_KINDS = _EPILOGUES | frozenset(FUSES)


class GraphView(Protocol):
    """What the grouping reads of a graph (a Graph, or a PendingGraph not built yet)."""

    output_set: frozenset[str]

    def producer_of(self, name: str) -> Node | None: ...

    def users_of(self, name: str) -> list[tuple[Node, int]]: ...

    def is_constant_value(self, name: str) -> bool: ...


def is_folded(graph: GraphView, node: Node) -> bool:
    """True for op-table nodes that ``fold_constants`` turns into initializers: they cost nothing."""
    if node.is_opaque:
        return False
    return OPS[node.op].weights_only or all(graph.is_constant_value(i) for i in node.inputs if i)


_OP_TYPES = {name: entry.onnx_types[0] for name, entry in OPS.items()}


def ort_type(node: Node) -> str:
    """The ONNX op type ORT sees for ``node`` (the first one its op-table encoding writes)."""
    found = _OP_TYPES.get(node.op)
    return found if found is not None else node.onnx_type


def _single_output(node: Node) -> str | None:
    outs = [o for o in node.outputs if o]
    return outs[0] if len(outs) == 1 else None


#: A memo of the functions below for one graph (a graph's nodes and edges never change once made;
#: the search asks the same questions of a parent for each of its children). Its owner (the coster)
#: keeps one per graph; without one, each call starts afresh.
FusionMemo = dict


def _sole_reader(graph: GraphView, value: str, memo: FusionMemo) -> tuple[Node, int] | None:
    key = ("r", value)
    if key in memo:
        return memo[key]
    users = [] if value in graph.output_set else graph.users_of(value)
    found = memo[key] = users[0] if len(users) == 1 and users[0][1] >= 0 else None
    return found


def _link(graph: GraphView, node: Node, memo: FusionMemo) -> int | None:
    """The input position through which ``node`` would join a chain (see the module doc)."""
    for pos, name in enumerate(node.inputs):
        if not name:
            continue
        producer = graph.producer_of(name)
        if producer is None or graph.is_constant_value(name):  # a weight, even one an Identity passes on
            continue
        sole = _sole_reader(graph, name, memo)
        if sole is not None and sole[0] is node:
            return pos
    return None


def chain(graph: GraphView, head: Node, memo: FusionMemo | None = None) -> tuple[Node, ...]:
    """``head`` and the epilogues fused into it, in order; just ``(head,)`` when it heads no chain."""
    memo = {} if memo is None else memo
    key = ("c", id(head))
    found = memo.get(key)
    if found is None or found[0] is not head:
        found = memo[key] = _chain(graph, head, memo)
    return found


def _chain(graph: GraphView, head: Node, memo: FusionMemo) -> tuple[Node, ...]:
    takes = FUSES.get(ort_type(head))
    value = _single_output(head)
    if takes is None or value is None or head.implicit or is_folded(graph, head):
        return (head,)
    if ort_type(head) in _EPILOGUES and head_of(graph, head, memo) is not None:
        return (head,)  # an epilogue of another head (only Add is both kinds)
    nodes = [head]
    while len(nodes) <= MAX_EPILOGUES:
        sole = _sole_reader(graph, value, memo)
        if sole is None:
            break
        reader, pos = sole
        out = _single_output(reader)
        kind = ort_type(reader)
        if (out is None or reader.implicit or kind not in takes or _link(graph, reader, memo) != pos
                or is_folded(graph, reader) or AFTER_ADD.get(kind, ort_type(nodes[-1])) != ort_type(nodes[-1])):
            break
        nodes.append(reader)
        value = out
    return tuple(nodes)


def head_of(graph: GraphView, node: Node, memo: FusionMemo | None = None) -> Node | None:
    """The head whose chain absorbs ``node``; None when ``node`` is a head or stands alone."""
    if ort_type(node) not in _EPILOGUES:
        return None
    memo = {} if memo is None else memo
    key = ("h", id(node))
    found = memo.get(key)
    if found is None or found[0] is not node:
        found = memo[key] = (node, _head_of(graph, node, memo))
    return found[1]


def _head_of(graph: GraphView, node: Node, memo: FusionMemo) -> Node | None:
    current = node
    for _ in range(MAX_EPILOGUES):
        if ort_type(current) not in _EPILOGUES:
            return None
        pos = _link(graph, current, memo)
        if pos is None:
            return None
        producer = graph.producer_of(current.inputs[pos])
        assert producer is not None
        if ort_type(producer) in FUSES:
            if any(n is node for n in chain(graph, producer, memo)):
                return producer
            if ort_type(producer) not in _EPILOGUES:
                return None
        current = producer  # an epilogue kind (an Add heading no chain with ``node``): go on up
    return None


def groups(graph: GraphView, nodes: Iterable[Node], memo: FusionMemo | None = None) -> list[tuple[Node, ...]]:
    """The groups of the graph that hold any of ``nodes``, each once, in first-seen order."""
    memo = {} if memo is None else memo
    found: dict[int, tuple[Node, ...]] = {}
    for n in nodes:
        head = head_of(graph, n, memo) or n
        if id(head) not in found:
            found[id(head)] = chain(graph, head, memo)
    return list(found.values())


def neighbourhood(graph: GraphView, values: Iterable[str], memo: FusionMemo | None = None) -> list[Node]:
    """The producer and the reader of each of ``values`` that is produced and read once (only such a
    value can link a chain), and the epilogues up to ``MAX_EPILOGUES`` sole-reader steps after those:
    with the changed nodes, the nodes whose group can differ between a graph and one derived from it
    by a change over those values (take the union over both graphs)."""
    seen: dict[int, Node] = {}
    memo = {} if memo is None else memo
    for v in values:
        key = ("n", v)
        near = memo.get(key)
        if near is None:
            near = memo[key] = _near_value(graph, v, memo)
        for n in near:
            seen.setdefault(id(n), n)
    return list(seen.values())


def _near_value(graph: GraphView, value: str, memo: FusionMemo) -> tuple[Node, ...]:
    producer = graph.producer_of(value)
    sole = _sole_reader(graph, value, memo) if producer is not None else None
    if sole is None:
        return ()
    found = [producer, sole[0]]
    node = sole[0]
    for _ in range(MAX_EPILOGUES):
        if ort_type(node) not in _KINDS:
            break
        out = _single_output(node)
        nxt = _sole_reader(graph, out, memo) if out is not None else None
        if nxt is None or ort_type(nxt[0]) not in _EPILOGUES:
            break
        node = nxt[0]
        found.append(node)
    return tuple(found)
