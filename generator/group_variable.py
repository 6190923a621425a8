"""A conv's group as a rule variable where the rule cannot depend on it.

The enumeration's kernels fix the group (4 input channels and a 1-channel kernel make a depthwise conv of
group 4), and the op table cannot try other groups on those shapes, so a generated rule pins ``group`` to 1
or 4 and never matches a real depthwise conv (group 32, 96, ...). When every conv of a rule, on both sides,
reads one and the same kernel input as it is, the rule only moves what surrounds the conv (a pad folded into
its padding), and the group belongs to that kernel: the rule is tried first with the group a variable, which
the verifier proves for every group or rejects (the literal variants follow it)."""

from __future__ import annotations

from typing import Any

from xflow.generator.generalize import copy_nodes

GROUP_VAR = "?cg"


def _convs(rule: dict[str, Any]) -> list[dict[str, Any]]:
    return [n for n in (*rule["src"], *rule["dst"]) if n["op"] == "conv"]


def group_free(rule: dict[str, Any]) -> bool:
    """Whether every conv of ``rule`` reads the same rule input as kernel with one literal group."""
    convs = _convs(rule)
    if not convs:
        return False
    kernels = {n["in"][1] for n in convs}
    groups = {n["attrs"].get("group") for n in convs}
    return len(kernels) == 1 and kernels <= set(rule["inputs"]) and len(groups) == 1 and isinstance(
        next(iter(groups)), int)


def with_group_variable(variants: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``variants`` (most general first) preceded by the first one with its convs' group a variable, when
    ``group_free`` says the rule cannot depend on it; unchanged otherwise."""
    if not variants or not group_free(variants[0]):
        return variants
    first = variants[0]
    # a copy of the nodes and their attributes only: nothing else of the rule is changed, and the variants
    # already share the rest (``generalize.variants``); a deep copy of the whole rule cost an eighth of emission
    general = {**first, "src": copy_nodes(first["src"]), "dst": copy_nodes(first["dst"])}
    for node in _convs(general):
        node["attrs"]["group"] = GROUP_VAR
    return [general, *variants]
