"""The op table: every operator of the substitution algebra, by name, and ONNX decoders by op type."""

from __future__ import annotations

from types import ModuleType

from xflow.ops import conv, elementwise, linalg, norm, pool, shape_ops, tensors
from xflow.ops.base import Decoder, OpDef

_MODULES: tuple[ModuleType, ...] = (elementwise, linalg, shape_ops, conv, pool, norm, tensors)

OPS: dict[str, OpDef] = {op.name: op for module in _MODULES for op in module.OPS}

DECODERS: dict[str, Decoder] = {}
for _op in OPS.values():
    if _op.decode is not None:
        DECODERS.setdefault(_op.onnx_types[0], _op.decode)
for _module in _MODULES:
    DECODERS.update(getattr(_module, "DECODERS", {}))


def op(name: str) -> OpDef:
    """The op-table entry for ``name``; KeyError with the known names otherwise."""
    try:
        return OPS[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}; the op table has {sorted(OPS)}") from None
