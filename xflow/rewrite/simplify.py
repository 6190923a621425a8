"""Undo the split trees that pairwise rules leave behind once the search is done.

Rules merge two operators at a time, so merging NasRNN's eight gates leaves seven two-way splits per
step, and each gate's add reads one piece of two such trees. Both forms below are identities of
split itself (a piece of a piece is a piece; an elementwise op on matching pieces is a piece of the op
on the wholes) and need no search: every one removes kernels and copies. The written model is still
checked against the original by ``xflow optimize``.
"""

from __future__ import annotations

from dataclasses import dataclass

from xflow.ir import Attrs, Graph, Node, TensorType
from xflow.ops import OPS
from xflow.ops.shape_ops import nested_split_attrs
from xflow.rewrite.apply import content_name


@dataclass
class Simplified:
    """The simplified graph and what was done to it."""

    graph: Graph
    nested_splits: int = 0  # splits of a piece of another split folded into it
    elementwise_hoisted: int = 0  # elementwise ops applied once before a split instead of per piece


def simplify_splits(graph: Graph) -> Simplified:
    """Fold nested splits along one axis into one split, and apply an elementwise op once before a
    split when it is applied to every piece of splits alike; repeated until neither applies."""
    result = Simplified(graph)
    while True:
        changed = _fold_nested(result) or _hoist_elementwise(result)
        if not changed:
            return result


def _readers(graph: Graph, value: str) -> list[Node]:
    return [u for u, _ in graph.users.get(value, ())]


def _sole_reader(graph: Graph, value: str) -> Node | None:
    readers = {id(u): u for u in _readers(graph, value)}
    if len(readers) != 1 or value in graph.output_set:
        return None
    return next(iter(readers.values()))


def _fold_nested(result: Simplified) -> bool:
    graph = result.graph
    for inner in graph.nodes:
        if inner.op != "split" or inner.is_opaque:
            continue
        outer = graph.producers.get(inner.inputs[0])
        if outer is None or outer.op != "split" or _sole_reader(graph, inner.inputs[0]) is not inner:
            continue
        k = outer.outputs.index(inner.inputs[0])
        attrs = nested_split_attrs(outer.attrs, k, inner.attrs)
        if attrs is None:
            continue
        merged = Node("split", outer.inputs, outer.outputs[:k] + inner.outputs + outer.outputs[k + 1:], attrs)
        nodes = [n for n in graph.nodes if n is not inner and n is not outer] + [merged]
        result.graph = graph.with_nodes(nodes)
        result.nested_splits += 1
        return True
    return False


def _hoist_elementwise(result: Simplified) -> bool:
    graph = result.graph
    for node in graph.nodes:
        if node.is_opaque or not OPS[node.op].elementwise or OPS[node.op].num_outputs(node.attrs) != 1:
            continue
        splits = [graph.producers.get(i) for i in node.inputs]
        if not splits or any(s is None or s.op != "split" or s.is_opaque for s in splits):
            continue
        first = splits[0]
        if any(s.attrs["axis"] != first.attrs["axis"] for s in splits):
            continue
        if any(graph.types[s.inputs[0]] != graph.types[first.inputs[0]] for s in splits):
            continue  # pieces of equal shape can still come from wholes that broadcast differently
        found = _pieces(graph, node, splits)
        if found is None:
            continue
        pieces, orders = found
        permuted = sum(order != sorted(order) for order in orders)
        if 2 * permuted + 2 >= len(splits) + len(pieces):
            continue  # a concat per permuted split would cost what the hoist saves
        added: list[Node] = []
        types: dict[str, TensorType] = {}
        wholes: list[str] = []
        for s, order in zip(splits, orders, strict=True):
            if order == sorted(order):
                wholes.append(s.inputs[0])
                continue
            # the pieces line up in another order: put them in this one (two merge trees that paired
            # NasRNN's gates differently concatenated their weights in different orders)
            parts = tuple(s.outputs[k] for k in order)
            name = content_name("concat", Attrs({"axis": first.attrs["axis"]}), parts, 0)
            added.append(Node("concat", parts, (name,), OPS["concat"].normalize_attrs({"axis": first.attrs["axis"]})))
            types[name] = graph.types[s.inputs[0]]
            wholes.append(name)
        whole = content_name(node.op, node.attrs, tuple(wholes), 0)
        if whole in graph.types or any(a.outputs[0] in graph.types for a in added):
            continue
        types[whole] = TensorType(graph.types[node.outputs[0]].dtype, graph.types[first.inputs[0]].shape)
        added.append(Node(node.op, tuple(wholes), (whole,), Attrs(node.attrs)))
        added.append(Node("split", (whole,), tuple(p.outputs[0] for p in pieces), first.attrs))
        gone = {id(n) for n in pieces} | {id(s) for s, o in zip(splits, orders, strict=True) if o == sorted(o)}
        result.graph = graph.with_nodes([n for n in graph.nodes if id(n) not in gone] + added, types=types)
        result.elementwise_hoisted += 1
        return True
    return False


def _pieces(graph: Graph, node: Node, splits: list[Node]) -> tuple[list[Node], list[list[int]]] | None:
    """The nodes applying ``node``'s op to the pieces of ``splits``, one per piece of the first split in
    turn, each reading one piece of every split of the same size, and for each split the piece each of
    them reads; None unless they are all that reads the splits' outputs and read each piece once."""
    first = splits[0]
    sizes = first.attrs["split"]
    pieces: list[Node] = []
    orders: list[list[int]] = [[] for _ in splits]
    for i in range(len(first.outputs)):
        readers = {id(u): u for u in _readers(graph, first.outputs[i])}
        match = [u for u in readers.values() if u.op == node.op and u.attrs == node.attrs
                 and len(u.inputs) == len(splits) and u.inputs[0] == first.outputs[i]
                 and all(v in s.outputs and s.attrs["split"][s.outputs.index(v)] == sizes[i]
                         for s, v in zip(splits, u.inputs, strict=True))]
        if len(match) != 1:
            return None
        pieces.append(match[0])
        for order, s, v in zip(orders, splits, match[0].inputs, strict=True):
            order.append(s.outputs.index(v))
    if any(sorted(order) != list(range(len(s.outputs))) for order, s in zip(orders, splits, strict=True)):
        return None  # a piece read twice, or one not read
    wanted = {id(p) for p in pieces}
    for s in splits:
        for o in s.outputs:
            if o in graph.output_set or any(id(u) not in wanted for u in _readers(graph, o)):
                return None
    return pieces, orders
