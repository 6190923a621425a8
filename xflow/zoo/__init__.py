"""Benchmark model zoo: seeded, static-shape ONNX (opset 17, IR 8) builders for the paper's models.

Usage::

    from xflow import zoo
    model = zoo.build("resnet50", small=True, seed=0)
    feeds = zoo.random_inputs(model, seed=0)
"""

from __future__ import annotations

from collections.abc import Callable

import onnx

from ._builder import IR_VERSION, OPSET, GraphBuilder
from ._inputs import random_inputs
from .dynamic import dynamic_twin
from .inception import inception_v3
from .nas import nasnet_a, nasrnn
from .resnet import resnet50, resnext50
from .squeeze import squeezenet
from .transformer import BertConfig, bert

MODELS: dict[str, Callable[..., onnx.ModelProto]] = {
    "resnet50": resnet50,
    "resnext50": resnext50,
    "inception_v3": inception_v3,
    "squeezenet": squeezenet,
    "bert": bert,
    "nasnet_a": nasnet_a,
    "nasrnn": nasrnn,
}


def build(name: str, small: bool = False, seed: int = 0, dynamic: bool = False) -> onnx.ModelProto:
    """Build zoo model ``name`` (full size unless ``small``) with weights drawn from ``seed``; with
    ``dynamic``, its dynamic-batch twin (``dim_param`` batch on every input and output)."""
    try:
        fn = MODELS[name]
    except KeyError:
        raise KeyError(f"unknown zoo model {name!r}; valid names: {', '.join(sorted(MODELS))}") from None
    model = fn(small=small, seed=seed)
    return dynamic_twin(model) if dynamic else model


__all__ = [
    "IR_VERSION",
    "MODELS",
    "OPSET",
    "BertConfig",
    "GraphBuilder",
    "bert",
    "build",
    "dynamic_twin",
    "inception_v3",
    "nasnet_a",
    "nasrnn",
    "random_inputs",
    "resnet50",
    "resnext50",
    "squeezenet",
]
