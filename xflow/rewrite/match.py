"""Find every match of a rule's source pattern in a graph.

A match binds pattern nodes to distinct graph nodes, pattern tensors to graph values and attribute
variables to values, such that ops and attributes agree (commutative ops in either input order),
input kinds hold, the source's internal tensors have no users outside the match, the ``where``
conditions hold and the target pattern instantiates with valid shapes of the same types.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import onnx

from xflow.ir import Graph, Node, TensorType
from xflow.ir.dims import Dim, SymbolicDim
from xflow.ops import OPS, ShapeError
from xflow.rules.expr import Expr, ExprError, ShapeEnv
from xflow.rules.model import AttrTemplate, PatternNode, Rule, Var


@dataclass(frozen=True)
class Match:
    """A place a rule applies, with everything the applier needs."""

    rule: Rule
    nodes: tuple[Node, ...]  # graph node per source pattern node
    values: dict[str, str]  # pattern tensor -> graph value (rule inputs and source tensors)
    variables: dict[str, Any]  # attribute variable -> value
    dst_attrs: tuple[dict[str, Any], ...]  # evaluated attributes per target node
    dst_types: dict[str, TensorType]  # target tensor -> type


class MatchStatus(enum.Enum):
    """How far a near-miss got: its structure matched (ops, attributes, commutativity) and then a condition on
    it failed, or the target could not be instantiated there."""

    CONDITION_FAILED = "condition failed"
    REPLACEMENT_FAILED = "replacement failed"


class FailureKind(enum.Enum):
    """Which check refused a structural match, in the order the matcher makes them."""

    INPUT_NOT_CONSTANT = "input is not a constant"  # a rule input of kind ``const`` is computed at run time
    INPUT_INSIDE_MATCH = "input is computed inside the match"  # the target would read a value the rewrite removes
    INTERNAL_USED_OUTSIDE = "internal tensor is used outside the match"
    SHAPE_UNKNOWN = "tensor has no known shape"
    CONDITION_FALSE = "condition is false"  # a ``where`` condition
    TARGET_INVALID = "target does not instantiate"  # a shape rule refused the target, or an expression failed
    OUTPUT_TYPE_CHANGED = "output would change type"

    @property
    def status(self) -> MatchStatus:
        """Condition or replacement failure."""
        replacement = (FailureKind.TARGET_INVALID, FailureKind.OUTPUT_TYPE_CHANGED)
        return MatchStatus.REPLACEMENT_FAILED if self in replacement else MatchStatus.CONDITION_FAILED


@dataclass(frozen=True)
class MatchFailure:
    """Why one structural match of a rule was refused: the check (``kind``), the rule, the graph node at fault
    (the one producing or reading the tensor concerned), the pattern tensor or condition concerned, and the
    details in words."""

    kind: FailureKind
    rule: str
    node: Node
    subject: str = ""  # the pattern tensor, or the ``where`` condition's source
    detail: str = ""

    @property
    def status(self) -> MatchStatus:
        """Condition or replacement failure."""
        return self.kind.status

    def __str__(self) -> str:
        subject = f" {self.subject!r}" if self.subject else ""
        detail = f" ({self.detail})" if self.detail else ""
        return f"{self.rule}: {self.kind.value}{subject}{detail} at {self.node!r}"


@dataclass
class MatchTracer:
    """Keeps the failures of near-misses (structural matches a later check refused), per rule name, in the
    order they happened, for ``--explain`` style output."""

    failures: dict[str, list[MatchFailure]] = field(default_factory=dict)

    def record(self, failure: MatchFailure) -> None:
        """Keep one failure."""
        self.failures.setdefault(failure.rule, []).append(failure)

    def best(self, rule: str) -> MatchFailure | None:
        """The near-miss of ``rule`` that got furthest (its check comes latest; the first of those), or None."""
        order = list(FailureKind)
        return max(self.failures.get(rule, ()), key=lambda f: order.index(f.kind), default=None)


def _order(rule: Rule, first: int | None = None) -> list[int]:
    """Visit source nodes so each after the first touches an already bound tensor when possible."""
    order: list[int] = [] if first is None else [first]
    bound: set[str] = set() if first is None else {*rule.src[first].inputs, *rule.src[first].outputs}
    remaining = [i for i in range(len(rule.src)) if i != first]
    while remaining:
        # prefer nodes whose output is consumed by a bound node (unique producer), then shared inputs
        def score(i: int) -> tuple[int, int]:
            n = rule.src[i]
            return (0 if set(n.outputs) & bound else 1 if set(n.inputs) & bound else 2, -i)

        best = min(remaining, key=score)
        remaining.remove(best)
        order.append(best)
        bound.update(rule.src[best].inputs)
        bound.update(rule.src[best].outputs)
    return order


def _unify_attr(template: AttrTemplate, value: Any, env: dict[str, Any]) -> bool:
    if isinstance(template, Var):
        if template.name in env:
            return env[template.name] == value
        env[template.name] = value
        return True
    if isinstance(template, tuple):
        if not isinstance(value, tuple) or len(value) != len(template):
            return False
        return all(_unify_attr(t, v, env) for t, v in zip(template, value, strict=True))
    return template == value


def _candidates(graph: Graph, p: PatternNode, values: dict[str, str]) -> list[Node]:
    for out in p.outputs:
        if out in values:
            producer = graph.producers.get(values[out])
            return [producer] if producer is not None and producer.op == p.op else []
    for name in p.inputs:
        if name in values:
            seen: dict[int, Node] = {}
            for user, _ in graph.users.get(values[name], []):
                if user.op == p.op:
                    seen.setdefault(id(user), user)
            return list(seen.values())
    return graph.by_op.get(p.op, [])


def _bind_names(pattern: tuple[str, ...], actual: tuple[str, ...], values: dict[str, str]) -> dict[str, str] | None:
    if len(pattern) != len(actual):
        return None
    new = dict(values)
    for p, a in zip(pattern, actual, strict=True):
        if not a:
            return None
        if p in new:
            if new[p] != a:
                return None
        else:
            new[p] = a
    return new


_Nbr = tuple[int, str, tuple[int, int], tuple[tuple[str, Any], ...]]


@dataclass(frozen=True)
class _CompiledNode:
    """A source pattern node prepared for matching: attribute templates with the op's defaults filled
    in, split into ground ones (compared by equality) and ones with variables (unified), and what its
    neighbours in the source pattern require of a graph node's neighbours (a cheap, sound prefilter for
    the nodes the search starts from)."""

    ground: tuple[tuple[str, Any], ...]
    variable: tuple[tuple[str, AttrTemplate], ...]
    commutative: bool
    arity: tuple[int, int] = (0, 0)  # inputs, outputs
    in_ops: tuple[str | None, ...] = ()  # per input: the op of the source node producing it, if any
    out_ops: tuple[tuple[str, ...], ...] = ()  # per output: ops of the source nodes reading it
    in_nbrs: tuple[_Nbr, ...] = ()  # the source nodes producing inputs: (input, op, arity, ground attrs)
    out_nbrs: tuple[_Nbr, ...] = ()  # the source nodes reading outputs: (output, op, arity, ground attrs)

    def admits(self, node: Node) -> bool:
        """False when the node's attributes rule it out whatever the variables are bound to."""
        attrs = node.attrs
        return all(attrs.get(key) == value for key, value in self.ground)

    def fits(self, graph: Graph, node: Node) -> bool:
        """False when the node cannot be bound to this pattern node in any match: wrong arity or
        attributes, or an input whose producer (an output whose readers) lack the ops the pattern
        puts there."""
        if (len(node.inputs), len(node.outputs)) != self.arity:
            return False
        facts = _facts(graph, node)
        return facts is not None and self.fits_facts(node, facts) and self.neighbours_fit(graph, node)

    def neighbours_fit(self, graph: Graph, node: Node) -> bool:
        """The node's producers and readers where the pattern has source nodes: each must be one that
        source node's op, arity and ground attributes admit."""
        if self.in_nbrs:
            producers = graph.producers
            orders = [node.inputs]
            if self.commutative and len(node.inputs) == 2:
                orders.append(node.inputs[::-1])
            if not any(all(_nbr_admits(producers.get(inputs[nbr[0]]), nbr) for nbr in self.in_nbrs)
                       for inputs in orders):
                return False
        users = graph.users
        return all(any(_nbr_admits(u, nbr) for u, _ in users.get(node.outputs[nbr[0]], ()))
                   for nbr in self.out_nbrs)

    def fits_facts(self, node: Node, facts: _Facts) -> bool:
        """``fits`` with the node's neighbourhood already summed up by ``_facts`` (same arity assumed)."""
        in_ops, out_ops = facts
        need = self.in_ops
        if any(need) and not _ops_fit(need, in_ops) and not (
                self.commutative and len(in_ops) == 2 and _ops_fit(need, in_ops[::-1])):
            return False
        return self.fits_rest(node, out_ops)

    def fits_rest(self, node: Node, out_ops: tuple[frozenset[str], ...]) -> bool:
        """``fits_facts`` once the inputs' producers are known to fit."""
        if self.ground and not self.admits(node):
            return False
        return all(not ops or have.issuperset(ops) for ops, have in zip(self.out_ops, out_ops, strict=True))

    @property
    def key(self) -> tuple:
        """Everything ``fits`` reads: equal keys, equal answers."""
        return (self.ground, self.commutative, self.arity, self.in_ops, self.out_ops, self.in_nbrs, self.out_nbrs)


