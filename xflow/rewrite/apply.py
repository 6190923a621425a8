"""Apply a match: replace the matched nodes by the instantiated target pattern."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from xflow.ir import OPAQUE, Attrs, CycleError, Graph, Node, TensorType
from xflow.ops.elementwise import IDENTITY
from xflow.rewrite.match import Match


def content_name(op: str, attrs: Attrs, inputs: tuple[str, ...], index: int) -> str:
    """A value name derived from what computes it, so that the same computation reached by
    different rewrite orders has the same name (and graphs compare equal by their node hashes)."""
    text = repr((op, attrs, inputs, index)).encode()
    return "xf_" + hashlib.blake2b(text, digest_size=8).hexdigest()


@dataclass(frozen=True)
class Change:
    """What applying a match does to a graph: nodes removed, nodes added (in topological order among
    themselves) and the types of the values the added nodes compute."""

    removed: tuple[Node, ...]
    added: tuple[Node, ...]
    types: Mapping[str, TensorType]  # may be shared: do not modify


@dataclass(frozen=True)
class _Target:
    """The target nodes of a match. They depend on the match alone (names identify computations), so
    they are built once per match and the same Node objects serve every graph the match is kept in."""

    names: dict[str, str]  # pattern tensor -> graph value
    nodes: tuple[tuple[Node, bool], ...]  # (node, whether it takes over a source output name)
    types: dict[str, TensorType]
    identities: tuple[tuple[str, str], ...]  # (target tensor, source output) mapped to one target twice
    to_inputs: tuple[tuple[str, str], ...]  # (source output, rule input) the output is mapped to


class MatchTargets:
    """The target nodes of matches, built once per match while its owner (a search) runs: the same Node
    objects then serve every graph a match is kept in, so costs memoized by node are found again."""

    def __init__(self) -> None:
        self._by_match: dict[int, tuple[Match, _Target]] = {}  # the match is held, so its id stays its own

    def of(self, match: Match) -> _Target:
        """The target of ``match`` (built on first use)."""
        held = self._by_match.get(id(match))
        if held is None:
            held = self._by_match[id(match)] = (match, _target(match))
        return held[1]


def _target(match: Match) -> _Target:
    rule = match.rule
    names: dict[str, str] = {p: g for p, g in match.values.items() if p in rule.inputs}
    renamed: dict[str, str] = {}  # dst tensor -> graph name of the source output it replaces
    identities: list[tuple[str, str]] = []
    to_inputs: list[tuple[str, str]] = []
    for s, d in rule.outputs.items():
        src_name = match.values[s]
        if d in rule.inputs:
            to_inputs.append((src_name, d))
        elif d not in renamed:
            renamed[d] = src_name
        else:
            identities.append((d, src_name))
    types: dict[str, TensorType] = {}
    nodes: list[tuple[Node, bool]] = []
    taken = set(renamed.values())
    for p, attrs in zip(rule.dst, match.dst_attrs, strict=True):
        frozen = Attrs(attrs)
        inputs = tuple(names[i] for i in p.inputs)
        outs = []
        for k, out in enumerate(p.outputs):
            names[out] = renamed.get(out) or content_name(p.op, frozen, inputs, k)
            types[names[out]] = match.dst_types[out]
            outs.append(names[out])
        nodes.append((Node(p.op, inputs, tuple(outs), frozen), any(o in taken for o in outs)))
    return _Target(names, tuple(nodes), types, tuple(identities), tuple(to_inputs))


def produced(match: Match) -> tuple[tuple[Node, ...], dict[str, str]]:
    """What applying ``match`` puts in place of its source nodes, as a picture shows it: the target nodes, with the
    graph's value names, and each source output that becomes another value (one mapped to a rule input, such as
    transpose(transpose(x)) -> x, or to a target tensor another source output already takes over)."""
    target = _target(match)
    aliases = {src_name: match.values[d] for src_name, d in target.to_inputs}
    aliases.update({graph_name: target.names[tensor] for tensor, graph_name in target.identities})
    return tuple(node for node, _ in target.nodes), aliases


def plan_match(graph: Graph, match: Match, targets: MatchTargets | None = None) -> Change:
    """The change applying ``match`` to ``graph`` makes, without building the new graph (which may
    contain a cycle: ``Graph.creates_cycle`` says, ``Graph.derive`` raises).

    Target tensors mapped to source outputs take over the source output names, so consumers,
    graph outputs and subgraph captures need no rewiring. A source output mapped to a rule input
    (e.g. split(concat(a, b)) -> a) is rewired in its consumers, or kept by an Identity where it is
    a graph output or read by a subgraph. A target node that computes exactly what an existing node
    computes is not added again (its content name already exists). Producers left without users
    are removed. ``targets`` keeps each match's target nodes for the next call with the same match."""
    target = targets.of(match) if targets is not None else _target(match)
    names = target.names
    identities = target.identities
    rewire: dict[str, str] = {}  # graph value to drop -> graph value replacing it in consumers
    if target.to_inputs:
        identities = list(identities)
        for src_name, d in target.to_inputs:
            if src_name in graph.output_set or any(idx < 0 for _, idx in graph.users.get(src_name, [])):
                identities.append((d, src_name))
            else:
                rewire[src_name] = match.values[d]
    types = target.types
    added: list[Node] = []
    producers = graph.producers
    for node, renames in target.nodes:
        if not renames and _computed_already(producers, node.outputs, match.nodes):
            continue  # common subexpression: a node that stays in the graph already computes these values
        added.append(node)
    if identities:
        types = dict(types)
        for tensor, graph_name in identities:
            added.append(Node(IDENTITY.name, (names[tensor],), (graph_name,)))
            types[graph_name] = graph.types[graph_name]
    removed: list[Node] = list(match.nodes)
    if rewire:
        matched = {id(m) for m in match.nodes}
        readers = {id(u): u for value in rewire for u, _ in graph.users.get(value, []) if id(u) not in matched}
        position = graph.position
        for n in sorted(readers.values(), key=position.__getitem__):
            removed.append(n)
            added.append(Node(n.op, tuple(rewire.get(i, i) for i in n.inputs), n.outputs, n.attrs, n.name,
                              n.origin if n.is_opaque else None, n.implicit))
    removed.extend(_unread_readers(graph, removed))
    removed.extend(_dead_producers(graph, removed, added))
    return Change(tuple(removed), tuple(added), types)


