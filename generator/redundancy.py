"""TASO's redundancy pruning of a rule set: a rule that is a composition of smaller rules is dropped.

Each generated rule states the instance it was found on in its ``doc``: ``lhs -> rhs``, each side the
canonical text of its outputs (``generator.fingerprint.expressions``) over the enumeration's inputs
(``generator.enumerate.INPUTS``, whose shapes are fixed). A rule is *redundant* when rewriting its
left-hand side with other rules, each strictly smaller in ``TermRule.order`` (fewer ops in all, then name),
reaches its right-hand side in at most ``depth`` steps. The order is total and well founded, so dropping
every redundant rule keeps the closure: a dropped rule is made of earlier rules, each kept or itself made of
earlier ones.

The rewriting works on the instance's terms, as the search would on that graph: a rule's inputs are
variables that bind any subterm of the same shape (a weight input only subterms of weights alone);
commutative operands match in either order; a match's inner values must have no user outside it (the
search's matcher refuses such a match); every occurrence of a rewritten subterm changes together (a
graph shares equal values). Attributes must be equal as written, so a rule only composes on the instance's
own attribute values: a conservative test (more general compositions are not looked for). Lifted rules
(bias, batchnorm: their inputs are not the enumeration's) are neither tested nor used.

The last step of a composition is not tried forwards from every state the earlier steps reach (thousands, each
matched by thousands of rules once a file holds tens of thousands): the states one rule takes to the goal are
found once, backwards from the goal, and looked up (``composition``).
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache, lru_cache
from typing import Any

import numpy as np
from xflow.generator.enumerate import INPUTS, IntEvaluator, tensor_fp

from xflow.ops import OPS, OpDef, ShapeError

#: Rewrites tried from a rule's left-hand side before it counts as not composed (TASO composes two).
DEFAULT_DEPTH = 2
#: Most states one breadth-first level keeps (bounds the time of a rule whose side matches everywhere).
MAX_STATES = 2000

_INPUT_SHAPE = {name: shape for name, _, _, shape in INPUTS}
_INPUT_INDEX = {name: i for i, (name, _, _, _) in enumerate(INPUTS)}
_INPUT_CONST = {name: kind == "const" for name, _, kind, _ in INPUTS}


class DocError(ValueError):
    """A rule's doc is not the canonical text of an enumerated instance."""


@dataclass(frozen=True)
class Term:
    """An input (``head`` its name, no ``args``) or an op application's output ``slot`` (-1: its only one)."""

    head: str  # "op[attrs]" as the generator writes it, or the input's name
    args: tuple[Term, ...]
    slot: int
    text: str = field(compare=False)
    shape: tuple[int, ...] = field(compare=False)
    const: bool = field(compare=False)  # computed from weights alone

    @property
    def is_input(self) -> bool:
        """True for an input of the enumeration (a rule's variable)."""
        return not self.args and "[" not in self.head


@dataclass(frozen=True)
class TermRule:
    """One rule as terms: its left and right sides (outputs, sorted by text) and its order key."""

    name: str
    lhs: tuple[Term, ...]
    rhs: tuple[Term, ...]
    size: int  # op applications on both sides
    #: the right-hand output of each left-hand output, in ``lhs`` order (see ``_rhs_for``)
    paired_rhs: tuple[Term, ...] = field(compare=False, default=())

    @property
    def order(self) -> tuple[int, str]:
        """The rule's place in the order rules are made of smaller ones: fewer ops in all, then name."""
        return (self.size, self.name)


