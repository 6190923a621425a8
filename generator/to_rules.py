"""Turn surviving pairs into xflow rules (the JSON rule format of ``xflow.rules.model``).

The side with fewer ops is the target (ties: the smaller canonical text). Inputs of the weight families
(w*, kernels, the scalar) are ``const``, the others ``any``. An attribute shared by source and target
(conv/pool strides and pads, concat/split axis) becomes a variable when every other menu value that both
sides accept on these shapes keeps them equal (checked on the int inputs), otherwise a literal. The pair was
found on fixed shapes; ``generator.generalize`` turns it into shape-generic variants for the verifier.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any

import numpy as np
from xflow.generator.enumerate import INPUTS, Graph, IntEvaluator, tensor_fp
from xflow.generator.fingerprint import MemoEvaluator, Pair, expressions, match_outputs
from xflow.generator.generalize import tensor_names, variants
from xflow.generator.group_variable import with_group_variable
from xflow.generator.prune import renaming_key

from xflow.ir import Attrs
from xflow.ops import OPS


def _generalizable_attrs() -> tuple[tuple[str, tuple[str, ...], str, tuple[Any, ...]], ...]:
    """(variable, ops, attribute, alternative values tried), from the op table's ``AttrSpec.generalize``."""
    groups: dict[tuple[str, str, tuple[Any, ...]], list[str]] = {}
    for name in sorted(OPS):
        for spec in OPS[name].attrs:
            if spec.generalize is not None:
                groups.setdefault((spec.generalize.var, spec.name, spec.generalize.alternatives), []).append(name)
    return tuple((var, tuple(ops), attr, alts) for (var, attr, alts), ops in groups.items())


GENERALIZABLE = _generalizable_attrs()

INPUT_NAMES = tuple(n for n, _, _, _ in INPUTS)
INPUT_KIND = {n: k for n, _, k, _ in INPUTS}
INPUT_SHAPE = {n: s for n, _, _, s in INPUTS}


def _substitute(graph: Graph, ops: tuple[str, ...], attr: str, value: Any) -> Graph:
    return tuple((op, Attrs({**attrs, attr: value}) if op in ops and attr in attrs else attrs, ins)
                 for op, attrs, ins in graph)


def _generalizable(pair: Pair, mapping, ops: tuple[str, ...], attr: str, alternatives, evaluator: MemoEvaluator
                   ) -> Any:
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
        found_a = evaluator.values(_substitute(pair.a.graph, ops, attr, alt))
        found_b = evaluator.values(_substitute(pair.b.graph, ops, attr, alt))
        if found_a is None and found_b is None:
            continue
        if found_a is None or found_b is None:
            return None
        va, vb = found_a[0], found_b[0]
        if any(va[x].shape != vb[y].shape or tensor_fp(va[x]) != tensor_fp(vb[y]) for x, y in mapping):
            return None
        checked += 1
    return value if checked else None


@functools.lru_cache(maxsize=8192)
def _shapes(graph: Graph) -> tuple[tuple[int, ...], ...]:
    """Every tensor's shape on the enumeration shapes: the inputs', then each op's outputs (cached: a pair's
    rule is made in both directions, and a bucket's smallest graph is in all of its pairs)."""
    shapes = [tuple(INPUT_SHAPE[n]) for n in INPUT_NAMES]
    for op, attrs, ins in graph:
        shapes.extend(tuple(out) for out in OPS[op].infer([shapes[t] for t in ins], attrs))
    return tuple(shapes)


@functools.lru_cache(maxsize=4)
def _int_inputs(seed: int) -> list[np.ndarray]:
    """The seeded int inputs, drawn once per process (drawing them took a fifth of the emission time)."""
    return IntEvaluator(seed).inputs


def attribute_evaluator(seed: int) -> MemoEvaluator:
    """The evaluator ``rule_variables`` tries other attribute values with (shape rules checked); one shared by
    many pairs saves re-evaluating the subexpressions they share."""
    return MemoEvaluator(_int_inputs(seed), integer=True, check_shapes=True)


def rule_variables(pair: Pair, seed: int, evaluator: MemoEvaluator | None = None) -> dict[tuple[str, str], str]:
    """(op, attribute) -> variable name, for the attributes the pair's equality does not depend on. The same
    for the pair in either direction. ``evaluator``: ``attribute_evaluator(seed)``, shared across calls."""
    mapping = match_outputs(pair.a, pair.b)
    assert mapping is not None
    evaluator = attribute_evaluator(seed) if evaluator is None else evaluator
    variables: dict[tuple[str, str], str] = {}
    for var, ops, attr, alternatives in GENERALIZABLE:
        if _generalizable(pair, mapping, ops, attr, alternatives, evaluator) is not None:
            for op in ops:
                variables[(op, attr)] = var
    return variables


def rule_name(key: tuple[str, str], max_ops: int) -> str:
    """The name of the rule of a pair whose ``renaming_key`` is ``key``."""
    return f"g{max_ops}_{hashlib.sha1(f'{key[0]} => {key[1]}'.encode()).hexdigest()[:10]}"


def pair_to_rule(pair: Pair, seed: int, max_ops: int, variables: dict[tuple[str, str], str] | None = None,
                 key: tuple[str, str] | None = None) -> dict[str, Any]:
    """The candidate of one pair (``pair.a`` is the source): a JSON rule with its shape-generic ``variants``
    (most general first, see ``generator.generalize``) under the key ``"variants"``. ``variables`` is
    ``rule_variables(pair, seed)`` when the caller has it (from the pair in the other direction), ``key`` its
    ``renaming_key``."""
    mapping = match_outputs(pair.a, pair.b)
    assert mapping is not None
    if variables is None:
        variables = rule_variables(pair, seed)
    src_names = tensor_names(pair.a.graph, INPUT_NAMES, "s")
    dst_names = tensor_names(pair.b.graph, INPUT_NAMES, "d")
    used = [INPUT_NAMES[i] for i in sorted(pair.a.inputs_used)]
    key = renaming_key(pair) if key is None else key
    ta, tb = expressions(pair.a.graph), expressions(pair.b.graph)
    doc = " ; ".join(sorted(ta[t] for t in pair.a.outputs)) + " -> " + " ; ".join(sorted(tb[t] for t in pair.b.outputs))
    base = {
        "name": rule_name(key, max_ops),
        "doc": doc,
        "inputs": {n: INPUT_KIND[n] for n in used},
        "provenance": {"generator": {"seed": seed, "max_ops": max_ops, "version": 2},
                       "fingerprint": f"{pair.fingerprint:016x}",
                       "found_on": {n: list(INPUT_SHAPE[n]) for n in used}},
    }
    outputs = {src_names[x]: dst_names[y] for x, y in mapping}
    ranks = {n: len(INPUT_SHAPE[n]) for n in used}
    found = with_group_variable(variants(pair.a.graph, pair.b.graph, INPUT_NAMES, ranks, used,
                                         (_shapes(pair.a.graph), _shapes(pair.b.graph)), variables, outputs, base))
    return {**found[0], "variants": found}
