"""Symbolic dims: a dim is an int or a sympy integer expression over positive integer symbols.

Named ONNX ``dim_param``s become symbols of that name; an unnamed dynamic dim becomes a fresh symbol
named after where it sits (``x[0]``: input ``x``, axis 0). Derived dims (``batch*seq``, ``seq+1``) are
expressions over them. Every predicate here is decided for *all* values of the symbols: when that cannot
be shown it answers False (no match, never a guess).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import sympy

Dim = int | sympy.Expr


def symbol(name: str) -> sympy.Symbol:
    """The symbol of a dynamic dim (a positive integer)."""
    return sympy.Symbol(name, integer=True, positive=True)


def unnamed_symbol_name(input_name: str, axis: int) -> str:
    """The name given to an unnamed dynamic dim of a graph input (what ``--shape-profile`` calls it)."""
    return f"{input_name}[{axis}]"


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_EXPRESSION = re.compile(r"[A-Za-z0-9_+\-*/() ]+")


def parse_dim(text: str) -> Dim:
    """A dim from its ``dim_param`` text: ``"batch"``, ``"batch*seq"``, ``"seq+1"``, ``"8"``. Every name in an
    expression is a symbol (nothing else is looked up, so a model's text cannot reach a function); any other
    text (``"batch size"``, ``"s.0"``) is one symbol of that name."""
    if _NAME.fullmatch(text) or not _EXPRESSION.fullmatch(text):
        return symbol(text)
    try:
        expr = sympy.sympify(text, locals={name: symbol(name) for name in _names(text)})
    except (sympy.SympifyError, TypeError, SyntaxError, ValueError):
        return symbol(text)
    if not isinstance(expr, sympy.Expr) or not expr.is_integer:
        return symbol(text)
    return int(expr) if expr.is_Integer else expr


def _names(text: str) -> set[str]:
    names, current = set(), ""
    for ch in text + " ":
        if ch.isalnum() or ch == "_":
            current += ch
            continue
        if current and not current[0].isdigit():
            names.add(current)
        current = ""
    return names


def dims_of(value_info: onnx.ValueInfoProto) -> tuple[Dim, ...] | None:
    """The dims of a graph input or output (None when its rank is unknown)."""
    tensor = value_info.type.tensor_type
    if not value_info.type.HasField("tensor_type") or not tensor.HasField("shape"):
        return None
    dims: list[Dim] = []
    for axis, d in enumerate(tensor.shape.dim):
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.dim_param:
            dims.append(parse_dim(d.dim_param))
        else:
            dims.append(symbol(unnamed_symbol_name(value_info.name, axis)))
    return tuple(dims)


def is_static(dim: Dim) -> bool:
    """True for a known integer."""
    return isinstance(dim, int) or (isinstance(dim, sympy.Expr) and dim.is_Integer)


def free_symbols(dims: Sequence[Dim]) -> list[str]:
    """Names of the symbols in ``dims``, in order of first appearance."""
    found: dict[str, None] = {}
    for d in dims:
        if isinstance(d, sympy.Expr):
            for s in sorted(d.free_symbols, key=lambda s: s.name):
                found.setdefault(s.name, None)
    return list(found)


def equal(a: Dim, b: Dim) -> bool:
    """True when ``a == b`` for every value of the symbols."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return sympy.simplify(sympy.sympify(a) - sympy.sympify(b)) == 0


def divides(a: Dim, b: Dim) -> bool:
    """True when ``a`` divides ``b`` for every value of the symbols (shown by ``b / a`` being a polynomial
    with integer coefficients; anything else, even a true but unproven case, is False)."""
    if isinstance(a, int) and isinstance(b, int):
        return a != 0 and b % a == 0
    if sympy.sympify(a) == 0:
        return False
    quotient = sympy.cancel(sympy.sympify(b) / sympy.sympify(a))
    symbols = sorted(quotient.free_symbols, key=lambda s: s.name)
    if not symbols:
        return bool(quotient.is_Integer)
    if not quotient.is_polynomial(*symbols):
        return False
    return all(c.is_Integer for c in sympy.Poly(quotient, *symbols).coeffs())


def concrete(dim: Dim, values: Mapping[str, int]) -> int:
    """The dim's value at these symbol values; KeyError naming a symbol that has none."""
    if isinstance(dim, int):
        return dim
    missing = [s.name for s in dim.free_symbols if s.name not in values]
    if missing:
        raise KeyError(missing[0])
    value = dim.subs({s: values[s.name] for s in dim.free_symbols})
    return int(value)


def as_dim(value: object) -> Dim:
    """A shape rule's result dim in canonical form: an int, or a sympy expression with symbols."""
    if isinstance(value, sympy.Expr):
        return int(value) if value.is_Integer else value
    return int(value)  # type: ignore[call-overload]


def product(dims: Sequence[Dim]) -> Dim:
    """The number of elements of a shape (an expression when a dim is symbolic)."""
    total: Dim = 1
    for d in dims:
        total = total * d
    return as_dim(total)


class NotBroadcastable(ValueError):
    """The shapes do not broadcast for every value of their symbols."""


def broadcast(*shapes: Sequence[Dim]) -> tuple[Dim, ...]:
    """ONNX/numpy multidirectional broadcasting, decided for every value of the symbols: per axis the dims
    other than a static 1 must all be equal; NotBroadcastable otherwise (a symbol beside a static size
    other than 1 holds for one value only, so it is no match)."""
    if all(type(d) is int for s in shapes for d in s):  # the common case, as fast as numpy's own
        try:
            return tuple(int(d) for d in np.broadcast_shapes(*shapes))
        except ValueError as exc:
            raise NotBroadcastable(str(exc)) from None
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = []
    for axis in range(rank):
        dims = [s[len(s) - rank + axis] for s in shapes if len(s) - rank + axis >= 0]
        kept = [d for d in dims if not (is_static(d) and int(d) == 1)]
        if not kept:
            out.append(1)
            continue
        if any(not equal(kept[0], d) for d in kept[1:]):
            raise NotBroadcastable(f"shapes {[tuple(s) for s in shapes]} do not broadcast at axis {axis}")
        out.append(as_dim(kept[0]))
    return tuple(out)
