"""Relations between a model's dynamic input dims that the graph states, and the sizes that respect them.

A decoder with a KV cache takes ``past_seq`` (the cache) and ``seq`` (the new tokens) and also ``total_seq``
(the attention mask), and runs only where ``total_seq = past_seq + seq``: nothing in the interface says so,
but the graph does, twice. The cache ``Concat`` of ``past_seq`` and ``seq`` along one axis makes a dim
``past_seq + seq`` that meets ``total_seq`` where a graph output (``present_*``) declares it, and where the
mask broadcasts against the attention scores. Those meetings are the relations found here:

- a graph output whose declared dim differs from the one inferred for it;
- two inputs of a broadcasting op (or of a MatMul, or a Concat off its axis) whose dims at one axis differ
  and are neither 1.

The inferred dims are ONNX Runtime's symbolic shape inference without merging (the loader's): it follows
Shape -> Gather -> Range -> Concat chains and writes ``past_seq + seq`` where the cache is concatenated,
and stops where it would have to assume two dims equal, which is where the relations are. Its own merges
(``auto_merge``) are not used: they pair an expression with whichever symbol the node made up for its
output, not with the input dim it meets. Only polynomial relations over the input symbols are kept
(``Min(256, past_seq + seq)`` from a clamped Slice says nothing a size can be derived from).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import onnx
import sympy

from xflow.ir.dims import Dim, dims_of, free_symbols, integer_terms, is_static, parse_dim, symbol
from xflow.ir.types import TensorType

Meet = Callable[[Dim, Dim, str], None]  # records that two dims must be equal, and where

#: ops whose inputs broadcast against each other (numpy rules), so that two dims > 1 at one axis are equal
BROADCASTING = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Mod", "And", "Or", "Xor", "Equal", "Less", "LessOrEqual", "Greater",
    "GreaterOrEqual", "Max", "Min", "Sum", "Mean", "Where", "PRelu", "BitShift",
})


@dataclass(frozen=True)
class DimRelation:
    """``symbol = expr`` over the model's input symbols, and where in the graph it was found."""

    symbol: str
    expr: sympy.Expr
    where: str

    def __str__(self) -> str:
        return f"{self.symbol} = {self.expr}"

    def holds(self, point: Mapping[str, int]) -> bool:
        """True when the point's sizes satisfy the relation."""
        return point[self.symbol] == int(self.expr.subs({s: point[s.name] for s in self.expr.free_symbols}))

    def describe(self, point: Mapping[str, int]) -> str:
        """The relation with the point's sizes (``total_seq = past_seq + seq (where): total_seq=128, but
        past_seq + seq = 128 + 1 = 129``)."""
        sides = {s: point[s.name] for s in self.expr.free_symbols}
        value = int(self.expr.subs(sides))
        terms = self.expr.as_ordered_terms()  # the order str(self) prints them in
        shown = " + ".join(str(sides[t]) for t in terms) + " = " if self.expr.is_Add and \
            all(t.is_Symbol for t in terms) else ""
        return f"{self} ({self.where}): {self.symbol}={point[self.symbol]}, but {self.expr} = {shown}{value}"


@dataclass(frozen=True)
class Cache:
    """A KV cache: ``past`` (the cache's length, an input dim) concatenated with ``new`` (the new tokens)."""

    past: str
    new: str
    where: str


@dataclass(frozen=True)
class DimRelations:
    """What the graph says of its input symbols: equalities between them, and the caches it extends."""

    relations: tuple[DimRelation, ...] = ()
    caches: tuple[Cache, ...] = ()
    #: the value types they were read from (ORT's symbolic inference without merging; None when none ran),
    #: which the loader reuses where it derives no dim (the same model, so the same inference)
    inferred: Mapping[str, TensorType] | None = field(default=None, compare=False, repr=False)

    def broken_at(self, point: Mapping[str, int]) -> list[DimRelation]:
        """The relations the point's sizes break (those over symbols it sizes)."""
        return [r for r in self.relations if {r.symbol, *(s.name for s in r.expr.free_symbols)} <= set(point)
                and not r.holds(point)]


def find_relations(model: onnx.ModelProto, inferred: Mapping[str, TensorType],
                   merges: Iterable[tuple[str, str]] = ()) -> DimRelations:
    """The relations between ``model``'s input symbols that its graph states, from the value types
    ``inferred`` for it (ONNX Runtime's symbolic inference without merging: ``load.plain_symbolic_types``), and
    from the dims that inference assumed equal where it merges them (``load.symbolic_merges``): past a clamped
    Slice (``Min(256, past_seq + seq)``) the plain one knows no more, and the mask meets the cache only there."""
    initializers = {t.name for t in model.graph.initializer}
    inputs = {vi.name: dims_of(vi) for vi in model.graph.input if vi.name not in initializers}
    named = {s for dims in inputs.values() for s in free_symbols(dims or ())}
    order = [s for dims in inputs.values() for s in free_symbols(dims or ())]
    found: dict[sympy.Expr, DimRelation] = {}

    def meet(a: Dim, b: Dim, where: str) -> None:
        relation = _relation(a, b, named, order, where)
        if relation is not None:
            found.setdefault(_key(relation), relation)

    for a, b in merges:
        meet(parse_dim(a), parse_dim(b), "dims ONNX Runtime's shape inference merges")
    for vi in model.graph.output:
        declared, t = dims_of(vi), inferred.get(vi.name)
        if declared is not None and t is not None and t.shape is not None and len(t.shape) == len(declared):
            for axis, (d, e) in enumerate(zip(declared, t.shape, strict=True)):
                meet(d, e, f"output {vi.name} dim {axis}")
    types = {**{name: TensorType(0, dims) for name, dims in inputs.items()}, **inferred}
    caches: list[Cache] = []
    for node in model.graph.node:
        shapes = [_shape(types, name) for name in node.input]
        label = f"{node.op_type} {node.name or node.output[0]}"
        if node.op_type in BROADCASTING:
            _meet_broadcast([s for s in shapes if s is not None], meet, label)
        elif node.op_type == "MatMul" and all(s is not None and len(s) >= 2 for s in shapes[:2]):
            meet(shapes[0][-1], shapes[1][-2], label)
            _meet_broadcast([shapes[0][:-2], shapes[1][:-2]], meet, label)
        elif node.op_type == "Concat":
            cache = _meet_concat(node, shapes, inputs, meet, label)
            if cache is not None and all((c.past, c.new) != (cache.past, cache.new) for c in caches):
                caches.append(cache)
    return DimRelations(tuple(found.values()), tuple(caches), dict(inferred))