_Facts = tuple[tuple["str | None", ...], tuple[frozenset[str], ...]]


def _nbr_admits(node: Node | None, nbr: _Nbr) -> bool:
    _, op, arity, ground = nbr
    if node is None or node.op != op or (len(node.inputs), len(node.outputs)) != arity:
        return False
    attrs = node.attrs
    return all(attrs.get(key) == value for key, value in ground)


def _facts(graph: Graph, node: Node) -> _Facts | None:
    """What ``fits`` asks of a node's neighbourhood: the op producing each input (None for graph
    inputs and constants) and the ops reading each output; None when an input or output is missing
    (no pattern node binds it)."""
    inputs, outputs = node.inputs, node.outputs
    if not all(inputs) or not all(outputs):
        return None
    producers, users = graph.producers, graph.users
    in_ops = tuple(p.op if (p := producers.get(v)) is not None else None for v in inputs)
    return in_ops, tuple(frozenset(u.op for u, _ in users.get(v, ())) for v in outputs)


def _ops_fit(need: tuple[str | None, ...], have: tuple[str | None, ...]) -> bool:
    return all(n is None or n == h for n, h in zip(need, have, strict=True))


def _has_var(template: AttrTemplate) -> bool:
    if isinstance(template, Var):
        return True
    return isinstance(template, tuple) and any(_has_var(t) for t in template)


