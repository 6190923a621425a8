"""The op table against ONNX Runtime: kernels, shape rules, ONNX codecs and integer fingerprint variants."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from xflow.ir import Attrs, Node, Shape, TensorType
from xflow.onnx_io.save import import_node_domains
from xflow.ops import DECODERS, OPS, ShapeError, decoder_for, domain_key

OPSET = 17
FLOAT, DOUBLE, INT64, BOOL = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT64, TensorProto.BOOL


class EncodeCtx:
    """An EncodeContext that collects constants as initializers."""

    def __init__(self, opset: int = OPSET) -> None:
        self.opset = opset
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0

    def fresh_name(self, hint: str) -> str:
        self._count += 1
        return f"{hint}__{self._count}"

    def add_constant(self, array: np.ndarray, hint: str) -> str:
        name = self.fresh_name(hint)
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def constants(self) -> dict[str, np.ndarray]:
        return {t.name: numpy_helper.to_array(t) for t in self.initializers}


class TypedEncodeCtx(EncodeCtx):
    """An EncodeContext that can also tell value types (lets encoders write static details)."""

    def __init__(self, types: dict[str, TensorType], opset: int = OPSET) -> None:
        super().__init__(opset)
        self.types = types

    def type_of(self, name: str) -> TensorType | None:
        return self.types.get(name)


class DecodeCtx:
    """A DecodeContext over known value types and constants."""

    def __init__(self, types: dict[str, TensorType], constants: dict[str, np.ndarray] | None = None,
                 opset: int = OPSET) -> None:
        self.opset = opset
        self.types = dict(types)
        self.constants = dict(constants or {})
        self._count = 0

    def type_of(self, name: str) -> TensorType | None:
        return self.types.get(name)

    def constant_value(self, name: str) -> np.ndarray | None:
        return self.constants.get(name)

    def constant_array(self, name: str) -> np.ndarray | None:
        return self.constants.get(name)

    def fresh_name(self, hint: str) -> str:
        self._count += 1
        return f"{hint}__d{self._count}"

    def add_constant(self, array: np.ndarray, hint: str) -> str:
        name = self.fresh_name(hint)
        self.constants[name] = array
        return name


def case(op: str, *shapes: Shape, **attrs: Any):
    """One configuration: an op, its input shapes and attributes."""
    label = f"{op}-{'_'.join('x'.join(map(str, s)) or 's' for s in shapes)}-" + \
        "-".join(f"{k}={v}" for k, v in sorted(attrs.items()))
    return pytest.param(op, shapes, attrs, id=label.rstrip("-").replace(" ", ""))


UNARY_SHAPES = [(5,), (2, 3, 4), (2, 3, 4, 5)]
BINARY_SHAPES = [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (4,)), ((1, 3, 1), (2, 1, 5))]

CASES = [
    *(case(op, *shapes) for op in ("add", "mul", "sub", "sum") for shapes in BINARY_SHAPES),
    case("smul", (2, 3), ()), case("smul", (4, 5, 6), (1,)), case("smul", (7,), ()), case("smul", (), ()),
    *(case(op, shape) for op in ("relu", "sigmoid", "tanh", "identity") for shape in UNARY_SHAPES),
    case("matmul", (3, 4), (4, 5)), case("matmul", (2, 3, 4), (4, 5)),
    case("matmul", (2, 1, 3, 4), (3, 4, 6)),
    case("transpose", (3, 4), perm=(1, 0)), case("transpose", (2, 3, 4), perm=(0, 2, 1)),
    case("transpose", (2, 3, 4, 5), perm=(3, 1, 0, 2)), case("transpose", (), perm=()),
    case("concat", (2, 3), (4, 3), (1, 3), axis=0), case("concat", (2, 3, 4), (2, 1, 4), axis=1),
    case("concat", (2, 3, 1), (2, 3, 2), (2, 3, 3), axis=2),
    case("split", (7, 4), axis=0, split=(3, 4)), case("split", (2, 5), axis=1, split=(1, 3, 1)),
    case("split", (2, 3, 4), axis=2, split=(3, 1)),
    case("reshape", (2, 3, 4), shape=(6, 4)), case("reshape", (2, 3, 4), shape=(24,)),
    case("reshape", (6,), shape=(1, 2, 3)),
    case("conv", (2, 4, 7, 7), (6, 4, 3, 3), (6,)),
    case("conv", (1, 4, 8, 9), (6, 2, 3, 2), group=2, strides=(2, 1), pads=(1, 0, 1, 1), act="relu"),
    case("conv", (2, 3, 6, 6), (3, 1, 3, 3), (3,), group=3, strides=(2, 2), pads=(1, 1, 1, 1)),
    case("conv", (1, 2, 5, 5), (4, 2, 1, 1), strides=(2, 2), act="relu"),
    case("conv", (1, 3, 5, 6), (2, 3, 2, 3), (2,), pads=(0, 2, 1, 0), act="relu"),
    case("enlarge", (4, 3, 1, 1), size=(3, 3)), case("enlarge", (2, 2, 3, 3), size=(5, 7)),
    case("enlarge", (1, 1, 3, 1), size=(3, 3)),
    case("maxpool", (2, 3, 7, 7), kernel=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1)),
    case("maxpool", (1, 2, 6, 5), kernel=(2, 2), strides=(2, 2)),
    case("maxpool", (1, 1, 5, 6), kernel=(3, 2), strides=(1, 2), pads=(0, 1, 2, 0)),
    case("avgpool", (2, 3, 7, 7), kernel=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1), count_include_pad=1),
    case("avgpool", (1, 2, 6, 5), kernel=(2, 2), strides=(2, 2)),
    case("avgpool", (1, 1, 5, 6), kernel=(3, 2), strides=(1, 2), pads=(0, 1, 2, 0), count_include_pad=0),
    case("avgpool", (1, 2, 5, 5), kernel=(3, 3), pads=(1, 1, 1, 1)),
    case("batchnorm", (2, 3, 4, 5), (3,), (3,), (3,), (3,)),
    case("batchnorm", (4, 6), (6,), (6,), (6,), (6,), epsilon=1e-3),
    case("batchnorm", (1, 2, 3, 2, 2), (2,), (2,), (2,), (2,), epsilon=0.5),
    case("const_pool", shape=(3, 1, 3, 3)), case("const_pool", shape=(2, 1, 2, 4), dtype=DOUBLE),
    case("const_pool", shape=(1, 1, 1, 1)),
    case("const_iconv", shape=(3, 3, 3, 3)), case("const_iconv", shape=(2, 2, 1, 1)),
    case("const_iconv", shape=(4, 4, 3, 5), dtype=DOUBLE),
    case("const_imatmul", shape=(4, 4)), case("const_imatmul", shape=(1, 1)),
    case("const_imatmul", shape=(5, 5), dtype=DOUBLE),
    case("const_ones", shape=(2, 3)), case("const_ones", shape=()),
    case("const_ones", shape=(1, 2, 3), dtype=INT64),
    # -- the algebra of today's models (issue 20)
    *(case(op, *shapes) for op in ("div",) for shapes in BINARY_SHAPES),
    *(case(op, shape) for op in ("neg", "reciprocal", "sqrt", "exp", "erf", "hardswish") for shape in UNARY_SHAPES),
    case("pow", (2, 3), exponent=2.0), case("pow", (2, 3, 4), exponent=3.0), case("pow", (5,), exponent=0.5),
    case("softmax", (2, 3, 4), axis=2), case("softmax", (2, 3, 4), axis=0), case("softmax", (7,), axis=0),
    case("layernorm", (2, 3, 4), (4,), (4,), axis=2), case("layernorm", (2, 3, 4), (3, 4), axis=1, epsilon=1e-3),
    case("layernorm", (3, 5), (5,), axis=1),
    *(case(op, (2, 3, 4), axes=axes, keepdims=k) for op in ("reducemean", "reducesum", "reducemax")
      for axes, k in (((2,), 1), ((0, 2), 0), ((0, 1, 2), 1))),
    case("where", (2, 3, 4), (2, 3, 4), (2, 3, 4)), case("where", (1, 3, 1), (2, 3, 4), (4,)),
    case("where", (3,), (2, 3), ()),
    *(case(op, *shapes) for op in ("equal", "less", "greater", "less_equal", "greater_equal")
      for shapes in BINARY_SHAPES),
    case("cast", (2, 3), to=DOUBLE), case("cast", (4,), to=TensorProto.FLOAT16), case("cast", (2, 2), to=BOOL),
    case("squeeze", (2, 1, 3, 1), axes=(1, 3)), case("squeeze", (1,), axes=(0,)), case("squeeze", (1, 4), axes=(0,)),
    case("unsqueeze", (2, 3), axes=(0,)), case("unsqueeze", (2, 3), axes=(1, 3)), case("unsqueeze", (), axes=(0, 1)),
    case("flatten", (2, 3, 4), axis=1), case("flatten", (2, 3, 4), axis=0), case("flatten", (2, 3, 4), axis=3),
    case("expand", (3, 1), shape=(2, 3, 4)), case("expand", (1,), shape=(5,)), case("expand", (2, 3), shape=(1, 1)),
    case("gather", (10, 4), (2, 3)), case("gather", (3, 5, 2), (4,), axis=1), case("gather", (6,), (), axis=0),
    case("slice", (5, 6), starts=(1, 0), stops=(4, 6), steps=(1, 2)),
    case("slice", (5,), starts=(4,), stops=(-1,), steps=(-1,)),
    case("slice", (3, 4, 5), starts=(0, 3, 1), stops=(3, 0, 5), steps=(1, -2, 3)),
    case("pad", (2, 3), pads=(1, 0, 2, 1)), case("pad", (1, 2, 3, 3), pads=(0, 0, 1, 1, 0, 0, 1, 1), value=-1.0),
    case("pad", (4,), pads=(0, 3), value=0.5),
    case("clip", (2, 3, 4), min=0.0, max=6.0), case("clip", (5,), min=-0.5), case("clip", (3, 3), max=0.25),
    case("hardsigmoid", (2, 3, 4)), case("hardsigmoid", (5,), alpha=0.5, beta=0.25),
    case("hardsigmoid", (2, 3), alpha=0.125, beta=0.75),
    case("gelu", (2, 3, 4)), case("gelu", (5,), approximate="tanh"), case("gelu", (2, 3), approximate="none"),
    # ONNX Runtime's fused kernels (com.microsoft, and its SimplifiedLayerNormalization): the table's kernel is
    # their decomposition, here compared with ONNX Runtime's own kernel
    case("skip_layernorm", (2, 3, 8), (2, 3, 8), (8,), (8,)), case("skip_layernorm", (4, 6), (4, 6), (6,)),
    case("skip_layernorm", (1, 5, 16), (1, 5, 16), (16,), (16,), epsilon=1e-5),
    case("skip_rmsnorm", (2, 3, 8), (2, 3, 8), (8,)), case("skip_rmsnorm", (4, 6), (4, 6), (6,), epsilon=1e-6),
    case("skip_rmsnorm", (1, 7, 5), (1, 7, 5), (5,)),
    case("rmsnorm", (2, 3, 8), (8,), axis=2), case("rmsnorm", (2, 3, 4), (3, 4), axis=1, epsilon=1e-6),
    case("rmsnorm", (3, 5), (5,), axis=1),
    case("ms_gelu", (2, 3, 4)), case("ms_gelu", (7,)), case("ms_gelu", (2, 3, 4, 5)),
    case("bias_gelu", (2, 3, 4), (4,)), case("bias_gelu", (5, 6), (6,)), case("bias_gelu", (1, 2, 3, 4), (4,)),
    case("fast_gelu", (2, 3, 4)), case("fast_gelu", (5, 6), (6,)), case("fast_gelu", (1, 2, 3, 4), (4,)),
    case("quick_gelu", (2, 3, 4)), case("quick_gelu", (5, 6), alpha=1.0), case("quick_gelu", (7,), alpha=0.5),
    case("fused_matmul", (3, 4), (4, 5)), case("fused_matmul", (2, 3, 4), (2, 5, 4), transB=1, alpha=0.125),
    case("fused_matmul", (4, 3), (4, 5), transA=1), case("fused_matmul", (2, 1, 4, 3), (3, 6, 4), transA=1, transB=1),
    case("fused_conv", (2, 4, 7, 7), (6, 4, 3, 3), (6,), pads=(1, 1, 1, 1)),
    case("fused_conv", (1, 4, 8, 9), (6, 2, 3, 2), group=2, strides=(2, 1), pads=(1, 0, 1, 1), activation="Sigmoid"),
    case("fused_conv", (1, 3, 5, 6), (2, 3, 2, 3), (2,), activation="Tanh"),
    case("instancenorm", (2, 3, 4), (3,), (3,)), case("instancenorm", (1, 2, 3, 4), (2,), (2,), epsilon=1e-3),
    case("instancenorm", (2, 1, 5, 2, 2), (1,), (1,)),
    case("groupnorm", (2, 4, 3), (4,), (4,), num_groups=2), case("groupnorm", (1, 6, 3, 4), (6,), (6,), num_groups=3,
                                                                  epsilon=1e-3),
    case("groupnorm", (2, 3, 2, 2, 2), (3,), (3,), num_groups=1),
    case("groupnorm", (1, 4, 5), (4,), (4,), num_groups=4),
    case("pow2_scale", (2, 3, 4), exponent=64), case("pow2_scale", (5,), exponent=-64),
    case("pow2_scale", (2, 3), exponent=3), case("pow2_scale", (), exponent=1),
    # the scale absent (1/sqrt(head size)), given, and 1/sqrt(1) = 1 exactly; a value size unlike the key's
    case("mha", (2, 3, 8), (2, 5, 8), (2, 5, 8), num_heads=2), case("mha", (1, 4, 6), (1, 7, 6), (1, 7, 9), num_heads=3,
                                                                     scale=0.25),
    case("mha", (2, 1, 4), (2, 1, 4), (2, 1, 4), num_heads=4), case("mha", (1, 5, 3), (1, 2, 3), (1, 2, 2), num_heads=1,
                                                                    scale=1.0),
    # the packed projection: thirds, the scale given, Ev unlike Eq, one head of size 1 (scale 1/sqrt(1) = 1)
    case("attention", (2, 3, 4), (4, 24), (24,), num_heads=2),
    case("attention", (1, 5, 8), (8, 24), (24,), num_heads=2, scale=0.25),
    case("attention", (2, 4, 3), (3, 20), (20,), num_heads=2, qkv_hidden_sizes=(8, 8, 4)),
    case("attention", (1, 1, 1), (1, 3), (3,), num_heads=1),
    # rotary: a decode step (one position) and a prefill, several heads and batches, a head of 2
    case("rotary", (1, 3, 1, 8), (1, 1), (16, 4), (16, 4)), case("rotary", (2, 2, 5, 6), (2, 5), (7, 3), (7, 3)),
    case("rotary", (3, 1, 2, 2), (3, 2), (4, 1), (4, 1)),
]

INVALID = [
    *(case(op, *shapes) for op in ("add", "mul", "sub", "sum")
      for shapes in (((2, 3), (4,)), ((2, 3), (3, 2)), ((2,),))),
    case("smul", (2, 3), (2,)), case("smul", (2, 3), (1, 1)), case("smul", (2, 3)),
    case("smul", (), (1,)),  # ONNX's Mul makes it a vector: not a scalar multiple of x
    *(case(op, *shapes) for op in ("relu", "sigmoid", "tanh", "identity") for shapes in (((2,), (2,)), ())),
    case("matmul", (3, 4), (5, 6)), case("matmul", (4,), (4, 5)), case("matmul", (2, 3, 4), (3, 4, 5)),
    case("transpose", (3, 4), perm=(0, 0)), case("transpose", (3, 4, 5), perm=(1, 0)),
    case("concat", (2, 3), (2, 4), axis=0), case("concat", (2, 3), (2, 3, 1), axis=1),
    case("concat", (2, 3), axis=2),
    case("split", (5,), axis=0, split=(2, 2)), case("split", (5,), axis=1, split=(5,)),
    case("split", (4,), axis=0, split=(5, -1)),
    case("reshape", (2, 3), shape=(7,)), case("reshape", (2, 3), shape=(-1, 6)),
    case("conv", (1, 4, 5), (6, 4, 3, 3)), case("conv", (1, 4, 5, 5), (6, 3, 3, 3)),
    case("conv", (1, 4, 5, 5), (6, 2, 3, 3), group=3), case("conv", (1, 4, 5, 5), (6, 4, 3, 3), (5,)),
    case("conv", (1, 1, 2, 2), (1, 1, 3, 3)), case("conv", (1, 1, 5, 5), (1, 1, 3, 3), pads=(-1, 0, 0, 0)),
    case("conv", (1, 1, 5, 5), (1, 1, 3, 3), strides=(0, 1)),
    case("conv", (1, 1, 5, 5), (1, 1, 3, 3), act="gelu"),
    case("enlarge", (1, 1, 3, 3), size=(4, 3)), case("enlarge", (1, 1, 3, 3), size=(1, 1)),
    case("enlarge", (1, 3, 3), size=(3, 3)),
    *(case(op, *shapes, **attrs) for op in ("maxpool", "avgpool") for shapes, attrs in (
        (((1, 5, 5),), {"kernel": (2, 2)}), (((1, 1, 2, 2),), {"kernel": (3, 3)}),
        (((1, 1, 5, 5),), {"kernel": (2, 2), "pads": (2, 0, 0, 0)}),
        (((1, 1, 5, 5),), {"kernel": (2, 2), "strides": (0, 1)}), (((1, 1, 5, 5),), {"kernel": (0, 2)}))),
    case("avgpool", (1, 1, 5, 5), kernel=(2, 2), count_include_pad=2),
    case("batchnorm", (3,), (3,), (3,), (3,), (3,)), case("batchnorm", (2, 3, 4), (3,), (3,), (4,), (3,)),
    case("batchnorm", (2, 3, 4), (3,), (3,), (3,)),
    case("const_pool", shape=(3, 2, 3, 3)), case("const_pool", shape=(3, 1, 3, 3), dtype=INT64),
    case("const_pool", shape=(3, 1, 3)),
    case("const_iconv", shape=(3, 2, 3, 3)), case("const_iconv", shape=(3, 3, 0, 3)),
    case("const_iconv", shape=(3, 3)),
    case("const_imatmul", shape=(3, 4)), case("const_imatmul", shape=(3,)),
    case("const_ones", shape=(-1, 2)), case("const_ones", shape=(2,), dtype=TensorProto.STRING),
    case("const_ones", (2,), shape=(2,)),
    case("div", (2, 3), (4,)),
    *(case(op, (2,), (2,)) for op in ("neg", "reciprocal", "sqrt", "exp", "erf", "hardswish")),
    case("pow", (2,), (2,), exponent=2.0), case("softmax", (2, 3), axis=2),
    case("layernorm", (2, 3, 4), (3,), axis=2), case("layernorm", (2, 3), (3,), axis=-1),
    *(case(op, (2, 3), axes=axes) for op in ("reducemean", "reducesum", "reducemax") for axes in ((2,), (1, 0), ())),
    case("where", (2,), (3,), (3,)),
    *(case(op, (2, 3), (4,)) for op in ("equal", "less", "greater", "less_equal", "greater_equal")),
    case("cast", (2,), to=INT64), case("squeeze", (2, 3), axes=(0,)), case("unsqueeze", (2,), axes=(3,)),
    case("flatten", (2, 3), axis=3), case("expand", (2, 3), shape=(4, 3)), case("gather", (3, 4), (2,), axis=2),
    case("slice", (5,), starts=(0,), stops=(7,), steps=(1,)), case("slice", (5,), starts=(0,), stops=(5,), steps=(0,)),
    case("slice", (5, 2), starts=(0,), stops=(5,), steps=(1,)),
    case("pad", (2, 3), pads=(1, 1)), case("pad", (2,), pads=(-1, 0)), case("pad", (), pads=()),
    case("clip", (2,), (2,)), case("hardsigmoid", (2,), (2,)), case("gelu", (2,), approximate="fast"),
    case("instancenorm", (2, 3), (3,), (3,)), case("instancenorm", (2, 3, 4), (2,), (3,)),
    # groupnorm: rank 2; groups not dividing the channels; no groups; scale per group (opset 18's form); bias unlike C
    case("groupnorm", (2, 4), (4,), (4,), num_groups=2), case("groupnorm", (2, 4, 3), (4,), (4,), num_groups=3),
    case("groupnorm", (2, 4, 3), (4,), (4,), num_groups=0), case("groupnorm", (2, 4, 3), (2,), (2,), num_groups=2),
    case("groupnorm", (2, 4, 3), (4,), (2,), num_groups=2),
    case("pow2_scale", (2,), (2,), exponent=1), case("pow2_scale", exponent=1),
    case("skip_layernorm", (2, 3, 8), (2, 3, 4), (8,)), case("skip_layernorm", (8,), (8,), (8,)),
    case("skip_rmsnorm", (2, 3, 8), (2, 3, 8), (3,)), case("rmsnorm", (2, 3), (2,), axis=1),
    case("ms_gelu", (2,), (2,)), case("bias_gelu", (2, 3), (2,)), case("fast_gelu", (2, 3), (2, 3)),
    case("quick_gelu", (2,), (2,)), case("fused_matmul", (3, 4), (3, 5)), case("fused_matmul", (4,), (4, 5)),
    case("fused_conv", (1, 2, 5, 5), (3, 2, 3, 3), activation="LeakyRelu"),
    case("fused_conv", (1, 2, 5, 5), (3, 4, 3, 3)),
    # key and query hidden sizes differ; lengths of key and value, batches differ; hidden sizes not multiples of the
    # heads; no heads; the packed (rank-4) and rank-2 forms
    *(case("mha", q, k, v, num_heads=h) for q, k, v, h in (
        ((2, 3, 8), (2, 5, 6), (2, 5, 8), 2), ((2, 3, 8), (2, 5, 8), (2, 4, 8), 2),
        ((2, 3, 8), (1, 5, 8), (1, 5, 8), 2), ((2, 3, 6), (2, 5, 6), (2, 5, 6), 4),
        ((2, 3, 8), (2, 5, 8), (2, 5, 6), 4), ((2, 3, 8), (2, 5, 8), (2, 5, 8), 0),
        ((1, 2, 3, 8), (1, 2, 5, 8), (1, 2, 5, 8), 2), ((3, 8), (5, 8), (5, 8), 2))),
    # attention: weight rows unlike the input's hidden size; bias unlike the columns; columns not thirds; sizes
    # not adding up to the columns; Eq unlike Ek; sizes not multiples of the heads; no heads; sizes not three; the
    # input of rank 2 and 4, weights of rank 3
    *(case("attention", x, w, b, num_heads=h, **extra) for x, w, b, h, extra in (
        ((2, 3, 4), (5, 24), (24,), 2, {}), ((2, 3, 4), (4, 24), (12,), 2, {}), ((2, 3, 4), (4, 16), (16,), 2, {}),
        ((2, 3, 4), (4, 24), (24,), 2, {"qkv_hidden_sizes": (8, 8, 4)}),
        ((2, 3, 4), (4, 24), (24,), 2, {"qkv_hidden_sizes": (8, 4, 12)}), ((2, 3, 4), (4, 18), (18,), 4, {}),
        ((2, 3, 4), (4, 24), (24,), 0, {}), ((2, 3, 4), (4, 24), (24,), 2, {"qkv_hidden_sizes": (12, 12)}),
        ((3, 4), (4, 24), (24,), 2, {}), ((1, 2, 3, 4), (4, 24), (24,), 2, {}), ((2, 3, 4), (1, 4, 24), (24,), 2, {}))),
    # rotary: a rank-3 input, position ids not (batch, seq), caches not half the head, unlike, an odd head
    *(case("rotary", *shapes) for shapes in (
        ((1, 1, 8), (1, 1), (16, 4), (16, 4)), ((2, 3, 4, 8), (1, 4), (16, 4), (16, 4)),
        ((1, 3, 1, 8), (1, 1), (16, 8), (16, 8)), ((1, 3, 1, 8), (1, 1), (16, 4), (15, 4)),
        ((1, 3, 1, 7), (1, 1), (16, 3), (16, 3)))),
]

#: ops whose ONNX form needs a newer opset than the tests' default
OPSET_OF = {"gelu": 20, "groupnorm": 21}
#: the element type an input role takes in these tests (float otherwise)
ROLE_DTYPE = {"indices": INT64, "mask": BOOL}


# ---- helpers ------------------------------------------------------------------------------------


def make_node_for(op: str, shapes: Sequence[Shape], attrs: dict[str, Any]) -> Node:
    """An IR node of ``op`` reading in0.. and writing out0.."""
    normalized = OPS[op].normalize_attrs(attrs)
    n_out = OPS[op].num_outputs(normalized)
    return Node(op, tuple(f"in{i}" for i in range(len(shapes))), tuple(f"out{i}" for i in range(n_out)),
                normalized, name="node")


def random_inputs(op: str, shapes: Sequence[Shape], dtype: type = np.float32,
                  seed: int = 0) -> list[np.ndarray]:
    """Inputs for a case; batchnorm's variance is kept positive, integers stay small."""
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "i":
        arrays = [rng.integers(-5, 6, size=s).astype(dtype) for s in shapes]
    else:
        arrays = [rng.standard_normal(s).astype(dtype) for s in shapes]
    if op == "batchnorm":
        arrays[4] = np.abs(arrays[4]) + dtype(0.5)
    if op in ("sqrt", "pow") and np.dtype(dtype).kind == "f":  # real results only (ONNX gives NaN below 0)
        arrays[0] = np.abs(arrays[0])
    for k, role in enumerate(OPS[op].roles):
        if role == "indices" and op == "rotary":  # position ids: rows of the caches
            arrays[k] = rng.integers(0, shapes[2][0], size=shapes[k]).astype(np.int64)
        elif role == "indices":  # in range of the gathered axis (negative ones count from its end)
            arrays[k] = rng.integers(-2, 2, size=shapes[k]).astype(np.int64)
        elif role == "mask":
            arrays[k] = rng.random(shapes[k]) < 0.5
    return arrays


