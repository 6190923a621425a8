"""Lift conv candidates to the forms real models have: convs with a bias, convs followed by BatchNormalization.

The enumeration's convs have no bias, but nearly every conv of an exported model has one, and the zoo's
convs feed a BatchNormalization. A candidate over convs becomes, mechanically:

- ``bias``: every conv gets a bias. A conv whose kernel is an input ``w`` takes a new input ``b_w``; a conv
  whose kernel is built from inputs (concat along the output channels, enlarge, add, scalar mul) takes the
  same construction over their biases (concat on axis 0, nothing, add, scalar mul);
- ``batchnorm``: every conv (no activation, no bias) is followed by a BatchNormalization whose four
  parameters are built from per-kernel inputs the same way (concat and enlarge only), all sharing one
  epsilon variable.

Lifting only proposes: a lifted candidate goes through the verifier like any other (numeric check, then a
z3 proof from the axioms of biased convs and batchnorm) and is shipped only when proved.
"""

from __future__ import annotations

import copy
import re
from typing import Any

BN_PARAMS = ("scale", "shift", "mean", "var")
#: A concat axis written relative to the rank of a 4-D kernel: axis 0, the output channels.
_OUT_CHANNEL_EXPR = re.compile(r"^=rank\(\w+\) - 4$")


class _CannotLift(Exception):
    """This candidate has no lifted form (a kernel built in a way its bias cannot follow)."""


def _out_channel_concat(node: dict[str, Any], where: list[str]) -> bool:
    axis = node.get("attrs", {}).get("axis")
    if axis == 0:
        return True
    if isinstance(axis, str) and _OUT_CHANNEL_EXPR.match(axis):
        return True
    if isinstance(axis, str) and axis.startswith("?"):
        var = axis[1:]
        return any(re.fullmatch(rf"{re.escape(var)} == rank\(\w+\) - 4", cond) for cond in where)
    return False


class _Mirror:
    """Builds, on one side of a rule, the per-channel vector that follows a kernel's construction."""

    def __init__(self, nodes: list[dict[str, Any]], inputs: dict[str, str], where: list[str], leaf: str,
                 allow_linear: bool) -> None:
        self.producer = {out: n for n in nodes for out in n["out"]}
        self.inputs = inputs
        self.where = where
        self.leaf = leaf  # format of the vector input of kernel input {w}
        self.allow_linear = allow_linear
        self.memo: dict[str, str] = {}
        self.new_nodes: list[dict[str, Any]] = []
        self.new_inputs: dict[str, str] = {}

    def vector(self, kernel: str) -> str:
        if kernel in self.memo:
            return self.memo[kernel]
        if kernel in self.inputs:
            name = self.leaf.format(w=kernel)
            self.new_inputs[name] = "const"
        else:
            node = self.producer.get(kernel)
            if node is None:
                raise _CannotLift(f"kernel {kernel} is neither an input nor computed")
            op, ins = node["op"], node["in"]
            name = f"{kernel}_{self.leaf.format(w='')}".rstrip("_")
            if op == "enlarge":
                name = self.vector(ins[0])  # an enlarged kernel keeps its output channels
            elif op == "concat" and _out_channel_concat(node, self.where):
                self._add("concat", [self.vector(i) for i in ins], name, {"axis": 0})
            elif op == "add" and self.allow_linear:
                self._add("add", [self.vector(i) for i in ins], name, None)
            elif op == "smul" and self.allow_linear:
                self._add("smul", [self.vector(ins[0]), ins[1]], name, None)
            else:
                raise _CannotLift(f"kernel built by {op}")
        self.memo[kernel] = name
        return name

    def _add(self, op: str, ins: list[str], out: str, attrs: dict[str, Any] | None) -> None:
        node: dict[str, Any] = {"op": op, "in": ins, "out": [out]}
        if attrs:
            node["attrs"] = attrs
        self.new_nodes.append(node)