def _unread_readers(graph: Graph, removed: list[Node]) -> list[Node]:
    """The graph's unread opaque nodes (``Graph.is_unread``) that read what the rewrite removes, and those
    reading them: a dynamic export's Shape of an attention context that the fused op no longer makes."""
    users = graph.users
    gone = {id(n) for n in removed}
    found: list[Node] = []
    frontier = [o for n in removed for o in n.outputs if o]
    while frontier:
        for user, _ in users.get(frontier.pop(), ()):
            if user.is_opaque and id(user) not in gone and graph.is_unread(user):
                gone.add(id(user))
                found.append(user)
                frontier.extend(o for o in user.outputs if o)
    return found


def _computed_already(producers: dict[str, Node], outputs: tuple[str, ...], matched: tuple[Node, ...]) -> bool:
    """True when every output already has a producer that the rewrite keeps."""
    for o in outputs:
        producer = producers.get(o)
        if producer is None or any(producer is m for m in matched):
            return False
    return True


def apply_match(graph: Graph, match: Match, targets: MatchTargets | None = None) -> Graph | None:
    """The graph with the match rewritten (see ``plan_match``), or None when the result would
    contain a cycle."""
    change = plan_match(graph, match, targets)
    try:
        return graph.derive(change.removed, change.added, change.types)
    except CycleError:
        return None


def _dead_producers(graph: Graph, removed: list[Node], added: list[Node]) -> list[Node]:
    """Op-table nodes whose every output lost its last user through this rewrite."""
    producers, users, outputs = graph.producers, graph.users, graph.output_set
    gone: set[int] | None = None
    still_read: set[str] | None = None
    dead: list[Node] = []
    frontier = [i for n in removed for i in n.inputs if i]
    while frontier:
        value = frontier.pop()
        producer = producers.get(value)
        if producer is None or producer.op == OPAQUE:
            continue
        if gone is None or still_read is None:
            gone = {id(n) for n in removed}
            still_read = {i for n in added for i in (*n.inputs, *n.implicit)}
        if id(producer) in gone:
            continue
        if any(o in outputs or o in still_read or any(id(u) not in gone for u, _ in users.get(o, ()))
               for o in producer.outputs):
            continue
        gone.add(id(producer))
        dead.append(producer)
        frontier.extend(i for i in producer.inputs if i)
    return dead
