"""Values computed twice, read once: equal constants become one, and a node that computes what an earlier node
computes (the same op and attributes on the same inputs) goes, its readers reading the earlier one's values.

ALBERT's export repeats its shared layer's attention twelve times, each with its own copies of the mask's
constants, so twelve ``Where`` nodes compute one mask; onnxslim writes it once. The shape arithmetic's sharing
(``xflow.rewrite.shapes``) covers the integer vectors of sizes; this covers the rest: op-table nodes (each the
function its definition states) and standard ONNX nodes of deterministic ops, with constants compared by their
bytes (at most ``MAX_BYTES`` each: a weight is not hashed on every run to find a copy that exports never write).
Graph outputs keep their nodes, and so do values a subgraph reads. ``check_step`` re-derives each claim."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from xflow.ir import Graph, Node
from xflow.ops import DEFAULT_DOMAINS
from xflow.ops.standard_facts import DETERMINISTIC

#: the certificate's name for the step
KIND = "shared"

#: the most bytes a constant compared with the others may hold
MAX_BYTES = 1 << 20


@dataclass(frozen=True)
class SharedStep:
    """The values shared (name -> the earlier equal value its readers now read), the nodes deleted (by label)
    and the graph made."""

    shared: dict[str, str]
    removed: tuple[str, ...]
    graph: Graph

    def record(self) -> dict[str, Any]:
        """What the certificate states of the step."""
        return {"kind": KIND, "shared": dict(sorted(self.shared.items())), "removed": list(self.removed),
                "graph": self.graph.structural_hash}


def _deterministic(node: Node) -> bool:
    """A node whose outputs are a function of its inputs and attributes: an op-table node, or a standard ONNX
    node of a ``DETERMINISTIC`` op without subgraphs."""
    if node.implicit or not node.outputs or not all(node.outputs):
        return False
    if not node.is_opaque:
        return True
    if node.origin is None:
        return False
    proto = node.origin.proto
    return proto.domain in DEFAULT_DOMAINS and proto.op_type in DETERMINISTIC and not any(
        a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in proto.attribute)


def _constant_key(graph: Graph, name: str) -> tuple[Any, ...] | None:
    """What two equal constants share: dtype, shape and a digest of their bytes (None: not compared here)."""
    if not graph.is_constant(name):
        return None
    const = graph.constants[name]
    if const.type.shape is None or const.nbytes > MAX_BYTES:
        return None
    array = np.asarray(const.value())
    if array.dtype.hasobject:
        return None
    data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)  # a flat copy only where it is not contiguous
    return ("constant", array.dtype.str, array.shape, hashlib.blake2b(data, digest_size=16).digest())


def _node_key(node: Node, shared: Mapping[str, str]) -> tuple[Any, ...]:
    """What two nodes computing the same values share: op and attributes and inputs (after the sharing so far)."""
    return ("node", node.signature(), tuple(shared.get(i, i) for i in node.inputs))


def _fixed(graph: Graph) -> set[str]:
    """Values that keep their producers: graph outputs and values subgraphs read."""
    return set(graph.outputs) | {name for n in graph.nodes for name in n.implicit}


def share_values(graph: Graph) -> SharedStep | None:
    """``graph``'s equal constants and repeated nodes shared (the module's doc); None when nothing is."""
    shared: dict[str, str] = {}
    first: dict[tuple[Any, ...], str] = {}
    read = {i for n in graph.nodes for i in n.inputs if i}
    for name in sorted(graph.constants):
        key = _constant_key(graph, name) if name in read else None
        if key is not None:
            kept = first.setdefault(key, name)
            if kept != name:
                shared[name] = kept
    fixed = _fixed(graph)
    by_node: dict[tuple[Any, ...], Node] = {}
    for node in graph.nodes:
        if not _deterministic(node):
            continue
        key = _node_key(node, shared)
        earlier = by_node.get(key)
        if earlier is None or len(earlier.outputs) != len(node.outputs) or set(node.outputs) & fixed:
            by_node.setdefault(key, node)
            continue
        shared.update(zip(node.outputs, earlier.outputs, strict=True))
    made, removed = apply_step(graph, shared)
    if not removed and not any(name in graph.constants and name not in made.constants for name in shared):
        return None  # nothing goes (the readers of a copy are written as their original nodes, which read it)
    return SharedStep(shared, removed, made)


def apply_step(graph: Graph, shared: Mapping[str, str]) -> tuple[Graph, tuple[str, ...]]:
    """``graph`` with the readers of each ``shared`` value reading the value it names and the nodes whose
    outputs are all shared deleted; and the deleted nodes' labels (constants nothing reads go with the graph's
    pruning)."""
    nodes: list[Node] = []
    removed: list[str] = []
    for node in graph.nodes:
        if node.outputs and all(o in shared for o in node.outputs):
            removed.append(node.label)
            continue
        if any(i in shared for i in node.inputs):
            node = dataclasses.replace(node, inputs=tuple(shared.get(i, i) for i in node.inputs))
        nodes.append(node)
    return graph.with_nodes(nodes), tuple(sorted(removed))


def check_step(graph: Graph, step: Mapping[str, Any]) -> Graph:
    """The graph a certificate's ``shared`` step makes of ``graph``, each claim re-derived: two constants of equal
    bytes, or two deterministic nodes of one op and attributes on the same inputs (under the sharing stated), the
    earlier computed first; the nodes deleted and the graph made those stated. ValueError naming the first claim
    that fails."""
    stated: dict[str, str] = dict(step.get("shared", {}))
    fixed = _fixed(graph)
    position = graph.position
    for name, target in stated.items():
        if target in stated:
            raise ValueError(f"{name} -> {target}: {target} is itself shared")
        if name in graph.constants:
            a, b = graph.constants[name].value(), graph.constants.get(target)
            b = b.value() if b is not None else None
            if b is None or not graph.is_constant(name) or not graph.is_constant(target) or a.dtype != b.dtype \
                    or np.shape(a) != np.shape(b) or not np.array_equal(a, b):
                raise ValueError(f"{name} and {target} are not equal constants")
            continue
        node, earlier = graph.producers.get(name), graph.producers.get(target)
        if node is None or earlier is None or not _deterministic(node) or not _deterministic(earlier) \
                or name in fixed or _node_key(node, stated) != _node_key(earlier, stated) \
                or node.outputs.index(name) != earlier.outputs.index(target):
            raise ValueError(f"{name} and {target} are not the same op on the same inputs")
        if position[earlier] >= position[node]:
            raise ValueError(f"{target} is computed after {name}")
    made, removed = apply_step(graph, stated)
    if list(removed) != list(step.get("removed", [])):
        raise ValueError("the nodes deleted are not those stated")
    if made.structural_hash != step.get("graph"):
        raise ValueError("the graph made is not the one stated")
    return made
