"""IR nodes: an op-table operator applied to named values, or an opaque ONNX node."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import cached_property

import onnx

from xflow.ir.types import Attrs

OPAQUE = "opaque"


@dataclass(frozen=True, eq=False)
class Origin:
    """The original ONNX node that one or more IR nodes were decoded from.

    When every IR node of an origin survives unchanged, the saver writes the original node back
    (lossless: name, doc string, metadata and exact attribute form are kept).
    """

    proto: onnx.NodeProto
    size: int


@dataclass(frozen=True, eq=False)
class Node:
    """One operation. Identity (not value) equality: an unchanged node is the same object in every
    graph the search derives, which the saver and the incremental cost rely on.

    ``op`` is an op-table name (``xflow.ops.OPS``) or ``OPAQUE``. Missing optional inputs are "".
    """

    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Attrs = field(default_factory=Attrs)
    name: str = ""
    origin: Origin | None = None
    implicit: tuple[str, ...] = ()  # outer-scope values read by subgraphs (If/Loop/Scan bodies)

    @property
    def is_opaque(self) -> bool:
        """True for nodes outside the substitution algebra, carried through untouched."""
        return self.op == OPAQUE

    @property
    def onnx_type(self) -> str:
        """The ONNX op type (domain-qualified for non-default domains) for display."""
        if self.is_opaque and self.origin is not None:
            p = self.origin.proto
            return f"{p.domain}::{p.op_type}" if p.domain not in ("", "ai.onnx") else p.op_type
        return self.op

    @property
    def label(self) -> str:
        """How steps and messages name the node: its name, or its first output's."""
        return self.name or self.outputs[0]

    def signature(self) -> tuple:
        """Structural identity without names: op, attributes and, for opaque nodes, the proto bytes."""
        return self._signature

    @cached_property
    def _signature(self) -> tuple:
        if self.is_opaque and self.origin is not None:
            body = self.origin.proto
            stripped = onnx.NodeProto()
            stripped.CopyFrom(body)
            del stripped.input[:]
            del stripped.output[:]
            stripped.name = ""
            return (self.op, stripped.SerializeToString(deterministic=True))
        return (self.op, self.attrs)

    @cached_property
    def local_hash(self) -> int:
        """A 128-bit hash of the node with its value names; a graph's hash is the sum over its nodes.
        Names identify computations: original values keep their names through rewrites and new ones
        are named after their content (see ``xflow.rewrite.apply``)."""
        text = repr((self._signature, self.inputs, self.outputs, self.implicit)).encode()
        return int.from_bytes(hashlib.blake2b(text, digest_size=16).digest(), "little")

    def __repr__(self) -> str:
        attrs = "" if not self.attrs else f" {dict(self.attrs)}"
        return f"<{self.onnx_type}{attrs} {list(self.inputs)} -> {list(self.outputs)}>"
