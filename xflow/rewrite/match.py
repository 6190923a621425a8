"""Find every match of a rule's source pattern in a graph.

A match binds pattern nodes to distinct graph nodes, pattern tensors to graph values and attribute
variables to values, such that ops and attributes agree (commutative ops in either input order),
input kinds hold, the source's internal tensors have no users outside the match, the ``where``
conditions hold and the target pattern instantiates with valid shapes of the same types.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from xflow.ir import Graph, Node, TensorType
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


@dataclass
class MatchTracer:
    """Records why near-misses failed (the last reason per rule), for ``--explain`` style output."""

    reasons: dict[str, list[str]] = field(default_factory=dict)

    def fail(self, rule: Rule, reason: str) -> None:
        """Record one failure."""
        self.reasons.setdefault(rule.name, []).append(reason)


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


def _unify_node(p: PatternNode, node: Node, values: dict[str, str], env: dict[str, Any]
                ) -> Iterator[tuple[dict[str, str], dict[str, Any]]]:
    entry = OPS[p.op]
    attr_env = dict(env)
    for key in entry.attr_names:
        template = p.attrs.get(key, next(a.default for a in entry.attrs if a.name == key))
        if not _unify_attr(template, node.attrs.get(key), attr_env):
            return
    orders = [node.inputs]
    if entry.commutative and len(node.inputs) == 2 and node.inputs[0] != node.inputs[1]:
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
    of those nodes (the search then starts from them, so it costs little on a large graph)."""
    if anchor is None:
        yield from _search(graph, rule, _order(rule), None, tracer)
        return
    anchor = list(anchor)
    seen: set[tuple[int, ...]] = set()
    for slot, p in enumerate(rule.src):
        seeds = [n for n in anchor if n.op == p.op]
        if not seeds:
            continue
        for match in _search(graph, rule, _order(rule, slot), seeds, tracer):
            key = tuple(map(id, match.nodes))
            if key not in seen:
                seen.add(key)
                yield match


def _search(graph: Graph, rule: Rule, order: list[int], seeds: list[Node] | None,
            tracer: MatchTracer | None) -> Iterator[Match]:
    def search(k: int, used: list[Node], values: dict[str, str], env: dict[str, Any]) -> Iterator[Match]:
        if k == len(order):
            nodes: list[Node] = [None] * len(rule.src)  # type: ignore[list-item]
            for slot, node in zip(order, used, strict=True):
                nodes[slot] = node
            match = _finish(graph, rule, tuple(nodes), values, env, tracer)
            if match is not None:
                yield match
            return
        p = rule.src[order[k]]
        candidates = seeds if (k == 0 and seeds is not None) else _candidates(graph, p, values)
        for node in candidates:
            if any(node is u for u in used):
                continue
            for new_values, new_env in _unify_node(p, node, values, env):
                used.append(node)
                yield from search(k + 1, used, new_values, new_env)
                used.pop()

    yield from search(0, [], {}, {})


def _finish(graph: Graph, rule: Rule, nodes: tuple[Node, ...], values: dict[str, str], env: dict[str, Any],
            tracer: MatchTracer | None) -> Match | None:
    def fail(reason: str) -> None:
        if tracer is not None:
            tracer.fail(rule, f"{reason} at {nodes[0]!r}")

    produced = {o for n in nodes for o in n.outputs}
    for name, kind in rule.inputs.items():
        if kind == "const" and not graph.is_constant_value(values[name]):
            return fail(f"input {name} ({values[name]}) is not a constant")
        if values[name] in produced:  # the target would read a value whose producer the rewrite removes
            return fail(f"input {name} ({values[name]}) is computed inside the match")
    matched = set(map(id, nodes))
    for p_node, node in zip(rule.src, nodes, strict=True):
        for p_out, out in zip(p_node.outputs, node.outputs, strict=True):
            if p_out in rule.outputs:
                continue
            if out in graph.output_set or any(id(u) not in matched for u, _ in graph.users.get(out, [])):
                return fail(f"internal tensor {p_out} ({out}) is used outside the match")
    shapes: dict[str, tuple[int, ...]] = {}
    for p_name, g_name in values.items():
        t = graph.type_of(g_name)
        if t is None or not t.is_static:
            return fail(f"tensor {p_name} ({g_name}) has no static shape")
        shapes[p_name] = t.static_shape
    shape_env = ShapeEnv(env, shapes)
    try:
        for cond in rule.where:
            if not cond.evaluate(shape_env):
                return fail(f"condition {cond.source!r} is false")
        dst_attrs, dst_types = instantiate_target(graph, rule, values, shape_env)
    except (ShapeError, ExprError, IndexError, TypeError, ZeroDivisionError) as exc:
        return fail(f"target does not instantiate: {exc}")
    for s, d in rule.outputs.items():
        src_type = graph.type_of(values[s])
        dst_type = dst_types.get(d) or graph.type_of(values.get(d, ""))
        if src_type != dst_type:
            return fail(f"output {s} would change type from {src_type} to {dst_type}")
    return Match(rule, nodes, values, env, dst_attrs, dst_types)


def evaluate_template(template: AttrTemplate, env: ShapeEnv) -> Any:
    """The concrete attribute value of a target template."""
    if isinstance(template, Var):
        return env.variables[template.name]
    if isinstance(template, Expr):
        return template.evaluate(env)
    if isinstance(template, tuple):
        return tuple(evaluate_template(t, env) for t in template)
    return template


def instantiate_target(graph: Graph, rule: Rule, values: dict[str, str], env: ShapeEnv
                       ) -> tuple[tuple[dict[str, Any], ...], dict[str, TensorType]]:
    """Evaluate the target's attributes and infer its tensor types with the op table's shape rules
    (this is the shape precondition: a ShapeError means the rule does not apply here)."""
    types: dict[str, TensorType] = {}
    all_attrs: list[dict[str, Any]] = []
    shapes = dict(env.shapes)
    for p in rule.dst:
        entry = OPS[p.op]
        local = ShapeEnv(env.variables, shapes)
        attrs = entry.normalize_attrs({k: evaluate_template(t, local) for k, t in p.attrs.items()})
        in_types = [types.get(i) or graph.type_of(values[i]) for i in p.inputs]
        out_shapes = entry.infer([t.static_shape for t in in_types], attrs)  # type: ignore[union-attr]
        if len(out_shapes) != len(p.outputs):
            raise ShapeError(f"{p.op} gives {len(out_shapes)} outputs, pattern names {len(p.outputs)}")
        if in_types:
            dtype = in_types[0].dtype  # type: ignore[union-attr]
            if any(t.dtype != dtype for t in in_types if t is not None and p.op not in ("smul",)):
                raise ShapeError(f"{p.op}: inputs have different element types")
        else:
            dtype = int(attrs.get("dtype", 1))
        for name, shape in zip(p.outputs, out_shapes, strict=True):
            types[name] = TensorType(dtype, shape)
            shapes[name] = shape
        all_attrs.append(dict(attrs))
    return tuple(all_attrs), types
