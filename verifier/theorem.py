"""Which candidates state the same theorem: a rule and its reverse.

The generator emits every pair in both directions (the smaller side is not always the faster one), and the
verifier's query for ``a -> b`` is the one for ``b -> a``: the facts of both sides, the rule's conditions and equal
output shapes are hypotheses, each output's equality the goal (``verifier.encode.encode_rule``). So a direction
refuted refutes the other, and a direction z3 could not prove within its budget is seldom proved the other way
round (z3's search follows the order the terms reach it, which is all that differs). ``theorem_key`` names that
query without z3 (a few strings per variant); ``same_theorem_groups`` gathers the candidates whose key is equal,
so a verifier can run them one after the other in one task (``verifier.batch.verify_group``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

TheoremKey = tuple[frozenset, frozenset, frozenset, tuple]


def _terms(nodes: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Each tensor a side's nodes produce, written as the term that computes it from the rule's inputs."""
    terms: dict[str, str] = {}
    for node in nodes:
        attrs = json.dumps(node.get("attrs", {}), sort_keys=True)
        args = ",".join(terms.get(name, name) for name in node.get("in", ()))
        outs = node.get("out", ())
        for i, name in enumerate(outs):
            index = f"#{i}" if len(outs) > 1 else ""
            terms[name] = f"{node['op']}{index}{attrs}({args})"
    return terms


def theorem_key(raw: dict[str, Any]) -> TheoremKey:
    """What the verifier is asked of the rule ``raw`` (a JSON rule), the same for the rule and its reverse: the
    terms of both sides (their facts are hypotheses), each output's equation unordered, the conditions and the
    inputs."""
    src, dst = _terms(raw.get("src", ())), _terms(raw.get("dst", ()))
    outputs = raw.get("outputs", {})
    equations = frozenset(frozenset((src.get(s, s), dst.get(d, d))) for s, d in outputs.items())
    sides = frozenset((frozenset(src.values()), frozenset(dst.values())))
    where = frozenset(raw.get("where", ()))
    return sides, equations, where, tuple(sorted((raw.get("inputs") or {}).items()))


def same_theorem_groups(candidates: Sequence[dict[str, Any]]) -> list[tuple[int, ...]]:
    """The candidates' indices grouped by ``theorem_key`` of each candidate itself (the rule as found, before its
    generalized variants), every index once, groups ordered by their first index and each in the candidates'
    order."""
    groups: dict[TheoremKey, list[int]] = {}
    for index, candidate in enumerate(candidates):
        groups.setdefault(theorem_key(candidate), []).append(index)
    return sorted(tuple(g) for g in groups.values())
