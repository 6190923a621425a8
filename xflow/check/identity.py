"""A split simplification as a certificate step that the checker re-establishes on its own.

The step states the nodes it removes and the nodes it adds (op, attributes, inputs, outputs). The checker finds the
removed nodes in the graph, builds the added ones with the op table (their outputs typed by its shape rules),
requires every value the rest of the graph reads from the removed nodes to be made again by the added ones, and
decides that the added nodes compute each such value as the removed ones did (``terms.same_terms``: the same
expression of the same input elements). Nothing of ``xflow.rewrite.simplify``'s reasoning is trusted."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from xflow.check.terms import NotDecided, same_terms
from xflow.errors import one_line
from xflow.ir import Attrs, Graph, Node, TensorType
from xflow.ir.graph import CycleError, topological_sort
from xflow.ops import OPS
from xflow.rewrite.simplify import Instance

KIND = "simplification"


def node_record(node: Node) -> dict[str, Any]:
    """How an identity step states a node: op, attributes, inputs and outputs."""
    from xflow.check.certificate import plain

    return {"op": node.op, "attrs": plain(dict(node.attrs)), "inputs": list(node.inputs),
            "outputs": list(node.outputs)}


def identity_record(instance: Instance) -> dict[str, Any]:
    """The step of one split simplification: its form, the nodes removed and added, and the graph it makes."""
    return {"kind": KIND, "form": instance.form, "removed": [node_record(n) for n in instance.removed],
            "added": [node_record(n) for n in instance.added], "graph": instance.graph.structural_hash}


def apply_identity(graph: Graph, step: Mapping[str, Any]) -> Graph:
    """The graph ``step`` makes of ``graph``, each of its claims re-established; ValueError saying which fails."""
    producers = graph.producers
    removed: list[Node] = []
    for record in step.get("removed", []):
        outputs = record.get("outputs") or [""]
        node = producers.get(outputs[0])
        if node is None or node.is_opaque or node_record(node) != record:
            raise ValueError(f"the node making {outputs[0]} is not the {record.get('op')} stated")
        removed.append(node)
    gone = {id(n) for n in removed}
    if len(gone) != len(removed):
        raise ValueError("a node is removed twice")
    added = [_node(record) for record in step.get("added", [])]
    made_before = {o for n in removed for o in n.outputs if o}
    made_after = {o for n in added for o in n.outputs if o}
    for name in made_after - made_before:
        if name in graph.types:
            raise ValueError(f"an added node makes {name}, which the graph has already")
    kept = [n for n in graph.nodes if id(n) not in gone]
    read_outside = {i for n in kept for i in (*n.inputs, *n.implicit)} | set(graph.outputs)
    exported = sorted(made_before & read_outside)
    missing = [name for name in exported if name not in made_after]
    if missing:
        raise ValueError(f"{missing[0]}, which the rest of the graph reads, is no longer made")
    for node in added:
        for name in node.inputs:
            if name in made_before and name not in made_after:
                raise ValueError(f"an added node reads {name}, a value the step removes")
    types = _types(graph, added)
    fresh = {name: t for name, t in types.items() if name not in graph.types}
    try:
        ordered = topological_sort(added, (), ())
    except CycleError:
        raise ValueError("the added nodes make a cycle") from None
    try:
        same_terms(removed, ordered, exported, lambda name: types.get(name) or graph.types[name])
    except NotDecided as exc:
        raise ValueError(f"the nodes added do not compute what the nodes removed did: {exc}") from None
    except (ValueError, IndexError, TypeError, KeyError) as exc:  # numpy's refusal: shapes that do not fit
        raise ValueError(f"the nodes stated cannot be evaluated: {one_line(exc)}") from None
    return graph.with_nodes(kept + added, types=fresh)


def _node(record: Mapping[str, Any]) -> Node:
    op = record.get("op")
    if op not in OPS:
        raise ValueError(f"an added node's op {op!r} is not in the op table")
    try:
        attrs = OPS[op].normalize_attrs({k: _tuples(v) for k, v in dict(record.get("attrs", {})).items()})
    except Exception as exc:  # noqa: BLE001 - the op table's refusal, said as the step's fault
        raise ValueError(f"an added {op}'s attributes are not valid: {exc}") from None
    return Node(op, tuple(record.get("inputs", ())), tuple(record.get("outputs", ())), Attrs(attrs))


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _types(graph: Graph, added: list[Node]) -> dict[str, TensorType]:
    """The added nodes' outputs typed by the op table's shape and dtype rules, in dependency order."""
    types: dict[str, TensorType] = {}
    try:
        ordered = topological_sort(added, (), ())
    except CycleError:
        raise ValueError("the added nodes make a cycle") from None
    for node in ordered:
        spec = OPS[node.op]
        try:
            ins = [types.get(i) or graph.types[i] for i in node.inputs]
            shapes = spec.infer([t.shape for t in ins], node.attrs)
            dtype = spec.output_dtype([t.dtype for t in ins], node.attrs)
        except KeyError as exc:
            raise ValueError(f"an added {node.op} reads {exc.args[0]}, which is not in the graph") from None
        except Exception as exc:  # noqa: BLE001 - the shape rule's refusal (ShapeError and kin)
            raise ValueError(f"an added {node.op} does not fit its inputs: {exc}") from None
        for name, shape in zip(node.outputs, shapes, strict=True):
            types[name] = TensorType(dtype, shape)
    return types


__all__ = ["KIND", "apply_identity", "identity_record", "node_record"]
