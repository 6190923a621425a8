"""Symbolic dims: a dim is an int or a sympy integer expression over positive integer symbols.

Named ONNX ``dim_param``s become symbols of that name; an unnamed dynamic dim becomes a fresh symbol
named after where it sits (``x[0]``: input ``x``, axis 0). Derived dims (``batch*seq``, ``seq+1``) are
expressions over them. Every predicate here is decided for *all* values of the symbols: when that cannot
be shown it answers False (no match, never a guess).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

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
    return exact_quotient(b, a) is not None


def exact_quotient(b: Dim, a: Dim) -> Dim | None:
    """``b / a`` when it is a polynomial with integer coefficients in the symbols (so a dim for every value of
    them), else None (even where it is one but that is not shown)."""
    if isinstance(a, int) and isinstance(b, int):
        return b // a if a != 0 and b % a == 0 else None
    if sympy.sympify(a) == 0:
        return None
    quotient = sympy.cancel(sympy.sympify(b) / sympy.sympify(a))
    symbols = sorted(quotient.free_symbols, key=lambda s: s.name)
    if not symbols:
        return int(quotient) if quotient.is_Integer else None
    if not quotient.is_polynomial(*symbols):
        return None
    return quotient if all(c.is_Integer for c in sympy.Poly(quotient, *symbols).coeffs()) else None


#: a polynomial's terms: (integer coefficient, ((symbol name, power), ...)); () for the constant term
Terms = list[tuple[int, tuple[tuple[str, int], ...]]]


def integer_terms(dim: Dim) -> Terms | None:
    """The dim as a polynomial with integer coefficients in its symbols (``batch*seq``, ``2*seq + 1``), term
    by term, or None when it is not one (``seq/2``, ``floor(seq/2)``): what a run can compute from the
    symbols' values with integer Mul and Add."""
    expr = sympy.sympify(dim)
    if expr.is_Integer:
        return [(int(expr), ())] if int(expr) else []
    symbols = sorted(expr.free_symbols, key=lambda s: s.name)
    if not symbols or not expr.is_polynomial(*symbols):
        return None
    poly = sympy.Poly(sympy.expand(expr), *symbols)
    if not all(c.is_Integer for c in poly.coeffs()):
        return None
    return [(int(c), tuple((s.name, k) for s, k in zip(symbols, monom, strict=True) if k))
            for monom, c in poly.terms()]


@dataclass(frozen=True)
class SymbolSource:
    """Where a run of the model reads a symbol's value: dim ``axis`` of graph input ``input`` is
    ``scale * symbol + offset`` (so the symbol is ``(dim - offset) / scale``, an exact division)."""

    input: str
    axis: int
    scale: int = 1
    offset: int = 0


def symbol_sources(inputs: Iterable[tuple[str, Sequence[Dim] | None]]) -> dict[str, SymbolSource]:
    """For every symbol a run can read from the graph inputs (``(name, dims)`` pairs), where: a dim that is
    the symbol itself (preferred) or ``scale * symbol + offset`` in it alone. A symbol only found in dims over
    several symbols (``batch*seq``) has none."""
    found: dict[str, SymbolSource] = {}
    for name, dims in inputs:
        for axis, d in enumerate(dims or ()):
            if is_static(d) or len(d.free_symbols) != 1:
                continue
            (s,) = d.free_symbols
            terms = integer_terms(d)
            if terms is None or any(powers not in ((), ((s.name, 1),)) for _, powers in terms):
                continue
            scale = sum(c for c, powers in terms if powers)
            offset = sum(c for c, powers in terms if not powers)
            source = SymbolSource(name, axis, scale, offset)
            if s.name not in found or (scale, offset) == (1, 0) != (found[s.name].scale, found[s.name].offset):
                found[s.name] = source
    return found


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


class Undecided(TypeError):
    """A condition on dims that holds for some values of the symbols and not for others (or that cannot be
    shown either way). A TypeError, as sympy's own refusal of ``bool(batch < 4)`` is: whoever asked treats
    it as no match."""


def never_equal(a: Dim, b: Dim) -> bool:
    """True when ``a != b`` for every value of the symbols (their difference is a nonzero constant, or of
    one sign for all positive values)."""
    if isinstance(a, int) and isinstance(b, int):
        return a != b
    difference = sympy.simplify(sympy.sympify(a) - sympy.sympify(b))
    if difference.is_Integer:
        return difference != 0
    return bool(difference.is_positive or difference.is_negative)


def decide_equal(a: Dim, b: Dim) -> bool:
    """``a == b`` when it is the same answer for every value of the symbols; Undecided otherwise."""
    if equal(a, b):
        return True
    if never_equal(a, b):
        return False
    raise Undecided(f"{a} == {b} holds for some sizes only")


