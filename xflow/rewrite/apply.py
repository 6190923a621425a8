"""Apply a match: replace the matched nodes by the instantiated target pattern."""

from __future__ import annotations

from xflow.ir import Attrs, CycleError, Graph, Node, TensorType
from xflow.rewrite.match import Match


def apply_match(graph: Graph, match: Match) -> Graph | None:
    """The graph with the match rewritten, or None when the result would contain a cycle.

    Target tensors mapped to source outputs take over the source output names, so consumers,
    graph outputs and subgraph captures need no rewiring. A source output mapped to a rule input
    (e.g. split(concat(a, b)) -> a) is rewired in its consumers, or kept by an Identity where it is
    a graph output or read by a subgraph."""
    rule = match.rule
    names: dict[str, str] = {p: g for p, g in match.values.items() if p in rule.inputs}
    renamed_sources: dict[str, str] = {}  # dst tensor -> graph name of the source output it replaces
    extra_identities: list[tuple[str, str]] = []  # (target tensor or rule input, graph name to keep)
    rewire: dict[str, str] = {}  # graph value to drop -> graph value replacing it in consumers
    for s, d in rule.outputs.items():
        src_name = match.values[s]
        if d in rule.inputs:
            target = match.values[d]
            if src_name in graph.output_set or any(idx < 0 for _, idx in graph.users.get(src_name, [])):
                extra_identities.append((d, src_name))
            else:
                rewire[src_name] = target
        elif d not in renamed_sources:
            renamed_sources[d] = src_name
        else:
            extra_identities.append((d, src_name))
    types: dict[str, TensorType] = {}
    new_nodes: list[Node] = []
    for p, attrs in zip(rule.dst, match.dst_attrs, strict=True):
        outs = []
        for out in p.outputs:
            names[out] = renamed_sources.get(out) or graph.fresh_name(f"{rule.name}")
            types[names[out]] = match.dst_types[out]
            outs.append(names[out])
        new_nodes.append(Node(p.op, tuple(names[i] for i in p.inputs), tuple(outs), Attrs(attrs)))
    for tensor, graph_name in extra_identities:
        new_nodes.append(Node("identity", (names[tensor],), (graph_name,)))
        types[graph_name] = graph.types[graph_name]
    matched = set(map(id, match.nodes))
    kept: list[Node] = []
    for n in graph.nodes:
        if id(n) in matched:
            continue
        if rewire and any(i in rewire for i in n.inputs):
            n = Node(n.op, tuple(rewire.get(i, i) for i in n.inputs), n.outputs, n.attrs, n.name,
                     n.origin if n.is_opaque else None, n.implicit)
        kept.append(n)
    try:
        return graph.with_nodes(kept + new_nodes, types=types)
    except CycleError:
        return None