@dataclass
class _CompiledRule:
    nodes: tuple[_CompiledNode, ...]
    ops: frozenset[str]
    orders: dict[int | None, list[int]] = field(default_factory=dict)

    def order(self, rule: Rule, first: int | None) -> list[int]:
        order = self.orders.get(first)
        if order is None:
            order = self.orders[first] = _order(rule, first)
        return order


def compiled(rule: Rule) -> _CompiledRule:
    """The rule's matching plan (a ``RuleIndex`` makes it once per rule and keeps it)."""
    grounds: list[tuple[tuple[str, Any], ...]] = []
    variables: list[tuple[tuple[str, AttrTemplate], ...]] = []
    for p in rule.src:
        entry = OPS[p.op]
        ground: list[tuple[str, Any]] = []
        variable: list[tuple[str, AttrTemplate]] = []
        defaults = {a.name: a.default for a in entry.attrs}
        for key in sorted(defaults):
            template = p.attrs.get(key, defaults[key])
            (variable if _has_var(template) else ground).append((key, template))
        grounds.append(tuple(ground))
        variables.append(tuple(variable))
    made_by = {o: k for k, q in enumerate(rule.src) for o in q.outputs}

    def nbr(pos: int, k: int) -> _Nbr:
        q = rule.src[k]
        return (pos, q.op, (len(q.inputs), len(q.outputs)), grounds[k])

    nodes = []
    for j, p in enumerate(rule.src):
        readers = [[k for k, q in enumerate(rule.src) if k != j and o in q.inputs] for o in p.outputs]
        nodes.append(_CompiledNode(
            grounds[j], variables[j], OPS[p.op].commutative, (len(p.inputs), len(p.outputs)),
            tuple(rule.src[made_by[i]].op if i in made_by else None for i in p.inputs),
            tuple(tuple(sorted({rule.src[k].op for k in ks})) for ks in readers),
            tuple(nbr(pos, made_by[i]) for pos, i in enumerate(p.inputs) if i in made_by),
            tuple(nbr(pos, k) for pos, ks in enumerate(readers) for k in ks)))
    return _CompiledRule(tuple(nodes), frozenset(p.op for p in rule.src))