def _convs(rule: dict[str, Any]) -> list[dict[str, Any]]:
    return [n for side in ("src", "dst") for n in rule[side] if n["op"] == "conv"]


def _lift_side(nodes: list[dict[str, Any]], mirrors: list[_Mirror], rewrite_conv: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for node in nodes:
        if node["op"] != "conv":
            out.append(node)
            continue
        before = [len(m.new_nodes) for m in mirrors]
        vectors = [m.vector(node["in"][1]) for m in mirrors]
        for m, start in zip(mirrors, before, strict=True):
            out.extend(m.new_nodes[start:])
        out.extend(rewrite_conv(node, vectors))
    return out


def _lift(rule: dict[str, Any], kind: str) -> dict[str, Any]:
    if not any(n["op"] == "conv" for n in rule["src"]):
        raise _CannotLift("no conv in the source")
    lifted = copy.deepcopy({k: v for k, v in rule.items() if k != "variants"})
    for conv in _convs(lifted):
        if len(conv["in"]) != 2:
            raise _CannotLift("conv already has a bias")
        act = conv.get("attrs", {}).get("act", "none")
        if kind == "batchnorm" and act != "none":
            if not (isinstance(act, str) and act.startswith("?")):
                raise _CannotLift("conv with a fused activation")
            conv["attrs"]["act"] = "none"  # an activation variable: the batchnorm form is the act=none case
    where = list(lifted.get("where", []))
    inputs = dict(lifted["inputs"])
    leaves = ["b_{w}"] if kind == "bias" else [f"bn_{p}_{{w}}" for p in BN_PARAMS]
    sides = {}
    new_inputs: dict[str, str] = {}
    for side in ("src", "dst"):
        mirrors = [_Mirror(lifted[side], inputs, where, leaf, allow_linear=kind == "bias") for leaf in leaves]

        def rewrite_conv(node: dict[str, Any], vectors: list[str]) -> list[dict[str, Any]]:
            if kind == "bias":
                return [{**node, "in": [*node["in"], vectors[0]]}]
            out = node["out"][0]
            raw = f"{out}_conv"
            return [{**node, "out": [raw]},
                    {"op": "batchnorm", "in": [raw, *vectors], "out": [out], "attrs": {"epsilon": "?eps"}}]

        sides[side] = _lift_side(lifted[side], mirrors, rewrite_conv)
        for m in mirrors:
            new_inputs.update(m.new_inputs)
    # a kernel used only in the target would give it an unbound vector input
    src_used = {name for n in sides["src"] for name in n["in"]}
    if any(name not in src_used for name in new_inputs):
        raise _CannotLift("a vector input is not read by the source")
    lifted.update(src=sides["src"], dst=sides["dst"], inputs={**inputs, **new_inputs})
    provenance = dict(lifted.get("provenance", {}))
    provenance["lifted"] = {"from": rule["name"], "by": kind}
    lifted["provenance"] = provenance
    lifted["name"] = f"{rule['name']}_{kind}"
    lifted["doc"] = f"{kind}-lifted: {rule.get('doc', '')}"
    return lifted


def lift_candidate(candidate: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """The ``kind`` (``"bias"`` or ``"batchnorm"``) lift of a candidate and of each of its variants, or None
    when the candidate has no conv in its source or a kernel its vectors cannot follow."""
    if kind not in ("bias", "batchnorm"):
        raise ValueError(f"unknown lift {kind!r}")
    variants = candidate.get("variants") or [candidate]
    lifted_variants = []
    for variant in variants:
        try:
            lifted_variants.append(_lift(variant, kind))
        except _CannotLift:
            continue
    if not lifted_variants:
        return None
    return {**lifted_variants[0], "variants": lifted_variants}


def lift_candidates(candidates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every bias and batchnorm lift of ``candidates`` (in their order, bias first)."""
    out = []
    for candidate in candidates:
        for kind in ("bias", "batchnorm"):
            lifted = lift_candidate(candidate, kind)
            if lifted is not None:
                out.append(lifted)
    return out