def onnx_model(protos: Sequence[onnx.NodeProto], inputs: dict[str, np.ndarray],
               outputs: dict[str, TensorType], initializers: Sequence[onnx.TensorProto] = (),
               opset: int = OPSET) -> onnx.ModelProto:
    """A checked one-graph model over these nodes; outputs are declared by rank only (ORT decides dims)."""
    graph = helper.make_graph(
        list(protos), "t",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in inputs.items()],
        [helper.make_tensor_value_info(n, t.dtype, [f"{n}_d{i}" for i in range(len(t.shape or ()))])
         for n, t in outputs.items()],
        initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              ir_version=8 if opset <= 17 else 10)
    import_node_domains(model)  # a fused kernel's contrib domain
    if all(onnx.defs.has(p.op_type, p.domain) for p in protos):  # ONNX Runtime's own ops have no ONNX schema
        onnx.checker.check_model(model)
    return model


def run_ort(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Run a model on the CPU provider with graph optimizations off."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, inputs)


def encode_and_run(node: Node, arrays: Sequence[np.ndarray], ctx: EncodeCtx) -> list[np.ndarray]:
    """Encode one IR node with ``ctx`` and run it in ONNX Runtime."""
    protos = OPS[node.op].encode(node, ctx)
    feeds = dict(zip(node.inputs, arrays, strict=True))
    dtype = OPS[node.op].output_dtype([helper.np_dtype_to_tensor_dtype(a.dtype) for a in arrays], node.attrs)
    shapes = OPS[node.op].infer([a.shape for a in arrays], node.attrs)
    outputs = {o: TensorType(dtype, s) for o, s in zip(node.outputs, shapes, strict=True)}
    return run_ort(onnx_model(protos, feeds, outputs, ctx.initializers, ctx.opset), feeds)


def float_types(node: Node, shapes: Sequence[Shape]) -> dict[str, TensorType]:
    """The types of a node's inputs: float, but for indices (int64) and masks (bool)."""
    return {n: TensorType(ROLE_DTYPE.get(OPS[node.op].role(k), FLOAT), tuple(s))
            for k, (n, s) in enumerate(zip(node.inputs, shapes, strict=True))}


@functools.cache
def _ort_outputs(op: str, shapes: tuple[Shape, ...], attrs: Attrs) -> tuple[np.ndarray, ...]:
    node = make_node_for(op, shapes, dict(attrs))
    ctx = TypedEncodeCtx(float_types(node, shapes), OPSET_OF.get(op, OPSET))
    return tuple(encode_and_run(node, random_inputs(op, shapes), ctx))


def ort_outputs(op: str, shapes: Sequence[Shape], attrs: dict[str, Any]) -> tuple[np.ndarray, ...]:
    """ONNX Runtime's outputs for a case on its random float32 inputs (cached per case)."""
    return _ort_outputs(op, tuple(tuple(s) for s in shapes), Attrs(attrs))


def assert_close(got: Sequence[Any], want: Sequence[np.ndarray]) -> None:
    """Same count, shapes, dtypes and (float32 tolerance) values."""
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        g = np.asarray(g)
        assert g.shape == w.shape
        assert g.dtype == w.dtype
        if w.dtype == np.bool_:
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


# ---- the whole table against ONNX Runtime -------------------------------------------------------


def test_every_op_has_cases() -> None:
    counts = {name: 0 for name in OPS}
    for param in CASES:
        counts[param.values[0]] += 1
    assert {name: n for name, n in counts.items() if n < 3} == {}
    assert {p.values[0] for p in INVALID} == set(OPS)


@pytest.mark.parametrize(("op", "shapes", "attrs"), CASES)
def test_kernel_matches_onnxruntime(op: str, shapes: tuple[Shape, ...], attrs: dict[str, Any]) -> None:
    node = make_node_for(op, shapes, attrs)
    got = OPS[op].evaluate(np, random_inputs(op, shapes), node.attrs)
    assert_close(got, ort_outputs(op, shapes, attrs))


@pytest.mark.parametrize(("op", "shapes", "attrs"), CASES)
def test_shape_rule_matches_onnxruntime(op: str, shapes: tuple[Shape, ...], attrs: dict[str, Any]) -> None:
    node = make_node_for(op, shapes, attrs)
    assert OPS[op].infer(shapes, node.attrs) == [o.shape for o in ort_outputs(op, shapes, attrs)]


def _random_case(rng: np.random.Generator, op: str) -> tuple[list[Shape], Node] | None:
    """Shapes drawn by role (half the time one moved toward broadcasting: dims set to 1, leading dims dropped,
    another size or rank), attributes from the op table's sampling domain, repaired by the op's fit: a case
    xflow's shape rule accepts, or None."""
    from xflow.verifier.axioms import _perturbed_shape
    from xflow.verifier.numeric import _shape

    entry = OPS[op]
    n = int(rng.integers(entry.min_inputs, min(entry.max_inputs, entry.min_inputs + 2) + 1))
    shapes = [_shape(rng, entry.role(p), wide=bool(rng.integers(2))) for p in range(n)]
    if entry.channel_params and len(shapes[0]) > 1:  # per-channel vectors sized to the image, as in models
        for pos in (p for p in entry.channel_params if p < n):
            shapes[pos] = (shapes[0][1],)
    if rng.random() < 0.5:
        shapes[int(rng.integers(n))] = _perturbed_shape(rng, shapes[int(rng.integers(n))])
    attrs: dict[str, Any] = {}
    for spec in entry.attrs:
        if spec.name == "pads" and spec.sample is None:
            attrs["pads"] = tuple(int(v) for v in rng.integers(0, 3, size=2 * len(shapes[0])))
        elif spec.sample is not None:
            if (value := spec.sample(rng, shapes, attrs, 2 if op == "split" else 1)) is None:
                return None
            attrs[spec.name] = value
    try:
        node = make_node_for(op, shapes, attrs)
        try:
            entry.infer(shapes, node.attrs)
        except ShapeError:
            if (fitted := entry.fit_inputs(shapes, node.attrs, frozenset(range(1, n)))) is None:
                return None
            shapes = [tuple(s) for s in fitted]
            entry.infer(shapes, node.attrs)
    except (ShapeError, ValueError, KeyError, TypeError, IndexError, ZeroDivisionError):
        return None
    return shapes, node


@pytest.mark.parametrize("op", sorted(name for name, entry in OPS.items() if entry.min_inputs > 0))
def test_random_cases_match_onnxruntime(op: str) -> None:
    """Beyond the hand-written cases: wherever xflow's shape rule accepts a random case (broadcasting operands,
    scalars, sampled attributes), ONNX Runtime runs its encoding and agrees on every output's shape and values.
    The verifier proves rules about these kernels and shape rules, so they must be ONNX's."""
    rng, ran = np.random.default_rng(sum(map(ord, op))), 0
    for _ in range(150):
        if (drawn := _random_case(rng, op)) is None:
            continue
        shapes, node = drawn
        arrays = [np.asarray(a) for a in random_inputs(op, shapes)]
        try:
            got = OPS[op].evaluate(np, arrays, node.attrs)
        except IndexError:
            continue  # gather's random indices beyond a short axis: ONNX Runtime refuses them too
        want = encode_and_run(node, arrays, TypedEncodeCtx(float_types(node, shapes), OPSET_OF.get(op, OPSET)))
        assert [tuple(s) for s in OPS[op].infer(shapes, node.attrs)] == [w.shape for w in want], (shapes, node.attrs)
        assert_close([np.asarray(g) for g in got], want)
        ran += 1
    assert ran or op in NOT_DRAWN, "no case drawn"


#: ops whose inputs the role-based draw does not reach (shape tensors, a reshape's target, constants of a
#: fused kernel's fixed layout): covered by their hand-written cases only
NOT_DRAWN = {"expand", "reshape", "rotary", "skip_layernorm", "skip_rmsnorm", "slice", "squeeze", "unsqueeze"}


@pytest.mark.parametrize(("op", "shapes", "attrs"),
                         [c for c in CASES if c.values[1] and OPS[c.values[0]].out_dtype is None])
def test_kernel_keeps_float64(op: str, shapes: tuple[Shape, ...], attrs: dict[str, Any]) -> None:
    node = make_node_for(op, shapes, attrs)
    got = OPS[op].evaluate(np, random_inputs(op, shapes, np.float64), node.attrs)
    want = OPS[op].evaluate(np, random_inputs(op, shapes, np.float32), node.attrs)
    assert all(g.dtype == np.float64 for g in got)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("op", "shapes", "attrs"), INVALID)