def _attr_value(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # a bare word such as ``none``


def _attrs(text: str) -> dict[str, Any]:
    """The attributes of an op's text ``k=v,k2=v2``."""
    out = {}
    for part in _split_top(text):
        key, _, value = part.partition("=")
        out[key] = _attr_value(value)
    return out


def _split_top(text: str) -> list[str]:
    """``text`` cut at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if text[start:]:
        parts.append(text[start:])
    return parts


def _make(head: str, args: tuple[Term, ...], slot: int) -> Term:
    """The term, with its text, shape (the op table's shape rule) and constness."""
    if not args and "[" not in head:
        if head not in _INPUT_SHAPE:
            raise DocError(f"unknown input {head!r}")
        return Term(head, (), -1, head, _INPUT_SHAPE[head], _INPUT_CONST[head])
    commutative, shapes = _head_shapes(head, tuple(a.shape for a in args))
    texts = [a.text for a in args]
    if commutative:
        texts.sort()
    text = f"{head}({','.join(texts)})" + (f"#{slot}" if slot >= 0 else "")
    return Term(head, args, slot, text, shapes[max(slot, 0)], all(a.const for a in args))


@cache
def _head_op(head: str) -> tuple[OpDef, dict[str, Any]]:
    """The op and normalized attributes of an application's head ``op[k=v,...]`` (parsed once per head: the
    rewriting builds the same few heads hundreds of thousands of times)."""
    op, attr_text = head.split("[", 1)
    entry = OPS.get(op)
    if entry is None:
        raise DocError(f"unknown op {op!r}")
    return entry, entry.normalize_attrs(_attrs(attr_text[:-1]))


@lru_cache(maxsize=1 << 16)
def _head_shapes(head: str, arg_shapes: tuple[tuple[int, ...], ...]) -> tuple[bool, tuple[tuple[int, ...], ...]]:
    """(whether the op is commutative, its output shapes on ``arg_shapes``); DocError when they are
    ill-formed."""
    entry, attrs = _head_op(head)
    try:
        shapes = entry.infer(list(arg_shapes), attrs)
    except ShapeError as e:
        raise DocError(f"{head}: {e}") from None
    return entry.commutative, tuple(tuple(int(d) for d in s) for s in shapes)


def _parse(text: str, i: int = 0) -> tuple[Term, int]:
    j = i
    while j < len(text) and (text[j].isalnum() or text[j] == "_"):
        j += 1
    if j == i:
        raise DocError(f"expected a name at {text[i:i + 20]!r}")
    head = text[i:j]
    if j >= len(text) or text[j] != "[":
        return _make(head, (), -1), j
    depth, k = 0, j
    while True:  # the attributes: up to the matching bracket
        depth += {"[": 1, "]": -1}.get(text[k], 0)
        k += 1
        if depth == 0:
            break
    head = text[i:k]
    if text[k] != "(":
        raise DocError(f"expected '(' after {head!r}")
    args, k = [], k + 1
    while text[k] != ")":
        arg, k = _parse(text, k)
        args.append(arg)
        if text[k] == ",":
            k += 1
    k += 1
    slot = -1
    if k < len(text) and text[k] == "#":
        m = k + 1
        while m < len(text) and text[m].isdigit():
            m += 1
        slot, k = int(text[k + 1:m]), m
    return _make(head, tuple(args), slot), k


def parse_side(text: str) -> tuple[Term, ...]:
    """The output terms of one side of a doc (``t1 ; t2``), sorted by text."""
    terms = []
    for part in text.split(" ; "):
        term, end = _parse(part.strip())
        if end != len(part.strip()):
            raise DocError(f"trailing text after {term.text!r}")
        terms.append(term)
    return tuple(sorted(terms, key=lambda t: t.text))


def _apps(terms: Sequence[Term]) -> set[tuple[str, tuple[str, ...]]]:
    """The distinct op applications of some terms (a multi-output op counts once)."""
    seen: set[tuple[str, tuple[str, ...]]] = set()

    def visit(t: Term) -> None:
        if t.is_input:
            return
        key = (t.head, tuple(a.text for a in t.args))
        if key not in seen:
            seen.add(key)
            for a in t.args:
                visit(a)

    for t in terms:
        visit(t)
    return seen


def _term_rule_of(name: str, doc: str) -> TermRule:
    """The rule ``name`` of an enumerated instance's ``doc`` as terms (DocError when it is not one)."""
    lhs_text, _, rhs_text = doc.partition(" -> ")
    lhs, rhs = parse_side(lhs_text), parse_side(rhs_text)
    return TermRule(name, lhs, rhs, len(_apps(lhs)) + len(_apps(rhs)), _rhs_for(lhs, rhs))


def term_rule(rule: Mapping[str, Any]) -> TermRule | None:
    """The rule as terms, or None when its doc is not an enumerated instance (a lifted rule)."""
    doc = rule.get("doc", "")
    lhs_text, sep, _ = doc.partition(" -> ")
    if not sep or ":" in lhs_text.split("(")[0]:
        return None
    try:
        return _term_rule_of(rule["name"], doc)
    except DocError:
        return None


# ---- matching and rewriting -----------------------------------------------------------------------------

Binding = dict[str, Term]
Match = tuple[Binding, frozenset[str]]  # the variables' terms, the texts of the op terms the pattern covers


def _match(pattern: Term, subject: Term, binding: Binding, covered: frozenset[str] = frozenset()) -> Iterator[Match]:
    """Every extension of ``binding`` under which ``pattern`` is ``subject``, with the covered op terms."""
    if pattern.is_input:
        bound = binding.get(pattern.head)
        if bound is not None:
            if bound.text == subject.text:
                yield binding, covered
            return
        if subject.shape == pattern.shape and (subject.const or not pattern.const):
            yield {**binding, pattern.head: subject}, covered
        return
    if pattern.head != subject.head or pattern.slot != subject.slot or len(pattern.args) != len(subject.args):
        return
    orders = [subject.args]
    if len(subject.args) == 2 and _head_op(pattern.head)[0].commutative \
            and subject.args[0].text != subject.args[1].text:
        orders.append(subject.args[::-1])
    for args in orders:
        partial: list[Match] = [(binding, covered | {subject.text})]
        for p, s in zip(pattern.args, args, strict=True):
            partial = [m2 for b, c in partial for m2 in _match(p, s, b, c)]
        yield from partial


def _instantiate(term: Term, binding: Binding) -> Term:
    if term.is_input:
        return binding[term.head]
    return _make(term.head, tuple(_instantiate(a, binding) for a in term.args), term.slot)


def _replace(term: Term, table: Mapping[str, Term]) -> Term:
    found = table.get(term.text)
    if found is not None:
        return found
    if term.is_input:
        return term
    args = tuple(_replace(a, table) for a in term.args)
    if all(a is b for a, b in zip(args, term.args, strict=True)):
        return term
    return _make(term.head, args, term.slot)


def _subterms(outputs: Sequence[Term]) -> tuple[dict[str, Term], dict[str, set[str]]]:
    """(distinct op subterms by text, text -> texts of the terms that read it; "" marks an output)."""
    terms: dict[str, Term] = {}
    readers: dict[str, set[str]] = {}

    def visit(t: Term) -> None:
        if t.text in terms or t.is_input:
            return
        terms[t.text] = t
        for a in t.args:
            readers.setdefault(a.text, set()).add(t.text)
            visit(a)

    for t in outputs:
        readers.setdefault(t.text, set()).add("")
        visit(t)
    return terms, readers


def _first_lhs(rule: TermRule) -> Term | None:
    return rule.lhs[0]


def reversible(rule: TermRule) -> bool:
    """Whether the rule can be applied backwards, its right side matched and its left side built from that match:
    every right-hand output an op application (a bare variable would match everywhere), and every variable of the
    left side bound by the right (``x * 0 -> 0`` cannot say which ``x`` it came from)."""
    return not any(t.is_input for t in rule.rhs) \
        and frozenset().union(*map(_variables, rule.lhs)) <= frozenset().union(*map(_variables, rule.rhs))


def _variables(term: Term) -> frozenset[str]:
    if term.is_input:
        return frozenset((term.head,))
    return frozenset().union(*(_variables(a) for a in term.args))


def _reverse_pattern(rule: TermRule) -> Term | None:
    return rule.paired_rhs[0] if reversible(rule) else None


class RuleIndex:
    """Rules by the head of one pattern term (by default their first left-hand output) and the heads of its arguments
    (a subterm can only match rules of its own head whose op arguments have the heads of its arguments, in either
    order where the op is commutative). Heads alone left thousands of rules to try at every subterm once a file holds
    tens of thousands. ``pattern`` picks the indexed term of a rule (None: the rule is not indexed)."""

    def __init__(self, rules: Sequence[TermRule], pattern: Callable[[TermRule], Term | None] = _first_lhs) -> None:
        #: (head, the argument heads, None for a variable) -> (position in ``rules``, rule)
        self.by_args: dict[tuple[str, tuple[str | None, ...]], list[tuple[int, TermRule]]] = {}
        for position, r in enumerate(rules):
            first = pattern(r)
            if first is not None and not first.is_input:
                key = (first.head, tuple(None if a.is_input else a.head for a in first.args))
                self.by_args.setdefault(key, []).append((position, r))

    def candidates(self, subject: Term) -> list[TermRule]:
        """The rules whose indexed term may match ``subject``, in the order they were given (a superset of those
        that do: only heads are compared)."""
        heads = [a.head for a in subject.args]
        orders = [heads]
        if len(heads) == 2 and heads[0] != heads[1] and _head_op(subject.head)[0].commutative:
            orders.append(heads[::-1])
        found: dict[int, TermRule] = {}
        for order in orders:
            for combo in itertools.product(*((h, None) for h in order)):
                for position, rule in self.by_args.get((subject.head, combo), ()):
                    found[position] = rule
        return [found[p] for p in sorted(found)]

    def rewrites(self, state: tuple[Term, ...], before: tuple[int, str]) -> Iterator[tuple[Term, ...]]:
        """Every state one rule earlier than ``before`` makes of ``state``."""
        return (new for _, new in self.tagged_rewrites(state, before))

    def tagged_rewrites(self, state: tuple[Term, ...], before: tuple[int, str] | None = None
                        ) -> Iterator[tuple[tuple[int, str], tuple[Term, ...]]]:
        """(the rule's order, the state) for every state one rule earlier than ``before`` (None: any rule of the
        index) makes of ``state``; with ``before`` the subsequence of what None gives, in the same order."""
        terms, readers = _subterms(state)
        for first in terms.values():
            for rule in self.candidates(first):
                if before is None or rule.order < before:
                    for new in _rewrites_at(rule, state, terms, readers, first):
                        yield rule.order, new

    def reverse_rewrites(self, state: tuple[Term, ...], before: tuple[int, str] | None
                         ) -> Iterator[tuple[TermRule, tuple[Term, ...]]]:
        """(rule, the state it came from) for each way a reversible rule earlier than ``before`` may have made
        ``state`` in one step (the index must be keyed by right sides: ``pattern=_reverse_pattern``). Each
        occurrence of the matched subterm goes back together; a candidate only: the forward step is what
        counts (``step_reaches``). ``before`` None: every rule of the index."""
        terms, _ = _subterms(state)
        for subject in terms.values():
            for rule in self.candidates(subject):
                if before is not None and rule.order >= before:
                    continue
                for binding, _covered in _match(rule.paired_rhs[0], subject, {}):
                    for new in _reverse_complete(rule, state, terms, [subject], binding):
                        yield rule, new


def _reverse_complete(rule: TermRule, state: tuple[Term, ...], terms: dict[str, Term], roots: list[Term],
                      binding: Binding) -> Iterator[tuple[Term, ...]]:
    """The states ``rule`` taken backwards makes of ``state``, its right-hand outputs matched at ``roots`` so far."""
    k = len(roots)
    if k < len(rule.paired_rhs):
        for subject in terms.values():
            if all(subject.text != r.text for r in roots):
                for extended, _covered in _match(rule.paired_rhs[k], subject, binding):
                    yield from _reverse_complete(rule, state, terms, [*roots, subject], extended)
        return
    table = {s.text: _instantiate(t, binding) for s, t in zip(roots, rule.lhs, strict=True)}
    yield tuple(sorted((_replace(t, table) for t in state), key=lambda t: t.text))


def _rewrites_at(rule: TermRule, state: tuple[Term, ...], terms: dict[str, Term], readers: dict[str, set[str]],
                 first: Term) -> Iterator[tuple[Term, ...]]:
    """The states ``rule`` makes of ``state`` with its first left-hand output matched at ``first``."""
    for binding, covered in _match(rule.lhs[0], first, {}):
        yield from _complete(rule, state, terms, readers, [first], binding, covered)


def _complete(rule: TermRule, state: tuple[Term, ...], terms: dict[str, Term], readers: dict[str, set[str]],
              roots: list[Term], binding: Binding, covered: frozenset[str]) -> Iterator[tuple[Term, ...]]:
    k = len(roots)
    if k < len(rule.lhs):
        for subject in terms.values():
            if any(subject.text == r.text for r in roots):
                continue
            for extended, more in _match(rule.lhs[k], subject, binding, covered):
                yield from _complete(rule, state, terms, readers, [*roots, subject], extended, more)
        return
    root_texts = {r.text for r in roots}
    for text in covered - root_texts:
        if not readers.get(text, set()) <= covered:
            return  # an inner value read outside the match: the search's matcher refuses it
    table = {s.text: _instantiate(r, binding) for s, r in zip(roots, rule.paired_rhs, strict=True)}
    yield tuple(sorted((_replace(t, table) for t in state), key=lambda t: t.text))


def step_reaches(rule: TermRule, state: tuple[Term, ...], goal: str) -> bool:
    """Whether one application of ``rule`` to ``state`` gives the state whose text is ``goal``."""
    terms, readers = _subterms(state)
    return any(_side_text(new) == goal for first in terms.values()
               for new in _rewrites_at(rule, state, terms, readers, first))


def _rhs_for(lhs: tuple[Term, ...], rhs: tuple[Term, ...]) -> tuple[Term, ...]:
    """The right-hand output of each left-hand output, in ``lhs`` order: the one of equal value on the
    enumeration's int inputs (the doc lists each side sorted, not paired)."""
    if len(lhs) == 1:
        return rhs
    free = list(rhs)
    out = []
    for t in lhs:
        pick = next((i for i, r in enumerate(free) if _value_fp(r) == _value_fp(t)), 0)
        out.append(free.pop(pick))
    return tuple(out)


_VALUES: dict[str, list[Any]] = {}


def _value_fp(term: Term) -> int:
    """The term's fingerprint on the seeded int inputs (``generator.enumerate.tensor_fp``)."""
    return tensor_fp(_values(term)[max(term.slot, 0)])


def _values(term: Term) -> list[Any]:
    """All outputs of the term's op application (or the input itself) on the seeded int inputs."""
    key = term.text.rsplit("#", 1)[0] if term.slot >= 0 else term.text
    found = _VALUES.get(key)
    if found is None:
        if term.is_input:
            found = [IntEvaluator(0).inputs[_INPUT_INDEX[term.head]]]
        else:
            op, attr_text = term.head.split("[", 1)
            entry = OPS[op]
            with np.errstate(over="ignore"):
                found = entry.evaluate_int(np, [_values(a)[max(a.slot, 0)] for a in term.args],
                                           entry.normalize_attrs(_attrs(attr_text[:-1])))
        _VALUES[key] = found
    return found


def _side_text(terms: Sequence[Term]) -> str:
    return " ; ".join(sorted(t.text for t in terms))


@dataclass(frozen=True)
class CompositionIndexes:
    """The rules a composition may use, indexed three ways: by left sides (the forward steps), by right sides (the
    reversible rules, for the last step taken backwards from the goal) and the irreversible rules alone by left
    sides (their last step can only be taken forwards)."""

    forward: RuleIndex
    backward: RuleIndex
    irreversible: RuleIndex

    @classmethod
    def of(cls, rules: Sequence[TermRule]) -> CompositionIndexes:
        """The three indexes of ``rules`` (in ``TermRule.order``)."""
        return cls(RuleIndex(rules), RuleIndex(rules, _reverse_pattern),
                   RuleIndex([r for r in rules if not reversible(r)]))


@dataclass
class SideCache:
    """The first forward level of a left side and the backward steps of a right side, computed once for all the
    rules that share the side (a class of m equal graphs gives m - 1 rules from each; the ``x - x`` families,
    hundreds). Kept unfiltered, each step tagged with its rule's order, and filtered per rule: a rule sees exactly
    the steps, in the order, that the index gives it (``RuleIndex.tagged_rewrites``). Only the sides of more than
    one rule are kept, each until the last of its rules is ``release``d."""

    uses: dict[str, int]  # "lhs:" / "rhs:" + a side's text -> rules left that will read it
    steps: dict[str, list[Any]] = field(default_factory=dict)

    @classmethod
    def of(cls, rules: Sequence[TermRule]) -> SideCache:
        """A cache for testing ``rules``: the sides more than one of them has."""
        counts: dict[str, int] = {}
        for r in rules:
            for key in _side_keys(r):
                counts[key] = counts.get(key, 0) + 1
        return cls({k: n for k, n in counts.items() if n > 1})

    def _read(self, key: str, compute: Callable[[], Iterator[Any]]) -> list[Any] | None:
        if key not in self.uses:
            return None
        found = self.steps.get(key)
        if found is None:
            found = self.steps[key] = list(compute())
        return found

    def release(self, rule: TermRule) -> None:
        """``rule`` is tested: a side none of the rules still to test has is let go."""
        for key in _side_keys(rule):
            if key in self.uses:
                self.uses[key] -= 1
                if not self.uses[key]:
                    del self.uses[key]
                    self.steps.pop(key, None)

    def first_level(self, index: RuleIndex, rule: TermRule) -> Iterator[tuple[Term, ...]]:
        """``index.rewrites(rule.lhs, rule.order)``."""
        steps = self._read(_side_keys(rule)[0], lambda: index.tagged_rewrites(rule.lhs))
        if steps is None:
            return index.rewrites(rule.lhs, rule.order)
        return (new for order, new in steps if order < rule.order)

    def last_step(self, index: RuleIndex, rule: TermRule) -> Iterator[tuple[TermRule, tuple[Term, ...]]]:
        """``index.reverse_rewrites(rule.rhs, rule.order)``."""
        steps = self._read(_side_keys(rule)[1], lambda: index.reverse_rewrites(rule.rhs, None))
        if steps is None:
            return index.reverse_rewrites(rule.rhs, rule.order)
        return ((earlier, state) for earlier, state in steps if earlier.order < rule.order)


def _side_keys(rule: TermRule) -> tuple[str, str]:
    """``SideCache``'s keys of the rule's left and right sides."""
    return f"lhs:{_side_text(rule.lhs)}", f"rhs:{_side_text(rule.rhs)}"


def composition(rule: TermRule, indexes: CompositionIndexes, depth: int = DEFAULT_DEPTH,
                cache: SideCache | None = None) -> list[tuple[Term, ...]] | None:
    """The states from ``rule``'s left side to its right side through earlier rules (None: not composed).

    Breadth first for ``depth - 1`` steps; the last step meets the goal: the states one reversible rule takes
    to the goal are found once, backwards from it, and each frontier state is looked up among them (then the
    step is replayed forwards, so only a real rewrite counts), while the irreversible rules are tried forwards
    from each. This finds what trying every rule forwards from every frontier state finds, at the cost of two
    levels instead of one level per frontier state; the one difference is a step whose right side already
    occurs in the state elsewhere (taken back, both occurrences go back together), left not composed. ``cache``
    shares the first level and the last step among rules of one side (the same answer and path)."""
    goal = _side_text(rule.rhs)
    frontier: dict[str, tuple[tuple[Term, ...], list[tuple[Term, ...]]]] = {_side_text(rule.lhs): (rule.lhs, [])}
    seen = set(frontier)
    for level in range(depth - 1):
        nxt: dict[str, tuple[tuple[Term, ...], list[tuple[Term, ...]]]] = {}
        for state, path in frontier.values():
            steps = (cache.first_level(indexes.forward, rule) if level == 0 and cache is not None
                     else indexes.forward.rewrites(state, rule.order))
            for new in steps:
                text = _side_text(new)
                if text == goal:
                    return [*path, new]
                if text not in seen and len(nxt) < MAX_STATES:
                    seen.add(text)
                    nxt[text] = (new, [*path, new])
        frontier = nxt
        if not frontier:
            return None
    back: dict[str, list[TermRule]] = {}
    last = (cache.last_step(indexes.backward, rule) if cache is not None
            else indexes.backward.reverse_rewrites(rule.rhs, rule.order))
    for earlier, state in last:
        back.setdefault(_side_text(state), []).append(earlier)
    for text, (state, path) in frontier.items():
        if any(step_reaches(earlier, state, goal) for earlier in back.get(text, ())) \
                or any(_side_text(new) == goal for new in indexes.irreversible.rewrites(state, rule.order)):
            return [*path, rule.rhs]
    return None


@dataclass
class RedundancyReport:
    """Names of the rules kept and dropped (with the composing path's states as text), and of the rules
    not tested (their doc is not an enumerated instance: lifts)."""

    kept: list[str]
    dropped: dict[str, list[str]]
    untested: list[str]


def _paths(args: tuple[list[tuple[str, str]], list[int], int]) -> list[list[str] | None]:
    """The composing path (states as text) of each of ``usable[i]`` for i in ``part``, or None; ``usable`` as
    (name, doc) pairs, made terms here: terms a worker unpickles are scattered over its heap, and the rewriting,
    which chases their pointers, ran a fifth slower on them than on terms it built itself."""
    named, part, depth = args
    usable = [_term_rule_of(name, doc) for name, doc in named]
    indexes = CompositionIndexes.of(usable)
    rules = [usable[i] for i in part]
    cache = SideCache.of(rules)
    found: dict[int, list[str] | None] = {}
    # rules of one left side one after the other: its first level is kept only while they are tested
    for k in sorted(range(len(rules)), key=lambda k: _side_text(rules[k].lhs)):
        path = composition(rules[k], indexes, depth, cache)
        cache.release(rules[k])
        found[k] = None if path is None else [_side_text(s) for s in path]
    return [found[k] for k in range(len(rules))]


def _parts(usable: Sequence[TermRule], jobs: int) -> list[list[int]]:
    """``usable``'s positions cut into ``jobs`` parts, the rules of one left side in one part (they share its first
    level), the sides dealt in turn."""
    by_side: dict[str, list[int]] = {}
    for i, r in enumerate(usable):
        by_side.setdefault(_side_text(r.lhs), []).append(i)
    parts: list[list[int]] = [[] for _ in range(jobs)]
    for k, side in enumerate(sorted(by_side)):
        parts[k % jobs].extend(by_side[side])
    return [sorted(p) for p in parts if p]


def find_compositions(rules: Sequence[Mapping[str, Any]], depth: int = DEFAULT_DEPTH,
                      executor: Any = None) -> RedundancyReport:
    """Which of ``rules`` (rule-file JSON dicts) are compositions of earlier ones (see the module doc). With an
    ``executor`` (``xflow.tasks``) of several jobs the rules are tested in that many parts at once (each test
    depends only on the rule and the index, so the report is the same)."""
    as_terms = {r["name"]: term_rule(r) for r in rules}
    docs = {r["name"]: r["doc"] for r in rules}
    usable = [t for t in as_terms.values() if t is not None]
    jobs = getattr(executor, "jobs", 1)
    parts = _parts(usable, jobs)
    paths: dict[int, list[str] | None] = {}
    named = [(t.name, docs[t.name]) for t in usable]
    results = (executor.imap(_paths, [(named, p, depth) for p in parts]) if jobs > 1
               else map(_paths, [(named, p, depth) for p in parts]))
    for part, found in zip(parts, results, strict=True):
        paths.update(zip(part, found, strict=True))
    position = {id(t): i for i, t in enumerate(usable)}
    kept, dropped, untested = [], {}, []
    for r in rules:
        t = as_terms[r["name"]]
        if t is None:
            untested.append(r["name"])
            kept.append(r["name"])
            continue
        path = paths[position[id(t)]]
        if path is None:
            kept.append(r["name"])
        else:
            dropped[r["name"]] = path
    return RedundancyReport(kept, dropped, untested)


def drop_compositions(rules: Sequence[Mapping[str, Any]], depth: int = DEFAULT_DEPTH, executor: Any = None
                      ) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """(rules kept, rules dropped as compositions of earlier ones), each in the input order; ``executor`` as for
    ``find_compositions``."""
    report = find_compositions(rules, depth, executor)
    return ([r for r in rules if r["name"] not in report.dropped],
            [r for r in rules if r["name"] in report.dropped])
