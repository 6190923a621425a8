"""Shape profiles: the concrete sizes at which a model with dynamic dims is measured and checked.

A model's dynamic dims are symbols (``xflow.ir.dims``). ``--shape-profile batch=1,8 seq=128`` gives
each symbol the sizes costs are measured and the A/B is timed at; the profile's points are every
combination of them. A symbol left out takes a documented default: ``DEFAULT_BATCH`` when it is the
first dim of an input, else ``DEFAULT_SIZE``. ``--input-shape`` pins the symbols of the inputs it names
to the sizes it gives (for measuring only: the written model keeps its dynamic interface). Equivalence
is also checked at an off-profile point, where every symbol takes a size the profile does not list.

Dims the graph relates (``dim_relations``: a KV cache's ``total_seq = past_seq + seq``) are not sized
alone: each relation derives one symbol from the others, so every point respects it, and a model with a
cache is measured at a decode step (``DECODE_NEW`` token over a cache of ``DEFAULT_SIZE - 1``) and a prefill
(``PREFILL_NEW`` tokens, no cache) unless the options size its cache. Sizes the user gives that break a
relation are kept (the runtime may not need it), and ``ShapePlan.broken_relation`` names it where ONNX
Runtime cannot run them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import onnx
import sympy

from xflow.errors import XflowError
from xflow.ir.dims import Dim, concrete, dims_of, free_symbols, is_static
from xflow.onnx_io.dim_relations import DimRelations, solve_sizes
from xflow.onnx_io.load import model_relations

DEFAULT_BATCH = 1  # a symbol first in an input's dims
DEFAULT_SIZE = 128  # any other symbol (a sequence length, an image side)
DECODE_NEW = 1  # new tokens at a KV-cache model's decode step (over a cache of DEFAULT_SIZE - 1)
PREFILL_NEW = DEFAULT_SIZE  # new tokens at its prefill (over an empty cache)

InputShapes = dict[str, tuple[int, ...]]


def parse_shape_profile(specs: list[str] | tuple[str, ...]) -> dict[str, tuple[int, ...]]:
    """Parse ``NAME=V1,V2,...`` options (positive sizes) into symbol -> sizes."""
    profile: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        for item in spec.split():
            name, sep, values = item.rpartition("=")
            try:
                sizes = tuple(int(v) for v in values.split(","))
                if not sep or not name or any(v <= 0 for v in sizes):
                    raise ValueError
            except ValueError:
                raise XflowError(None, f"--shape-profile {item!r}: expected NAME=V1,V2,... with positive ints "
                                       "(NAME a dim_param of an input)") from None
            profile[name] = tuple(dict.fromkeys(sizes))
    return profile


@dataclass(frozen=True)
class ShapePlan:
    """The model's input dims (symbolic) and the sizes of each symbol: where costs are measured and the A/B
    timed (``points``), and where equivalence is checked besides.

    A symbol is sized one of three ways: alone (``sizes``: every combination of them is taken), jointly with
    others (``steps``: a KV cache's decode step and prefill size its ``past`` and ``new`` symbols together), or
    derived from the others by a relation the graph states (``derived``: ``total_seq = past_seq + seq``)."""

    input_dims: Mapping[str, tuple[Dim, ...] | None]
    sizes: Mapping[str, tuple[int, ...]]  # symbol -> profile sizes, in the order given
    steps: tuple[Mapping[str, int], ...] = ()  # joint sizes of the cache symbols, one point each
    derived: Mapping[str, sympy.Expr] = field(default_factory=dict)  # symbol -> expression over the others
    relations: DimRelations = field(default_factory=DimRelations)
    order: tuple[str, ...] = ()  # every symbol, in the inputs' order
    zero_ok: frozenset[str] = frozenset()  # symbols that may be 0 (a cache's length: a prefill has none)

    @property
    def symbols(self) -> list[str]:
        """The model's dynamic dims by name."""
        return list(self.order or self.sizes)

    @property
    def is_dynamic(self) -> bool:
        """True when some input dim is a symbol."""
        return bool(self.symbols)

    def points(self) -> list[dict[str, int]]:
        """Every combination of the profile's sizes, each with every step and the derived symbols (the first
        is a decode step where the model has a cache); combinations that would make a derived dim negative
        (or 0 where it cannot be) are left out."""
        names = list(self.sizes)
        found = []
        for combo in itertools.product(*self.sizes.values()):
            for step in self.steps or ({},):
                point = self._complete({**dict(zip(names, combo, strict=True)), **step})
                if point is not None:
                    found.append(point)
        return found

    def off_profile(self) -> Iterator[dict[str, int]]:
        """Points where every symbol sized alone or in a step takes a size the profile does not list (candidates,
        in order: the largest size + 1, twice the largest + 1, then the least size above 0 not listed, which
        stays within what a model with position tables can take; the derived ones follow), so that a rewrite
        valid only at the profile cannot pass."""
        stepped = {name: tuple(step[name] for step in self.steps) for name in (self.steps[0] if self.steps else {})}
        for grow in (lambda s: max(s) + 1, lambda s: 2 * max(s) + 1,
                     lambda s: next(n for n in itertools.count(1) if n not in s)):
            point = self._complete({name: grow(sizes) for name, sizes in {**self.sizes, **stepped}.items()})
            if point is not None:
                yield point

    def _complete(self, point: Mapping[str, int]) -> dict[str, int] | None:
        """The point with its derived symbols, in the inputs' order; None where one comes out below its least."""
        full = dict(point)
        for name, expr in self.derived.items():
            full[name] = int(expr.subs({s: full[s.name] for s in expr.free_symbols}))
            if full[name] < (0 if name in self.zero_ok else 1):
                return None
        return {name: full[name] for name in (self.order or full)}

    def broken_relation(self, point: Mapping[str, int]) -> str | None:
        """The first relation the graph states that ``point`` breaks, in words, or None."""
        broken = self.relations.broken_at(point)
        return broken[0].describe(point) if broken else None

    def shapes_at(self, point: Mapping[str, int]) -> InputShapes:
        """The input shapes at a point (dynamic inputs only)."""
        shapes: InputShapes = {}
        for name, dims in self.input_dims.items():
            if dims is not None and not all(is_static(d) for d in dims):
                shapes[name] = tuple(concrete(d, point) for d in dims)
        return shapes

    def describe(self, point: Mapping[str, int]) -> str:
        """A point in words (``batch=1 seq=128``)."""
        return " ".join(f"{k}={v}" for k, v in point.items())


def shape_plan(model: onnx.ModelProto, profile: Mapping[str, tuple[int, ...]],
               input_shapes: Mapping[str, tuple[int, ...]], path: str,
               relations: DimRelations | None = None) -> ShapePlan:
    """The shape plan of ``model`` for a ``--shape-profile`` and ``--input-shape``; XflowError naming ``path``
    when the profile names a symbol the inputs do not have or the two options disagree. The symbols the graph
    relates (``dim_relations``; ``relations`` when already found) are derived from the others, and a model with
    a KV cache gets a decode step and a prefill as its points unless the options size the cache."""
    initializers = {t.name for t in model.graph.initializer}
    input_dims = {vi.name: dims_of(vi) for vi in model.graph.input if vi.name not in initializers}
    first: set[str] = set()
    order: list[str] = []
    for dims in input_dims.values():
        if dims:
            first.update(free_symbols(dims[:1]))
            order += [s for s in free_symbols(dims) if s not in order]
    unknown = [name for name in profile if name not in order]
    if unknown:
        known = ", ".join(order) if order else "none: every input dim is fixed"
        raise XflowError(path, f"--shape-profile names {unknown[0]!r}, which is not a dynamic dim of the inputs "
                               f"(dynamic dims: {known})")
    pinned = _pinned_by_input_shapes(input_dims, input_shapes)
    for name, value in pinned.items():
        if name in profile and profile[name] != (value,):
            raise XflowError(path, f"--shape-profile {name}={','.join(map(str, profile[name]))} disagrees with "
                                   f"--input-shape, which sets {name}={value}")
    if relations is None:
        relations = model_relations(model) if len(order) > 1 else DimRelations()
    given = set(pinned) | set(profile)
    derived = solve_sizes(relations.relations, given, order)
    steps = _cache_steps(relations, given | set(derived))
    stepped = set(steps[0]) if steps else set()
    sizes: dict[str, tuple[int, ...]] = {}
    for name in order:
        if name in derived or name in stepped:
            continue
        if name in pinned:
            sizes[name] = (pinned[name],)
        elif name in profile:
            sizes[name] = profile[name]
        else:
            sizes[name] = (DEFAULT_BATCH if name in first else DEFAULT_SIZE,)
    plan = ShapePlan(input_dims, sizes, steps, derived, relations, tuple(order),
                     frozenset(c.past for c in relations.caches))
    if order and not plan.points():
        raise XflowError(path, f"the sizes given leave no size for {', '.join(derived)} by "
                               f"{'; '.join(str(r) for r in relations.relations)}")
    return plan


def _cache_steps(relations: DimRelations, fixed: set[str]) -> tuple[dict[str, int], ...]:
    """A decode step (one new token over a cache of ``DEFAULT_SIZE - 1``) and a prefill (``DEFAULT_SIZE`` new
    tokens, no cache) over the cache symbols not ``fixed`` (given or derived); () for a model without a cache."""
    steps: list[dict[str, int]] = []
    for new, past in ((DECODE_NEW, DEFAULT_SIZE - DECODE_NEW), (PREFILL_NEW, 0)):
        step: dict[str, int] = {}
        for cache in relations.caches:
            step.setdefault(cache.new, new)
            step.setdefault(cache.past, past)
        step = {name: value for name, value in step.items() if name not in fixed}
        if step and step not in steps:
            steps.append(step)
    return tuple(steps)


def _pinned_by_input_shapes(input_dims: Mapping[str, tuple[Dim, ...] | None],
                            input_shapes: Mapping[str, tuple[int, ...]]) -> dict[str, int]:
    """Symbol -> size where ``--input-shape`` gives a plain symbol's dim (its other checks are the loader's)."""
    pinned: dict[str, int] = {}
    for name, shape in input_shapes.items():
        dims = input_dims.get(name)
        if not dims or len(dims) != len(shape):
            continue
        for d, value in zip(dims, shape, strict=True):
            if not is_static(d) and len(free_symbols([d])) == 1 and getattr(d, "is_Symbol", False):
                pinned.setdefault(d.name, value)
    return pinned
