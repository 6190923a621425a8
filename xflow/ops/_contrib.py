"""Helpers the fused-kernel operator files share: ONNX Runtime contrib ops (domain ``com.microsoft``) whose
meaning is their decomposition into op-table ops. Defines no operator.

A fused op's kernel is the composition of its decomposition's kernels (``compose``), so the op table
states its meaning once: the kernel the rules are checked with is the decomposition itself, and a test
compares it with ONNX Runtime's own kernel before the op is trusted.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

import onnx

from xflow.ir import Attrs, Node
from xflow.ops._forms import decoded, present_inputs
from xflow.ops.base import DecodeContext, EncodeContext, OpDef, onnx_attrs
from xflow.ops.norm import canonical_float

MS_DOMAIN = "com.microsoft"
_F, _D, _H, _B = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
                  onnx.TensorProto.BFLOAT16)
#: ``OpDef.kernel_dtypes`` of the contrib ops: ONNX Runtime's CPU kernels of most are float only (float16 runs
#: through the casts ORT inserts around a float kernel, and natively on CUDA); double has no kernel
FLOAT_KERNELS = (_F, _H)
FLOAT_DOUBLE_KERNELS = (_F, _D, _H)  # FusedMatMul
NORM_KERNELS = (_F, _D, _H, _B)  # SkipLayerNormalization, SkipSimplifiedLayerNormalization

#: reads the ONNX attributes of a node (and the context) into the op's attributes; None: stays opaque
AttrReader = Callable[[Mapping[str, Any], onnx.NodeProto, DecodeContext], dict[str, Any] | None]


def contrib_encoder(onnx_type: str, domain: str = MS_DOMAIN,
                    attrs_of: Callable[[Node, EncodeContext], Mapping[str, Any]] | None = None
                    ) -> Callable[[Node, EncodeContext], list[onnx.NodeProto]]:
    """An encoder writing one ``domain``:``onnx_type`` node with the same inputs and outputs (its attributes
    from ``attrs_of``, or the node's own)."""

    def encode(node: Node, ctx: EncodeContext) -> list[onnx.NodeProto]:
        attrs = dict(attrs_of(node, ctx) if attrs_of is not None else node.attrs)
        return [onnx.helper.make_node(onnx_type, list(node.inputs), list(node.outputs),
                                      name=node.name or ctx.fresh_name(onnx_type), domain=domain, **attrs)]

    return encode


def contrib_decoder(op: Callable[[], OpDef], arities: Collection[int], known: Collection[str] = (),
                    read: AttrReader | None = None) -> Callable[[onnx.NodeProto, DecodeContext], list[Node] | None]:
    """A decoder for a one-node form with only its first output used, ``arities`` inputs present (no gap) and
    no attribute outside ``known``; ``read`` turns the attributes into the op's (None: stays opaque)."""

    def decode(proto: onnx.NodeProto, ctx: DecodeContext) -> list[Node] | None:
        inputs = present_inputs(proto)
        if inputs is None or len(inputs) not in arities or not proto.output or not proto.output[0]:
            return None
        if any(proto.output[1:]):  # statistics outputs (mean, inverse std) the algebra does not compute
            return None
        attrs = onnx_attrs(proto)
        if set(attrs) - set(known):
            return None
        values = read(attrs, proto, ctx) if read is not None else {}
        return None if values is None else decoded(proto, op(), inputs, values)

    return decode


def float_attr(attrs: Mapping[str, Any], name: str, default: float) -> float:
    """A float attribute as ONNX stores it (float32), or its default."""
    return canonical_float(attrs.get(name, default))


def scale_stand_in(value: float) -> int:
    """An integer fingerprint variant's factor for a float scale other than 1 (fused_matmul's alpha, attention's
    scale): a distinct integer per value to a thousandth, so a scaled product is told from the plain one."""
    return int(round(value * 1000)) + 7919


def compose(*steps: tuple[OpDef, Callable[[list[Any], Attrs], tuple[list[Any], Mapping[str, Any]]]],
            integer: bool = False) -> Callable[[Any, list[Any], Attrs], list[Any]]:
    """A kernel that runs ops in turn: each step maps (the values so far: the inputs, then each step's
    output appended, and the fused op's attributes) to the step op's inputs and attributes. With
    ``integer`` the steps' integer fingerprint variants run instead of their float kernels."""

    def kernel(xp: Any, arrays: list[Any], attrs: Attrs) -> list[Any]:
        values = list(arrays)
        for entry, wiring in steps:
            inputs, step_attrs = wiring(values, attrs)
            run = entry.evaluate_int if integer else entry.evaluate
            values.append(run(xp, inputs, entry.normalize_attrs(step_attrs))[0])
        return [values[-1]]

    return kernel
