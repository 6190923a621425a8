"""Translate op-table terms and rules (``xflow.rules.Rule``) into z3.

Tensors are the uninterpreted sort ``T``. Each op is an uninterpreted function named by its
``z3_symbol`` whose leading arguments are its attributes as z3 Ints (see ``ATTR_LAYOUT``) and whose
trailing arguments are its input tensors. Multi-output ops (split) get one function per output.
Shapes are modelled by ``rank(T) -> Int`` and ``dim(T, Int) -> Int``.

Attribute kinds (the op table's ``AttrSpec.z3``; ``ATTR_LAYOUT`` is a view of them): an int n (n Int slots;
tuples of length n), ``"choice"`` (one Int: the value's index among the attribute's choices, e.g. act none 0,
relu 1), ``"float"`` (one Int: the bits of the value as float32, how ONNX stores it), ``"code"`` (one Int: an
injective code of a tuple literal, for perm and shapes whose length varies) and ``"sizes"`` (split sizes: one
Int per output). The shape facts of an application are the table's ``OpDef.facts``. What cannot be expressed
raises ``Unsupported``.
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import z3

from xflow.ops import OPS
from xflow.rules.expr import PYTHON_SEMANTICS, Expr, Semantics, ShapeEnv
from xflow.rules.model import Rule, Var

T = z3.DeclareSort("T")
RANK = z3.Function("rank", T, z3.IntSort())
DIM = z3.Function("dim", T, z3.IntSort(), z3.IntSort())
#: ``value(t)`` of a one-element constant: the bits of its float32 value, as a "float" attribute holds them (an
#: uninterpreted function: the definition axioms that read a constant's value state what it means)
SCALAR_BITS = z3.Function("scalar_bits", T, z3.IntSort())
#: ``dtype(t)``: a tensor's ONNX element type (uninterpreted; ``cast_same_type`` is the axiom that reads it)
DTYPE = z3.Function("dtype", T, z3.IntSort())


def float_bits(value: float) -> int:
    """The bits of ``value`` as float32, how a "float" attribute is coded."""
    return int.from_bytes(struct.pack("<f", float(value)), "little")


@dataclass(frozen=True)
class ScalarValue:
    """``value(t)`` in z3: the bits of the constant's float32 value. As a float attribute it is those bits; compared
    with a number it equals that number's bits (``value(o) == 1``), so the Python and z3 meanings agree."""

    bits: Any

#: Per op: its attributes with their z3 kinds, in the order of the function's Int arguments (a view of
#: the op table's ``AttrSpec.z3``).
ATTR_LAYOUT: dict[str, tuple[tuple[str, Any], ...]] = {
    name: tuple((a.name, a.z3) for a in entry.attrs) for name, entry in OPS.items()}
#: Codes of the string values of "choice"-kind attributes: the index of the value among the attribute's choices.
CHOICE_CODES: dict[str, int] = {value: i for entry in OPS.values() for a in entry.attrs if a.z3 == "choice"
                                 for i, value in enumerate(a.choices or ())}


class Unsupported(Exception):
    """The encoder cannot express this rule or term; it must be reported, never proved."""


def tuple_code(values: Sequence[int]) -> int:
    """An injective code of a tuple of small non-negative ints (< 999), length included."""
    code = len(values)
    for v in values:
        if not isinstance(v, int) or not 0 <= v < 999:
            raise Unsupported(f"cannot code tuple element {v!r}")
        code = code * 1000 + v + 1
    return code


_FUNCS: dict[tuple[str, int, int, int, int], z3.FuncDeclRef] = {}
_CODES: dict[int, z3.FuncDeclRef] = {}