def _unify_node(p: PatternNode, c: _CompiledNode, node: Node, values: dict[str, str], env: dict[str, Any]
                ) -> Iterator[tuple[dict[str, str], dict[str, Any]]]:
    if not c.admits(node):
        return
    attr_env = env
    if c.variable:
        attr_env = dict(env)
        for key, template in c.variable:
            if not _unify_attr(template, node.attrs.get(key), attr_env):
                return
    orders = [node.inputs]
    if c.commutative and len(node.inputs) == 2 and node.inputs[0] != node.inputs[1]:
        orders.append((node.inputs[1], node.inputs[0]))
    for inputs in orders:
        bound = _bind_names(p.inputs, inputs, values)
        if bound is None:
            continue
        bound = _bind_names(p.outputs, node.outputs, bound)
        if bound is not None:
            yield bound, attr_env


def find_matches(graph: Graph, rule: Rule, tracer: MatchTracer | None = None,
                 anchor: Iterable[Node] | None = None) -> Iterator[Match]:
    """Every match of ``rule`` in ``graph``; with ``anchor``, only the matches that use at least one
    of those nodes (the search then starts from them, so it costs little on a large graph). The rule's
    plan is made for this call: to match many graphs, index the rules once (``RuleIndex``)."""
    plan = compiled(rule)
    if anchor is None:
        yield from _search(graph, rule, plan, plan.order(rule, None), None, tracer)
        return
    anchor = list(anchor)
    seeds = {slot: [n for n in anchor if n.op == p.op and plan.nodes[slot].fits(graph, n)]
             for slot, p in enumerate(rule.src)}
    yield from _anchored(graph, rule, plan, seeds, tracer)


def _anchored(graph: Graph, rule: Rule, plan: _CompiledRule, seeds: dict[int, list[Node]],
              tracer: MatchTracer | None) -> Iterator[Match]:
    """Matches with source node ``slot`` bound to one of ``seeds[slot]``, each match once: the search
    from a slot leaves out the matches that bind an earlier slot to one of its seeds (the search from
    that slot finds them), so the matches come in the same order as searching every slot and
    skipping repeats, without building the repeats."""
    banned: dict[int, set[int]] = {}
    for slot in sorted(seeds):
        if not seeds[slot]:
            continue
        yield from _search(graph, rule, plan, plan.order(rule, slot), seeds[slot], tracer, banned)
        banned[slot] = {id(n) for n in seeds[slot]}


