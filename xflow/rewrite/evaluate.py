"""Constant subgraphs the rewrites do not touch, evaluated once: a value that nodes compute from constants alone
becomes an initializer, and the nodes nothing reads any more go.

Exports compute masks and tables from constants (Whisper-tiny's causal masks: ConstantOfShape, Trilu, Equal, Where,
Expand; ALBERT's embedding masks); ONNX Runtime folds them when it loads the model, so the model runs no faster
without them, but it is the simpler model to ship, as onnxsim and onnxslim write it. ``fold_constants`` folds what
the rewrites made, with the op table's kernels; this folds the rest, with ONNX Runtime, the engine the model was
exported for, so the values are those the original computes.

Only ops whose result ONNX defines exactly are evaluated (``xflow.ops.standard_facts.EXACT``: data movement,
comparisons, selection, integer arithmetic and the IEEE-rounded four operations), never transcendental ones (Exp,
Sin, Erf, Pow: their values are the kernel's), so the values do not depend on the machine and ``check_step``
recomputes them bit for bit anywhere. A value larger than ``MAX_BYTES`` stays computed (an Expand of a scalar into a
large tensor would grow the file), and so do graph outputs and values a subgraph reads. A model with control flow is
left as it is: a value made an initializer lets ONNX Runtime pick If branches at load and check the branch not taken
against it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from xflow.digest import array_hash
from xflow.ir import Graph, Node
from xflow.ir.tensor import Constant
from xflow.ops import DEFAULT_DOMAINS, OPS
from xflow.ops.standard_facts import EXACT

#: the certificate's name for the step
KIND = "evaluated"

#: the most bytes one evaluated value may hold (a mask of a 448-token decoder is 784 KiB of float32)
MAX_BYTES = 1 << 20


@dataclass(frozen=True)
class EvaluatedStep:
    """The values evaluated (name -> array), the nodes deleted (by label) and the graph made."""

    values: dict[str, np.ndarray]
    removed: tuple[str, ...]
    graph: Graph

    def record(self) -> dict[str, Any]:
        """What the certificate states of the step: each value's dtype, shape and sha256 of its bytes."""
        return {"kind": KIND,
                "values": {name: {"dtype": a.dtype.str, "shape": list(a.shape), "sha256": array_hash(a)}
                           for name, a in sorted(self.values.items())},
                "removed": list(self.removed), "graph": self.graph.structural_hash}


def _exact(node: Node) -> bool:
    """A node of the standard domain whose every ONNX op is exact (``EXACT``), without subgraphs."""
    if node.implicit:
        return False
    if node.is_opaque:
        if node.origin is None:
            return False
        proto = node.origin.proto
        return proto.domain in DEFAULT_DOMAINS and proto.op_type in EXACT and not any(
            a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in proto.attribute)
    op = OPS.get(node.op)
    return op is not None and not op.domain and all(t in EXACT for t in op.onnx_types)


def _has_control_flow(graph: Graph) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
               for n in graph.nodes if n.is_opaque and n.origin is not None for a in n.origin.proto.attribute)


def _reads(node: Node, available: set[str]) -> set[str]:
    """What ``node`` reads as it is written: its inputs, and its original proto's where every value that proto
    reads is still ``available`` (the writer then writes the node as that proto, which may read values the IR node
    holds as attributes: a Reshape's computed target; else it encodes the node anew from the IR)."""
    read = {i for i in (*node.inputs, *node.implicit) if i}
    if node.origin is not None:
        original = {i for i in node.origin.proto.input if i}
        if node.is_opaque or original <= available:
            read |= original
    return read


def _available(graph: Graph) -> set[str]:
    return {*graph.inputs, *graph.constants, *graph.producers}


def constant_nodes(graph: Graph) -> tuple[list[Node], list[str]]:
    """The exact nodes computing from constants alone (in graph order), and of their values those read by
    the rest of the graph, that are graph outputs or that a subgraph reads excepted (the frontier, in order)."""
    if _has_control_flow(graph):
        return [], []
    available = _available(graph)
    known = {name for name in graph.constants if graph.is_constant(name)}
    found: list[Node] = []
    for node in graph.nodes:
        if _exact(node) and _reads(node, available) <= known and node.outputs and all(node.outputs):
            found.append(node)
            known.update(node.outputs)
    members = {id(n) for n in found}
    read_outside = {name for n in graph.nodes if id(n) not in members for name in _reads(n, available)}
    captured = {name for n in graph.nodes for name in n.implicit}
    frontier = [o for n in found for o in n.outputs
                if o in read_outside and o not in graph.output_set and o not in captured]
    return found, frontier


def _sized(graph: Graph, names: list[str]) -> list[str]:
    """The values of ``names`` whose type is known, static and at most ``MAX_BYTES``."""
    kept = []
    for name in names:
        t = graph.types.get(name)
        if t is None or t.shape is None or not all(isinstance(d, int) for d in t.shape):
            continue
        if t.size * t.np_dtype.itemsize <= MAX_BYTES:
            kept.append(name)
    return kept


