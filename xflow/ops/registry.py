"""The op table: every operator of the substitution algebra, by name, and ONNX decoders by (domain, op type).

Found by discovery: each module of this package that defines ``OPS`` (a tuple of ``OpDef``) adds its
operators, and its ``DECODERS`` when it has them (keyed by ONNX type in the op's domain, or by a
(domain, type) pair). Adding an operator is adding a module; no list here or elsewhere names it.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from types import ModuleType

from xflow.ops.base import Decoder, OpDef

_NOT_OPS = frozenset({"base", "registry"})
#: the names of the standard ONNX domain (ONNX writes it as "" or "ai.onnx")
DEFAULT_DOMAINS = ("", "ai.onnx")
#: the opset version written for an ONNX Runtime contrib domain when a model gains its first node of it
DOMAIN_VERSIONS: dict[str, int] = {"com.microsoft": 1}


def domain_key(domain: str, op_type: str) -> tuple[str, str]:
    """The (domain, op type) key of an ONNX node, the standard domain spelled ""."""
    return ("" if domain in DEFAULT_DOMAINS else domain, op_type)


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


def _decoders(modules: tuple[ModuleType, ...], table: dict[str, OpDef]) -> dict[tuple[str, str], Decoder]:
    found: dict[tuple[str, str], Decoder] = {}
    for entry in table.values():
        if entry.decode is not None:
            found.setdefault(domain_key(entry.domain, entry.onnx_types[0]), entry.decode)
    for module in modules:
        for key, decoder in getattr(module, "DECODERS", {}).items():
            found[domain_key(*key) if isinstance(key, tuple) else domain_key("", key)] = decoder
    return found


_MODULES = _op_modules()
OPS: dict[str, OpDef] = _table(_MODULES)
DECODERS: dict[tuple[str, str], Decoder] = _decoders(_MODULES, OPS)


def decoder_for(domain: str, op_type: str) -> Decoder | None:
    """The decoder of ONNX nodes of this domain and type, or None (they stay opaque)."""
    return DECODERS.get(domain_key(domain, op_type))


def op(name: str) -> OpDef:
    """The op-table entry for ``name``; KeyError with the known names otherwise."""
    try:
        return OPS[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}; the op table has {sorted(OPS)}") from None