def symbolic_code(values: Sequence[Any]) -> z3.ArithRef:
    """The code of a tuple with symbolic entries (a reshape target whose dims are rule variables or shape terms):
    an uninterpreted function of the entries, one per length, so that two such tuples with provably equal entries
    get equal codes by congruence. Nothing relates it to ``tuple_code`` of a literal tuple: a rule equal only
    where a symbolic tuple takes some literal's value stays unproved, never proved wrongly."""
    if len(values) not in _CODES:
        _CODES[len(values)] = z3.Function(f"code{len(values)}", *([z3.IntSort()] * (len(values) + 1)))
    return _CODES[len(values)](*[_int(v) for v in values])


def op_function(op: str, n_ints: int, n_tensors: int, out: int = 0, n_out: int = 1) -> z3.FuncDeclRef:
    """The uninterpreted function of ``op`` with this arity (one per output of a multi-output op)."""
    key = (op, n_ints, n_tensors, out, n_out)
    if key not in _FUNCS:
        if op not in ATTR_LAYOUT:
            raise Unsupported(f"op {op!r} has no z3 encoding")
        sym = OPS[op].z3_symbol or op
        name = sym if n_out == 1 else f"{sym}{n_out}_{out}"
        entry = OPS[op]
        if entry.min_inputs != entry.max_inputs:
            name = f"{name}_{n_tensors}"
        _FUNCS[key] = z3.Function(name, *([z3.IntSort()] * n_ints), *([T] * n_tensors), T)
    return _FUNCS[key]


def _int(v: Any) -> z3.ArithRef:
    if isinstance(v, z3.ArithRef):
        return v
    if isinstance(v, bool) or not isinstance(v, int):
        raise Unsupported(f"attribute value {v!r} is not an int")
    return z3.IntVal(v)


def flatten_attr(op: str, kind: Any, value: Any, n_out: int) -> list[z3.ArithRef]:
    """The Int slots of one attribute value (python literal or z3 / tuple of z3)."""
    if kind == "choice":
        if isinstance(value, str):
            if value not in CHOICE_CODES:
                raise Unsupported(f"{op}: unknown activation {value!r}")
            return [z3.IntVal(CHOICE_CODES[value])]
        return [_int(value)]
    if kind == "float":
        if isinstance(value, ScalarValue):
            return [value.bits]
        if isinstance(value, z3.ArithRef):
            return [value]
        if isinstance(value, int | float) and not isinstance(value, bool):
            return [z3.IntVal(float_bits(value))]
        raise Unsupported(f"{op}: float attribute {value!r} is not a number")
    if kind == "code":
        if isinstance(value, z3.ArithRef):
            return [value]
        if isinstance(value, tuple) and all(isinstance(v, int) for v in value):
            return [z3.IntVal(tuple_code(value))]
        if isinstance(value, tuple) and value and all(isinstance(v, int) or _is_z3(v) for v in value):
            return [symbolic_code(value)]
        raise Unsupported(f"{op}: tuple attribute {value!r} is not a literal")
    width = n_out if kind == "sizes" else kind
    if width == 1 and not isinstance(value, tuple):
        return [_int(value)]
    if not isinstance(value, tuple) or len(value) != width:
        raise Unsupported(f"{op}: attribute value {value!r} does not have {width} entries")
    return [_int(v) for v in value]


def apply_op(op: str, attrs: dict[str, Any], args: Sequence[z3.ExprRef], n_out: int = 1) -> list[z3.ExprRef]:
    """The z3 terms of the outputs of ``op`` applied to ``args`` (attribute defaults filled)."""
    if op not in ATTR_LAYOUT:
        raise Unsupported(f"op {op!r} has no z3 encoding")
    entry = OPS[op]
    ints: list[z3.ArithRef] = []
    for name, kind in ATTR_LAYOUT[op]:
        value = attrs.get(name, next(a.default for a in entry.attrs if a.name == name))
        if value is None:
            raise Unsupported(f"{op}: attribute {name} missing")
        ints.extend(flatten_attr(op, kind, value, n_out))
    return [op_function(op, len(ints), len(args), i, n_out)(*ints, *args) for i in range(n_out)]


