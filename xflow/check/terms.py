"""Two small subgraphs compared as terms: does each output compute the same expression of the same input elements?

Every element of every input is a distinct leaf (an int); each op builds, per output element, the term that
defines it: split and concat move elements, an elementwise op applies itself to the elements at one index (numpy's
broadcasting), a per-channel op (batchnorm) to an element and its channel's parameters, and a matmul's element is the
dot of its row of the left operand and its column of the right. Equal terms are equal values for every value of the
inputs: this decides the split simplifications (``xflow.rewrite.simplify``) exactly, with no proof search, at the
subgraph's shapes. A dim that is a symbol is taken at two sizes; it may not be an axis a split or concat cuts or a
matmul contracts (the ops act alike along every other axis, so two sizes stand for all). Any other op is refused."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import sympy

from xflow.ir import Node, TensorType
from xflow.ops import OPS

#: The sizes a symbolic dim is taken at.
SYMBOL_SIZES = (1, 2)
#: Elements an input of the subgraph may hold (its terms are Python objects); a larger one is refused, not guessed.
MAX_ELEMENTS = 10_000_000


class NotDecided(Exception):
    """The terms cannot be compared (an op or an axis outside what this module evaluates), or they differ."""


def same_terms(before: Sequence[Node], after: Sequence[Node], outputs: Sequence[str],
               types: Callable[[str], TensorType]) -> None:
    """NotDecided unless ``after`` computes each of ``outputs`` as the same term as ``before`` does, at every size
    of the symbolic dims (``types``: each value's type, inputs' and the nodes' outputs')."""
    names = {v for n in (*before, *after) for v in (*n.inputs, *n.outputs) if v}
    symbolic = any(not isinstance(d, int) for v in names for d in (types(v).shape or ()))
    for size in SYMBOL_SIZES if symbolic else SYMBOL_SIZES[:1]:  # static shapes: one evaluation says it all
        leaves: dict[str, np.ndarray] = {}
        numbers = [0]  # the next leaf's number, shared by both sides' inputs
        one = _evaluate(before, leaves, numbers, types, size)
        other = _evaluate(after, leaves, numbers, types, size)
        for name in outputs:
            a, b = one.get(name), other.get(name)
            if a is None or b is None:
                raise NotDecided(f"{name} is not computed by both sides")
            if a.shape != b.shape or a.tolist() != b.tolist():  # nested lists of terms, compared in C
                raise NotDecided(f"{name} is not the same expression of the inputs on both sides")


def _evaluate(nodes: Sequence[Node], leaves: dict[str, np.ndarray], numbers: list[int],
              types: Callable[[str], TensorType], size: int) -> dict[str, np.ndarray]:
    made: dict[str, np.ndarray] = {}
    produced = {o for n in nodes for o in n.outputs}

    def value(name: str) -> np.ndarray:
        if name in made:
            return made[name]
        if name in produced:
            raise NotDecided(f"{name} is read before it is computed")
        if name not in leaves:
            shape = _concrete(types(name).shape, size)
            if int(np.prod(shape)) > MAX_ELEMENTS:
                raise NotDecided(f"{name} is too large to compare element by element")
            size_of = int(np.prod(shape))
            start = numbers[0]
            numbers[0] += size_of
            leaves[name] = np.arange(start, start + size_of, dtype=np.int64).astype(object).reshape(shape)
        return leaves[name]

    for node in nodes:
        if node.is_opaque:
            raise NotDecided(f"{node.op} is outside the op table")
        outs = _apply(node, [value(i) for i in node.inputs], types)
        made.update(zip(node.outputs, outs, strict=True))
    return made


def _concrete(shape: Sequence[Any] | None, size: int) -> tuple[int, ...]:
    if shape is None:
        raise NotDecided("a value of unknown rank")
    out = []
    for dim in shape:
        if isinstance(dim, int):
            out.append(dim)
        else:
            expr = sympy.sympify(dim)
            out.append(int(expr.subs({s: size for s in expr.free_symbols})))
    return tuple(out)


def _apply(node: Node, args: list[np.ndarray], types: Callable[[str], TensorType]) -> list[np.ndarray]:
    op, attrs = node.op, node.attrs
    spec = OPS[op]
    key = (op, repr(sorted(attrs.items())))
    if spec.terms is not None:  # the op table says how its elements move or combine (split, concat, matmul)
        try:
            return spec.terms(args, attrs, [types(name).shape for name in node.inputs], key)
        except ValueError as exc:
            raise NotDecided(str(exc)) from None
    if spec.num_outputs(attrs) != 1:
        raise NotDecided(f"{op} has several outputs")
    if spec.elementwise:
        return [_elementwise(lambda *a: (key, *a), len(args))(*args)]
    if spec.channel_params and set(spec.channel_params) == set(range(1, len(args))):
        x = args[0]
        if x.ndim < 2:
            raise NotDecided(f"{op} of rank {x.ndim}")
        params = []
        for p in args[1:]:
            if p.shape != (x.shape[1],):
                raise NotDecided(f"{op}'s parameters are not one per channel")
            params.append(p.reshape((1, -1) + (1,) * (x.ndim - 2)))
        return [_elementwise(lambda *a: (key, *a), len(args))(x, *params)]
    raise NotDecided(f"{op} is not an op this check evaluates (one with term rules in the op table, elementwise, "
                     "per-channel)")


def _elementwise(f: Callable[..., Any], arity: int) -> Callable[..., np.ndarray]:
    ufunc = np.frompyfunc(f, arity, 1)

    def apply(*arrays: np.ndarray) -> np.ndarray:
        return np.asarray(ufunc(*arrays), dtype=object)
    return apply


__all__ = ["MAX_ELEMENTS", "NotDecided", "SYMBOL_SIZES", "same_terms"]
