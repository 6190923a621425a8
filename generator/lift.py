"""Lift conv candidates to the forms real models have: convs with a bias, convs followed by BatchNormalization.

The enumeration's convs have no bias, but nearly every conv of an exported model has one, and the zoo's
convs feed a BatchNormalization. A candidate over convs becomes, mechanically:

- ``bias``: every conv gets a bias. A conv whose kernel is an input ``w`` takes a new input ``b_w``; a conv
  whose kernel is built from inputs (concat along the output channels, enlarge, add, scalar mul) takes the
  same construction over their biases (concat on axis 0, nothing, add, scalar mul);
- ``batchnorm``: every conv (no activation, no bias) is followed by a BatchNormalization whose four
  parameters are built from per-kernel inputs the same way (concat and enlarge only), all sharing one
  epsilon variable.

Which ops these are is the op table's: the kernel op is the one with a ``bias`` input role, the normalization
the one with per-channel parameters (``channel_params``); a kernel's vector follows a weights-only op on the
kernel unchanged, a concat along the output channels as a concat on axis 0, and a linear element-wise op as
the same op (its scalar inputs kept).

Lifting only proposes: a lifted candidate goes through the verifier like any other (numeric check, then a
z3 proof from the axioms of biased convs and batchnorm) and is shipped only when proved.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from xflow.ops import OPS, OpDef


def _only(found: list[OpDef], what: str) -> OpDef:
    if len(found) != 1:
        raise RuntimeError(f"the op table has {len(found)} {what}; lifting needs exactly one")
    return found[0]


#: the op that applies a kernel and may add a bias per output channel (conv)
_KERNEL_OP = _only([e for e in OPS.values() if "bias" in e.roles], "ops with a bias input")
_KERNEL_AT, _BIAS_AT = _KERNEL_OP.roles.index("kernel"), _KERNEL_OP.roles.index("bias")
#: its fused-activation attribute and the value that means none
_ACT = next(a for a in _KERNEL_OP.attrs if a.z3 == "choice")
#: the op with a parameter vector per channel of its input (batchnorm)
_NORM = _only([e for e in OPS.values() if e.channel_params], "ops with per-channel parameters")
#: the op that joins kernels (concat): an axis attribute and any number of inputs (layernorm and gather also
#: have an axis and a second input, but a fixed few)
_JOIN = _only([e for e in OPS.values() if e.max_inputs > 16 and "axis" in e.attr_names], "joining ops")
LIFTS = ("bias", _NORM.name)
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
        self.kernel_of: dict[str, str] = {}  # each new vector input -> the kernel input whose channels it has

    def vector(self, kernel: str) -> str:
        if kernel in self.memo:
            return self.memo[kernel]
        if kernel in self.inputs:
            name = self.leaf.format(w=kernel)
            self.new_inputs[name] = "const"
            self.kernel_of[name] = kernel
        else:
            node = self.producer.get(kernel)
            if node is None:
                raise _CannotLift(f"kernel {kernel} is neither an input nor computed")
            op, ins = node["op"], node["in"]
            entry = OPS[op]
            name = f"{kernel}_{self.leaf.format(w='')}".rstrip("_")
            if entry.weights_only and len(ins) == 1 and entry.role(0) == "kernel":
                name = self.vector(ins[0])  # a kernel reshaped in place (enlarged) keeps its output channels
            elif entry is _JOIN and _out_channel_concat(node, self.where):
                self._add(op, [self.vector(i) for i in ins], name, {"axis": 0})
            elif entry.elementwise and entry.linear and self.allow_linear:
                self._add(op, [i if entry.role(k) == "scalar" else self.vector(i) for k, i in enumerate(ins)],
                          name, None)
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
    return [n for side in ("src", "dst") for n in rule[side] if n["op"] == _KERNEL_OP.name]


def _lift_side(nodes: list[dict[str, Any]], mirrors: list[_Mirror], rewrite_conv: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for node in nodes:
        if node["op"] != _KERNEL_OP.name:
            out.append(node)
            continue
        before = [len(m.new_nodes) for m in mirrors]
        vectors = [m.vector(node["in"][_KERNEL_AT]) for m in mirrors]
        for m, start in zip(mirrors, before, strict=True):
            out.extend(m.new_nodes[start:])
        out.extend(rewrite_conv(node, vectors))
    return out


def _lift(rule: dict[str, Any], kind: str) -> dict[str, Any]:
    if not any(n["op"] == _KERNEL_OP.name for n in rule["src"]):
        raise _CannotLift("no conv in the source")
    lifted = copy.deepcopy({k: v for k, v in rule.items() if k != "variants"})
    for conv in _convs(lifted):
        if len(conv["in"]) != _BIAS_AT:
            raise _CannotLift("conv already has a bias")
        act = conv.get("attrs", {}).get(_ACT.name, _ACT.default)
        if kind == _NORM.name and act != _ACT.default:
            if not (isinstance(act, str) and act.startswith("?")):
                raise _CannotLift("conv with a fused activation")
            conv["attrs"][_ACT.name] = _ACT.default  # an activation variable: the normalized form has none
    where = list(lifted.get("where", []))
    inputs = dict(lifted["inputs"])
    leaves = ["b_{w}"] if kind == "bias" else [f"bn_{p}_{{w}}" for p in BN_PARAMS]
    sides = {}
    new_inputs: dict[str, str] = {}
    kernel_of: dict[str, str] = {}
    for side in ("src", "dst"):
        mirrors = [_Mirror(lifted[side], inputs, where, leaf, allow_linear=kind == "bias") for leaf in leaves]

        def rewrite_conv(node: dict[str, Any], vectors: list[str]) -> list[dict[str, Any]]:
            if kind == "bias":
                return [{**node, "in": [*node["in"], vectors[0]]}]
            out = node["out"][0]
            raw = f"{out}_conv"
            return [{**node, "out": [raw]},
                    {"op": _NORM.name, "in": [raw, *vectors], "out": [out], "attrs": {"epsilon": "?eps"}}]

        sides[side] = _lift_side(lifted[side], mirrors, rewrite_conv)
        for m in mirrors:
            new_inputs.update(m.new_inputs)
            kernel_of.update(m.kernel_of)
    # a kernel used only in the target would give it an unbound vector input
    src_used = {name for n in sides["src"] for name in n["in"]}
    if any(name not in src_used for name in new_inputs):
        raise _CannotLift("a vector input is not read by the source")
    lifted.update(src=sides["src"], dst=sides["dst"], inputs={**inputs, **new_inputs})
    provenance = dict(lifted.get("provenance", {}))
    provenance["lifted"] = {"from": rule["name"], "by": kind}
    found_on = provenance.get("found_on")
    if found_on and all(k in found_on for k in kernel_of.values()):
        # the numeric check starts from the shapes a rule was found on only when they name every input: the new
        # vectors have their kernel's output channels (without them most lifts of pad and stride rules had no
        # valid instance among shapes drawn by role alone)
        provenance["found_on"] = {**found_on, **{v: [found_on[k][0]] for v, k in kernel_of.items()}}
    lifted["provenance"] = provenance
    lifted["name"] = f"{rule['name']}_{kind}"
    lifted["doc"] = f"{kind}-lifted: {rule.get('doc', '')}"
    return lifted


def lift_candidate(candidate: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """The ``kind`` (``"bias"`` or ``"batchnorm"``) lift of a candidate and of each of its variants, or None
    when the candidate has no conv in its source or a kernel its vectors cannot follow."""
    if kind not in LIFTS:
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
        for kind in LIFTS:
            lifted = lift_candidate(candidate, kind)
            if lifted is not None:
                out.append(lifted)
    return out