def _shape(types: Mapping[str, TensorType], name: str) -> tuple[Dim, ...] | None:
    t = types.get(name) if name else None
    return t.shape if t is not None else None


def _meet_broadcast(shapes: Sequence[Sequence[Dim]], meet: Meet, label: str) -> None:
    """Meet the dims of broadcast operands at each axis (from the right) where neither is 1."""
    rank = max((len(s) for s in shapes), default=0)
    for axis in range(1, rank + 1):
        dims = [s[-axis] for s in shapes if len(s) >= axis and not (is_static(s[-axis]) and int(s[-axis]) == 1)]
        for other in dims[1:]:
            meet(dims[0], other, label)


def _meet_concat(node: onnx.NodeProto, shapes: list[tuple[Dim, ...] | None],
                 inputs: Mapping[str, tuple[Dim, ...] | None], meet: Meet, label: str) -> Cache | None:
    """Meet the dims off the Concat's axis; the cache it extends when it appends to a graph input's dim."""
    known = [s for s in shapes if s is not None]
    if len(known) != len(shapes) or len(known) < 2 or len({len(s) for s in known}) != 1:
        return None
    rank = len(known[0])
    axis = next((a.i for a in node.attribute if a.name == "axis"), 0) % rank
    for k in range(rank):
        if k != axis:
            for other in known[1:]:
                meet(known[0][k], other[k], label)
    if len(known) != 2 or node.input[0] not in inputs:
        return None
    past, new = known[0][axis], known[1][axis]
    if isinstance(past, sympy.Symbol) and isinstance(new, sympy.Symbol) and past != new:
        return Cache(past.name, new.name, f"{label} of input {node.input[0]} dim {axis}")
    return None


def _relation(a: Dim, b: Dim, named: set[str], order: list[str], where: str) -> DimRelation | None:
    """``a = b`` as a relation over the input symbols (``named``), or None when it says nothing: equal, one
    side static (a dim the graph fixes is a size the model refuses to run at, named as such when it fails,
    not one to derive), or over symbols that are not input dims or not polynomial (``Min(...)``, fresh
    symbols)."""
    if is_static(a) or is_static(b):
        return None
    ea, eb = sympy.sympify(a), sympy.sympify(b)
    difference = sympy.expand(ea - eb)
    if difference == 0 or not {s.name for s in difference.free_symbols} <= named:
        return None
    if integer_terms(ea) is None or integer_terms(eb) is None:
        return None
    # the symbol derived from the others: one side alone (the later in input order when both are)
    lone = [e for e in (ea, eb) if isinstance(e, sympy.Symbol)]
    if lone:
        chosen = max(lone, key=lambda s: order.index(s.name))
    else:
        chosen = max(difference.free_symbols, key=lambda s: order.index(s.name))
    solved = sympy.solve(sympy.Eq(ea, eb), chosen)
    if len(solved) != 1 or integer_terms(solved[0]) is None:
        return None
    return DimRelation(chosen.name, sympy.expand(solved[0]), where)


def _key(relation: DimRelation) -> sympy.Expr:
    """The relation as one expression equal to 0, its sign fixed: the same relation found twice is one."""
    difference = sympy.expand(symbol(relation.symbol) - relation.expr)
    return -difference if sympy.Poly(difference).LC() < 0 else difference


def solve_sizes(relations: Iterable[DimRelation], given: Iterable[str], order: Sequence[str]
                ) -> dict[str, sympy.Expr]:
    """The symbols derived from the others (symbol -> expression over those that are not derived), each
    relation solved for one of its symbols not in ``given`` (those the user sizes): its own symbol where it
    can, else the latest in ``order`` (the inputs' order). A relation over given symbols only derives
    nothing (it is checked at the points instead)."""
    given = set(given)
    derived: dict[str, sympy.Expr] = {}
    for relation in relations:
        equation = sympy.expand((symbol(relation.symbol) - relation.expr).subs(
            {symbol(name): expr for name, expr in derived.items()}))
        if equation == 0:
            continue
        free = [s for s in equation.free_symbols if s.name not in given]
        if not free:
            continue
        chosen = symbol(relation.symbol) if symbol(relation.symbol) in free else \
            max(free, key=lambda s: order.index(s.name) if s.name in order else -1)
        solved = sympy.solve(equation, chosen)
        if len(solved) != 1 or integer_terms(solved[0]) is None:
            continue
        value = sympy.expand(solved[0])
        derived = {name: sympy.expand(expr.subs(chosen, value)) for name, expr in derived.items()}
        derived[chosen.name] = value
    return derived
