"""The op table (``OPS``): the single home of each operator's meaning (see ``xflow.ops.base.OpDef``)."""

from xflow.ops.base import FAMILIES, AttrSpec, Generalize, Menu, OpDef, ShapeError, make_node
from xflow.ops.registry import DECODERS, DEFAULT_DOMAINS, DOMAIN_VERSIONS, OPS, decoder_for, domain_key, op

__all__ = ["AttrSpec", "DECODERS", "DEFAULT_DOMAINS", "DOMAIN_VERSIONS", "FAMILIES", "Generalize", "Menu", "OPS",
           "OpDef", "ShapeError", "decoder_for", "domain_key", "make_node", "op"]
