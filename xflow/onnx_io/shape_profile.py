"""Shape profiles: the concrete sizes at which a model with dynamic dims is measured and checked.

A model's dynamic dims are symbols (``xflow.ir.dims``). ``--shape-profile batch=1,8 seq=128`` gives
each symbol the sizes costs are measured and the A/B is timed at; the profile's points are every
combination of them. A symbol left out takes a documented default: ``DEFAULT_BATCH`` when it is the
first dim of an input, else ``DEFAULT_SIZE``. ``--input-shape`` pins the symbols of the inputs it names
to the sizes it gives (for measuring only: the written model keeps its dynamic interface). Equivalence
is also checked at an off-profile point, where every symbol takes a size the profile does not list.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import onnx

from xflow.errors import XflowError
from xflow.ir.dims import Dim, concrete, dims_of, free_symbols, is_static

DEFAULT_BATCH = 1  # a symbol first in an input's dims
DEFAULT_SIZE = 128  # any other symbol (a sequence length, an image side)

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
    timed (``points``: every combination of the sizes), and where equivalence is checked besides."""

    input_dims: Mapping[str, tuple[Dim, ...] | None]
    sizes: Mapping[str, tuple[int, ...]]  # symbol -> profile sizes, in the order given

    @property
    def symbols(self) -> list[str]:
        """The model's dynamic dims by name."""
        return list(self.sizes)

    @property
    def is_dynamic(self) -> bool:
        """True when some input dim is a symbol."""
        return bool(self.sizes)

    def points(self) -> list[dict[str, int]]:
        """Every combination of the profile's sizes (the first is where the search measures costs)."""
        names = list(self.sizes)
        return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*self.sizes.values())]

    def off_profile(self) -> Iterator[dict[str, int]]:
        """Points where every symbol takes a size the profile does not list (candidates, in order: the
        largest size + 1, then twice the largest + 1), so that a rewrite valid only at the profile cannot pass."""
        for step in (lambda s: max(s) + 1, lambda s: 2 * max(s) + 1):
            yield {name: step(sizes) for name, sizes in self.sizes.items()}

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
               input_shapes: Mapping[str, tuple[int, ...]], path: str) -> ShapePlan:
    """The shape plan of ``model`` for a ``--shape-profile`` and ``--input-shape``; XflowError naming ``path``
    when the profile names a symbol the inputs do not have or the two options disagree."""
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
    sizes: dict[str, tuple[int, ...]] = {}
    for name in order:
        if name in pinned:
            sizes[name] = (pinned[name],)
        elif name in profile:
            sizes[name] = profile[name]
        else:
            sizes[name] = (DEFAULT_BATCH if name in first else DEFAULT_SIZE,)
    return ShapePlan(input_dims, sizes)


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
