"""A standard-domain ``Constant`` node's value as a graph constant, written back as the node it was.

To the rules, folding and the cost model a ``Constant`` node's output is a constant exactly as an initializer of
the same value is (an export's ``Pow(x, 2)`` reads its 2 from one). Load turns each such node into a
``NodeConstant`` (no IR node); save writes one that is still read back as its original node, at its original place
in the node order where the graph lets it: an unchanged model round-trips as it was."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import onnx

from xflow.ir import Constant, TensorType
from xflow.ops import DEFAULT_DOMAINS

_ATTR = onnx.AttributeProto
#: the list forms of a Constant node's value: (element type, rank)
_LISTS = {"value_float": (onnx.TensorProto.FLOAT, 0), "value_floats": (onnx.TensorProto.FLOAT, 1),
          "value_int": (onnx.TensorProto.INT64, 0), "value_ints": (onnx.TensorProto.INT64, 1)}


@dataclass(frozen=True, eq=False)
class NodeConstant(Constant):
    """A constant the source model computes with a ``Constant`` node (``node``, the ``index``-th of its graph);
    ``order``: the index of the node making each value of the source graph, shared by the graph's NodeConstants
    (where the writer puts the node back)."""

    node: onnx.NodeProto | None = field(default=None, repr=False)
    index: int = 0
    order: Mapping[str, int] = field(default_factory=dict, repr=False)


def node_value(node: onnx.NodeProto) -> onnx.TensorProto | None:
    """The tensor a standard-domain ``Constant`` node with one output makes (its ``value``, or a
    ``value_float(s)``/``value_int(s)`` as a tensor), None for any other node: another op, a sparse or string
    value, data in an external file."""
    if node.op_type != "Constant" or node.domain not in DEFAULT_DOMAINS or len(node.output) != 1 \
            or not node.output[0] or len(node.attribute) != 1:
        return None
    attr = node.attribute[0]
    if attr.name == "value" and attr.type == _ATTR.TENSOR:
        tensor = attr.t
        if tensor.data_location == onnx.TensorProto.EXTERNAL or tensor.data_type in (
                onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED):
            return None
        return tensor
    if attr.name in _LISTS:
        dtype, rank = _LISTS[attr.name]
        values = {"value_float": [attr.f], "value_floats": list(attr.floats), "value_int": [attr.i],
                  "value_ints": list(attr.ints)}[attr.name]
        return onnx.helper.make_tensor("", dtype, [len(values)] if rank else [], values)
    return None


def node_constants(graph: onnx.GraphProto, taken: Iterable[str], base_dir: str = "") -> dict[str, NodeConstant]:
    """The graph's ``Constant`` nodes (``node_value``) as constants, by output name: those some node of the graph
    reads (directly or in a subgraph) whose output is no graph output and no initializer (``taken``). The others
    stay nodes: an unread one would not be written back, a graph output stays a node's."""
    outputs = {vi.name for vi in graph.output} | set(taken)
    read = {name for n in graph.node for name in n.input} | _subgraph_reads(graph.node)
    order: dict[str, int] = {}
    found: dict[str, NodeConstant] = {}
    for k, node in enumerate(graph.node):
        order.update((o, k) for o in node.output if o)
        tensor = node_value(node)
        if tensor is None or node.output[0] in outputs or node.output[0] not in read:
            continue
        found[node.output[0]] = NodeConstant(TensorType(tensor.data_type, tuple(int(d) for d in tensor.dims)),
                                             proto=tensor, base_dir=base_dir, node=node, index=k, order=order)
    return found


def _subgraph_reads(nodes: Iterable[onnx.NodeProto]) -> set[str]:
    """Every name a node of a subgraph (at any depth) of ``nodes`` reads (a superset of what they capture)."""
    names: set[str] = set()

    def visit(members: Iterable[onnx.NodeProto], top: bool) -> None:
        for n in members:
            if not top:
                names.update(n.input)
            for attr in n.attribute:
                for sub in ([attr.g] if attr.type == _ATTR.GRAPH else list(attr.graphs)):
                    visit(sub.node, False)

    visit(nodes, True)
    return names


def written_as_nodes(constants: Mapping[str, Constant]) -> dict[str, NodeConstant]:
    """The constants to write as their ``Constant`` nodes: NodeConstants still under their node's output name."""
    return {name: c for name, c in constants.items()
            if isinstance(c, NodeConstant) and c.node is not None and c.node.output[0] == name}


def with_constant_nodes(nodes: list[onnx.NodeProto], constants: Mapping[str, NodeConstant],
                        read: set[str]) -> list[onnx.NodeProto]:
    """``nodes`` with the ``Constant`` nodes of the ``constants`` that are ``read`` put back: each before the first
    node that came after it in the source model (a node counts as where the source made its first output), and in
    any case before the first node reading it; those only graph outputs read, at the end."""
    wanted = sorted((c.index, name) for name, c in constants.items() if name in read)
    if not wanted:
        return nodes
    order = constants[wanted[0][1]].order
    out: list[onnx.NodeProto] = []
    placed: set[str] = set()
    j = 0

    def place(name: str) -> None:
        if name not in placed:
            placed.add(name)
            out.append(constants[name].node)  # type: ignore[arg-type]

    for proto in nodes:
        first = next((o for o in proto.output if o), None)
        at = order.get(first) if first is not None else None
        while at is not None and j < len(wanted) and wanted[j][0] < at:
            place(wanted[j][1])
            j += 1
        for name in (*proto.input, *_subgraph_reads((proto,))):
            if name in constants and name in read:
                place(name)
        out.append(proto)
    for _, name in wanted:
        place(name)
    return out