def _run(graph: Graph, nodes: list[Node], outputs: list[str]) -> dict[str, np.ndarray] | None:
    """The values ``outputs`` of ``nodes`` computed by ONNX Runtime (one session of just those nodes, no graph
    optimizations, one thread); None when it cannot make or run that model."""
    import onnxruntime as ort

    needed = _ancestors(nodes, outputs)  # not the rest: a constant Transpose of a weight nothing small derives from
    sub = Graph(tuple(n for n in nodes if id(n) in needed), (), tuple(outputs), graph.types, graph.constants,
                graph.context)
    try:
        model = _model(sub)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.intra_op_num_threads = 1
        options.log_severity_level = 4
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        arrays = session.run(outputs, {})
    except Exception:  # noqa: BLE001 - a sub-model ORT refuses is simply not evaluated
        return None
    found = {}
    for name, array in zip(outputs, arrays, strict=True):
        declared = graph.types[name]
        array = np.asarray(array)
        if array.dtype != declared.np_dtype or tuple(array.shape) != tuple(declared.shape):
            return None  # what the model declares wins: a disagreement is not ours to settle
        found[name] = array
    return found


def _ancestors(nodes: list[Node], outputs: list[str]) -> set[int]:
    """ids of the nodes of ``nodes`` (in graph order) that ``outputs`` are computed from."""
    producer = {o: n for n in nodes for o in n.outputs}
    wanted, found = set(outputs), set()
    for node in reversed(nodes):
        if wanted & set(node.outputs):
            found.add(id(node))
            wanted.update(i for i in (*node.inputs, *(node.origin.proto.input if node.origin is not None else ()))
                          if i in producer)
    return found


def _model(sub: Graph) -> onnx.ModelProto:
    """The ONNX model of ``sub``'s nodes as the writer writes them: no inputs, the constants they read as
    initializers, ``sub``'s outputs; the source model's opsets and IR version."""
    from xflow.onnx_io.save import encode_nodes, import_node_domains

    protos, made = encode_nodes(sub)
    read = {i for p in protos for i in p.input if i}
    initializers = [numpy_helper.from_array(sub.constants[name].value(), name)
                    for name in sorted(read) if name in sub.constants]
    initializers += [numpy_helper.from_array(array, name) for name, array in made.items()]
    outputs = [onnx.helper.make_tensor_value_info(name, sub.types[name].dtype, list(sub.types[name].shape))
               for name in sub.outputs]
    template = sub.context.template  # type: ignore[union-attr]
    model = onnx.helper.make_model(onnx.helper.make_graph(protos, "constants", [], outputs, initializers),
                                   opset_imports=list(template.opset_import))
    model.ir_version = template.ir_version
    import_node_domains(model)
    return model


def evaluate_constants(graph: Graph) -> EvaluatedStep | None:
    """``graph``'s constant subgraphs evaluated (the module's doc); None when nothing changes."""
    nodes, frontier = constant_nodes(graph)
    wanted = _sized(graph, frontier)
    if not wanted:
        return None
    values = _run(graph, nodes, wanted)
    if values is None:
        return None
    made, removed = apply_values(graph, values)
    if not removed:
        return None
    return EvaluatedStep(values, removed, made)


def apply_values(graph: Graph, values: Mapping[str, np.ndarray]) -> tuple[Graph, tuple[str, ...]]:
    """``graph`` with ``values`` as initializers (their nodes gone) and then every exact node computing from
    constants that nothing reads deleted; and the deleted nodes' labels."""
    nodes, _ = constant_nodes(graph)
    members = {id(n) for n in nodes}
    available = _available(graph)
    read = set(graph.outputs)
    kept: list[Node] = []
    removed: list[str] = []
    for node in reversed(graph.nodes):  # readers come after what they read: one pass backwards
        if id(node) in members and (all(o in values for o in node.outputs) or not (set(node.outputs) & read)):
            removed.append(node.label)
            continue
        kept.append(node)
        read.update(_reads(node, available))
    # in the order of their names, as a replay reads them from the certificate
    # (np.ascontiguousarray would make a scalar a one-element vector)
    constants = {name: Constant.from_array(np.require(values[name], requirements="C")) for name in sorted(values)}
    made = graph.with_nodes(reversed(kept), constants=constants)
    return made, tuple(sorted(removed))


def check_step(graph: Graph, step: Mapping[str, Any]) -> Graph:
    """The graph a certificate's ``evaluated`` step makes of ``graph``: the values recomputed by ONNX Runtime from
    the nodes that compute them here, each equal bit for bit to the one stated, the nodes deleted those stated, the
    graph made the one stated. ValueError naming the first claim that fails."""
    stated = step.get("values", {})
    nodes, frontier = constant_nodes(graph)
    missing = [name for name in stated if name not in frontier]
    if missing:
        raise ValueError(f"{missing[0]} is not a value computed from constants by exact ops")
    values = _run(graph, nodes, list(stated))
    if values is None:
        raise ValueError("ONNX Runtime cannot compute the values stated")
    for name, claim in stated.items():
        array = values[name]
        if [array.dtype.str, list(array.shape), array_hash(array)] != \
                [claim.get("dtype"), claim.get("shape"), claim.get("sha256")]:
            raise ValueError(f"{name} recomputed differs from the value stated")
    made, removed = apply_values(graph, values)
    if list(removed) != list(step.get("removed", [])):
        raise ValueError("the nodes deleted are not those stated")
    if made.structural_hash != step.get("graph"):
        raise ValueError("the graph made is not the one stated")
    return made
