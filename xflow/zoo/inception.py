"""Inception-v3 in the torchvision layout (Inception A/B/C/D/E blocks, BasicConv2d = Conv+BN+Relu)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import onnx

from ._builder import GraphBuilder
from ._layers import IntPair, avg_pool, classifier, concat, conv_bn_relu, max_pool

BN_EPS = 1e-3

Width = Callable[[int], int]


def _basic(
    gb: GraphBuilder,
    x: str,
    cout: int,
    kernel: IntPair,
    stride: IntPair = 1,
    padding: IntPair = 0,
    *,
    name: str,
) -> str:
    return conv_bn_relu(gb, x, cout, kernel, stride, padding, eps=BN_EPS, name=name)


def _inception_a(gb: GraphBuilder, x: str, pool_features: int, w: Width) -> str:
    b1 = _basic(gb, x, w(64), 1, name="branch1x1")
    b5 = _basic(gb, x, w(48), 1, name="branch5x5_1")
    b5 = _basic(gb, b5, w(64), 5, padding=2, name="branch5x5_2")
    b3 = _basic(gb, x, w(64), 1, name="branch3x3dbl_1")
    b3 = _basic(gb, b3, w(96), 3, padding=1, name="branch3x3dbl_2")
    b3 = _basic(gb, b3, w(96), 3, padding=1, name="branch3x3dbl_3")
    bp = _basic(gb, avg_pool(gb, x, 3, 1, 1), w(pool_features), 1, name="branch_pool")
    return concat(gb, [b1, b5, b3, bp])


def _inception_b(gb: GraphBuilder, x: str, w: Width) -> str:
    b3 = _basic(gb, x, w(384), 3, stride=2, name="branch3x3")
    bd = _basic(gb, x, w(64), 1, name="branch3x3dbl_1")
    bd = _basic(gb, bd, w(96), 3, padding=1, name="branch3x3dbl_2")
    bd = _basic(gb, bd, w(96), 3, stride=2, name="branch3x3dbl_3")
    bp = max_pool(gb, x, 3, 2)
    return concat(gb, [b3, bd, bp])


def _inception_c(gb: GraphBuilder, x: str, c7: int, w: Width) -> str:
    b1 = _basic(gb, x, w(192), 1, name="branch1x1")
    b7 = _basic(gb, x, w(c7), 1, name="branch7x7_1")
    b7 = _basic(gb, b7, w(c7), (1, 7), padding=(0, 3), name="branch7x7_2")
    b7 = _basic(gb, b7, w(192), (7, 1), padding=(3, 0), name="branch7x7_3")
    bd = _basic(gb, x, w(c7), 1, name="branch7x7dbl_1")
    bd = _basic(gb, bd, w(c7), (7, 1), padding=(3, 0), name="branch7x7dbl_2")
    bd = _basic(gb, bd, w(c7), (1, 7), padding=(0, 3), name="branch7x7dbl_3")
    bd = _basic(gb, bd, w(c7), (7, 1), padding=(3, 0), name="branch7x7dbl_4")
    bd = _basic(gb, bd, w(192), (1, 7), padding=(0, 3), name="branch7x7dbl_5")
    bp = _basic(gb, avg_pool(gb, x, 3, 1, 1), w(192), 1, name="branch_pool")
    return concat(gb, [b1, b7, bd, bp])


def _inception_d(gb: GraphBuilder, x: str, w: Width) -> str:
    b3 = _basic(gb, x, w(192), 1, name="branch3x3_1")
    b3 = _basic(gb, b3, w(320), 3, stride=2, name="branch3x3_2")
    b7 = _basic(gb, x, w(192), 1, name="branch7x7x3_1")
    b7 = _basic(gb, b7, w(192), (1, 7), padding=(0, 3), name="branch7x7x3_2")
    b7 = _basic(gb, b7, w(192), (7, 1), padding=(3, 0), name="branch7x7x3_3")
    b7 = _basic(gb, b7, w(192), 3, stride=2, name="branch7x7x3_4")
    bp = max_pool(gb, x, 3, 2)
    return concat(gb, [b3, b7, bp])


def _inception_e(gb: GraphBuilder, x: str, w: Width) -> str:
    b1 = _basic(gb, x, w(320), 1, name="branch1x1")
    b3 = _basic(gb, x, w(384), 1, name="branch3x3_1")
    b3 = concat(
        gb,
        [
            _basic(gb, b3, w(384), (1, 3), padding=(0, 1), name="branch3x3_2a"),
            _basic(gb, b3, w(384), (3, 1), padding=(1, 0), name="branch3x3_2b"),
        ],
    )
    bd = _basic(gb, x, w(448), 1, name="branch3x3dbl_1")
    bd = _basic(gb, bd, w(384), 3, padding=1, name="branch3x3dbl_2")
    bd = concat(
        gb,
        [
            _basic(gb, bd, w(384), (1, 3), padding=(0, 1), name="branch3x3dbl_3a"),
            _basic(gb, bd, w(384), (3, 1), padding=(1, 0), name="branch3x3dbl_3b"),
        ],
    )
    bp = _basic(gb, avg_pool(gb, x, 3, 1, 1), w(192), 1, name="branch_pool")
    return concat(gb, [b1, b3, bd, bp])


def _mixed(gb: GraphBuilder, name: str, fn: Callable[..., str], x: str, *args: object) -> str:
    with gb.scope(name):
        return fn(gb, x, *args)


def inception_v3(
    *,
    small: bool = False,
    seed: int = 0,
    image_size: int | None = None,
    width_mult: float | None = None,
    num_classes: int = 1000,
) -> onnx.ModelProto:
    """Inception-v3 ([1,3,299,299] -> [1,1000]); ``small`` = one block per kind, width/8, 75px input."""
    image_size = image_size or (75 if small else 299)
    mult = width_mult if width_mult is not None else (0.125 if small else 1.0)

    def w(c: int) -> int:
        return max(4, int(round(c * mult)))

    pool_features: Sequence[int] = (32,) if small else (32, 64, 64)
    c7s: Sequence[int] = (128,) if small else (128, 160, 160, 192)
    n_e = 1 if small else 2

    gb = GraphBuilder("inception_v3", seed)
    x = gb.add_input("input", (1, 3, image_size, image_size))
    x = _basic(gb, x, w(32), 3, stride=2, name="Conv2d_1a_3x3")
    x = _basic(gb, x, w(32), 3, name="Conv2d_2a_3x3")
    x = _basic(gb, x, w(64), 3, padding=1, name="Conv2d_2b_3x3")
    x = max_pool(gb, x, 3, 2)
    x = _basic(gb, x, w(80), 1, name="Conv2d_3b_1x1")
    x = _basic(gb, x, w(192), 3, name="Conv2d_4a_3x3")
    x = max_pool(gb, x, 3, 2)
    for i, pf in enumerate(pool_features):
        x = _mixed(gb, f"Mixed_5{'bcd'[i]}", _inception_a, x, pf, w)
    x = _mixed(gb, "Mixed_6a", _inception_b, x, w)
    for i, c7 in enumerate(c7s):
        x = _mixed(gb, f"Mixed_6{'bcde'[i]}", _inception_c, x, c7, w)
    x = _mixed(gb, "Mixed_7a", _inception_d, x, w)
    for i in range(n_e):
        x = _mixed(gb, f"Mixed_7{'bc'[i]}", _inception_e, x, w)
    gb.add_output(classifier(gb, x, num_classes), "logits")
    return gb.to_model(doc=f"inception_v3: image={image_size} width_mult={mult}")