def var_value(op: str, attr: str, name: str, n_out: int) -> Any:
    """A fresh z3 value for attribute variable ``name`` used as ``op.attr``."""
    kind = dict(ATTR_LAYOUT[op])[attr]
    if kind in ("choice", "code", "float") or kind == 1:
        return z3.Int(name)
    width = n_out if kind == "sizes" else kind
    return tuple(z3.Int(f"{name}_{i}") for i in range(width))


# ---- expressions -------------------------------------------------------------------------------


def _is_z3(v: Any) -> bool:
    return isinstance(v, z3.ExprRef)


def z3_eq(a: Any, b: Any) -> Any:
    """Equality of values that may be ints, z3 terms or tuples of them."""
    if isinstance(a, ScalarValue) or isinstance(b, ScalarValue):
        scalar, other = (a, b) if isinstance(a, ScalarValue) else (b, a)
        if isinstance(other, ScalarValue):
            return scalar.bits == other.bits
        if isinstance(other, int | float) and not isinstance(other, bool):
            return scalar.bits == float_bits(other)
        raise Unsupported(f"cannot compare a constant's value with {other!r}")
    if isinstance(a, tuple) != isinstance(b, tuple) and _is_z3(b if isinstance(a, tuple) else a):
        # a "code" attribute variable against a tuple (``ax == (rank(x) - 1,)``): the variable is the code of
        # the tuple the matcher bound, so it equals the tuple's code (literal or symbolic, as the axioms write it)
        code, items = (b, a) if isinstance(a, tuple) else (a, b)
        literal = all(isinstance(v, int) and not isinstance(v, bool) for v in items)
        return code == (tuple_code(items) if literal else symbolic_code(items))
    if isinstance(a, tuple) or isinstance(b, tuple):
        if not (isinstance(a, tuple) and isinstance(b, tuple)):
            raise Unsupported(f"cannot compare {a!r} with {b!r}")
        if len(a) != len(b):
            return False
        return z3_and(*[z3_eq(x, y) for x, y in zip(a, b, strict=True)])
    if _is_z3(a) or _is_z3(b):
        return a == b
    return a == b


def z3_and(*parts: Any) -> Any:
    """Conjunction of python bools and z3 Bools (python bools folded)."""
    rest = []
    for p in parts:
        if isinstance(p, bool):
            if not p:
                return False
        else:
            rest.append(p)
    return True if not rest else (rest[0] if len(rest) == 1 else z3.And(*rest))


def z3_or(*parts: Any) -> Any:
    """Disjunction of python bools and z3 Bools."""
    rest = []
    for p in parts:
        if isinstance(p, bool):
            if p:
                return True
        else:
            rest.append(p)
    return False if not rest else (rest[0] if len(rest) == 1 else z3.Or(*rest))


def z3_not(a: Any) -> Any:
    """Negation of a python bool or z3 Bool."""
    return (not a) if isinstance(a, bool) else z3.Not(a)


def z3_max(a: Any, b: Any) -> Any:
    """max of ints or z3 Ints."""
    if _is_z3(a) or _is_z3(b):
        return z3.If(_int(a) >= _int(b), _int(a), _int(b))
    return max(a, b)


def z3_min(a: Any, b: Any) -> Any:
    """min of ints or z3 Ints."""
    if _is_z3(a) or _is_z3(b):
        return z3.If(_int(a) <= _int(b), _int(a), _int(b))
    return min(a, b)


def z3_if(c: Any, a: Any, b: Any) -> Any:
    """A conditional value."""
    if isinstance(c, bool):
        return a if c else b
    if isinstance(a, tuple) or isinstance(b, tuple):
        if not (isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b)):
            raise Unsupported("conditional tuples of different lengths")
        return tuple(z3_if(c, x, y) for x, y in zip(a, b, strict=True))
    return z3.If(c, a, b)


