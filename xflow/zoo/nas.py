"""NAS-derived benchmark models: NASNet-A (mobile) CNN and the unrolled NasRNN cell.

NasRNN: each step computes eight gates ``x @ Wx_i + h @ Wh_i`` (16 MatMuls, 8 sharing ``x`` and 8
sharing ``h``) and combines them with Relu/Sigmoid/Tanh, Add and Mul as in the TASO ``nasrnn`` benchmark.
"""

from __future__ import annotations

import math

import onnx

from ._builder import GraphBuilder
from ._layers import avg_pool, batch_norm, classifier, concat, conv, max_pool, relu

BN_EPS = 1e-3
N_GATES = 8


def _bn(gb: GraphBuilder, x: str) -> str:
    return batch_norm(gb, x, eps=BN_EPS)


def _separable(gb: GraphBuilder, x: str, cout: int, kernel: int, stride: int) -> str:
    """Depthwise kxk conv (group=C) then pointwise 1x1 conv."""
    c = gb.shape(x)[1]
    dw = conv(gb, x, c, kernel, stride, kernel // 2, group=c, name="depthwise")
    return conv(gb, dw, cout, 1, name="pointwise")


def _branch_sep(gb: GraphBuilder, x: str, cout: int, kernel: int, stride: int, name: str) -> str:
    """Relu, separable(stride), BN, Relu, separable, BN."""
    with gb.scope(name):
        with gb.scope("sep1"):
            y = _bn(gb, _separable(gb, relu(gb, x), gb.shape(x)[1], kernel, stride))
        with gb.scope("sep2"):
            return _bn(gb, _separable(gb, relu(gb, y), cout, kernel, 1))


def _factorized_reduction(gb: GraphBuilder, x: str, filters: int) -> str:
    """Halve the spatial size with two offset stride-2 1x1 paths concatenated (NASNet 'path' trick)."""
    x = relu(gb, x)
    n, c, h, w = gb.shape(x)
    with gb.scope("path1"):
        p1 = conv(gb, avg_pool(gb, x, 1, 2), filters // 2, 1)
    with gb.scope("path2"):
        pads = gb.const([0, 0, 0, 0, 0, 0, 1, 1], "int64")
        padded = gb.node("Pad", [x, pads], (n, c, h + 1, w + 1), mode="constant")
        starts, ends, axes = (
            gb.const([1, 1], "int64"),
            gb.const([h + 1, w + 1], "int64"),
            gb.const([2, 3], "int64"),
        )
        shifted = gb.node("Slice", [padded, starts, ends, axes], (n, c, h, w))
        p2 = conv(gb, avg_pool(gb, shifted, 1, 2), filters - filters // 2, 1)
    return _bn(gb, concat(gb, [p1, p2]))


def _fit(gb: GraphBuilder, x: str, size: int, filters: int, name: str) -> str:
    """Project ``x`` to ``filters`` channels at spatial ``size`` (Relu-Conv1x1-BN or factorized reduction)."""
    h = gb.shape(x)[2]
    with gb.scope(name):
        if h == size:
            return _bn(gb, conv(gb, relu(gb, x), filters, 1))
        if (h + 1) // 2 != size:
            raise ValueError(f"cannot fit spatial size {h} to {size}")
        return _factorized_reduction(gb, x, filters)


def _normal_cell(gb: GraphBuilder, cur: str, prev: str, filters: int) -> str:
    """NASNet-A normal cell; output has 6 * filters channels at the input resolution."""
    size = gb.shape(cur)[2]
    right = _fit(gb, cur, size, filters, "conv_1x1")
    left = _fit(gb, prev, size, filters, "conv_prev_1x1")
    c0 = gb.add(
        _branch_sep(gb, right, filters, 5, 1, "comb0_left"),
        _branch_sep(gb, left, filters, 3, 1, "comb0_right"),
    )
    c1 = gb.add(
        _branch_sep(gb, left, filters, 5, 1, "comb1_left"),
        _branch_sep(gb, left, filters, 3, 1, "comb1_right"),
    )
    c2 = gb.add(avg_pool(gb, right, 3, 1, 1), left)
    c3 = gb.add(avg_pool(gb, left, 3, 1, 1), avg_pool(gb, left, 3, 1, 1))
    c4 = gb.add(_branch_sep(gb, right, filters, 3, 1, "comb4_left"), right)
    return concat(gb, [left, c0, c1, c2, c3, c4])


def _reduction_cell(gb: GraphBuilder, cur: str, prev: str, filters: int) -> str:
    """NASNet-A reduction cell; output has 4 * filters channels at half the input resolution."""
    size = gb.shape(cur)[2]
    right = _fit(gb, cur, size, filters, "conv_1x1")
    left = _fit(gb, prev, size, filters, "conv_prev_1x1")
    c0 = gb.add(
        _branch_sep(gb, right, filters, 5, 2, "comb0_left"),
        _branch_sep(gb, left, filters, 7, 2, "comb0_right"),
    )
    c1 = gb.add(max_pool(gb, right, 3, 2, 1), _branch_sep(gb, left, filters, 7, 2, "comb1_right"))
    c2 = gb.add(avg_pool(gb, right, 3, 2, 1), _branch_sep(gb, left, filters, 5, 2, "comb2_right"))
    c3 = gb.add(avg_pool(gb, c0, 3, 1, 1), c1)
    c4 = gb.add(_branch_sep(gb, c0, filters, 3, 1, "comb4_left"), max_pool(gb, right, 3, 2, 1))
    return concat(gb, [c1, c2, c3, c4])


def nasnet_a(
    *,
    small: bool = False,
    seed: int = 0,
    image_size: int | None = None,
    cells_per_stack: int | None = None,
    num_stacks: int | None = None,
    stem_cells: int | None = None,
    filters: int | None = None,
    stem_filters: int | None = None,
    num_classes: int = 1000,
) -> onnx.ModelProto:
    """NASNet-A mobile 4@1056 ([1,3,224,224] -> [1,1000]); ``small`` = 1 stem cell + 1 normal cell, 32px."""
    image_size = image_size or (32 if small else 224)
    n_cells = cells_per_stack if cells_per_stack is not None else (1 if small else 4)
    n_stacks = num_stacks if num_stacks is not None else (1 if small else 3)
    n_stem = stem_cells if stem_cells is not None else (1 if small else 2)
    f = filters or (8 if small else 44)
    stem_f = stem_filters or (8 if small else 32)

    gb = GraphBuilder("nasnet_a", seed)
    x = gb.add_input("input", (1, 3, image_size, image_size))
    with gb.scope("conv0"):
        cur = _bn(gb, conv(gb, x, stem_f, 3, 2))
    prev = cur
    for i in range(n_stem):
        with gb.scope(f"cell_stem_{i}"):
            prev, cur = cur, _reduction_cell(gb, cur, prev, f // 2 ** (n_stem - i))
    idx = 0
    for s in range(n_stacks):
        if s > 0:
            with gb.scope(f"reduction_cell_{s - 1}"):
                prev, cur = cur, _reduction_cell(gb, cur, prev, f * 2**s)
        for _ in range(n_cells):
            with gb.scope(f"cell_{idx}"):
                prev, cur = cur, _normal_cell(gb, cur, prev, f * 2**s)
            idx += 1
    gb.add_output(classifier(gb, relu(gb, cur), num_classes, name="last_linear"), "logits")
    return gb.to_model(
        doc=f"nasnet_a: image={image_size} N={n_cells} stacks={n_stacks} stem_cells={n_stem} filters={f}"
    )


# ---------------------------------------------------------------- NasRNN


def _weights(gb: GraphBuilder, input_size: int, hidden: int) -> list[tuple[str, str]]:
    """Eight (Wx, Wh) weight pairs, scaled so every gate pre-activation has unit-ish variance."""
    std_x = 1.0 / math.sqrt(input_size)
    std_h = 1.0 / math.sqrt(hidden)
    return [
        (gb.normal(f"w_x{i}", (input_size, hidden), std_x), gb.normal(f"w_h{i}", (hidden, hidden), std_h))
        for i in range(N_GATES)
    ]


def _cell(gb: GraphBuilder, x: str, h: str, weights: list[tuple[str, str]]) -> str:
    """One NasRNN step: returns the new hidden state."""
    t = [gb.add(gb.matmul(x, wx), gb.matmul(h, wh)) for wx, wh in weights]

    def act(op: str, v: str) -> str:
        return gb.unary(op, v)

    m0 = gb.add(act("Relu", t[0]), act("Sigmoid", t[3]))
    m1 = gb.add(act("Sigmoid", t[1]), act("Tanh", t[2]))
    m2 = gb.mul(act("Sigmoid", t[4]), act("Tanh", t[5]))
    m3 = gb.mul(act("Sigmoid", t[6]), act("Relu", t[7]))
    m4 = gb.mul(act("Sigmoid", m1), act("Tanh", m2))
    m5 = gb.mul(act("Tanh", m0), act("Tanh", m3))
    m6 = gb.mul(act("Tanh", m4), act("Tanh", m5))
    return act("Tanh", m6)


def nasrnn(
    *,
    small: bool = False,
    seed: int = 0,
    hidden: int | None = None,
    steps: int | None = None,
    tie_weights: bool = True,
) -> onnx.ModelProto:
    """NasRNN unrolled 8 steps, hidden 512 (inputs x_0..x_7 and h_0 [1,512] -> h_final [1,512])."""
    hidden = hidden or (64 if small else 512)
    steps = steps or (3 if small else 8)
    gb = GraphBuilder("nasrnn", seed)
    xs = [gb.add_input(f"x_{t}", (1, hidden)) for t in range(steps)]
    h = gb.add_input("h_0", (1, hidden))
    with gb.scope("cell"):
        weights = _weights(gb, hidden, hidden)
    for t, x in enumerate(xs):
        with gb.scope(f"step{t}"):
            if not tie_weights and t > 0:
                weights = _weights(gb, hidden, hidden)
            h = _cell(gb, x, h, weights)
    gb.add_output(h, "h_final")
    return gb.to_model(doc=f"nasrnn: hidden={hidden} steps={steps} tie_weights={tie_weights}")