class RuleIndex:
    """Rules indexed by the ops of their source nodes, for matching whole graphs and for matching
    only around a few changed nodes (the search's incremental matching). Generic over the rule
    format: every source node of every rule is indexed, whatever its op and arity."""

    def __init__(self, rules: Iterable[Rule]) -> None:
        self.rules = list(rules)
        self.plans = [compiled(r) for r in self.rules]
        # op -> arity -> the ops required of the inputs' producers -> one group per distinct prefilter:
        # (a pattern node with it, [(rule, slot)])
        groups: dict[str, dict[tuple, tuple[_CompiledNode, list[tuple[int, int]]]]] = {}
        for ri, (rule, plan) in enumerate(zip(self.rules, self.plans, strict=True)):
            for slot, p in enumerate(rule.src):
                c = plan.nodes[slot]
                groups.setdefault(p.op, {}).setdefault(c.key, (c, []))[1].append((ri, slot))
        self.groups: dict[str, dict[tuple[int, int], dict[tuple, list[_Group]]]] = {}
        for op, by_key in groups.items():
            for c, slots in by_key.values():
                self.groups.setdefault(op, {}).setdefault(c.arity, {}).setdefault(c.in_ops, []).append((c, slots))
        self._usable: dict[frozenset[str], list[bool]] = {}
        self.widest = max((len(r.src) for r in self.rules), default=0)  # most nodes in a source pattern

    def usable(self, graph: Graph) -> list[bool]:
        """Per rule: are all its source ops in the graph?"""
        present = frozenset(graph.by_op)
        usable = self._usable.get(present)
        if usable is None:
            usable = self._usable[present] = [plan.ops <= present for plan in self.plans]
        return usable

    def all_matches(self, graph: Graph) -> list[Match]:
        """All matches of all rules, rule by rule (rules whose ops are absent are skipped); each rule's
        search starts from the graph nodes (in node order) that fit its first source node."""
        usable = self.usable(graph)
        firsts = [plan.order(rule, None)[0] for rule, plan in zip(self.rules, self.plans, strict=True)]
        seeds: dict[int, list[Node]] = {}
        for node in graph.nodes:
            by_need = self.groups.get(node.op, {}).get((len(node.inputs), len(node.outputs)))
            facts = _facts(graph, node) if by_need else None
            if facts is None:
                continue
            for _c, slots in _fitting(graph, by_need, node, facts):  # type: ignore[arg-type]
                for ri, slot in slots:
                    if usable[ri] and slot == firsts[ri]:
                        seeds.setdefault(ri, []).append(node)
        out: list[Match] = []
        for ri in sorted(seeds):
            rule, plan = self.rules[ri], self.plans[ri]
            out.extend(_search(graph, rule, plan, plan.order(rule, None), seeds[ri], None))
        return out

    def anchored_matches(self, graph: Graph, anchor: Iterable[Node]) -> list[Match]:
        """All matches that use at least one anchor node, rule by rule in rule order; the same list
        as ``find_matches(graph, rule, anchor=anchor)`` over all rules, without visiting rules that
        no anchor node can seed."""
        usable = self.usable(graph)
        seeds: dict[int, dict[int, list[Node]]] = {}
        for node in anchor:
            by_need = self.groups.get(node.op, {}).get((len(node.inputs), len(node.outputs)))
            if not by_need:
                continue
            facts = _facts(graph, node)
            if facts is None:
                continue
            for _c, slots in _fitting(graph, by_need, node, facts):
                for ri, slot in slots:
                    if usable[ri]:
                        seeds.setdefault(ri, {}).setdefault(slot, []).append(node)
        out: list[Match] = []
        for ri in sorted(seeds):
            out.extend(_anchored(graph, self.rules[ri], self.plans[ri], seeds[ri], None))
        return out


_Group = tuple[_CompiledNode, list[tuple[int, int]]]


def _fitting(graph: Graph, by_need: dict[tuple, list[_Group]], node: Node, facts: _Facts) -> Iterator[_Group]:
    """The groups whose pattern node ``node`` fits, found by looking up the input-producer ops the
    node offers (each input's producer op or nothing, in either order for a commutative op) instead of
    testing every group."""
    in_ops, out_ops = facts
    if len(in_ops) > 8:  # too many combinations: test each group
        yield from ((c, slots) for groups in by_need.values() for c, slots in groups
                    if c.fits_facts(node, facts) and c.neighbours_fit(graph, node))
        return
    offers = set(_relaxations(in_ops))
    if len(in_ops) == 2:  # only commutative pattern nodes take the swapped order
        swapped = set(_relaxations(in_ops[::-1])) - offers
        for need in swapped:
            for c, slots in by_need.get(need, ()):
                if c.commutative and c.fits_rest(node, out_ops) and c.neighbours_fit(graph, node):
                    yield c, slots
    for need in offers:
        for c, slots in by_need.get(need, ()):
            if c.fits_rest(node, out_ops) and c.neighbours_fit(graph, node):
                yield c, slots


def _relaxations(ops: tuple[str | None, ...]) -> list[tuple[str | None, ...]]:
    """Every tuple made from ``ops`` by replacing some entries with None."""
    out: list[tuple[str | None, ...]] = [()]
    for op in ops:
        out = [t + (None,) for t in out] + ([t + (op,) for t in out] if op is not None else [])
    return out


class _Job(NamedTuple):
    graph: Graph
    rule: Rule
    plan: _CompiledRule
    order: list[int]
    seeds: list[Node] | None
    tracer: MatchTracer | None
    banned: dict[int, set[int]] | None  # slot -> ids of nodes not to bind there


def _search(graph: Graph, rule: Rule, plan: _CompiledRule, order: list[int], seeds: list[Node] | None,
            tracer: MatchTracer | None, banned: dict[int, set[int]] | None = None) -> Iterator[Match]:
    return _extend(_Job(graph, rule, plan, order, seeds, tracer, banned or None), 0, [], {}, {})


