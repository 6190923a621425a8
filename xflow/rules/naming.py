"""Readable rule names, derived from what a rule's patterns do (``merge-matmul-shared-lhs``).

A rule's id is its hash (``g3_0a9d59f7d5``): stable, unique, unreadable. Its readable name is computed
from the source and target patterns each time it is asked for, so it cannot go stale, and several rules may
share one (the id tells them apart):

- ``cancel-A-B``: the target is empty (the outputs are inputs of the rule);
- ``merge-X-shared-P``: two or more X nodes of the source read one tensor at position P (``lhs``/``rhs``,
  or the input's role: ``input``, ``kernel``) and the target has fewer X; ``merge-X`` when they share none;
- ``fold-X-into-Y``: the source's X nodes compute at run time, the target's read only constants (so they fold
  into a new weight), and Y reads what they make (a layer scale folded into a matmul's weight);
- ``unmerge-X``: the target has more X nodes than the source (the reverse of a merge);
- ``fuse-Y-into-X``: the source's Y nodes are gone and the target keeps some of its ops in fewer nodes, X the
  ONNX Runtime kernel it adds (attention into ``mha``, its scalings kept) or else the first op it keeps;
- ``lift-denormals-before-Y``: the target is the source with ops whose saving is in the values added
  (``OpDef.gain_in_values``: power-of-two scales), and Y reads what they make;
- ``reorder-A-B``: both sides apply the same ops, in another order;
- ``rewrite-A-B-to-C``: anything else.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from xflow.ops import OPS
from xflow.rules.pattern import PatternNode


def _ops(nodes: Sequence[PatternNode]) -> list[str]:
    """The ops of ``nodes`` in pattern order, each once."""
    return list(dict.fromkeys(n.op for n in nodes))


def _position_name(op: str, position: int, arity: int) -> str:
    role = OPS[op].role(position) if op in OPS else "any"
    if role in ("matrix", "any"):
        return ("lhs", "rhs")[position] if arity == 2 and position < 2 else f"input{position}"
    return "input" if role == "image" else role


def _shared_position(op: str, nodes: Sequence[PatternNode]) -> str | None:
    """The position at which two or more ``op`` nodes read the same tensor, named; None when none do."""
    same = [n for n in nodes if n.op == op]
    for position in range(min(len(n.inputs) for n in same)):
        readers = Counter(n.inputs[position] for n in same)
        if readers.most_common(1)[0][1] >= 2:
            return _position_name(op, position, len(same[0].inputs))
    return None


def pattern_name(inputs: Mapping[str, str], src: Sequence[PatternNode], dst: Sequence[PatternNode]) -> str:
    """What the rule with these inputs (name -> kind) and source and target patterns does, in a few words joined
    by dashes (see the module doc; ``Rule.readable_name`` asks it)."""
    src_ops, dst_ops = Counter(n.op for n in src), Counter(n.op for n in dst)
    if not dst:
        return "cancel-" + "-".join(_ops(src))
    for op in _ops(src):
        if src_ops[op] >= 2 and 1 <= dst_ops[op] < src_ops[op]:
            shared = _shared_position(op, src)
            return f"merge-{op}-shared-{shared}" if shared else f"merge-{op}"
    folded = _folded_into(inputs, src, dst)
    if folded is not None:
        return folded
    for op in _ops(dst):
        if dst_ops[op] >= 2 and 1 <= src_ops[op] < dst_ops[op]:
            return f"unmerge-{op}"
    lifts = [n for n in dst if n.op in OPS and OPS[n.op].gain_in_values and not src_ops[n.op]]
    if lifts and Counter(n.op for n in dst if n not in lifts) == src_ops:
        made = {o for n in lifts for o in n.outputs}
        readers = [n.op for n in dst if n not in lifts and made & set(n.inputs)]
        return f"lift-denormals-before-{readers[0]}" if readers else "lift-denormals"
    gone = [op for op in _ops(src) if op not in dst_ops]
    kept = [op for op in _ops(dst) if op in src_ops]
    if gone and kept and len(dst) < len(src):  # into the fused kernel it adds, else the first kept op
        fused = [op for op in _ops(dst) if op not in src_ops and op in OPS and OPS[op].domain]
        return f"fuse-{'-'.join(gone)}-into-{(fused or kept)[0]}"
    if src_ops == dst_ops:
        return "reorder-" + "-".join(_ops(src))
    return f"rewrite-{'-'.join(_ops(src))}-to-{'-'.join(_ops(dst))}"


def _folded_into(inputs: Mapping[str, str], src: Sequence[PatternNode], dst: Sequence[PatternNode]) -> str | None:
    """``fold-X-into-Y`` when every X node of the source reads a run-time value and every X node of the target
    reads constants only (rule inputs of kind ``const``, or what other such nodes make); None otherwise."""
    weights = frozenset(name for name, kind in inputs.items() if kind == "const")
    constant = set(weights)
    on_constants = []
    for node in dst:
        if all(i in constant for i in node.inputs):
            constant.update(node.outputs)
            on_constants.append(node)
    for op in _ops(src):
        folded = [n for n in on_constants if n.op == op]
        if (not folded or any(n.op == op and n not in folded for n in dst)
                or any(set(n.inputs) <= weights for n in src if n.op == op)):
            continue
        made = {o for n in folded for o in n.outputs}
        readers = [n.op for n in dst if n not in folded and made & set(n.inputs)]
        if readers:
            return f"fold-{op}-into-{readers[0]}"
    return None


def by_readable_name(counts: dict[str, int], names: dict[str, str]) -> dict[str, int]:
    """Counts by rule id summed by readable name (``names``: id -> name; an id without one stays)."""
    out: Counter[str] = Counter()
    for rule_id, count in counts.items():
        out[names.get(rule_id, rule_id)] += count
    return dict(out)
