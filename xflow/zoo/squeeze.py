"""SqueezeNet 1.1 in the torchvision layout (fire modules, Conv with bias + Relu, ceil-mode MaxPool)."""

from __future__ import annotations

import onnx

from ._builder import GraphBuilder
from ._layers import concat, conv, max_pool, relu

# (squeeze, expand1x1, expand3x3) per fire module; None marks a MaxPool(3, 2, ceil_mode=1).
_LAYOUT: tuple[tuple[int, int, int] | None, ...] = (
    (16, 64, 64),
    (16, 64, 64),
    None,
    (32, 128, 128),
    (32, 128, 128),
    None,
    (48, 192, 192),
    (48, 192, 192),
    (64, 256, 256),
    (64, 256, 256),
)


def _conv_relu(gb: GraphBuilder, x: str, cout: int, kernel: int, stride: int = 1, padding: int = 0) -> str:
    return relu(gb, conv(gb, x, cout, kernel, stride, padding, bias=True))


def _fire(gb: GraphBuilder, x: str, squeeze: int, e1: int, e3: int) -> str:
    with gb.scope("squeeze"):
        s = _conv_relu(gb, x, squeeze, 1)
    with gb.scope("expand1x1"):
        a = _conv_relu(gb, s, e1, 1)
    with gb.scope("expand3x3"):
        b = _conv_relu(gb, s, e3, 3, padding=1)
    return concat(gb, [a, b])


def squeezenet(
    *,
    small: bool = False,
    seed: int = 0,
    image_size: int | None = None,
    width_mult: float | None = None,
    num_classes: int = 1000,
) -> onnx.ModelProto:
    """SqueezeNet 1.1 ([1,3,224,224] -> [1,1000]); ``small`` = width/4 and a 64px input."""
    image_size = image_size or (64 if small else 224)
    mult = width_mult if width_mult is not None else (0.25 if small else 1.0)

    def w(c: int) -> int:
        return max(4, int(round(c * mult)))

    gb = GraphBuilder("squeezenet", seed)
    x = gb.add_input("input", (1, 3, image_size, image_size))
    with gb.scope("features.0"):
        x = _conv_relu(gb, x, w(64), 3, stride=2)
    x = max_pool(gb, x, 3, 2, ceil=True)
    fire_idx = 0
    for spec in _LAYOUT:
        if spec is None:
            x = max_pool(gb, x, 3, 2, ceil=True)
            continue
        with gb.scope(f"fire{fire_idx}"):
            x = _fire(gb, x, *(w(c) for c in spec))
        fire_idx += 1
    with gb.scope("classifier"):
        x = _conv_relu(gb, x, num_classes, 1)
    n, c = gb.shape(x)[:2]
    x = gb.node("GlobalAveragePool", [x], (n, c, 1, 1))
    x = gb.node("Flatten", [x], (n, c), axis=1)
    gb.add_output(x, "logits")
    return gb.to_model(doc=f"squeezenet1_1: image={image_size} width_mult={mult}")
