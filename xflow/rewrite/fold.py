"""Fold constant-only subgraphs made by rewrites (concatenated weights, enlarged kernels, scaled
weights, TASO's constant tensors) into new initializers."""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field

import numpy as np

from xflow.ir import Constant, Graph, Node
from xflow.ops import OPS


@dataclass
class FoldMemo:
    """What earlier ``fold_constants`` calls folded, for graphs that share their constants (the finalists of one
    run, each a rewrite of the same model): the same node on the same constants gives the same arrays, computed and
    held once, not once per finalist (ConvNeXt-tiny's layer scales folded into its weights: 150 MB over its
    finalists). Keyed by the node's op and attributes and the identity of each input: a ``Constant`` object, or an
    array this memo holds; ``held`` keeps those objects alive while their ids key ``results``."""

    results: dict[tuple, list[np.ndarray]] = field(default_factory=dict)
    held: list[object] = field(default_factory=list)


def fold_constants(graph: Graph, max_bytes: int = 1 << 31, memo: FoldMemo | None = None) -> Graph:
    """Evaluate every new op-table node whose inputs are all constants with the reference kernel
    (numpy) and replace it by initializers. Nodes from the source model are left alone: folding the
    user's own constant subgraphs is not ours to do; but where such a node passes a constant on (an
    Identity of a tied weight, as exports write every bias), its value is known, and a new node reading
    it folds as if it read the constant. With ``memo``, a node folded before on the same inputs reuses its arrays."""
    constants: dict[str, Constant] = {}
    values: dict[str, np.ndarray] = {}
    forwarded: dict[str, str] = {}  # a source node's output that is its input, unchanged -> that constant
    kept: list[Node] = []
    for node in graph.nodes:
        if node.origin is not None:
            if (not node.is_opaque and OPS[node.op].forwards_input and node.inputs
                    and (graph.is_constant(node.inputs[0]) or node.inputs[0] in forwarded)):
                forwarded[node.outputs[0]] = forwarded.get(node.inputs[0], node.inputs[0])
            kept.append(node)
            continue
        foldable = (not node.is_opaque
                    and all(i in constants or i in forwarded or graph.is_constant(i) for i in node.inputs if i)
                    and all(o not in graph.output_set for o in node.outputs))
        # sizes only of foldable nodes: an opaque node's outputs may have dims no one could infer
        if not foldable or sum(graph.types[o].size * graph.types[o].np_dtype.itemsize
                               for o in node.outputs) > max_bytes:
            kept.append(node)
            continue
        sources = [values[i] if i in values else graph.constants[forwarded.get(i, i)] for i in node.inputs if i]
        key = (node.op, node.attrs, tuple(id(x) for x in sources), tuple(graph.types[o] for o in node.outputs))
        results = memo.results.get(key) if memo is not None else None
        if results is None:
            arrays = [x if isinstance(x, np.ndarray) else x.value() for x in sources]
            results = [np.asarray(array, dtype=graph.types[name].np_dtype)
                       for name, array in zip(node.outputs, OPS[node.op].evaluate(np, arrays, node.attrs),
                                              strict=True)]
            del arrays  # let the inputs go before the next node reads its own (large weights)
            if memo is not None:
                memo.results[key] = results
                memo.held.extend(sources)
        for name, array in zip(node.outputs, results, strict=True):
            values[name] = array
            constants[name] = Constant.from_array(array)
        del sources, results
    if not constants:
        return graph
    return graph.with_nodes(_share_equal(kept, constants, graph.constants), constants=constants)


def _share_equal(nodes: list[Node], constants: dict[str, Constant], earlier: dict[str, Constant]) -> list[Node]:
    """Let new nodes read one constant where several with equal contents were folded (two copies of a
    tied weight concatenated in the same order by different rewrites, now or in an ``earlier`` fold: a
    constant the optimizer made), so the model holds it once. Nodes from the source model keep their
    inputs (they are written as their original protos)."""
    made = {**{k: c for k, c in earlier.items() if c.array is not None and k not in constants}, **constants}
    by_type: dict[tuple, list[str]] = {}
    for name, const in made.items():
        by_type.setdefault((const.array.dtype.str, const.array.shape), []).append(name)  # type: ignore[union-attr]
    first: dict[tuple, str] = {}
    same: dict[str, str] = {}
    for kind, names in by_type.items():
        if len(names) < 2 or not any(n in constants for n in names):
            continue  # nothing new to compare: no hashing (a merged weight can be hundreds of MB)
        for name in names:  # earlier ones first: they are kept, the new copies go
            data = made[name].array  # C-contiguous (Constant.from_array): hashed without a copy
            digest = hashlib.blake2b(data, digest_size=16).digest()
            kept = first.setdefault((kind, digest), name)
            if kept != name and np.array_equal(made[kept].array, data):
                same[name] = kept
    if not same:
        return nodes
    if any(n.origin is not None and any(i in same for i in n.inputs) for n in nodes):
        return nodes
    return [dataclasses.replace(n, inputs=tuple(same.get(i, i) for i in n.inputs))
            if any(i in same for i in n.inputs) else n for n in nodes]