def test_shape_rule_rejects(op: str, shapes: tuple[Shape, ...], attrs: dict[str, Any]) -> None:
    with pytest.raises(ShapeError):
        OPS[op].infer(shapes, OPS[op].normalize_attrs(attrs))


@pytest.mark.parametrize(("op", "shapes", "attrs"), CASES)
def test_int_kernel(op: str, shapes: tuple[Shape, ...], attrs: dict[str, Any]) -> None:
    node = make_node_for(op, shapes, attrs)
    got = OPS[op].evaluate_int(np, random_inputs(op, shapes, np.int64), node.attrs)
    assert [np.asarray(g).dtype for g in got] == [np.dtype(np.int64)] * len(got)
    assert [g.shape for g in got] == OPS[op].infer(shapes, node.attrs)


def _decodable(op: str, shapes: tuple[Shape, ...], attrs: dict[str, Any]) -> bool:
    """True when every ONNX node the op encodes to has a decoder (constants have none) and the op is not
    one applied to weights only (enlarge writes a Pad, which reads back as the general pad) nor a power-of-two
    scale (written as a Mul by a constant, which reads back as mul or smul: what it computes, not why)."""
    if OPS[op].weights_only or op == "pow2_scale":
        return False
    node = make_node_for(op, shapes, attrs)
    protos = OPS[op].encode(node, TypedEncodeCtx(float_types(node, shapes), OPSET_OF.get(op, OPSET)))
    return all(domain_key(p.domain, p.op_type) in DECODERS for p in protos)


