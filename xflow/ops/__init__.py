"""The op table (``OPS``): the single home of each operator's meaning (see ``xflow.ops.base.OpDef``)."""

from xflow.ops.base import FAMILIES, AttrSpec, Generalize, Menu, OpDef, ShapeError, make_node
from xflow.ops.registry import DECODERS, OPS, op

__all__ = ["AttrSpec", "DECODERS", "FAMILIES", "Generalize", "Menu", "OPS", "OpDef", "ShapeError", "make_node", "op"]
