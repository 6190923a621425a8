"""Make a found pair shape-generic: rule variants from the most general to the most specific.

The generator finds a pair on fixed small shapes. A rule pinned to those shapes would never match a real
model, so each pair becomes a list of variants, most general first; the verifier keeps the first variant it
both checks numerically on random shapes and proves with z3:

1. no shape pins; concat/split axes relative to the operand's rank (a source axis becomes a variable
   tied by a ``where`` condition, a target axis an ``=rank(t) - k`` expression; inputs the target
   concatenates must have equal ranks); source split sizes become
   a variable; split sizes are expressed as dims of the concatenated pieces or of the inputs, one variant per
   candidate expression (the numeric check on random shapes tells the right one);
2. the same with the rank of every input pinned;
3. literal attributes with every input's rank pinned (the rule only applies where the shapes allow).
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from xflow.generator.enumerate import Graph

from xflow.ops import OPS

R = TypeVar("R")

MAX_SIZE_COMBOS = 12


@dataclass(frozen=True)
class Tensor:
    """A pattern tensor: its name in the rule and its rank on the enumeration shapes."""

    name: str
    rank: int


def tensor_names(graph: Graph, input_names: tuple[str, ...], prefix: str) -> list[str]:
    """Names of every tensor of ``graph`` (inputs first, then op outputs named ``prefix + index``)."""
    names = list(input_names)
    for op, attrs, _ in graph:
        first = len(names) - len(input_names)
        names.extend([f"{prefix}{first + k}" for k in range(OPS[op].num_outputs(attrs))])
    return names


def _render(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


@dataclass
class _Side:
    """The nodes of one side being rendered, with the conditions and choices they need."""

    nodes: list[dict[str, Any]]
    where: list[str]
    # per split node whose sizes need an expression: (node, its sizes attribute, choices)
    size_slots: list[tuple[dict[str, Any], str, list[str]]]


def _dims(a: str, b: str, offset: int) -> str:
    return f"(dim({a}, {offset}), dim({b}, {offset}))"


def _size_choices(pieces: list[tuple[str, str, int]], tensors: list[Tensor], rank: int, offset: int,
                  src_vars: dict[str, tuple[int, ...]], split: str, found: dict[str, tuple[int, ...]],
                  sizes: tuple[int, ...]) -> list[str]:
    """Candidate expressions for the sizes of a 2-way split along ``offset`` (negative) of the rank-``rank``
    tensor ``split``: a source split variable (``src_vars``: each with its sizes where the pair was found), the
    pieces of a concat, or two inputs' dims. A piece never has the split tensor's own size (the other piece would
    be empty), so no choice names ``split``. Only the choices giving the split's own ``sizes`` on the shapes the
    pair was found on (``found``) are kept, the source's variables too: any other one makes a variant that no
    instance near those shapes satisfies (a source split of twice the channels reused on the target's input),
    which the verifier could only call unchecked."""
    dims = [(a, b, off) for a, b, off in pieces if split not in (a, b)]
    same_rank = [t.name for t in tensors if t.rank == rank and t.name != split]
    dims += [(a, b, offset) for a, b in itertools.permutations(same_rank, 2)]
    dims += [(a, a, offset) for a in same_rank]
    fitting = [_dims(a, b, off) for a, b, off in dims
               if -len(found[a]) <= off < 0 and -len(found[b]) <= off < 0
               and (found[a][off], found[b][off]) == tuple(sizes)]
    same_sizes = [name for name, found_sizes in src_vars.items() if found_sizes == tuple(sizes)]
    return list(dict.fromkeys([*same_sizes, *fitting]))


def _render_side(graph: Graph, names: list[str], variables: dict[tuple[str, str], str], source: bool,
                 general: bool, inputs: list[Tensor], pieces: list[tuple[str, str, int]],
                 split_vars: dict[str, tuple[int, ...]], n_inputs: int, found: dict[str, tuple[int, ...]]) -> _Side:
    nodes: list[dict[str, Any]] = []
    where: list[str] = []
    slots: list[tuple[dict[str, Any], str, list[str]]] = []
    t = n_inputs
    for index, (op, attrs, operands) in enumerate(graph):
        n_out = OPS[op].num_outputs(attrs)
        outs = names[t:t + n_out]
        t += n_out
        node: dict[str, Any] = {"op": op, "in": [names[o] for o in operands], "out": outs}
        rendered: dict[str, Any] = {}
        first = names[operands[0]] if operands else ""
        rank = len(found[first]) if operands else 0
        for key, value in attrs.items():
            var = variables.get((op, key))
            if var:
                rendered[key] = f"?{var}"
            elif general and OPS[op].attr(key).generalize is not None and key == "axis":
                offset = value - rank
                if source:
                    name = f"ax{index}"
                    rendered[key] = f"?{name}"
                    where.append(f"{name} == rank({first}) - {-offset}")
                else:
                    rendered[key] = f"=rank({first}) - {-offset}"
                if len(operands) == 2:  # two pieces joined along the axis
                    pieces.append((names[operands[0]], names[operands[1]], offset))
                    a, b = (names[o] for o in operands)
                    if not source and operands[0] < n_inputs and operands[1] < n_inputs and a != b:
                        # the target's concat needs equal ranks; without the condition the proof cannot use it
                        where.append(f"rank({a}) == rank({b})")
            elif general and OPS[op].attr(key).z3 == "sizes" and len(value) == 2:
                offset = attrs["axis"] - rank
                choices = _size_choices(pieces, inputs, rank, offset, {} if source else split_vars, first, found,
                                        value)
                if source:
                    name = f"sz{index}"
                    rendered[key] = f"?{name}"
                    split_vars[name] = tuple(value)
                    slots.append((node, key, [f"{name} == {c}" for c in choices] + [""]))
                else:
                    rendered[key] = None
                    slots.append((node, key, choices))
            else:
                rendered[key] = _render(value)
        if rendered:
            node["attrs"] = rendered
        nodes.append(node)
    return _Side(nodes, where, slots)


def variants(src: Graph, dst: Graph, input_names: tuple[str, ...], input_ranks: dict[str, int],
             used: list[str], tensor_shapes: tuple[Sequence[tuple[int, ...]], Sequence[tuple[int, ...]]],
             variables: dict[tuple[str, str], str],
             outputs: dict[str, str], base: dict[str, Any]) -> list[dict[str, Any]]:
    """Rule JSON variants of one pair, most general first (see the module doc)."""
    src_names = tensor_names(src, input_names, "s")
    dst_names = tensor_names(dst, input_names, "d")
    # every tensor's shape where the pair was found (the inputs have one name and shape on both sides)
    found = {**dict(zip(src_names, tensor_shapes[0], strict=True)),
             **dict(zip(dst_names, tensor_shapes[1], strict=True))}
    inputs = [Tensor(n, input_ranks[n]) for n in used]
    rank_pins = [f"rank({n}) == {input_ranks[n]}" for n in used]
    out: list[dict[str, Any]] = []
    for general, pinned in ((True, False), (True, True), (False, True)):
        pieces: list[tuple[str, str, int]] = []
        split_vars: dict[str, tuple[int, ...]] = {}
        n = len(input_names)
        s = _render_side(src, src_names, variables, True, general, inputs, pieces, split_vars, n, found)
        d = _render_side(dst, dst_names, variables, False, general, inputs, pieces, split_vars, n, found)
        slots = s.size_slots + d.size_slots
        combos = itertools.islice(itertools.product(*(choices for _, _, choices in slots)), MAX_SIZE_COMBOS)
        for combo in combos:
            where = list(dict.fromkeys(s.where + d.where + (rank_pins if pinned else [])))
            for (node, key, _), choice in zip(slots, combo, strict=True):
                if node in s.nodes:
                    if choice:
                        where.append(choice)
                else:
                    node["attrs"][key] = f"={choice}"
            rule = {**base, "src": copy_nodes(s.nodes), "dst": copy_nodes(d.nodes), "outputs": outputs, "where": where}
            # a pair with no attribute to generalize gives the same rule as "pinned" and as "literal": the
            # verifier would check, prove and refute it twice, and split its z3 budget between the copies
            if rule not in out:
                out.append(rule)
    return out


def copy_nodes(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A copy of rule nodes whose attributes can be changed without touching the originals."""
    return [{**n, **({"attrs": dict(n["attrs"])} if "attrs" in n else {})} for n in nodes]


def _input_order(rule: dict[str, Any]) -> dict[str, str]:
    order: dict[str, str] = {}
    for node in rule["src"]:
        for name in node["in"]:
            if name in rule["inputs"] and name not in order:
                order[name] = f"in{len(order)}"
    return order


def canonical_key(rule: dict[str, Any]) -> str:
    """A text equal for rules that differ only in input names and kinds (x1 vs i1, const vs any)."""
    order = _input_order(rule)
    text = repr((rule["src"], rule["dst"], rule["outputs"], rule.get("where", [])))
    if not order:
        return text
    pattern = re.compile(r"\b(" + "|".join(sorted(order, key=len, reverse=True)) + r")\b")
    return pattern.sub(lambda m: order[m.group(1)], text)


def const_slots(rule: dict[str, Any]) -> frozenset[str]:
    """The canonical positions (``in0``, ``in1``, ...) of the inputs that must be constants."""
    order = _input_order(rule)
    return frozenset(order[name] for name, kind in rule["inputs"].items() if kind == "const" and name in order)


@dataclass
class MostGeneral(Generic[R]):
    """Per key, the most general rules offered so far (see ``dedupe``), each with its constant positions and name.
    Keeping is transitive: a rule left out here is left out of any larger set of rules that holds these."""

    best: dict[str, list[tuple[frozenset[str], str, R]]] = field(default_factory=dict)

    def offer(self, key: str, consts: frozenset[str], name: str, rule: R) -> bool:
        """Keep the rule unless one kept under its key is as general (drop those it is more general than);
        whether it is kept."""
        kept = self.best.setdefault(key, [])
        if any(c < consts or (c == consts and n <= name) for c, n, _ in kept):
            return False
        kept[:] = [(c, n, r) for c, n, r in kept if not consts <= c]
        kept.append((consts, name, rule))
        return True

    def rules(self) -> list[R]:
        """The kept rules, in name order."""
        return [r for _, _, r in sorted((entry for group in self.best.values() for entry in group), key=lambda e: e[1])]


def dedupe(rules: Iterable[R],
           key: Callable[[R], str] = canonical_key,
           slots: Callable[[R], frozenset[str]] = const_slots,
           name: Callable[[R], str] = lambda r: r["name"]) -> list[R]:
    """Per key (default: the canonical text), the most general rules: a rule is dropped when another of the
    same key needs constants at a subset of its positions (``x @ w1, x @ w2`` and ``w @ x1, w @ x2`` have one
    text but neither is more general, so both stay); among equal constant positions the first name wins.
    In name order. ``rules`` is consumed once, so a generator is never held whole; ``key``, ``slots`` and
    ``name`` read a rule (a JSON dict by default; the generator passes packed rules with the three precomputed)."""
    found = MostGeneral[R]()
    for rule in rules:
        found.offer(key(rule), slots(rule), name(rule), rule)
    return found.rules()


def final_name(rule: dict[str, Any], max_ops: int) -> str:
    """A stable name from the rule's canonical text and constant positions (independent of the input names
    it was found with)."""
    consts = const_slots(rule)
    text = canonical_key(rule) + (f" const {sorted(consts)}" if consts else "")
    return f"g{max_ops}_{hashlib.sha1(text.encode()).hexdigest()[:10]}"


def _in_models(op: str) -> bool:
    """Whether real models are made of ``op``: the op table's ops that are not applied only to constants
    (enlarge and TASO's constant tensors are the search's own)."""
    return op in OPS and not OPS[op].weights_only


def _contraction(op: str) -> bool:
    """Whether ``op`` costs more than one operation per output element (its op-table entry counts flops)."""
    return op in OPS and OPS[op].flops is not None


def priority(candidate: dict[str, Any]) -> tuple:
    """Order in which candidates are verified under a limit: rules over ops real models use, that make the
    graph smaller or merge ops, first; then by name (deterministic)."""
    src_ops = [n["op"] for n in candidate["src"]]
    dst_ops = [n["op"] for n in candidate["dst"]]
    foreign = sum(not _in_models(op) for op in src_ops + dst_ops)
    fewer_heavy = sum(map(_contraction, dst_ops)) < sum(map(_contraction, src_ops))
    return (foreign, not fewer_heavy, len(dst_ops) - len(src_ops), candidate["name"])