def _extend(job: _Job, k: int, used: list[Node], values: dict[str, str], env: dict[str, Any]
            ) -> Iterator[Match]:
    """Bind source node ``job.order[k]`` and the rest after it (a module-level generator, not a
    closure: a closure that calls itself is a reference cycle, garbage only the cyclic GC frees)."""
    order, src = job.order, job.rule.src
    if k == len(order):
        nodes: list[Node] = [None] * len(src)  # type: ignore[list-item]
        for slot, node in zip(order, used, strict=True):
            nodes[slot] = node
        match = _finish(job.graph, job.rule, tuple(nodes), values, env, job.tracer)
        if match is not None:
            yield match
        return
    slot = order[k]
    p = src[slot]
    candidates = job.seeds if (k == 0 and job.seeds is not None) else _candidates(job.graph, p, values)
    c = job.plan.nodes[slot]
    banned = job.banned.get(slot) if job.banned is not None else None
    for node in candidates:
        if any(node is u for u in used) or (banned is not None and id(node) in banned):
            continue
        for new_values, new_env in _unify_node(p, c, node, values, env):
            used.append(node)
            yield from _extend(job, k + 1, used, new_values, new_env)
            used.pop()


def _finish(graph: Graph, rule: Rule, nodes: tuple[Node, ...], values: dict[str, str], env: dict[str, Any],
            tracer: MatchTracer | None) -> Match | None:
    def fail(kind: FailureKind, subject: str = "", detail: str = "", node: Node | None = None) -> None:
        if tracer is not None:
            at = node if node is not None else _node_of(rule, nodes, subject)
            tracer.record(MatchFailure(kind, rule.name, at, subject, detail))

    produced = {o for n in nodes for o in n.outputs}
    for name, kind in rule.inputs.items():
        if kind == "const" and not graph.is_constant_value(values[name]):
            return fail(FailureKind.INPUT_NOT_CONSTANT, name, values[name])
        if values[name] in produced:  # the target would read a value whose producer the rewrite removes
            return fail(FailureKind.INPUT_INSIDE_MATCH, name, values[name], graph.producers.get(values[name]))
    matched = set(map(id, nodes))
    for p_node, node in zip(rule.src, nodes, strict=True):
        for p_out, out in zip(p_node.outputs, node.outputs, strict=True):
            if p_out in rule.outputs:
                continue
            if out in graph.output_set or any(id(u) not in matched and not graph.is_unread(u)
                                              for u, _ in graph.users.get(out, [])):
                return fail(FailureKind.INTERNAL_USED_OUTSIDE, p_out, out, node)
    shapes: dict[str, tuple[Dim, ...]] = {}
    for p_name, g_name in values.items():
        t = graph.type_of(g_name)
        if t is None or t.shape is None or any(d is None for d in t.shape):
            return fail(FailureKind.SHAPE_UNKNOWN, p_name, g_name)
        shapes[p_name] = t.shape
    dtypes = {p_name: graph.type_of(g_name).dtype for p_name, g_name in values.items()}  # typed above
    shape_env = ShapeEnv(env, _condition_shapes(shapes), ConstantValues(graph, values), dtypes)
    try:
        for cond in rule.where:
            if not cond.evaluate(shape_env):
                at = _node_of(rule, nodes, *sorted(cond.tensors))
                return fail(FailureKind.CONDITION_FALSE, cond.source, node=at)
        dst_attrs, dst_types = instantiate_target(graph, rule, values, shape_env)
    except (ShapeError, ExprError, IndexError, TypeError, ZeroDivisionError) as exc:
        # TypeError includes Undecided: a condition that holds for some values of the symbols only
        return fail(FailureKind.TARGET_INVALID, detail=str(exc), node=nodes[0])
    for s, d in rule.outputs.items():
        src_type = graph.type_of(values[s])
        dst_type = dst_types.get(d) or graph.type_of(values.get(d, ""))
        if src_type is None or not src_type.same_as(dst_type):
            return fail(FailureKind.OUTPUT_TYPE_CHANGED, s, f"from {src_type} to {dst_type}")
        if d in dst_types:
            dst_types[d] = src_type  # the same dims, written as the graph has them
    return Match(rule, nodes, values, env, dst_attrs, dst_types)


