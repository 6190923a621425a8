"""Turn surviving pairs into xflow rules (the JSON rule format of ``xflow.rules.model``).

The side with fewer ops is the target (ties: the smaller canonical text). Inputs of the weight families
(w*, kernels, the scalar) are ``const``, the others ``any``. Each input's shape is pinned by a ``where``
clause: the identity was found (and checked) on these shapes only. An attribute shared by source and
target (conv/pool strides and pads, concat/split axis) becomes a variable when every other menu value that
both sides accept on these shapes keeps them equal (checked on the int inputs), otherwise a literal.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from generator.enumerate import INPUTS, Graph, IntEvaluator, tensor_fp
from generator.fingerprint import N_IN, Pair, expressions, match_outputs
from generator.prune import renaming_key
from xflow.ir import Attrs
from xflow.ops import OPS, ShapeError

#: (variable, ops, attribute, alternative values tried)
GENERALIZABLE: tuple[tuple[str, tuple[str, ...], str, tuple[Any, ...]], ...] = (
    ("cs", ("conv",), "strides", ((1, 1), (2, 2))),
    ("cp", ("conv",), "pads", ((0, 0, 0, 0), (1, 1, 1, 1), (0, 1, 0, 1), (1, 0, 1, 0))),
    ("ps", ("avgpool", "maxpool"), "strides", ((1, 1), (2, 2))),
    ("pp", ("avgpool", "maxpool"), "pads", ((0, 0, 0, 0), (1, 1, 1, 1))),
    ("axis", ("concat", "split"), "axis", (0, 1, 2, 3)),
)

INPUT_NAMES = tuple(n for n, _, _, _ in INPUTS)
INPUT_KIND = {n: k for n, _, k, _ in INPUTS}
INPUT_SHAPE = {n: s for n, _, _, s in INPUTS}


def _substitute(graph: Graph, ops: tuple[str, ...], attr: str, value: Any) -> Graph:
    return tuple((op, Attrs({**attrs, attr: value}) if op in ops and attr in attrs else attrs, ins)
                 for op, attrs, ins in graph)


def _try_eval(graph: Graph, inputs: list[np.ndarray]) -> list[np.ndarray] | None:
    values = list(inputs)
    shapes = [tuple(v.shape) for v in values]
    with np.errstate(over="ignore"):
        for op, attrs, ins in graph:
            try:
                out_shapes = OPS[op].infer([shapes[t] for t in ins], attrs)
            except ShapeError:
                return None
            outs = OPS[op].evaluate_int(np, [values[t] for t in ins], attrs)
            values.extend(np.asarray(o) for o in outs)
            shapes.extend(tuple(s) for s in out_shapes)
    return values


def _generalizable(pair: Pair, mapping, ops: tuple[str, ...], attr: str, alternatives, inputs) -> Any:
    """The shared value of ``attr`` when it can become a variable, else None."""
    vals_a = [attrs[attr] for op, attrs, _ in pair.a.graph if op in ops and attr in attrs]
    vals_b = [attrs[attr] for op, attrs, _ in pair.b.graph if op in ops and attr in attrs]
    if not vals_a or not vals_b or len(set(vals_a + vals_b)) != 1:
        return None
    value = vals_a[0]
    checked = 0
    for alt in alternatives:
        if alt == value:
            continue
        va = _try_eval(_substitute(pair.a.graph, ops, attr, alt), inputs)
        vb = _try_eval(_substitute(pair.b.graph, ops, attr, alt), inputs)
        if va is None and vb is None:
            continue
        if va is None or vb is None:
            return None
        if any(va[x].shape != vb[y].shape or tensor_fp(va[x]) != tensor_fp(vb[y]) for x, y in mapping):
            return None
        checked += 1
    return value if checked else None


def _nodes(graph: Graph, prefix: str, variables: dict[tuple[str, str], str]) -> tuple[list[dict], list[str]]:
    names = list(INPUT_NAMES)
    nodes = []
    for op, attrs, ins in graph:
        n = OPS[op].num_outputs(attrs)
        outs = [f"{prefix}{len(names) - N_IN + k}" for k in range(n)]
        node: dict[str, Any] = {"op": op, "in": [names[t] for t in ins], "out": outs}
        rendered = {}
        for key, value in attrs.items():
            var = variables.get((op, key))
            rendered[key] = f"?{var}" if var else (list(value) if isinstance(value, tuple) else value)
        if rendered:
            node["attrs"] = rendered
        nodes.append(node)
        names.extend(outs)
    return nodes, names


def pair_to_rule(pair: Pair, seed: int, max_ops: int) -> dict[str, Any]:
    """The JSON rule of one pair (``pair.a`` is the source)."""
    mapping = match_outputs(pair.a, pair.b)
    assert mapping is not None
    inputs = IntEvaluator(seed).inputs
    variables: dict[tuple[str, str], str] = {}
    for var, ops, attr, alternatives in GENERALIZABLE:
        if _generalizable(pair, mapping, ops, attr, alternatives, inputs) is not None:
            for op in ops:
                variables[(op, attr)] = var
    src, src_names = _nodes(pair.a.graph, "s", variables)
    dst, dst_names = _nodes(pair.b.graph, "d", variables)
    used = sorted(pair.a.inputs_used)
    key = renaming_key(pair)
    text = f"{key[0]} => {key[1]}"
    digest = hashlib.sha1(text.encode()).hexdigest()[:10]
    ta, tb = expressions(pair.a.graph), expressions(pair.b.graph)
    doc = " ; ".join(sorted(ta[t] for t in pair.a.outputs)) + " -> " + " ; ".join(sorted(tb[t] for t in pair.b.outputs))
    return {
        "name": f"g{max_ops}_{digest}",
        "doc": doc,
        "inputs": {INPUT_NAMES[i]: INPUT_KIND[INPUT_NAMES[i]] for i in used},
        "src": src,
        "dst": dst,
        "outputs": {src_names[x]: dst_names[y] for x, y in mapping},
        "where": [f"shape({INPUT_NAMES[i]}) == {tuple(INPUT_SHAPE[INPUT_NAMES[i]])}" for i in used],
        "provenance": {"generator": {"seed": seed, "max_ops": max_ops, "version": 1},
                       "fingerprint": f"{pair.fingerprint:016x}"},
    }
