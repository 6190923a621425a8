"""Apply a match: replace the matched nodes by the instantiated target pattern."""

from __future__ import annotations

import hashlib

from xflow.ir import Attrs, CycleError, Graph, Node, TensorType
from xflow.rewrite.match import Match


def content_name(op: str, attrs: Attrs, inputs: tuple[str, ...], index: int) -> str:
    """A value name derived from what computes it, so that the same computation reached by
    different rewrite orders has the same name (and graphs compare equal by their node hashes)."""
    text = repr((op, attrs, inputs, index)).encode()
    return "xf_" + hashlib.blake2b(text, digest_size=8).hexdigest()


def apply_match(graph: Graph, match: Match) -> Graph | None:
    """The graph with the match rewritten, or None when the result would contain a cycle.

    Target tensors mapped to source outputs take over the source output names, so consumers,
    graph outputs and subgraph captures need no rewiring. A source output mapped to a rule input
    (e.g. split(concat(a, b)) -> a) is rewired in its consumers, or kept by an Identity where it is
    a graph output or read by a subgraph. A target node that computes exactly what an existing node
    computes is not added again (its content name already exists). Producers left without users
    are removed."""
    rule = match.rule
    names: dict[str, str] = {p: g for p, g in match.values.items() if p in rule.inputs}
    renamed: dict[str, str] = {}  # dst tensor -> graph name of the source output it replaces
    identities: list[tuple[str, str]] = []  # (target tensor or rule input, graph name to keep)
    rewire: dict[str, str] = {}  # graph value to drop -> graph value replacing it in consumers
    for s, d in rule.outputs.items():
        src_name = match.values[s]
        if d in rule.inputs:
            if src_name in graph.output_set or any(idx < 0 for _, idx in graph.users.get(src_name, [])):
                identities.append((d, src_name))
            else:
                rewire[src_name] = match.values[d]
        elif d not in renamed:
            renamed[d] = src_name
        else:
            identities.append((d, src_name))
    types: dict[str, TensorType] = {}
    added: list[Node] = []
    for p, attrs in zip(rule.dst, match.dst_attrs, strict=True):
        frozen = Attrs(attrs)
        inputs = tuple(names[i] for i in p.inputs)
        outs = []
        for k, out in enumerate(p.outputs):
            names[out] = renamed.get(out) or content_name(p.op, frozen, inputs, k)
            types[names[out]] = match.dst_types[out]
            outs.append(names[out])
        if not any(o in renamed.values() for o in outs) and all(
                o in graph.producers and all(graph.producers[o] is not m for m in match.nodes) for o in outs):
            continue  # common subexpression: a node that stays in the graph already computes these values
        added.append(Node(p.op, inputs, tuple(outs), frozen))
    for tensor, graph_name in identities:
        added.append(Node("identity", (names[tensor],), (graph_name,)))
        types[graph_name] = graph.types[graph_name]
    removed: list[Node] = list(match.nodes)
    if rewire:
        for n in graph.nodes:
            if any(i in rewire for i in n.inputs) and all(n is not m for m in match.nodes):
                removed.append(n)
                added.append(Node(n.op, tuple(rewire.get(i, i) for i in n.inputs), n.outputs, n.attrs, n.name,
                                  n.origin if n.is_opaque else None, n.implicit))
    removed.extend(_dead_producers(graph, removed, added))
    try:
        return graph.derive(removed, added, types)
    except CycleError:
        return None


def _dead_producers(graph: Graph, removed: list[Node], added: list[Node]) -> list[Node]:
    """Op-table nodes whose every output lost its last user through this rewrite."""
    gone = {id(n) for n in removed}
    still_read = {i for n in added for i in (*n.inputs, *n.implicit)}
    dead: list[Node] = []
    frontier = [i for n in removed for i in n.inputs if i]
    while frontier:
        value = frontier.pop()
        producer = graph.producers.get(value)
        if producer is None or producer.is_opaque or id(producer) in gone:
            continue
        if any(o in graph.output_set or o in still_read or
               any(id(u) not in gone for u, _ in graph.users.get(o, [])) for o in producer.outputs):
            continue
        gone.add(id(producer))
        dead.append(producer)
        frontier.extend(i for i in producer.inputs if i)
    return dead