@pytest.mark.parametrize(("op", "shapes", "attrs"), [c for c in CASES if _decodable(*c.values)])
def test_decode_encode_round_trip(op: str, shapes: tuple[Shape, ...], attrs: dict[str, Any]) -> None:
    node = make_node_for(op, shapes, attrs)
    types = float_types(node, shapes)
    encode_ctx = TypedEncodeCtx(types, OPSET_OF.get(op, OPSET))
    protos = OPS[op].encode(node, encode_ctx)
    out_shapes = OPS[op].infer(shapes, node.attrs)
    out_dtype = OPS[op].output_dtype([t.dtype for t in types.values()], node.attrs)
    types.update({o: TensorType(out_dtype, s) for o, s in zip(node.outputs, out_shapes, strict=True)})
    for o in (o for p in protos for o in p.output if o not in types):  # conv's pre-activation value
        types[o] = TensorType(FLOAT, out_shapes[0])
    decode_ctx = DecodeCtx(types, encode_ctx.constants(), OPSET_OF.get(op, OPSET))
    decoded = [n for p in protos for n in decoder_for(p.domain, p.op_type)(p, decode_ctx) or [None]]
    expected = [(op, node.attrs)]
    if op == "conv" and node.attrs["act"] == "relu":
        expected = [("conv", node.attrs.updated(act="none")), ("relu", Attrs())]
    assert None not in decoded
    assert [(n.op, n.attrs) for n in decoded] == expected
    assert decoded[0].inputs == node.inputs and decoded[-1].outputs == node.outputs


