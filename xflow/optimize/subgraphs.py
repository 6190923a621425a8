"""What each rewrite step matched and what it put in its place, as small subgraphs a page can draw (the report's
``steps[i]["before"]``, ``["after"]`` and ``["aliases"]``). Nodes are named by the ONNX op they are written as,
never by the algebra's own names."""

from __future__ import annotations

from typing import Any

from xflow.ir import Node
from xflow.ops import OPS
from xflow.rewrite.apply import produced
from xflow.search import Step

#: The longest attribute value a node record states in full (a reshape's target, a perm); longer ones are cut.
ATTR_CHARS = 60


def onnx_op(node: Node) -> str:
    """The ONNX op type ``node`` is written as (domain-qualified outside the default domain): an opaque node's or a
    node decoded alone from one ONNX node keeps that node's type (a Gemm without bias), others their op's first
    ONNX form ("Conv + Relu" for a conv whose activation is fused)."""
    if node.origin is not None and (node.is_opaque or node.origin.size == 1):
        proto = node.origin.proto
        return proto.op_type if proto.domain in ("", "ai.onnx") else f"{proto.domain}::{proto.op_type}"
    op = OPS.get(node.op)
    if op is None:
        return node.onnx_type
    written = op.onnx_types[0] if not op.domain else f"{op.domain}::{op.onnx_types[0]}"
    # TASO's conv with its activation fused is written as two ONNX nodes
    return f"{written} + Relu" if node.attrs.get("act") == "relu" else written


def node_record(node: Node) -> dict[str, Any]:
    """One node as the report states it for a picture: ONNX op, name, inputs, outputs, attributes as short text."""
    attrs = {}
    for key, value in node.attrs.items():
        text = str(list(value) if isinstance(value, tuple) else value)
        attrs[key] = text if len(text) <= ATTR_CHARS else text[:ATTR_CHARS - 1] + "…"
    return {"op": onnx_op(node), "name": node.name, "inputs": [i for i in node.inputs if i],
            "outputs": [o for o in node.outputs if o], "attrs": attrs}


def step_subgraphs(step: Step) -> dict[str, Any]:
    """``before``: the nodes ``step`` matched; ``after``: the nodes its rule's target put there; ``aliases``: the
    source outputs that became another value (a cancelled pair's output is its input). Empty when the step does
    not hold its match."""
    if step.match is None:
        return {}
    nodes, aliases = produced(step.match)
    return {"before": [node_record(n) for n in step.match.nodes], "after": [node_record(n) for n in nodes],
            "aliases": aliases}
