"""The op table (``OPS``): the single home of each operator's meaning."""

from xflow.ops.base import AttrSpec, OpDef, ShapeError, make_node
from xflow.ops.registry import DECODERS, OPS, op

__all__ = ["AttrSpec", "DECODERS", "OPS", "OpDef", "ShapeError", "make_node", "op"]