# ---- ONNX forms the decoders normalize ----------------------------------------------------------


def _decode_and_compare(proto: onnx.NodeProto, inputs: dict[str, np.ndarray],
                        opset: int = OPSET) -> list[Node]:
    """Decode one ONNX node, check it is in the algebra, and compare its kernels with ONNX Runtime."""
    types = {n: TensorType(FLOAT, a.shape) for n, a in inputs.items()}
    decoded = decoder_for(proto.domain, proto.op_type)(proto, DecodeCtx(types, opset=opset))
    assert decoded is not None
    values = dict(inputs)
    for n in decoded:
        outs = OPS[n.op].evaluate(np, [values[i] for i in n.inputs], n.attrs)
        values.update(zip(n.outputs, outs, strict=True))
    outputs = {o: TensorType(FLOAT, values[o].shape) for o in proto.output if o}
    want = run_ort(onnx_model([proto], inputs, outputs, opset=opset), inputs)
    assert_close([values[o] for o in proto.output if o], want)
    return decoded


def _arrays(*shapes: Shape, names: str = "xwb") -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in zip(names, shapes, strict=False)}


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID", "NOTSET"])
@pytest.mark.parametrize("strides", [(1, 1), (2, 3)])
def test_decode_conv_auto_pad(auto_pad: str, strides: tuple[int, int]) -> None:
    inputs = _arrays((1, 2, 7, 8), (3, 2, 4, 3))
    proto = helper.make_node("Conv", ["x", "w", ""], ["y"], auto_pad=auto_pad, strides=list(strides),
                             kernel_shape=[4, 3], dilations=[1, 1])
    (node,) = _decode_and_compare(proto, inputs)
    assert node.op == "conv" and node.inputs == ("x", "w")


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
@pytest.mark.parametrize(("onnx_type", "extra"), [("MaxPool", {}), ("AveragePool", {"count_include_pad": 0}),
                                                  ("AveragePool", {"count_include_pad": 1})])
