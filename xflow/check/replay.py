"""Replaying a certificate's steps on the input graph, each re-established as it is taken: the rule's match
found again by the matcher (its conditions decided for every value of the symbolic dims), folded constants
recomputed with the op table's kernels, each split simplification decided as terms (``xflow.check.identity``), the shape
arithmetic's values recomputed as expressions of the dims (``xflow.rewrite.shapes.check_step``), the constant
subgraphs' values recomputed by ONNX Runtime bit for bit (``xflow.rewrite.evaluate.check_step``), and each
graph's structural hash compared with the one stated. Used by
``xflow check`` and by ``xflow optimize --replay``; none of the search is involved."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from xflow.check.certificate import (
    find_stated,
    fold_record,
    match_record,
    node_label,
    rule_hash,
)
from xflow.check.identity import KIND as IDENTITY
from xflow.check.identity import apply_identity
from xflow.errors import XflowError
from xflow.ir import Graph
from xflow.rewrite import MatchTracer, apply_match, evaluate, fold_constants, share
from xflow.rewrite.shapes import check_step
from xflow.rules import Rule, default_rules_path, load_rules


class StepRefused(Exception):
    """A step of a certificate that does not replay: ``index`` (1-based) and why."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(f"step {index}: {reason}")
        self.index = index
        self.reason = reason


@dataclass(frozen=True)
class Replayed:
    """The graph a certificate's steps make from the input, and the rules its steps applied (by name)."""

    graph: Graph
    steps: int
    rules: dict[str, Rule]


def rules_for(certificate: dict[str, Any], rules_path: str | None) -> dict[str, Rule]:
    """The rules of the rule file the certificate names (or ``rules_path``) that its steps apply, by name."""
    stated = certificate.get("rules", {})
    path = rules_path or (str(default_rules_path()) if stated.get("shipped") else stated.get("path"))
    if not path:
        raise XflowError("<certificate>", "names no rule file")
    applied = {step.get("rule") for step in certificate.get("steps", []) if isinstance(step, dict)
               and step.get("kind") == "rule"}
    return {rule.name: rule for rule in load_rules(path, only={name for name in applied if isinstance(name, str)})}


def replay(graph: Graph, certificate: Mapping[str, Any], rules: Mapping[str, Rule],
           prove: Callable[[Rule], str | None] | None = None) -> Replayed:
    """Apply ``certificate``'s steps to ``graph`` (the input's), each re-established; ``rules`` by name (the rule
    file's). ``prove`` (a rule -> None when proved, else why not) is asked once per rule applied. StepRefused
    at the first step that does not replay."""
    if certificate.get("input", {}).get("graph") != graph.structural_hash:
        raise StepRefused(0, "the certificate is of another input model (its structural hash differs)")
    used: dict[str, Rule] = {}
    for index, step in enumerate(certificate["steps"], 1):
        kind = step.get("kind")
        if kind == "rule":
            rule = _rule_of(index, step, rules)
            if rule.name not in used:
                reason = prove(rule) if prove is not None else None
                if reason is not None:
                    raise StepRefused(index, f"rule {rule.name} does not re-prove: {reason}")
                used[rule.name] = rule
            graph = _apply(index, graph, rule, step)
        elif kind == "fold":
            folded = fold_constants(graph)
            if fold_record(graph, folded) != step:
                raise StepRefused(index, "the constants folded, recomputed with the op table's kernels, differ")
            graph = folded
        elif kind == IDENTITY:
            try:
                made = apply_identity(graph, step)
            except ValueError as exc:
                raise StepRefused(index, f"split simplification ({step.get('form')}): {exc}") from None
            if made.structural_hash != step.get("graph"):
                raise StepRefused(index, f"split simplification ({step.get('form')}): the graph it makes is not "
                                         "the one stated")
            graph = made
        elif kind == "shapes":
            try:  # re-derived symbolically: each value's expressions recomputed from this graph
                graph = check_step(graph, step)
            except ValueError as exc:
                raise StepRefused(index, f"shape arithmetic: {exc}") from None
        elif kind == evaluate.KIND:
            try:  # recomputed by ONNX Runtime from the nodes that compute them in this graph
                graph = evaluate.check_step(graph, step)
            except ValueError as exc:
                raise StepRefused(index, f"constant subgraphs: {exc}") from None
        elif kind == share.KIND:
            try:
                graph = share.check_step(graph, step)
            except ValueError as exc:
                raise StepRefused(index, f"shared values: {exc}") from None
        else:
            raise StepRefused(index, f"unknown kind of step {kind!r}")
    if certificate.get("output", {}).get("graph") != graph.structural_hash:
        raise StepRefused(len(certificate["steps"]), "the steps do not make the graph the certificate states")
    return Replayed(graph, len(certificate["steps"]), used)


def _rule_of(index: int, step: Mapping[str, Any], rules: Mapping[str, Rule]) -> Rule:
    rule = rules.get(step.get("rule", ""))
    if rule is None:
        raise StepRefused(index, f"rule {step.get('rule')!r} is not in the rule file")
    if rule_hash(rule) != step.get("rule_sha256"):
        raise StepRefused(index, f"rule {rule.name} in the rule file is not the rule applied (its content hash "
                                 "differs: edited since)")
    return rule


def _apply(index: int, graph: Graph, rule: Rule, step: Mapping[str, Any]) -> Graph:
    """The rule applied at the stated match, found again by the matcher."""
    labels = {node_label(n) for n in graph.nodes}
    missing = [label for label in step.get("nodes", []) if label not in labels]
    if missing:
        raise StepRefused(index, f"{rule.name}: node {missing[0]} is not in the graph")
    tracer = MatchTracer()
    match = find_stated(graph, rule, step["nodes"], step.get("values", {}), tracer)
    if match is None:
        near_miss = tracer.best(rule.name)
        why = str(near_miss) if near_miss is not None else "the pattern is not there"
        raise StepRefused(index, f"{rule.name} does not match at {', '.join(step['nodes'])}: {why}")
    record = match_record(graph, match)
    for key in ("attrs", "shapes", "conditions"):
        if record[key] != step.get(key):
            raise StepRefused(index, f"{rule.name}: the match's {key} differ from those stated")
    derived = apply_match(graph, match)
    if derived is None:
        raise StepRefused(index, f"{rule.name}: applying it makes a cycle")
    if derived.structural_hash != step.get("graph"):
        raise StepRefused(index, f"{rule.name}: the graph it makes is not the one stated")
    return derived
