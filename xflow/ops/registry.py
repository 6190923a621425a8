"""The op table: every operator of the substitution algebra, by name, and ONNX decoders by op type.

Found by discovery: each module of this package that defines ``OPS`` (a tuple of ``OpDef``) adds its
operators, and its ``DECODERS`` (ONNX type -> decoder) when it has them. Adding an operator is adding a
module; no list here or elsewhere names it.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from types import ModuleType

from xflow.ops.base import Decoder, OpDef

_NOT_OPS = frozenset({"base", "registry"})


def _op_modules() -> tuple[ModuleType, ...]:
    """The modules of ``xflow.ops`` that define operators, in name order (so the table's order is fixed)."""
    names = sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)]) if m.name not in _NOT_OPS)
    modules = (importlib.import_module(f"xflow.ops.{name}") for name in names)
    return tuple(m for m in modules if hasattr(m, "OPS"))


def _table(modules: tuple[ModuleType, ...]) -> dict[str, OpDef]:
    table: dict[str, OpDef] = {}
    for module in modules:
        for entry in module.OPS:
            if entry.name in table:
                raise ValueError(f"op {entry.name!r} is defined twice (again in {module.__name__})")
            table[entry.name] = entry
    return table


_MODULES = _op_modules()
OPS: dict[str, OpDef] = _table(_MODULES)

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
