"""ResNet-50 and ResNeXt-50 (32x4d) in the torchvision layout (bottleneck v1.5, Conv+BN+Relu)."""

from __future__ import annotations

from collections.abc import Sequence

import onnx

from ._builder import GraphBuilder
from ._layers import add_relu, classifier, conv_bn, conv_bn_relu, max_pool

EXPANSION = 4


def _bottleneck(gb: GraphBuilder, x: str, planes: int, stride: int, groups: int, width_per_group: int) -> str:
    """torchvision Bottleneck: 1x1 -> 3x3 (stride, groups) -> 1x1 expand, plus (projected) identity."""
    width = int(planes * (width_per_group / 64.0)) * groups
    cin = gb.shape(x)[1]
    out = conv_bn_relu(gb, x, width, 1, name="conv1")
    out = conv_bn_relu(gb, out, width, 3, stride, 1, group=groups, name="conv2")
    out = conv_bn(gb, out, planes * EXPANSION, 1, name="conv3")
    identity = x
    if stride != 1 or cin != planes * EXPANSION:
        identity = conv_bn(gb, x, planes * EXPANSION, 1, stride, name="downsample")
    return add_relu(gb, out, identity)


def _resnet(
    name: str,
    *,
    blocks: Sequence[int],
    groups: int,
    width_per_group: int,
    base: int,
    image_size: int,
    num_classes: int,
    seed: int,
) -> onnx.ModelProto:
    gb = GraphBuilder(name, seed)
    x = gb.add_input("input", (1, 3, image_size, image_size))
    x = conv_bn_relu(gb, x, base, 7, 2, 3, name="conv1")
    x = max_pool(gb, x, 3, 2, 1)
    for i, n_blocks in enumerate(blocks):
        planes = base * 2**i
        for j in range(n_blocks):
            stride = 2 if (i > 0 and j == 0) else 1
            with gb.scope(f"layer{i + 1}.{j}"):
                x = _bottleneck(gb, x, planes, stride, groups, width_per_group)
    gb.add_output(classifier(gb, x, num_classes), "logits")
    return gb.to_model(doc=f"{name}: blocks={list(blocks)} groups={groups} width_per_group={width_per_group}")


def resnet50(
    *,
    small: bool = False,
    seed: int = 0,
    image_size: int | None = None,
    num_classes: int = 1000,
) -> onnx.ModelProto:
    """ResNet-50 (input [1,3,224,224] -> logits [1,1000]); ``small`` = 1 block per stage, width/4, 64px."""
    return _resnet(
        "resnet50",
        blocks=(1, 1, 1, 1) if small else (3, 4, 6, 3),
        groups=1,
        width_per_group=64,
        base=16 if small else 64,
        image_size=image_size or (64 if small else 224),
        num_classes=num_classes,
        seed=seed,
    )


def resnext50(
    *,
    small: bool = False,
    seed: int = 0,
    image_size: int | None = None,
    num_classes: int = 1000,
) -> onnx.ModelProto:
    """ResNeXt-50 32x4d (grouped 3x3 convs, group=32); ``small`` = 1 block per stage, width/4, 64px."""
    return _resnet(
        "resnext50",
        blocks=(1, 1, 1, 1) if small else (3, 4, 6, 3),
        groups=32,
        width_per_group=4,
        base=16 if small else 64,
        image_size=image_size or (64 if small else 224),
        num_classes=num_classes,
        seed=seed,
    )