class ConstantValues(Mapping[str, Any]):
    """What ``value(t)`` reads at a match: the data of each pattern tensor bound to an initializer no caller may
    feed, read when asked (a rule that reads no value reads no data)."""

    def __init__(self, graph: Graph, values: Mapping[str, str]) -> None:
        self._graph, self._values = graph, values

    def _name(self, key: str) -> str | None:
        name = self._values.get(key)
        return name if name is not None and self._graph.is_constant(name) else None

    def __getitem__(self, key: str) -> Any:
        name = self._name(key)
        if name is None:
            raise KeyError(key)
        return self._graph.constants[name].value()

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._name(key) is not None

    def __iter__(self) -> Iterator[str]:
        return (k for k in self._values if self._name(k) is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _node_of(rule: Rule, nodes: tuple[Node, ...], *tensors: str) -> Node:
    """The matched node at fault for the first of these pattern tensors: the one producing it, else the first
    reading it; the match's first node when there is none."""
    for tensor in tensors[:1]:
        for p_node, node in zip(rule.src, nodes, strict=True):
            if tensor in p_node.outputs:
                return node
        for p_node, node in zip(rule.src, nodes, strict=True):
            if tensor in p_node.inputs:
                return node
    return nodes[0]


def _condition_shapes(shapes: dict[str, tuple[Dim, ...]]) -> dict[str, tuple[Any, ...]]:
    """Shapes as conditions read them: a dim over symbols is a SymbolicDim, whose comparisons are decided for
    every value of the symbols or raise Undecided (all-int shapes are passed as they are)."""
    return {name: shape if all(type(d) is int for d in shape) else tuple(SymbolicDim.wrap(d) for d in shape)
            for name, shape in shapes.items()}


def evaluate_template(template: AttrTemplate, env: ShapeEnv) -> Any:
    """The attribute value of a target template (dims over symbols as sympy expressions)."""
    if isinstance(template, Var):
        return env.variables[template.name]
    if isinstance(template, Expr):
        return SymbolicDim.unwrap(template.evaluate(env))
    if isinstance(template, tuple):
        return tuple(evaluate_template(t, env) for t in template)
    return template


def instantiate_target(graph: Graph, rule: Rule, values: dict[str, str], env: ShapeEnv
                       ) -> tuple[tuple[dict[str, Any], ...], dict[str, TensorType]]:
    """Evaluate the target's attributes and infer its tensor types with the op table's shape rules
    (this is the shape precondition: a ShapeError means the rule does not apply here). An attribute that
    would depend on a symbol where the op table allows none (a split of ``batch``) is a ShapeError."""
    types: dict[str, TensorType] = {}
    all_attrs: list[dict[str, Any]] = []
    readable = dict(env.shapes)
    for p in rule.dst:
        entry = OPS[p.op]
        local = ShapeEnv(env.variables, readable, env.values, env.dtypes)
        attrs = entry.normalize_attrs({k: evaluate_template(t, local) for k, t in p.attrs.items()})
        in_types = [types.get(i) or graph.type_of(values[i]) for i in p.inputs]
        out_shapes = entry.infer([t.shape for t in in_types], attrs)  # type: ignore[union-attr]
        if len(out_shapes) != len(p.outputs):
            raise ShapeError(f"{p.op} gives {len(out_shapes)} outputs, pattern names {len(p.outputs)}")
        if in_types and entry.same_dtype_inputs and \
                any(t.dtype != in_types[0].dtype for t in in_types if t is not None):  # type: ignore[union-attr]
            raise ShapeError(f"{p.op}: inputs have different element types")
        if entry.kernel_dtypes and in_types and in_types[0] is not None and \
                in_types[0].dtype not in entry.kernel_dtypes:  # type: ignore[union-attr]
            raise ShapeError(f"{p.op}: ONNX Runtime has no kernel for element type "
                             f"{onnx.TensorProto.DataType.Name(in_types[0].dtype)}")  # type: ignore[union-attr]
        dtype = entry.output_dtype([t.dtype for t in in_types if t is not None], attrs)
        for name, shape in zip(p.outputs, out_shapes, strict=True):
            types[name] = TensorType(dtype, shape)
            readable.update(_condition_shapes({name: shape}))
        all_attrs.append(dict(attrs))
    return tuple(all_attrs), types