def test_decode_pool_auto_pad(auto_pad: str, onnx_type: str, extra: dict[str, int]) -> None:
    proto = helper.make_node(onnx_type, ["x"], ["y"], kernel_shape=[3, 2], strides=[2, 2], auto_pad=auto_pad,
                             **extra)
    _decode_and_compare(proto, _arrays((2, 3, 7, 6)))


@pytest.mark.parametrize(("onnx_type", "op"),
                         [("GlobalAveragePool", "avgpool"), ("GlobalMaxPool", "maxpool")])
def test_decode_global_pool(onnx_type: str, op: str) -> None:
    (node,) = _decode_and_compare(helper.make_node(onnx_type, ["x"], ["y"]), _arrays((2, 3, 5, 4)))
    assert node.op == op and node.attrs["kernel"] == (5, 4) and node.attrs["pads"] == (0, 0, 0, 0)


def test_decode_maxpool_with_unused_indices_output() -> None:
    proto = helper.make_node("MaxPool", ["x"], ["y", ""], kernel_shape=[2, 2], storage_order=0)
    (node,) = _decode_and_compare(proto, _arrays((1, 2, 4, 4)))
    assert node.outputs == ("y",)


def test_decode_batchnorm_default_epsilon() -> None:
    rng = np.random.default_rng(2)
    inputs = {"x": rng.standard_normal((2, 3, 4)).astype(np.float32),
              **{n: rng.standard_normal(3).astype(np.float32) for n in ("s", "b", "m")},
              "v": rng.random(3).astype(np.float32) + 0.1}
    proto = helper.make_node("BatchNormalization", list(inputs), ["y"], momentum=0.8)
    (node,) = _decode_and_compare(proto, inputs)
    assert node.attrs["epsilon"] == 1e-5


