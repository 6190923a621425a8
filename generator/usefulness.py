"""Which candidates can fire on real models: under ``--limit``, those are verified first.

A candidate is matched against the zoo's graphs in its most general variant (the fewest preconditions),
as generated and in its bias and batchnorm lifts (the enumeration's convs have no bias, the zoo's do), with
the same matcher the search uses. A candidate that matches nowhere may still be true and useful elsewhere;
it is only verified later.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from xflow.generator.lift import lift_candidates

from xflow.ir import Graph
from xflow.ops import OPS
from xflow.rewrite.match import RuleIndex
from xflow.rules.model import Rule, RuleError, parse_rule

#: The zoo models matched by default: the paper's benchmark models.
ZOO_MODELS = ("resnet50", "resnext50", "inception_v3", "squeezenet", "bert", "nasnet_a", "nasrnn")


def zoo_graphs(names: Sequence[str] = ZOO_MODELS) -> list[Graph]:
    """The IR graphs of the named zoo models, small variants (the same ops and wiring with fewer layers and
    channels: matching needs the structure, not gigabytes of weights)."""
    from xflow import zoo
    from xflow.onnx_io import graph_from_model

    return [graph_from_model(zoo.build(name, small=True)) for name in names]


def _forms(candidate: dict[str, Any]) -> list[Rule]:
    rules = []
    for form in (candidate, *lift_candidates([candidate])):
        first = (form.get("variants") or [form])[0]
        try:
            rules.append(parse_rule({k: v for k, v in first.items() if k != "variants"}))
        except RuleError:
            continue
    return rules


def match_counts(candidates: Sequence[dict[str, Any]], graphs: Sequence[Graph]) -> list[int]:
    """Per candidate, how many matches its forms (as generated, bias-lifted, batchnorm-lifted) find in
    ``graphs`` together."""
    owners: list[int] = []
    rules: list[Rule] = []
    for i, candidate in enumerate(candidates):
        for rule in _forms(candidate):
            rules.append(rule)
            owners.append(i)
    counts = [0] * len(candidates)
    if not rules:
        return counts
    index = RuleIndex(rules)
    by_rule = {id(rule): owner for rule, owner in zip(rules, owners, strict=True)}
    for graph in graphs:
        for match in index.all_matches(graph):
            counts[by_rule[id(match.rule)]] += 1
    return counts


def batches_independent_elementwise(rule: dict[str, Any]) -> bool:
    """True for a rule whose source is two or more unconnected elementwise ops that share no tensor, such as
    ``relu(a) ; relu(b) -> split(relu(concat(a, b)))``. Such a rule is proved, but it matches every pair of
    those ops in a graph (28,000 matches in NasNet-A), which floods the search, and it cannot pay off on a
    CPU: the concat and split only add copies around an op whose cost is linear in its data."""
    src = rule["src"]
    if len(src) < 2 or not all(n["op"] in OPS and OPS[n["op"]].elementwise for n in src):
        return False
    parent = list(range(len(src)))

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    seen: dict[str, int] = {}
    for i, node in enumerate(src):
        for name in (*node["in"], *node["out"]):
            if name in seen:
                parent[root(i)] = root(seen[name])
            else:
                seen[name] = i
    return len({root(i) for i in range(len(src))}) > 1