def decide_less(a: Dim, b: Dim, strict: bool = True) -> bool:
    """``a < b`` (``a <= b`` when not ``strict``) when it is the same answer for every value of the symbols;
    Undecided otherwise."""
    if isinstance(a, int) and isinstance(b, int):
        return a < b if strict else a <= b
    difference = sympy.simplify(sympy.sympify(b) - sympy.sympify(a))
    holds = difference.is_positive if strict else difference.is_nonnegative
    fails = difference.is_nonpositive if strict else difference.is_negative
    if holds:
        return True
    if fails:
        return False
    raise Undecided(f"{a} {'<' if strict else '<='} {b} holds for some sizes only")


def has_symbols(value: object) -> bool:
    """True when ``value`` (a dim, or a tuple of them, nested) depends on a symbol."""
    if isinstance(value, sympy.Basic):
        return bool(value.free_symbols)
    if isinstance(value, tuple | list):
        return any(has_symbols(v) for v in value)
    return False


class SymbolicDim:
    """A dim as rule conditions see it (``dim(t, i)``, ``shape(t)``): arithmetic gives dims, and every
    comparison is decided for all values of the symbols or raises Undecided, so ``batch != 3`` or
    ``not batch == 3`` can never pass as true (sympy's own ``!=`` compares expressions, not values)."""

    __slots__ = ("expr",)

    def __init__(self, expr: Dim) -> None:
        self.expr = expr

    @staticmethod
    def wrap(dim: Dim) -> Dim | SymbolicDim:
        """An int stays an int; a dim over symbols becomes a SymbolicDim."""
        return int(dim) if is_static(dim) else SymbolicDim(dim)

    @staticmethod
    def unwrap(value: object) -> object:
        """The dims inside ``value`` (nested tuples too) as ints and sympy expressions again."""
        if isinstance(value, SymbolicDim):
            return value.expr
        if isinstance(value, tuple | list):
            return tuple(SymbolicDim.unwrap(v) for v in value)
        return value

    def _of(self, other: object) -> Dim:
        if isinstance(other, SymbolicDim):
            return other.expr
        if isinstance(other, bool) or not isinstance(other, int | sympy.Expr):
            raise Undecided(f"cannot compare the dim {self.expr} with {other!r}")
        return other

    def _make(self, value: object) -> Dim | SymbolicDim:
        return SymbolicDim.wrap(as_dim(value))

    def __eq__(self, other: object) -> bool:  # type: ignore[override]
        if isinstance(other, tuple | list | str | None):
            return False
        return decide_equal(self.expr, self._of(other))

    def __ne__(self, other: object) -> bool:  # type: ignore[override]
        return not self.__eq__(other)

    def __lt__(self, other: object) -> bool:
        return decide_less(self.expr, self._of(other))

    def __le__(self, other: object) -> bool:
        return decide_less(self.expr, self._of(other), strict=False)

    def __gt__(self, other: object) -> bool:
        return decide_less(self._of(other), self.expr)

    def __ge__(self, other: object) -> bool:
        return decide_less(self._of(other), self.expr, strict=False)

    def __hash__(self) -> int:
        return hash(self.expr)

    def __bool__(self) -> bool:
        return not decide_equal(self.expr, 0)

    def __add__(self, other: object) -> Dim | SymbolicDim:
        return self._make(self.expr + self._of(other))

    __radd__ = __add__

    def __sub__(self, other: object) -> Dim | SymbolicDim:
        return self._make(self.expr - self._of(other))

    def __rsub__(self, other: object) -> Dim | SymbolicDim:
        return self._make(self._of(other) - self.expr)

    def __mul__(self, other: object) -> Dim | SymbolicDim:
        return self._make(self.expr * self._of(other))

    __rmul__ = __mul__

    def __floordiv__(self, other: object) -> Dim | SymbolicDim:
        return self._make(sympy.floor(sympy.sympify(self.expr) / self._of(other)))

    def __rfloordiv__(self, other: object) -> Dim | SymbolicDim:
        return self._make(sympy.floor(sympy.sympify(self._of(other)) / self.expr))

    def __mod__(self, other: object) -> Dim | SymbolicDim:
        return self._make(sympy.Mod(self.expr, self._of(other)))

    def __rmod__(self, other: object) -> Dim | SymbolicDim:
        return self._make(sympy.Mod(self._of(other), self.expr))

    def __neg__(self) -> Dim | SymbolicDim:
        return self._make(-self.expr)

    def __abs__(self) -> Dim | SymbolicDim:
        return self._make(sympy.Abs(self.expr))

    def __repr__(self) -> str:
        return f"SymbolicDim({self.expr})"