OPAQUE_PROTOS = [
    pytest.param(helper.make_node("Conv", ["x", "w"], ["y"], dilations=[2, 2]), id="conv-dilated"),
    pytest.param(helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[2, 2]), id="conv-kernel-mismatch"),
    pytest.param(helper.make_node("Conv", ["x", "w"], ["y"], auto_pad="SAME_UPPER", pads=[1, 1, 1, 1]),
                 id="conv-auto-pad-and-pads"),
    pytest.param(helper.make_node("Conv", ["x", "unknown"], ["y"]), id="conv-unknown-shape"),
    pytest.param(helper.make_node("Conv", ["x", "w", "b9"], ["y"]), id="conv-bad-bias"),
    pytest.param(helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2]), id="maxpool-indices"),
    pytest.param(helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], ceil_mode=1),
                 id="maxpool-ceil"),
    pytest.param(helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], storage_order=1),
                 id="maxpool-storage-order"),
    pytest.param(helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], dilations=[2, 2]),
                 id="avgpool-dilated"),
    pytest.param(helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2, 2]), id="avgpool-3d"),
    pytest.param(helper.make_node("GlobalMaxPool", ["v"], ["y"]), id="globalpool-3d"),
    pytest.param(helper.make_node("BatchNormalization", ["x", "c", "c", "c", "c"], ["y"], training_mode=1),
                 id="bn-training"),
    pytest.param(helper.make_node("BatchNormalization", ["x", "c", "c", "c", "c"], ["y", "m", "v"]),
                 id="bn-three-outputs"),
    pytest.param(helper.make_node("BatchNormalization", ["x", "c", "c", "c", "b9"], ["y"]), id="bn-bad-var"),
]


@pytest.mark.parametrize("proto", OPAQUE_PROTOS)
def test_decoders_leave_unhandled_forms_opaque(proto: onnx.NodeProto) -> None:
    types = {"x": (1, 2, 6, 6), "w": (3, 2, 3, 3), "b9": (9,), "c": (2,), "v": (2, 6, 6)}
    known = {n: TensorType(FLOAT, s) for n, s in types.items()}
    ctx = DecodeCtx(known | {"unknown": TensorType(FLOAT, None)})
    assert decoder_for(proto.domain, proto.op_type)(proto, ctx) is None


@pytest.mark.parametrize("stash_type", [None, 1])
def test_groupnorm_decodes_at_opset_21_and_round_trips(stash_type: int | None) -> None:
    """GroupNormalization-21 (scale and bias per channel) reads as groupnorm and is written back running the same."""
    from xflow.onnx_io import graph_from_model, to_model_proto

    extra = {} if stash_type is None else {"stash_type": stash_type}
    rng = np.random.default_rng(3)
    scale, bias = (numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), n) for n in ("s", "b"))
    proto = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=3, epsilon=1e-4, **extra)
    graph = helper.make_graph([proto], "g", [helper.make_tensor_value_info("x", FLOAT, (2, 6, 3, 4))],
                              [helper.make_tensor_value_info("y", FLOAT, (2, 6, 3, 4))], [scale, bias])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    loaded = graph_from_model(model)
    (node,) = loaded.nodes
    assert node.op == "groupnorm" and node.attrs["num_groups"] == 3 and node.attrs["epsilon"] == np.float32(1e-4)
    written = to_model_proto(loaded, reuse_protos=False)
    assert [n.op_type for n in written.graph.node] == ["GroupNormalization"]
    feeds = {"x": rng.standard_normal((2, 6, 3, 4)).astype(np.float32)}
    want, got = run_ort(model, feeds), run_ort(written, feeds)
    assert all(np.array_equal(w, g) for w, g in zip(want, got, strict=True))
    assert_close(OPS["groupnorm"].evaluate(np, [feeds["x"], *(numpy_helper.to_array(t) for t in (scale, bias))],
                                           node.attrs), want)


