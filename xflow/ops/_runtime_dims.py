"""Shape inputs computed at run time: a Reshape or Expand target whose dims are expressions over the symbols
that one constant cannot say (``[batch*seq, 768]`` back to ``[batch, seq, 768]``).

Every symbol in the IR is a dim a run can read from a graph input (``xflow.ir.dims.symbol_sources``; load
keeps any node with another symbol opaque, and rules only combine the dims they match), so a dim that is an
integer polynomial in the symbols is computed from ``Shape`` of those inputs with int64 Gather, Mul and Add.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx

from xflow.ir.dims import Dim, integer_terms, is_static
from xflow.ops.base import EncodeContext


def writable(dim: Dim) -> bool:
    """Whether ``runtime_shape`` can compute the dim: an int, or an integer polynomial in the symbols."""
    return is_static(dim) or integer_terms(dim) is not None


def runtime_shape(pieces: Sequence[int | Dim], name: str, ctx: EncodeContext) -> tuple[list[onnx.NodeProto], str]:
    """ONNX nodes computing the 1-D int64 shape ``pieces`` at run time and the name of their result: each int
    (a static dim, or a marker such as Reshape's 0 and -1) as it is, runs of them as one constant, each
    symbolic dim computed from the graph inputs its symbols are read from (Shape, Gather; Sub and Div for an
    input dim ``scale * symbol + offset``; Mul and Add for the polynomial), then one Concat. ValueError when a
    symbol has no graph input to read it from or a dim is not an integer polynomial (``writable``).

    A context with a ``computed_values`` dict (the saver's) shares what it computed for one node with the next
    (the nodes are written in order): each input's Shape is read once per model, each symbol and dim computed
    once, an equal target made once, instead of once per Reshape and Expand."""
    protos: list[onnx.NodeProto] = []
    memo: dict[tuple[str, Any], str] = getattr(ctx, "computed_values", None)
    if not isinstance(memo, dict):
        memo = {}
    key = ("target", tuple(str(p) for p in pieces))
    if key in memo:
        return protos, memo[key]

    def node(op: str, inputs: list[str], **attrs: Any) -> str:
        out = ctx.fresh_name(f"{name}_{op.lower()}")
        protos.append(onnx.helper.make_node(op, inputs, [out], name=ctx.fresh_name(f"{name}_{op}"), **attrs))
        return out

    def const(values: Sequence[int]) -> str:
        if ("const", tuple(values)) not in memo:
            memo["const", tuple(values)] = ctx.add_constant(np.array(values, dtype=np.int64), f"{name}_dims")
        return memo["const", tuple(values)]

    def read(symbol: str) -> str:
        if ("symbol", symbol) not in memo:
            source = ctx.symbol_source(symbol)
            if source is None:
                raise ValueError(f"{name}: no graph input has the dim {symbol}")
            if ("shape", source.input) not in memo:
                memo["shape", source.input] = node("Shape", [source.input])
            value = node("Gather", [memo["shape", source.input], const([source.axis])], axis=0)
            if source.offset:
                value = node("Sub", [value, const([source.offset])])
            if source.scale != 1:
                value = node("Div", [value, const([source.scale])])
            memo["symbol", symbol] = value
        return memo["symbol", symbol]

    def compute(dim: Dim) -> str:
        if ("dim", str(dim)) not in memo:
            memo["dim", str(dim)] = _compute(dim)
        return memo["dim", str(dim)]

    def _compute(dim: Dim) -> str:
        terms = integer_terms(dim)
        if terms is None:
            raise ValueError(f"{name}: dim {dim} is not an integer polynomial in the symbols")
        total: str | None = None
        for coeff, powers in terms:
            value: str | None = None
            for symbol, power in powers:
                for _ in range(power):
                    value = read(symbol) if value is None else node("Mul", [value, read(symbol)])
            if value is None:
                value = const([coeff])
            elif coeff != 1:
                value = node("Mul", [value, const([coeff])])
            total = value if total is None else node("Add", [total, value])
        if total is None:
            raise ValueError(f"{name}: dim {dim} has no terms")
        return total

    inputs: list[str] = []
    run: list[int] = []
    for piece in pieces:
        if is_static(piece):
            run.append(int(piece))
            continue
        if run:
            inputs.append(const(run))
            run = []
        inputs.append(compute(piece))
    if run:
        inputs.append(const(run))
    if len(inputs) == 1 and not protos:  # a constant, or a dim computed for an earlier node
        return protos, inputs[0]
    memo[key] = node("Concat", inputs, axis=0)
    return protos, memo[key]