def dim_term(t: z3.ExprRef, i: Any) -> z3.ArithRef:
    """``dim(t, i)`` with python's negative indexing."""
    if isinstance(i, int):
        return DIM(t, z3.IntVal(i) if i >= 0 else RANK(t) + i)
    return DIM(t, z3.If(i < 0, RANK(t) + i, i))


def _z3_constant(value: Any) -> Any:
    if isinstance(value, str):
        if value in CHOICE_CODES:
            return CHOICE_CODES[value]
        raise Unsupported(f"string literal {value!r}")
    return value


def _z3_unbound(name: str, source: str) -> Any:
    raise Unsupported(f"variable {name!r} has no encoding")


def _z3_no_term(tensor: str, source: str) -> Any:
    raise Unsupported(f"tensor {tensor!r} has no term")


def _z3_arith(symbol: str, fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """``fn`` on ints or z3 Ints; tuples only concatenate (``+``)."""

    def arith(a: Any, b: Any) -> Any:
        if isinstance(a, tuple) or isinstance(b, tuple):
            if symbol == "+" and isinstance(a, tuple) and isinstance(b, tuple):
                return a + b
            raise Unsupported("arithmetic on tuples")
        return fn(a, b)
    return arith


def _z3_order(fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """An order comparison of ints or z3 Ints (not of tuples)."""

    def compare(a: Any, b: Any) -> Any:
        if isinstance(a, tuple) or isinstance(b, tuple):
            raise Unsupported(f"comparison of {a!r} with {b!r}")
        return fn(a, b)
    return compare


def _z3_in(a: Any, b: Any) -> Any:
    if not isinstance(b, tuple):
        raise Unsupported("'in' over a non-tuple")
    return z3_or(*[z3_eq(a, v) for v in b])


def _z3_index(container: Any, key: Any) -> Any:
    if not isinstance(container, tuple):
        raise Unsupported(f"subscript of {container!r}")
    if not isinstance(key, int):
        raise Unsupported("symbolic subscript")
    return container[key]


def _z3_slice(container: Any, lower: Any, upper: Any, step: Any) -> Any:
    raise Unsupported("slices have no encoding")


def _z3_shape(term: Any) -> Any:
    raise Unsupported("shape() has no fixed length")


def _one_tuple(fname: str, vals: tuple[Any, ...]) -> tuple[Any, ...]:
    if len(vals) != 1 or not isinstance(vals[0], tuple):
        raise Unsupported(f"{fname} of {vals!r}")
    return vals[0]


def _z3_sum(*vals: Any) -> Any:
    total: Any = 0
    for v in _one_tuple("sum()", vals):
        total = total + v
    return total


def _z3_extreme(fname: str, pick: Callable[[Any, Any], Any]) -> Callable[..., Any]:
    def extreme(*vals: Any) -> Any:
        items = vals[0] if len(vals) == 1 and isinstance(vals[0], tuple) else tuple(vals)
        if not items:
            raise Unsupported(f"{fname} of nothing")
        best = items[0]
        for v in items[1:]:
            best = pick(best, v)
        return best
    return extreme


def _z3_abs(*vals: Any) -> Any:
    if len(vals) != 1 or isinstance(vals[0], tuple):
        raise Unsupported(f"abs() of {vals!r}")
    v = vals[0]
    return z3.If(v >= 0, v, -v) if _is_z3(v) else abs(v)


#: The rule-expression language on z3 terms (``xflow.rules.expr``): the Python semantics, overriding only what
#: differs on z3 Ints, Bools and tensor terms (a tensor's entry in the environment is its term).
Z3_SEMANTICS: Semantics = PYTHON_SEMANTICS | {
    "literal": _z3_constant, "unbound": _z3_unbound, "no shape": _z3_no_term, "no value": _z3_no_term,
    "no dtype": _z3_no_term,
    "not": z3_not,
    "+": _z3_arith("+", operator.add), "-": _z3_arith("-", operator.sub), "*": _z3_arith("*", operator.mul),
    "%": _z3_arith("%", operator.mod),
    "//": _z3_arith("//", lambda a, b: a // b if not (_is_z3(a) or _is_z3(b)) else _int(a) / _int(b)),
    "==": z3_eq, "!=": lambda a, b: z3_not(z3_eq(a, b)),
    "<": _z3_order(operator.lt), "<=": _z3_order(operator.le), ">": _z3_order(operator.gt),
    ">=": _z3_order(operator.ge),
    "in": _z3_in, "not in": lambda a, b: z3_not(_z3_in(a, b)),
    "and": lambda values: z3_and(*values), "or": lambda values: z3_or(*values),
    "if": lambda cond, then, otherwise: z3_if(cond, then(), otherwise()),
    "[]": _z3_index, "[:]": _z3_slice,
    "rank()": RANK, "dim()": dim_term, "shape()": _z3_shape,
    "value()": lambda term: ScalarValue(SCALAR_BITS(term)), "dtype()": DTYPE,
    "len()": lambda *vals: len(_one_tuple("len()", vals)), "sum()": _z3_sum,
    "min()": _z3_extreme("min()", z3_min), "max()": _z3_extreme("max()", z3_max), "abs()": _z3_abs,
    "all()": lambda *vals: z3_and(*_one_tuple("all()", vals)),
    "any()": lambda *vals: z3_or(*_one_tuple("any()", vals)),
    "tuple()": lambda *vals: _one_tuple("tuple()", vals),
}


def translate_expr(expr: Expr, variables: dict[str, Any], tensors: dict[str, z3.ExprRef]) -> Any:
    """The z3 value (Int, Bool, python int or tuple) of a rule expression: its evaluation with ``Z3_SEMANTICS``,
    the rule's attribute variables as z3 values and its pattern tensors as terms."""
    return expr.evaluate(ShapeEnv(variables, tensors, tensors, tensors), Z3_SEMANTICS)


# ---- rules -------------------------------------------------------------------------------------


@dataclass
class EncodedRule:
    """A rule in z3: input constants, a term per pattern tensor, hypotheses and goals."""

    inputs: dict[str, z3.ExprRef]
    variables: dict[str, Any]
    terms: dict[str, z3.ExprRef]
    hypotheses: list[Any] = field(default_factory=list)
    goals: list[tuple[str, str, z3.ExprRef, z3.ExprRef]] = field(default_factory=list)


def _template_value(template: Any, op: str, attr: str, n_out: int, variables: dict[str, Any],
                    terms: dict[str, z3.ExprRef], source: bool) -> Any:
    if isinstance(template, Var):
        if template.name not in variables:
            if not source:
                raise Unsupported(f"variable ?{template.name} is unbound")
            variables[template.name] = var_value(op, attr, template.name, n_out)
        return variables[template.name]
    if isinstance(template, Expr):
        return translate_expr(template, variables, terms)
    if isinstance(template, tuple):  # a coded tuple with symbolic entries is coded by ``symbolic_code``
        return tuple(_template_value(t, op, attr, n_out, variables, terms, source) for t in template)
    return template


def encode_rule(rule: Rule) -> EncodedRule:
    """Encode ``rule``; raises ``Unsupported`` when some part has no z3 translation."""
    inputs = {name: z3.Const(f"in_{name}", T) for name in rule.inputs}
    variables: dict[str, Any] = {}
    terms: dict[str, z3.ExprRef] = dict(inputs)
    hyps: list[Any] = []
    src_terms = _encode_nodes(rule.src, variables, terms, source=True, facts=hyps)
    for cond in rule.where:
        value = translate_expr(cond, variables, src_terms)
        if value is False:
            hyps.append(z3.BoolVal(False))
        elif value is not True:
            if not isinstance(value, z3.BoolRef):
                raise Unsupported(f"condition {cond.source!r} is not boolean")
            hyps.append(value)
    # The target's facts are hypotheses too: the matcher infers the target's shapes with the op table's shape
    # rules and refuses a match where one raises (``rewrite.match.instantiate_target``), so a rule is only
    # ever applied where its target is well-formed (a rule true only there is still a rule).
    dst_terms = _encode_nodes(rule.dst, variables, dict(src_terms), source=False, facts=hyps)
    goals = [(s, d, src_terms[s], dst_terms[d]) for s, d in rule.outputs.items()]
    i = z3.Int("out_dim_index")
    for _, _, a, b in goals:  # the matcher rejects a rewrite that changes an output's type
        hyps.append(RANK(a) == RANK(b))
        hyps.append(z3.ForAll([i], DIM(a, i) == DIM(b, i)))
    return EncodedRule(inputs, variables, {**src_terms, **dst_terms}, hyps, goals)


class _Z3Shapes:
    """The op table's ``ShapeFacts`` in z3: ``rank``/``dim`` terms of the tensor sort."""

    rank = staticmethod(RANK)
    dim = staticmethod(dim_term)
    symbolic = staticmethod(_is_z3)
    int = staticmethod(_int)
    both = staticmethod(z3.And)
    div = staticmethod(lambda a, b: a / b)  # z3's integer division (floor for the positive strides it meets)


def table_facts(op: str, attrs: dict[str, Any], args: Sequence[z3.ExprRef], outs: Sequence[z3.ExprRef]) -> list[Any]:
    """Facts the op's shape rule guarantees when this application exists in a valid graph: of its inputs (the op
    table's ``facts``) and of its outputs (``output_facts``)."""
    entry = OPS[op]
    facts = [*(entry.facts(_Z3Shapes, attrs, args) if entry.facts else ()),
             *(entry.output_facts(_Z3Shapes, attrs, args, outs) if entry.output_facts else ())]
    return [f for f in facts if not isinstance(f, bool)]


#: Applications encoded at most this many at a time (``_APPLIED``).
APPLIED_ENTRIES = 20_000
#: (op, outputs, attribute values, argument ids) -> (output terms, their table facts, the attributes and arguments,
#: kept alive so that no other term takes their ids). Candidates of one run share most applications (the same
#: inputs, the same ops): building their z3 terms through z3's Python API was a fifth of the verifier's time.
_APPLIED: dict[tuple[Any, ...], tuple[list[z3.ExprRef], list[Any], Any, Any]] = {}


def _value_key(value: Any) -> Any:
    """A hashable key of an attribute value that tells 1, 1.0 and True apart and names a z3 term by its id."""
    if isinstance(value, ScalarValue):
        value = value.bits
    if isinstance(value, z3.AstRef):
        return ("z3", value.get_id())
    if isinstance(value, tuple):
        return tuple(_value_key(v) for v in value)
    return (type(value).__name__, value)


def _encode_nodes(nodes: Sequence[Any], variables: dict[str, Any], terms: dict[str, z3.ExprRef],
                  source: bool, facts: list[Any]) -> dict[str, z3.ExprRef]:
    for node in nodes:
        if node.op not in ATTR_LAYOUT:
            raise Unsupported(f"op {node.op!r} has no z3 encoding")
        n_out = len(node.outputs)
        attrs = {k: _template_value(t, node.op, k, n_out, variables, terms, source) for k, t in node.attrs.items()}
        args = [terms[i] for i in node.inputs]
        key = (node.op, n_out, tuple((k, _value_key(v)) for k, v in sorted(attrs.items())),
               tuple(a.get_id() for a in args))
        found = _APPLIED.get(key)
        if found is None:
            outs = apply_op(node.op, attrs, args, n_out)
            if len(_APPLIED) >= APPLIED_ENTRIES:
                _APPLIED.clear()
            found = _APPLIED[key] = (outs, table_facts(node.op, attrs, args, outs), attrs, args)
        outs = found[0]
        facts.extend(found[1])
        for name, term in zip(node.outputs, outs, strict=True):
            terms[name] = term
    return terms