@pytest.mark.parametrize(("opset", "params", "extra"), [(18, 3, {}), (20, 3, {}), (21, 6, {"stash_type": 0}),
                                                        (21, 6, {"axis": 1})],
                         ids=["opset18-per-group", "opset20", "stash-type-0", "unknown-attr"])
def test_groupnorm_other_forms_stay_opaque(opset: int, params: int, extra: dict[str, int]) -> None:
    """Before opset 21 GroupNormalization's scale and bias are per group, not this kernel's: left opaque."""
    proto = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=3, **extra)
    types = {"x": TensorType(FLOAT, (2, 6, 4)), "s": TensorType(FLOAT, (params,)), "b": TensorType(FLOAT, (params,))}
    assert decoder_for("", "GroupNormalization")(proto, DecodeCtx(types, opset=opset)) is None


def test_groupnorm_refuses_to_encode_before_opset_21() -> None:
    node = make_node_for("groupnorm", [(2, 6, 4), (6,), (6,)], {"num_groups": 3})
    with pytest.raises(ShapeError):
        OPS["groupnorm"].encode(node, EncodeCtx(20))


# ---- encoders without type information ----------------------------------------------------------


def test_conv_encodes_without_known_shapes() -> None:
    shapes = ((1, 4, 6, 6), (4, 2, 3, 3))
    node = make_node_for("conv", shapes, {"group": 2, "pads": (1, 1, 1, 1), "act": "relu"})
    protos = OPS["conv"].encode(node, EncodeCtx())
    assert [p.op_type for p in protos] == ["Conv", "Relu"]
    assert "kernel_shape" not in {a.name for a in protos[0].attribute}
    arrays = random_inputs("conv", shapes)
    assert_close(encode_and_run(node, arrays, EncodeCtx()), OPS["conv"].evaluate(np, arrays, node.attrs))


@pytest.mark.parametrize(("ctx_factory", "opset"), [(lambda types: EncodeCtx(), OPSET),
                                                    (lambda types: TypedEncodeCtx(types, 10), 10)])
def test_enlarge_encodes_without_known_shapes_or_before_opset_11(ctx_factory, opset: int) -> None:
    shapes = ((2, 3, 1, 3),)
    node = make_node_for("enlarge", shapes, {"size": (5, 5)})
    ctx = ctx_factory(float_types(node, shapes))
    assert ctx.opset == opset
    arrays = random_inputs("enlarge", shapes)
    assert_close(encode_and_run(node, arrays, ctx), OPS["enlarge"].evaluate(np, arrays, node.attrs))


# ---- semantics the rules rely on ----------------------------------------------------------------


def test_integer_relu_is_not_relu() -> None:
    x = np.arange(-3, 4, dtype=np.int64)
    assert not np.array_equal(OPS["relu"].evaluate_int(np, [x], Attrs())[0], np.maximum(x, 0))
    shapes = ((1, 2, 4, 4), (3, 2, 3, 3))
    arrays = random_inputs("conv", shapes, np.int64)
    attrs = OPS["conv"].normalize_attrs({"act": "relu"})
    linear = OPS["conv"].evaluate_int(np, arrays, attrs.updated(act="none"))[0]
    fused = OPS["conv"].evaluate_int(np, arrays, attrs)[0]
    np.testing.assert_array_equal(fused, OPS["relu"].evaluate_int(np, [linear], Attrs())[0])
    assert not np.array_equal(fused, np.maximum(linear, 0))


@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_avgpool_is_depthwise_conv_with_const_pool(dtype: type) -> None:
    x = random_inputs("avgpool", [(2, 3, 5, 6)], dtype)[0]
    geometry = {"strides": (2, 1), "pads": (1, 1, 1, 1)}
    pool_attrs = OPS["avgpool"].normalize_attrs({"kernel": (3, 3), "count_include_pad": 1, **geometry})
    kernel_attrs = OPS["const_pool"].normalize_attrs({"shape": (3, 1, 3, 3)})
    conv_attrs = OPS["conv"].normalize_attrs({"group": 3, **geometry})
    integer = dtype is np.int64
    run = "evaluate_int" if integer else "evaluate"
    (w,) = getattr(OPS["const_pool"], run)(np, [], kernel_attrs)
    (pooled,) = getattr(OPS["avgpool"], run)(np, [x], pool_attrs)
    (conv,) = getattr(OPS["conv"], run)(np, [x, w], conv_attrs)
    np.testing.assert_allclose(pooled, conv, rtol=1e-6, atol=1e-6)


def test_identity_constants_are_identities() -> None:
    x = random_inputs("conv", [(2, 3, 4, 5)])[0]
    (w,) = OPS["const_iconv"].evaluate(np, [], OPS["const_iconv"].normalize_attrs({"shape": (3, 3, 3, 3)}))
    (y,) = OPS["conv"].evaluate(np, [x, w], OPS["conv"].normalize_attrs({"pads": (1, 1, 1, 1)}))
    np.testing.assert_array_equal(y, x)
    (eye,) = OPS["const_imatmul"].evaluate(np, [], OPS["const_imatmul"].normalize_attrs({"shape": (5, 5)}))
    np.testing.assert_array_equal(OPS["matmul"].evaluate(np, [x, eye], Attrs())[0], x)


def test_enlarged_kernel_convolves_like_the_original() -> None:
    x, w = random_inputs("conv", [(1, 2, 6, 6), (3, 2, 1, 3)])
    (big,) = OPS["enlarge"].evaluate(np, [w], OPS["enlarge"].normalize_attrs({"size": (3, 5)}))
    small = OPS["conv"].evaluate(np, [x, w], OPS["conv"].normalize_attrs({"pads": (0, 1, 0, 1)}))[0]
    large = OPS["conv"].evaluate(np, [x, big], OPS["conv"].normalize_attrs({"pads": (1, 2, 1, 2)}))[0]
    np.testing.assert_allclose(small, large, rtol=1e-5, atol=1e-5)
