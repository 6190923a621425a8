"""Rules as data: patterns over named tensors, parsed and checked when loaded.

JSON form of one rule (see rules/README.md for the whole format)::

    {"name": "matmul_merge_shared_lhs",
     "doc": "x@a, x@b -> split(x @ concat(a, b))",
     "inputs": {"x": "any", "a": "const", "b": "const"},
     "src": [{"op": "matmul", "in": ["x", "a"], "out": ["y1"]},
             {"op": "matmul", "in": ["x", "b"], "out": ["y2"]}],
     "dst": [{"op": "concat", "in": ["a", "b"], "out": ["w"], "attrs": {"axis": "=rank(a) - 1"}},
             {"op": "matmul", "in": ["x", "w"], "out": ["y"]},
             {"op": "split", "in": ["y"], "out": ["z1", "z2"],
              "attrs": {"axis": "=rank(y1) - 1", "split": "=(dim(a, -1), dim(b, -1))"}}],
     "outputs": {"y1": "z1", "y2": "z2"},
     "where": ["rank(a) == 2"],
     "provenance": {...}}

Attribute values: a literal; ``"?v"`` binds (source) or reads (target) variable ``v``; ``"=expr"`` is an
expression (see ``xflow.rules.expr``). Lists may mix the three. A source attribute left out must
equal the op's default, so no attribute is silently ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from xflow.ops import OPS, ShapeError
from xflow.rules.expr import Expr, ExprError
from xflow.rules.naming import pattern_name
from xflow.rules.pattern import AttrTemplate, PatternNode, Var, template_vars

INPUT_KINDS = ("any", "const")


class RuleError(ValueError):
    """A rule is malformed: unknown op, unbound name or variable, wrong arity, bad output map."""


@dataclass(frozen=True)
class Rule:
    """A proved substitution: ``src`` computes the same tensors as ``dst`` for every input."""

    name: str
    inputs: Mapping[str, str]
    src: tuple[PatternNode, ...]
    dst: tuple[PatternNode, ...]
    outputs: Mapping[str, str]
    where: tuple[Expr, ...] = ()
    doc: str = ""
    provenance: Mapping[str, Any] = field(default_factory=dict)

    @property
    def src_values(self) -> frozenset[str]:
        """Tensors the source pattern produces."""
        return frozenset(o for n in self.src for o in n.outputs)

    @property
    def dst_values(self) -> frozenset[str]:
        """Tensors the target pattern produces."""
        return frozenset(o for n in self.dst for o in n.outputs)

    @property
    def readable_name(self) -> str:
        """What the rule does in a few words (``merge-matmul-shared-lhs``), derived from its patterns; the
        ``name`` stays its id."""
        return pattern_name(self.inputs, self.src, self.dst)

    @property
    def gain_in_values(self) -> bool:
        """Whether the target adds an op whose saving is in the values it reads (``OpDef.gain_in_values``): costs
        measured on random inputs cannot see it, so the rule is applied everywhere and timed end to end."""
        return bool(self._value_ops())

    @property
    def value_dtypes(self) -> frozenset[int]:
        """The element types every op the target adds for a saving in the values may be written on
        (``OpDef.value_dtypes``; empty when it adds none)."""
        sets = [frozenset(entry.value_dtypes) for entry in self._value_ops()]
        return frozenset.intersection(*sets) if sets else frozenset()

    def _value_ops(self) -> list[Any]:
        """The op table entries the target adds whose saving is in the values (``OpDef.gain_in_values``)."""
        added = {n.op for n in self.dst} - {n.op for n in self.src}
        return [OPS[op] for op in sorted(added) if op in OPS and OPS[op].gain_in_values]

    @property
    def variables(self) -> frozenset[str]:
        """Attribute variables bound by the source pattern."""
        return frozenset(v.name for n in self.src for t in n.attrs.values() for v in template_vars(t))

    def to_json(self) -> dict[str, Any]:
        """The JSON form."""
        out: dict[str, Any] = {"name": self.name}
        if self.doc:
            out["doc"] = self.doc
        out["inputs"] = dict(self.inputs)
        out["src"] = [n.to_json() for n in self.src]
        out["dst"] = [n.to_json() for n in self.dst]
        out["outputs"] = dict(self.outputs)
        if self.where:
            out["where"] = [e.source for e in self.where]
        if self.provenance:
            out["provenance"] = dict(self.provenance)
        return out


def _parse_template(value: Any) -> AttrTemplate:
    if isinstance(value, str) and value.startswith("?"):
        return Var(value[1:])
    if isinstance(value, str) and value.startswith("="):
        return Expr(value[1:].strip())
    if isinstance(value, list | tuple):
        return tuple(_parse_template(v) for v in value)
    return value


def _parse_node(raw: Mapping[str, Any], where: str) -> PatternNode:
    try:
        op, ins, outs = raw["op"], raw.get("in", []), raw["out"]
    except KeyError as exc:
        raise RuleError(f"{where}: node lacks {exc.args[0]!r}") from None
    if isinstance(outs, str):
        outs = [outs]
    attrs = {k: _parse_template(v) for k, v in (raw.get("attrs") or {}).items()}
    return PatternNode(op, tuple(ins), tuple(outs), attrs)


def _check_json_shape(raw: Any) -> None:
    """RuleError when the JSON is not shaped as a rule: an object whose name is a string, ``inputs`` and
    ``outputs`` objects of strings, ``src`` and ``dst`` lists of node objects (``op`` a string, ``in`` and ``out``
    lists of strings, ``attrs`` an object), ``where`` a list of strings, ``doc`` a string and ``provenance`` an
    object: what a later step would otherwise meet as a traceback."""
    if not isinstance(raw, Mapping):
        raise RuleError(f"a rule must be a JSON object, not {type(raw).__name__} {_short(raw)}")
    name = raw.get("name", "<unnamed>")
    if not isinstance(name, str):
        raise RuleError(f"rule name must be a string, not {type(name).__name__} {_short(name)}")
    where = f"rule {name}"

    def strings(value: Any, what: str) -> None:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise RuleError(f"{where}: {what} must be a list of strings, not {_short(value)}")

    for key in ("inputs", "outputs"):
        value = raw.get(key, {})
        if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                     for k, v in value.items()):
            raise RuleError(f"{where}: {key} must be an object of names to strings, not {_short(value)}")
    for side in ("src", "dst"):
        nodes = raw.get(side, [])
        if not isinstance(nodes, list):
            raise RuleError(f"{where}: {side} must be a list of nodes, not {_short(nodes)}")
        for i, node in enumerate(nodes):
            at = f"{side}[{i}]"
            if not isinstance(node, Mapping):
                raise RuleError(f"{where}: {at} must be a node object, not {_short(node)}")
            if not isinstance(node.get("op", ""), str):
                raise RuleError(f"{where}: {at}.op must be a string, not {_short(node['op'])}")
            strings(node.get("in", []), f"{at}.in")
            out = node.get("out", [])
            strings([out] if isinstance(out, str) else out, f"{at}.out")
            attrs = node.get("attrs") or {}
            if not isinstance(attrs, Mapping):
                raise RuleError(f"{where}: {at}.attrs must be an object, not {_short(node['attrs'])}")
            for key, value in attrs.items():
                if not _literal(value):
                    raise RuleError(f"{where}: {at}.attrs.{key} must be a number, string, bool or a list of them, "
                                    f"not {_short(value)}")
    strings(raw.get("where", []), "where")
    if not isinstance(raw.get("doc", ""), str):
        raise RuleError(f"{where}: doc must be a string")
    if not isinstance(raw.get("provenance", {}), Mapping):
        raise RuleError(f"{where}: provenance must be an object")


def _literal(value: Any) -> bool:
    """True for what an attribute template may be: a number, string, bool or null, or a list of them (a tuple in a
    rule built in Python, as its JSON list)."""
    if isinstance(value, list | tuple):
        return all(_literal(v) for v in value)
    return value is None or isinstance(value, int | float | str | bool)


def _short(value: Any) -> str:
    """A value as JSON, cut to a readable length, on one line."""
    import json

    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def parse_rule(raw: Mapping[str, Any]) -> Rule:
    """Build a rule from its JSON form and check it (``RuleError`` says what is wrong)."""
    _check_json_shape(raw)
    name = raw.get("name", "<unnamed>")
    try:
        rule = Rule(
            name=name,
            inputs=dict(raw["inputs"]),
            src=tuple(_parse_node(n, f"rule {name} src[{i}]") for i, n in enumerate(raw["src"])),
            dst=tuple(_parse_node(n, f"rule {name} dst[{i}]") for i, n in enumerate(raw["dst"])),
            outputs=dict(raw["outputs"]),
            where=tuple(Expr(e) for e in raw.get("where", [])),
            doc=raw.get("doc", ""),
            provenance=dict(raw.get("provenance", {})),
        )
    except KeyError as exc:
        raise RuleError(f"rule {name}: missing field {exc.args[0]!r}") from None
    validate(rule)
    return rule


def validate(rule: Rule) -> None:
    """Reject a malformed rule when it is built, not when it first matches (egg's ``Rewrite::new``)."""
    where = f"rule {rule.name}"
    for name, kind in rule.inputs.items():
        if kind not in INPUT_KINDS:
            raise RuleError(f"{where}: input {name!r} has kind {kind!r}, expected one of {INPUT_KINDS}")
    if not rule.src or not rule.outputs:
        raise RuleError(f"{where}: source pattern and output map must not be empty")
    src_defined = _check_pattern(rule, rule.src, "src", source=True)
    dst_defined = _check_pattern(rule, rule.dst, "dst", source=False)
    src_used = {i for n in rule.src for i in n.inputs}
    unused = set(rule.inputs) - src_used
    if unused:
        raise RuleError(f"{where}: inputs {sorted(unused)} are not used by the source pattern")
    for s, d in rule.outputs.items():
        if s not in src_defined - set(rule.inputs):
            raise RuleError(f"{where}: output map key {s!r} is not produced by the source pattern")
        if d not in dst_defined:
            raise RuleError(f"{where}: output map value {d!r} is not an input or a target tensor")
    bound_vars = rule.variables
    for expr in rule.where:
        _check_expr(expr, bound_vars, src_defined, f"{where} where {expr.source!r}")
    for n in rule.dst:
        for key, template in n.attrs.items():
            for v in template_vars(template):
                if v.name not in bound_vars:
                    raise RuleError(f"{where}: target attribute {key}={template!r} uses unbound variable ?{v.name}")
            for expr in _exprs(template):
                _check_expr(expr, bound_vars, src_defined | dst_defined, f"{where} dst {n.op}.{key}")
    # every source node must feed a mapped output, or its removal would be unaccounted for
    needed = set(rule.outputs)
    for n in reversed(rule.src):
        if needed & set(n.outputs):
            needed |= set(n.inputs)
    dead = [n.op for n in rule.src if not set(n.outputs) & needed]
    if dead:
        raise RuleError(f"{where}: source nodes {dead} feed no mapped output")


def _exprs(template: AttrTemplate) -> list[Expr]:
    if isinstance(template, Expr):
        return [template]
    if isinstance(template, tuple):
        return [e for t in template for e in _exprs(t)]
    return []


def _check_expr(expr: Expr, variables: frozenset[str], tensors: set[str] | frozenset[str], where: str) -> None:
    try:
        unbound_vars = expr.variables - variables
        unbound_tensors = expr.tensors - set(tensors)
    except ExprError as exc:
        raise RuleError(f"{where}: {exc}") from None
    if unbound_vars:
        raise RuleError(f"{where}: unbound variable(s) {sorted(unbound_vars)}")
    if unbound_tensors:
        raise RuleError(f"{where}: unknown tensor(s) {sorted(unbound_tensors)}")


def _check_pattern(rule: Rule, nodes: tuple[PatternNode, ...], side: str, source: bool) -> set[str]:
    defined = set(rule.inputs)
    for i, n in enumerate(nodes):
        where = f"rule {rule.name} {side}[{i}] ({n.op})"
        if n.op not in OPS:
            raise RuleError(f"{where}: unknown op; the op table has {sorted(OPS)}")
        entry = OPS[n.op]
        if not entry.min_inputs <= len(n.inputs) <= entry.max_inputs:
            raise RuleError(f"{where}: {len(n.inputs)} inputs, op takes {entry.min_inputs}..{entry.max_inputs}")
        for name in n.inputs:
            if name not in defined:
                raise RuleError(f"{where}: input {name!r} is neither a rule input nor an earlier output")
        unknown = set(n.attrs) - entry.attr_names
        if unknown:
            raise RuleError(f"{where}: unknown attribute(s) {sorted(unknown)}")
        missing = {a.name for a in entry.attrs if a.default is None} - set(n.attrs)
        if missing:
            raise RuleError(f"{where}: required attribute(s) {sorted(missing)} not given")
        if source:
            for key, template in n.attrs.items():
                if _exprs(template):
                    raise RuleError(f"{where}: source attribute {key} may not be an expression (use where)")
        if all(not template_vars(t) and not _exprs(t) for t in n.attrs.values()):
            try:
                count = entry.num_outputs(entry.normalize_attrs(n.attrs))
            except ShapeError as exc:
                raise RuleError(f"{where}: {exc}") from None
            if count != len(n.outputs):
                raise RuleError(f"{where}: {len(n.outputs)} outputs named, op gives {count}")
        for out in n.outputs:
            if out in defined:
                raise RuleError(f"{where}: tensor {out!r} defined twice")
            defined.add(out)
    return defined
