"""Enumerate every operator graph of up to ``max_ops`` operators over TASO's algebra (as the op table has it).

A graph is a tuple of op applications ``(op, attrs, operands)``; ``operands`` index the graph's tensors:
first the fixed inputs of ``INPUTS`` (in order), then each op's outputs in application order. The
graph's outputs are the op outputs no later op consumes (a graph of no op outputs a set of inputs).

Pruning while enumerating (TASO's generator): an op applies only where the op table's shape rule accepts
the operand shapes; commutative operands come in index order; within an input family ``x1`` is used
before ``x2``; two independent neighbouring ops come in key order; an op identical to one already in the
graph is skipped; an image shrunk below ``MIN_SPATIAL`` ends the graph; a graph whose new tensor equals
(by fingerprint) one it already has is reported but not extended; the last op must connect every part of
the graph. Operands are typed as in TASO (``operand_tuples``). The walk is depth-first and streams graphs:
nothing but the current path is kept.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import astuple, dataclass
from typing import Any

import numpy as np

from xflow.ir import Attrs
from xflow.ops import OPS, ShapeError

# ---- the menu: inputs and parameter values per op ------------------------------------------------------

#: (name, family, kind, shape). Inputs of one family are interchangeable (renamed canonically). Two kernels of
#: the common sizes (1x1, 3x3), so that two different convolutions of one input can merge.
INPUTS: tuple[tuple[str, str, str, tuple[int, ...]], ...] = (
    ("x1", "x", "any", (4, 4)), ("x2", "x", "any", (4, 4)), ("x3", "x", "any", (4, 4)),
    ("w1", "w", "const", (4, 4)), ("w2", "w", "const", (4, 4)), ("w3", "w", "const", (4, 4)),
    ("i1", "i", "any", (1, 4, 7, 7)), ("i2", "i", "any", (1, 4, 7, 7)),
    ("k33", "k33", "const", (4, 4, 3, 3)), ("k33b", "k33", "const", (4, 4, 3, 3)),
    ("k13", "k13", "const", (4, 4, 1, 3)), ("k31", "k31", "const", (4, 4, 3, 1)),
    ("k11", "k11", "const", (4, 4, 1, 1)), ("k11b", "k11", "const", (4, 4, 1, 1)),
    ("kd", "kd", "const", (4, 1, 3, 3)),
    ("s", "s", "const", ()),
)

#: The ops the generator enumerates (those whose op-table entry has a ``menu``), in name order.
MENU_OPS: tuple[str, ...] = tuple(sorted(name for name, entry in OPS.items() if entry.menu is not None))

Op = tuple[str, Attrs, tuple[int, ...]]
Graph = tuple[Op, ...]


def arity(op: str) -> int:
    """Operands one application of ``op`` takes in the enumeration (its menu's)."""
    return OPS[op].menu.arity  # type: ignore[union-attr]


def resolve(op: str, params: dict[str, Any], shapes: tuple[tuple[int, ...], ...]) -> Attrs | None:
    """The concrete attributes of one menu entry on these operand shapes, or None when it does not apply."""
    entry = OPS[op]
    menu = entry.menu
    attrs = dict(params) if menu is None or menu.resolve is None else menu.resolve(dict(params), shapes)
    if attrs is None:
        return None
    try:
        return entry.normalize_attrs(attrs)
    except ShapeError:
        return None


@dataclass(frozen=True)
class Application:
    """One menu entry of the enumeration: op name, its menu index (the order key) and raw parameters."""

    key: int
    op: str
    params: dict[str, Any]


APPLICATIONS: tuple[Application, ...] = tuple(
    Application(i, op, params) for i, (op, params) in
    enumerate((op, p) for op in MENU_OPS for p in OPS[op].menu.entries))  # type: ignore[union-attr]


BY_OP: dict[str, tuple[Application, ...]] = {
    op: tuple(a for a in APPLICATIONS if a.op == op) for op in dict.fromkeys(a.op for a in APPLICATIONS)}


class IntEvaluator:
    """Fixed random int64 inputs (seeded) and per-tensor fingerprints."""

    def __init__(self, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        info = np.iinfo(np.int64)
        self.inputs = [rng.integers(info.min, info.max, size=shape, dtype=np.int64, endpoint=True)
                       for _, _, _, shape in INPUTS]


_SHAPE_TEXT: dict[tuple[int, ...], bytes] = {}


def tensor_fp(array: np.ndarray) -> int:
    """A 64-bit fingerprint of one integer tensor (shape and values)."""
    # as ``np.ascontiguousarray`` gives it: a 0-d array is hashed as its 1-element vector
    a = array if array.flags.c_contiguous and array.ndim else np.ascontiguousarray(array)
    text = _SHAPE_TEXT.get(a.shape)
    if text is None:
        text = _SHAPE_TEXT[a.shape] = repr(a.shape).encode()
    h = hashlib.blake2b(text, digest_size=8)
    h.update(a)  # after the shape's text: the same digest as of the two joined
    return int.from_bytes(h.digest(), "little")


def graph_fp(output_fps: list[int]) -> int:
    """Order-independent fingerprint of a graph from its output tensors' fingerprints (a multiset)."""
    h = hashlib.blake2b(repr(sorted(output_fps)).encode(), digest_size=8)
    return int.from_bytes(h.digest(), "little")


@dataclass
class Visit:
    """One enumerated graph as the walk reports it."""

    graph: Graph
    fingerprint: int
    outputs: tuple[int, ...]
    output_fps: tuple[int, ...]
    inputs_used: frozenset[int]
    code: bytes = b""  # compact form: 3 bytes per op (application key, operands, NO_OPERAND padding)


#: Images whose height or width shrinks below this are degenerate: on 1x1 or 2x2 maps stride 1 and 2 (or a
#: pool and the identity) coincide, so identities found there are artifacts of the small enumeration shapes.
MIN_SPATIAL = 3
#: Most memoized op applications one walk keeps (then the memo starts over): bounds memory at 4 ops.
MEMO_ENTRIES = 400_000
#: The same for the last op's fingerprints where ``FingerprintCache`` does not hold them (an op of several outputs,
#: the walk of one application at a time): ints, no arrays, about 100 bytes an entry.
LAST_MEMO_ENTRIES = 2_000_000
#: The last op's fingerprints of one output are cached in 2**LAST_CACHE_BITS slots (16 bytes each).
LAST_CACHE_BITS = 24
#: Most operand-tuple lists one walk keeps for reuse by prefixes of equal shapes (then it starts over).
TUPLE_CACHE_ENTRIES = 50_000
#: Most walk levels whose last-op rows one walk keeps as arrays (``_LastRows``, a few kilobytes each).
LAST_LEVEL_ENTRIES = 5_000
#: The same for the rows of the levels' tensor shapes and kinds, which the levels' own rows are narrowed from.
SHAPE_LEVEL_ENTRIES = 2_000
#: The last op is tried on the rows of queued prefixes at once once they reach this many (``flush_last``): a
#: prefix has a few hundred, and each array operation's own cost then falls on hundreds of prefixes.
LAST_BATCH_ROWS = 50_000
NO_OPERAND = 255
INPUT_SET = 254  # key of the pseudo-op "this input is an output" in the codes of graphs of no op


def bit_mask(tensors: Iterable[int]) -> int:
    """The set of tensor indices as a bit mask (an operand read twice counts once)."""
    mask = 0
    for t in tensors:
        mask |= 1 << t
    return mask


def op_code(key: int, operands: tuple[int, ...]) -> bytes:
    """The 3-byte code of one op application."""
    return bytes((key, *operands, *([NO_OPERAND] * (2 - len(operands)))))


def _family_prev() -> list[int | None]:
    prev: list[int | None] = []
    last: dict[str, int] = {}
    for i, (_, fam, _, _) in enumerate(INPUTS):
        prev.append(last.get(fam))
        last[fam] = i
    return prev


FAMILY_PREV = _family_prev()
WEIGHT_INPUT = tuple(kind == "const" for _, _, kind, _ in INPUTS)


@dataclass
class Level:
    """What every op's operand tuples at one walk level share: for the last op, the connected components of the
    graph (``None`` before) with the ones each tensor touches as a bit mask (``full``: all of them)."""

    components: list[set[int]] | None
    masks: list[int]
    full: int

    @staticmethod
    def of(shapes: list[tuple[int, ...]], components: list[set[int]] | None) -> Level:
        if components is None:
            return Level(None, [], 0)
        masks = [0] * len(shapes)
        for i, members in enumerate(components):
            for t in members:
                masks[t] |= 1 << i
        return Level(components, masks, (1 << len(components)) - 1)


#: A tensor's kind as the operand typing sees it: (shape, whether it is a weight).
Kind = tuple[tuple[int, ...], bool]
#: What an application accepting operands of some kinds gives: (attributes, output shapes, all operands weights).
Accepted = tuple[Attrs, list[tuple[int, ...]], bool]


@dataclass
class WalkStats:
    """The counts of one walk (or of several, added): what ``enumerate_graphs`` yielded, tried and left out."""

    graphs: int = 0  # graphs yielded
    applications: int = 0  # op applications evaluated (or found in a memo)
    not_kept: int = 0  # graphs of ``max_ops`` ops ``keep_last`` (or a reducible last op) left out, never built
    duplicate_tensor: int = 0  # graphs whose new tensor repeats one they have: yielded, not walked on from
    reducible: int = 0  # prefixes whose last op must read an inner value of a reducible part, or none can
    reducible_last: int = 0  # last ops that end a part fewer ops compute
    open_output: int = 0  # prefixes no last op can complete: three outputs no kept graph has

    def __add__(self, other: WalkStats) -> WalkStats:
        return WalkStats(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))


class _StartOver(dict):
    """A memo of at most ``size`` entries that starts over when it is full: bounds a walk's memory (millions of
    paths at 4 ops) and keeps what the paths walked lately share."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def keep(self, key: Any, value: Any) -> Any:
        """Store ``value`` under ``key`` (emptied first when full) and return it."""
        if len(self) >= self.size:
            self.clear()
        self[key] = value
        return value


class _RecentFirst(dict):
    """A memo of at most ``size`` entries that drops the least recently used one for a new one."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def take(self, key: Any) -> Any:
        """The entry of ``key`` (None when there is none), taken out: ``keep`` puts it back as the most recent."""
        return self.pop(key, None)

    def keep(self, key: Any, value: Any, new: bool) -> Any:
        """Store ``value`` under ``key`` as the most recently used (a ``new`` one drops the oldest when full)."""
        if new and len(self) >= self.size:
            del self[next(iter(self))]
        self[key] = value
        return value


class MenuShapes:
    """What the menu entries give on operand shapes and kinds, memoized: the op table's shape rules and TASO's
    operand typing, which depend on the shapes and kinds only (never on the walk's path)."""

    def __init__(self) -> None:
        self.resolved: dict[tuple[int, tuple[tuple[int, ...], ...]], Accepted | None] = {}
        self.applies: dict[tuple[str, tuple[tuple[int, ...], ...]], bool] = {}
        self.typed_kinds: dict[tuple[str, tuple[Kind, ...]], bool] = {}

    def resolved_on(self, app: Application, in_shapes: tuple[tuple[int, ...], ...]) -> Accepted | None:
        """(attributes, output shapes, whether an output image shrinks below ``MIN_SPATIAL``) of the menu entry on
        operands of these shapes, or None when its shape rule refuses them."""
        key = (app.key, in_shapes)
        if key not in self.resolved:
            attrs = resolve(app.op, app.params, in_shapes)
            result = None
            if attrs is not None:
                try:
                    out_shapes = OPS[app.op].infer(in_shapes, attrs)
                except ShapeError:
                    out_shapes = None
                if out_shapes is not None:
                    # with it: whether an output image shrinks below MIN_SPATIAL (``accepted``)
                    result = (attrs, out_shapes, any(len(o) == 4 and min(o[2:]) < MIN_SPATIAL for o in out_shapes))
            self.resolved[key] = result
        return self.resolved[key]

    def some_entry_applies(self, op: str, in_shapes: tuple[tuple[int, ...], ...]) -> bool:
        """Whether any menu entry of ``op`` accepts these operand shapes (the op table's shape rule)."""
        key = (op, in_shapes)
        found = self.applies.get(key)
        if found is None:
            found = self.applies[key] = any(self.resolved_on(app, in_shapes) is not None for app in BY_OP[op])
        return found

    def typed(self, op: str, kinds: tuple[Kind, ...]) -> bool:
        """``operands_typed``, memoized."""
        found = self.typed_kinds.get((op, kinds))
        if found is None:
            found = self.typed_kinds[(op, kinds)] = operands_typed(op, kinds)
        return found

    def accepted(self, app: Application, in_shapes: tuple[tuple[int, ...], ...], all_weights: bool
                 ) -> tuple[Attrs, list[tuple[int, ...]]] | None:
        """(attributes, output shapes) of the menu entry on operands of these shapes, or None: its shape rule
        refuses them, or an image shrinks below ``MIN_SPATIAL`` from operands that are not all weights."""
        res = self.resolved_on(app, in_shapes)
        if res is None or (res[2] and not all_weights):
            return None
        return res[0], res[1]


def enumerate_graphs(max_ops: int = 3, seed: int = 0, first_ops: Callable[[int], bool] | None = None,
                     stats: WalkStats | None = None,
                     keep_last: Callable[[int], bool] | None = None,
                     fewer_ops: Mapping[int, int] | None = None,
                     multi_output_tensors: Container[int] | None = None,
                     kept_multisets: np.ndarray | None = None,
                     first_codes: FirstCodes | None = None,
                     last_fingerprints: FingerprintCache | None = None) -> Iterator[Visit]:
    """Yield every enumerated graph of 1..max_ops ops, then the graphs of no op (input sets of 1..3).

    ``first_ops(i)`` selects which applications of the first op this walk takes (a partition for workers);
    the no-op graphs come only from the walk that takes application 0. With ``keep_last``, a graph of
    ``max_ops`` ops is yielded only when ``keep_last(its fingerprint)``; the others are counted in
    ``stats.not_kept`` without being built (the 4-op run keeps only what a smaller graph computes).

    With ``fewer_ops`` (tensor fingerprint -> fewest ops of a smaller graph computing that tensor alone), a
    graph of ``max_ops`` ops is neither built nor walked towards when it has a *reducible part*: an op
    output below the last op whose ancestor ops outnumber ``fewer_ops`` of it, and whose other values only
    those ancestors read. Replacing that part by the smaller graph (a smaller rule) leaves a graph of fewer
    ops, so every rule of the graph is a composition of smaller ones (TASO's pruning); ``stats.reducible``
    counts the prefixes whose last op must read an inner value of such a part, and those not walked on because a
    part of theirs has none (one op: the graphs of fewer than ``max_ops`` ops below are not yielded either).
    ``multi_output_tensors`` (the output tensors of the kept graphs of two outputs or more): an output of the prefix
    outside it must be read by the last op, since a graph that leaves it as an output has two outputs or more
    (``stats.open_output`` counts the prefixes no last op can complete). ``kept_multisets`` (``output_multisets``
    of the kept graphs' outputs) tries the last op on the operand tuples of many prefixes at once: array operations
    over their rows instead of a Python step per application find the few whose outputs' multiset hash is a kept
    graph's, and only those are checked with ``keep_last`` (``GraphWalk.flush_last``: the same graphs of ``max_ops``
    ops in the same order, yielded in batches after smaller graphs the walk reached meanwhile).

    With ``first_codes`` as well, a part is also reducible when as many ops compute its tensor in the canonical
    graph of a smaller code (the part's code taken as its own graph's): a smaller rule of as many ops on each
    side rewrites it into the canonical graph, so every graph holding it has the rules of the graph holding the
    canonical one instead, composed with that smaller rule. Only parts whose own graph's op order is the walk's
    are compared: the ops before the part's end, or two ops (a chain has one order).

    ``last_fingerprints``: the cache of the last op's fingerprints (``kept_multisets``) to use, for a caller that
    walks several parts with the same seed (a fresh one of ``LAST_CACHE_BITS`` otherwise). The counts are added to
    ``stats``."""
    walk = GraphWalk(max_ops, seed, first_ops, WalkStats() if stats is None else stats, keep_last, fewer_ops,
                     multi_output_tensors, kept_multisets, first_codes, last_fingerprints)
    yield from walk.visits()


class GraphWalk:
    """One depth-first walk of ``enumerate_graphs`` (see there for the parameters): the current path (its tensors,
    ops and their bookkeeping, grown by ``extend`` and undone after), the memos its paths share, the prefixes
    queued for their last op, and its counts (``stats``). Nothing refers back to the walk, so its memos are freed
    with it, without the cyclic collector (which the generator's workers pause)."""

    def __init__(self, max_ops: int, seed: int, first_ops: Callable[[int], bool] | None, stats: WalkStats,
                 keep_last: Callable[[int], bool] | None, fewer_ops: Mapping[int, int] | None,
                 multi_output_tensors: Container[int] | None, kept_multisets: np.ndarray | None,
                 first_codes: FirstCodes | None, last_fingerprints: FingerprintCache | None) -> None:
        self.max_ops, self.first_ops, self.stats = max_ops, first_ops, stats
        self.keep_last, self.fewer_ops, self.first_codes = keep_last, fewer_ops, first_codes
        self.multi_output_tensors, self.kept_multisets = multi_output_tensors, kept_multisets
        self.filtering_below = fewer_ops is not None and keep_last is not None
        # the path: per tensor (the inputs first, then each op's outputs) and per op
        self.n_in = len(INPUTS)
        self.shapes: list[tuple[int, ...]] = [s for _, _, _, s in INPUTS]
        self.values: list[np.ndarray] = list(IntEvaluator(seed).inputs)
        self.fps: list[int] = [tensor_fp(v) for v in self.values]
        self.weight: list[bool] = list(WEIGHT_INPUT)
        self.consumers: list[int] = [0] * self.n_in
        self.tensor_op: list[int] = [-1] * self.n_in  # per tensor: the op producing it (-1: an input)
        self.readers: list[int] = [0] * self.n_in  # per tensor: bit mask of the ops reading it
        self.used = [0] * self.n_in  # per input: the ops reading it
        self.graph: list[Op] = []
        self.codes: list[bytes] = []
        self.op_keys: list[tuple[int, tuple[int, ...]]] = []
        self.producers: list[int] = []  # per op: first output tensor index
        self.op_cone: list[int] = []  # per op: bit mask of itself and its ancestor ops
        # the memos the paths share
        self.menu = MenuShapes()
        # (menu key, operand fingerprints) -> (outputs, their fingerprints); equal fingerprints mean equal values
        self.evaluated = _StartOver(MEMO_ENTRIES)
        self.seconds_cache = _StartOver(TUPLE_CACHE_ENTRIES)
        self.tuple_cache = _StartOver(TUPLE_CACHE_ENTRIES)
        self.last_memo = _StartOver(LAST_MEMO_ENTRIES)
        self.last_cache = _RecentFirst(LAST_LEVEL_ENTRIES)
        self.shape_cache = _RecentFirst(SHAPE_LEVEL_ENTRIES)
        self.kind_rows = KindRows(self.menu.accepted)
        self.int_kernels = [OPS[app.op].evaluate_int for app in APPLICATIONS]  # by menu key
        if last_fingerprints is not None:
            self.single_memo = last_fingerprints
        else:
            self.single_memo = FingerprintCache.of(LAST_CACHE_BITS if kept_multisets is not None else 0)
        self.multisets = MultisetFilter.of(kept_multisets if kept_multisets is not None else np.zeros(0, np.uint64))
        self.pending: list[_LastPrefix] = []  # prefixes queued for their last op (``queue_last``)
        self.pending_rows = 0  # their rows tried

    def visits(self) -> Iterator[Visit]:
        """The walk: its graphs of 1..max_ops ops, then (from the walk taking application 0) the graphs of no op."""
        yield from self.walk(0, [])
        if self.pending:
            yield from self.flush_last()
        if self.first_ops is None or self.first_ops(0):
            yield from _input_sets(self.fps[:self.n_in])

    def operand_tuples(self, op: str, level: Level) -> Iterator[tuple[int, ...]]:
        """The operand tuples of ``op`` at this level by TASO's typing of operands by the tensors' kinds
        (``operands_typed``); the op table's shape rule decides the rest. With ``components`` (the last op), only
        tuples touching every component."""
        shapes, weight, menu = self.shapes, self.weight, self.menu
        components = level.components
        k = arity(op)
        n = len(shapes)
        if k == 0:
            if components is None:
                yield ()
            return
        if components is not None and len(components) > k:
            return
        if k == 1:
            for a in (sorted(components[0]) if components is not None else range(n)):
                if menu.typed(op, ((shapes[a], weight[a]),)) and menu.some_entry_applies(op, (shapes[a],)):
                    yield (a,)
            return
        seconds = self.second_operands(op)
        if components is None:
            for a in range(n):
                for b in seconds[a]:
                    yield (a, b)
            return
        # the components a tensor touches as a bit mask: a tuple qualifies when its masks cover them all
        full, mask = level.full, level.masks
        for a in range(n):
            need = full & ~mask[a]
            if not need:
                yield from ((a, b) for b in seconds[a])
            else:
                yield from ((a, b) for b in seconds[a] if mask[b] & need == need)

    def second_operands(self, op: str) -> list[list[int]]:
        """Per tensor as the first operand of ``op`` (of two), the tensors it takes as the second, ascending:
        what ``operands_typed`` and some menu entry's shape rule accept. It depends on the tensors' kinds only."""
        shapes, weight, menu, n_in = self.shapes, self.weight, self.menu, self.n_in
        key = (op, tuple(shapes[n_in:]), tuple(weight[n_in:]))
        found = self.seconds_cache.get(key)
        if found is None:
            by_kind: dict[Kind, list[int]] = {}
            for t in range(len(shapes)):
                by_kind.setdefault((shapes[t], weight[t]), []).append(t)
            per_kind: dict[Kind, list[int]] = {}
            for kind in by_kind:
                accepted = [by_kind[other] for other in by_kind
                            if menu.typed(op, (kind, other)) and menu.some_entry_applies(op, (kind[0], other[0]))]
                per_kind[kind] = accepted[0] if len(accepted) == 1 else sorted(itertools.chain(*accepted))
            found = self.seconds_cache.keep(key, [per_kind[kind] for kind in zip(shapes, weight, strict=True)])
        return found

    def input_order_ok(self, operands: tuple[int, ...]) -> bool:
        """Whether these operands use the inputs of a family in order (``x1`` before ``x2``)."""
        n_in, used = self.n_in, self.used
        seen = set()
        for t in operands:
            if t < n_in and not used[t]:
                prev = FAMILY_PREV[t]
                if prev is not None and not used[prev] and prev not in seen:
                    return False
                seen.add(t)
        return True

    def level_tuples(self, op: str, level: Level, live: list[int], required: int
                     ) -> list[tuple[tuple[int, ...], bool, tuple, bool]]:
        """The operand tuples of ``op`` at this walk level that pass every test not depending on the menu
        entry: (operands, whether they read the previous op's outputs, operand shapes, all weights). With
        ``live`` (at the last op: the inner values of each reducible part), only tuples reading one of each; with
        ``required`` (a bit mask of tensors), only tuples reading all of them."""
        shapes, weight, input_order_ok = self.shapes, self.weight, self.input_order_ok
        entry = OPS[op]
        prev_first = self.producers[-1] if self.graph else len(shapes)
        commutative, distinct_only = entry.commutative, entry.constant_on_equal_inputs
        masked = bool(live or required)
        out = []
        for operands in self.operand_tuples(op, level):
            if len(operands) == 2:
                a, b = operands
                if (commutative and a > b) or (distinct_only and a == b):
                    continue
                all_weights = weight[a] and weight[b]
                depends = a >= prev_first or b >= prev_first
                in_shapes: tuple = (shapes[a], shapes[b])
                mask = 1 << a | 1 << b
            elif len(operands) == 1:
                (a,) = operands
                all_weights, depends, in_shapes, mask = weight[a], a >= prev_first, (shapes[a],), 1 << a
            else:
                all_weights, depends, in_shapes, mask = True, False, (), 0
            if not input_order_ok(operands):
                continue
            if masked and (mask & required != required or not all(inner & mask for inner in live)):
                continue
            out.append((operands, depends, in_shapes, all_weights))
        return out

    def outputs_of(self, i: int, prefix: _LastPrefix | None = None) -> range:
        """The tensor indices of op ``i``'s outputs (in ``prefix``, a queued prefix, or the walk's current one)."""
        starts, n = (self.producers, len(self.shapes)) if prefix is None else (prefix.producers, len(prefix.fps))
        return range(starts[i], starts[i + 1] if i + 1 < len(starts) else n)

    def reducible_parts(self, i: int, cone: int, live: list[int]) -> list[int]:
        """``live`` without the parts op ``i`` reads an inner value of, plus the reducible parts ending at op
        ``i``'s outputs (each as the bit mask of its inner values)."""
        graph, fps, readers, fewer_ops, first_codes = self.graph, self.fps, self.readers, self.fewer_ops, \
            self.first_codes
        operands = graph[i][2]
        mask = bit_mask(operands)
        out = [inner for inner in live if not inner & mask]
        if fewer_ops is None:
            return out
        size = cone.bit_count()
        prefix_or_pair = cone == (1 << size) - 1 or size <= 2
        for u in self.outputs_of(i):
            fewest = fewer_ops.get(fps[u])
            twin = None
            if fewest is None or fewest >= size:
                if first_codes is None or not prefix_or_pair:
                    continue
                twin = first_codes.code_of(fps[u], size)
                if twin is None:
                    continue
            inner, dead = 0, True
            for j in range(len(graph)):
                if not cone >> j & 1:
                    continue
                for v in self.outputs_of(j):
                    if v != u:
                        # an inner value read outside the part (or by nothing: a graph output) keeps it alive
                        dead = dead and readers[v] != 0 and readers[v] & ~cone == 0
                        inner |= 1 << v
            if dead and (twin is None or twin < self.part_code(cone)):
                out.append(inner)
        return out

    def reducible_last(self, operands: tuple[int, ...], new_fps: list[int], prefix: _LastPrefix | None = None
                       ) -> bool:
        """Whether the last op (of one output, reading ``operands``, in a graph of other outputs) ends a reducible
        part: its cone computes its output only, and fewer ops compute that (``stats.reducible_last``). The
        graph is then the rest of it beside that part, sharing inputs only, so replacing the part leaves a graph of
        fewer ops with the same outputs. ``prefix``: the queued prefix the last op completes (default: the walk's
        current one)."""
        if len(new_fps) != 1:
            return False
        if prefix is None:
            cones, made_by, read_by, index = self.op_cone, self.tensor_op, self.readers, len(self.graph)
        else:
            cones, made_by, read_by, index = prefix.op_cone, prefix.tensor_op, prefix.readers, len(prefix.graph)
        cone = 1 << index
        for t in operands:
            if t >= self.n_in:
                cone |= cones[made_by[t]]
        fewest = self.fewer_ops.get(new_fps[0])  # type: ignore[union-attr]
        if fewest is None or fewest >= cone.bit_count():
            return False
        for j in range(index):
            if cone >> j & 1:
                # every value of the part is read, and only by the part (the last op included)
                if any(read_by[v] & ~cone or not (read_by[v] or v in operands) for v in self.outputs_of(j, prefix)):
                    return False
        self.stats.reducible_last += 1
        return True

    def part_code(self, cone: int) -> bytes:
        """The code of the ops of ``cone`` as a graph of their own: their outputs renumbered after the inputs."""
        if cone == (1 << cone.bit_count()) - 1:
            return b"".join(self.codes[:cone.bit_count()])
        renamed: dict[int, int] = {}
        out = []
        for j in range(len(self.graph)):
            if cone >> j & 1:
                key, operands = self.op_keys[j]
                out.append(op_code(key, tuple(renamed.get(t, t) for t in operands)))
                for v in self.outputs_of(j):
                    renamed[v] = self.n_in + len(renamed)
        return b"".join(out)

    def applications_of(self, app: Application, op_tuples: list[tuple[tuple[int, ...], bool, tuple, bool]]
                        ) -> list[tuple[tuple[int, ...], bool, Attrs, list[tuple[int, ...]], bool]]:
        """The operand tuples this menu entry applies to (its shape rule accepts them and no image shrinks
        below ``MIN_SPATIAL``): (operands, reads the previous op, attributes, output shapes, all weights)."""
        out = []
        for operands, depends, in_shapes, is_w in op_tuples:
            res = self.menu.accepted(app, in_shapes, is_w)
            if res is not None:
                out.append((operands, depends, *res, is_w))
        return out

    def last_fps(self, app: Application, operands: tuple[int, ...], attrs: Attrs, memo_key: tuple[int, int, int],
                 tensors: list[np.ndarray] | None = None) -> int | tuple[int, ...]:
        """The fingerprint of the last op's output (a tuple of them for an op of several outputs), memoized by
        (menu key, the operands' fingerprints, 0 for none): its outputs are never operands, so only their
        fingerprints are kept. ``tensors``: the values the operands index (default: the walk's). The caller ignores
        overflow (wrapping int64)."""
        found = self.last_memo.get(memo_key)
        if found is None:
            tensors = self.values if tensors is None else tensors
            outs = OPS[app.op].evaluate_int(np, [tensors[t] for t in operands], attrs)
            found = self.last_memo.keep(memo_key,
                                        tensor_fp(outs[0]) if len(outs) == 1 else tuple(map(tensor_fp, outs)))
        return found

    def extend(self, app: Application, operands: tuple[int, ...], attrs: Attrs, out_shapes: list[tuple[int, ...]],
               is_w: bool, outs: list[np.ndarray | None], new_fps: list[int], depth: int, live: list[int]
               ) -> Iterator[Visit]:
        """Apply the op, yield the graph, walk on from it (unless it is the last or repeats a tensor), undo."""
        shapes, values, fps, weight, consumers = self.shapes, self.values, self.fps, self.weight, self.consumers
        tensor_op, readers, used, op_cone, n_in = self.tensor_op, self.readers, self.used, self.op_cone, self.n_in
        graph, codes, op_keys, producers = self.graph, self.codes, self.op_keys, self.producers
        existing = set(fps)
        duplicate = any(f in existing for f in new_fps) or len(set(new_fps)) < len(new_fps)
        first = len(shapes)
        index = len(graph)
        for o, s, f in zip(outs, out_shapes, new_fps, strict=True):
            shapes.append(tuple(s))
            values.append(o)
            fps.append(f)
            weight.append(is_w)
            consumers.append(0)
            tensor_op.append(index)
            readers.append(0)
        cone = 1 << index
        for t in operands:
            consumers[t] += 1
            readers[t] |= 1 << index
            if t < n_in:
                used[t] += 1
            else:
                cone |= op_cone[tensor_op[t]]
        op_cone.append(cone)
        graph.append((app.op, attrs, operands))
        codes.append(op_code(app.key, operands))
        op_keys.append((app.key, operands))
        producers.append(first)
        outputs = tuple(t for t in range(n_in, len(shapes)) if consumers[t] == 0)
        out_fps = tuple(fps[t] for t in outputs)
        self.stats.graphs += 1
        yield Visit(tuple(graph), graph_fp(list(out_fps)), outputs, out_fps,
                    frozenset(i for i in range(n_in) if used[i]), b"".join(codes))
        if duplicate:
            self.stats.duplicate_tensor += 1
        elif depth + 1 < self.max_ops:
            below = self.reducible_parts(index, cone, live) if self.filtering_below else live
            if 0 in below:
                # a part of one op has no inner value a later op could read: no widest graph below is kept
                self.stats.reducible += 1
            else:
                yield from self.walk(depth + 1, below)
        # undo
        producers.pop()
        op_cone.pop()
        for t in operands:
            readers[t] &= ~(1 << index)
        op_keys.pop()
        graph.pop()
        codes.pop()
        for t in operands:
            consumers[t] -= 1
            if t < n_in:
                used[t] -= 1
        del shapes[first:], values[first:], fps[first:], weight[first:], consumers[first:]
        del tensor_op[first:], readers[first:]

    def last_rows(self, level: Level, level_key: tuple, live: list[int], required: int) -> _LastRows:
        """The last op's rows of this level (memoized by ``level_key``): those of the level without ``live`` and
        ``required``, narrowed to them, or the rows of the tensors' shapes and kinds narrowed to the level's."""
        rows = self.last_cache.take(level_key)
        new = rows is None
        if new:
            if live or required:
                # the rows of the level without them, narrowed: levels differing only there share one build
                rows = self.last_rows(level, (*level_key[:-2], (), 0), [], 0).reading(required, live)
            else:
                rows = self.shape_rows().narrowed(np.array([u > 0 for u in self.used], dtype=bool), level.masks,
                                                  level.full)
        return self.last_cache.keep(level_key, rows, new)  # the most recently used last: the least recent go first

    def shape_rows(self) -> _LastRows:
        """The last op's rows of every level with these tensor shapes and kinds, whatever inputs the graph uses and
        however its components lie (``_LastRows.narrowed`` picks a level's own): array operations over
        ``kind_rows``' tables, no Python step per row."""
        shapes, weight, kind_rows = self.shapes, self.weight, self.kind_rows
        key = (tuple(shapes[self.n_in:]), tuple(weight[self.n_in:]))
        rows = self.shape_cache.take(key)
        new = rows is None
        if new:
            rows = kind_rows.rows_of([kind_rows.kind((s, w)) for s, w in zip(shapes, weight, strict=True)])
        return self.shape_cache.keep(key, rows, new)

    def queue_last(self, level: Level, level_key: tuple, live: list[int], required: int, open_outputs: list[int]
                   ) -> None:
        """Queue the current prefix for its last op (``kept_multisets``): its rows of the level and the state the
        last op's fingerprints, checks and graphs read, copied (the walk moves on before ``flush_last``)."""
        table = self.last_rows(level, level_key, live, required)
        if not len(table.keys):
            return
        tried = np.flatnonzero(table.tried(self.op_keys, self.producers[-1]))
        if not len(tried):
            return
        self.pending.append(_LastPrefix(table, tried, self.fps.copy(), self.values.copy(), open_outputs,
                                        self.used.copy(), self.readers.copy(), self.op_cone.copy(),
                                        self.tensor_op.copy(), self.producers.copy(), tuple(self.graph),
                                        b"".join(self.codes)))
        self.pending_rows += len(tried)

    def flush_last(self) -> Iterator[Visit]:
        """The last op over all the candidate applications of the queued prefixes at once: the applications whose
        graph's outputs have a kept graph's multiset hash, found by array operations over the prefixes' rows
        together (a prefix has a few hundred: one pass over many instead of a few dozen array operations each),
        checked one by one with ``keep_last``, then yielded prefix by prefix in the walk's order."""
        batch = self.pending.copy()
        self.pending.clear()
        self.pending_rows = 0
        single_memo, keep_last = self.single_memo, self.keep_last
        sizes = np.array([len(p.tried) for p in batch], np.int64)
        table_sizes = np.array([len(p.table.keys) for p in batch], np.int64)
        table_starts = np.zeros(len(batch), np.int64)
        np.cumsum(table_sizes[:-1], out=table_starts[1:])
        prefix_of = np.repeat(np.arange(len(batch)), sizes)  # per row: its prefix in the batch
        rows = np.concatenate([p.tried for p in batch]) + table_starts[prefix_of]  # into the tables joined
        first, second, one, keys, result_of = (_joined(batch, rows, "first"), _joined(batch, rows, "second"),
                                               _joined(batch, rows, "single"), _joined(batch, rows, "keys"),
                                               _joined(batch, rows, "result"))
        # each prefix's tensor fingerprints and a 0 for "no second operand", one after another
        widths = np.array([len(p.fps) + 1 for p in batch], np.int64)
        fps_at = np.cumsum(widths) - widths
        fps_all = np.fromiter((f for p in batch for f in (*p.fps, 0)), np.uint64, int(widths.sum()))
        at = fps_at[prefix_of]
        no_second = at + widths[prefix_of] - 1
        # per row of one output its fingerprint (from the cache, or computed once per key in the batch and stored),
        # per row of several (split) the tuple of theirs (memoized by ``last_fps``)
        tags, slots = single_memo.address(_joined(batch, rows, "key_tag"), fps_all[first + at],
                                          fps_all[np.where(second >= 0, second + at, no_second)])
        found = single_memo.values[slots]
        several: dict[int, tuple[int, ...]] = {}
        missed = np.flatnonzero((single_memo.tags[slots] != tags) & one)
        results = self.kind_rows.results
        with np.errstate(over="ignore"):
            if len(missed):
                _, firsts, inverse = np.unique(tags[missed], return_index=True, return_inverse=True)
                once = missed[firsts]
                computed = []
                for key, a, b, result, k in zip(keys[once].tolist(), first[once].tolist(), second[once].tolist(),
                                                result_of[once].tolist(), prefix_of[once].tolist(), strict=True):
                    tensors = batch[k].values
                    arrays = [tensors[a]] if b < 0 else [tensors[a], tensors[b]]
                    computed.append(tensor_fp(self.int_kernels[key](np, arrays, results[result][0])[0]))
                found[missed] = np.array(computed, dtype=np.uint64)[inverse.reshape(-1)]
                single_memo.store(tags, slots, found, once)
            multi = np.flatnonzero(~one)
            if len(multi):
                for j, key, a, b, result, k in zip(multi.tolist(), keys[multi].tolist(), first[multi].tolist(),
                                                   second[multi].tolist(), result_of[multi].tolist(),
                                                   prefix_of[multi].tolist(), strict=True):
                    p = batch[k]
                    app, operands = APPLICATIONS[key], (a,) if b < 0 else (a, b)
                    memo_key = (app.key, p.fps[a], p.fps[b] if b >= 0 else 0)
                    several[j] = self.last_fps(app, operands, results[result][0],  # type: ignore[assignment]
                                               memo_key, p.values)
        own = multiset_hash(found)
        if several:
            multi_at = sorted(several)
            width = max(len(several[j]) for j in multi_at)
            padded = np.array([(*several[j], *(0,) * (width - len(several[j]))) for j in multi_at], dtype=np.uint64)
            own[multi_at] = multiset_hash(padded).sum(axis=1, dtype=np.uint64)
        # the multiset hash of the graph's outputs: the open outputs the last op does not read, and its own
        most_open = max(len(p.open_outputs) for p in batch)
        if most_open:
            opened = np.full((len(batch), most_open), -2, np.int64)  # -2: no tensor (-1 is "no second operand")
            open_fps = np.zeros((len(batch), most_open), np.uint64)  # a 0 mixes to 0
            for k, p in enumerate(batch):
                if p.open_outputs:
                    opened[k, :len(p.open_outputs)] = p.open_outputs
                    open_fps[k, :len(p.open_outputs)] = [p.fps[t] for t in p.open_outputs]
            mixed = multiset_hash(open_fps)
            for i in range(most_open):
                t = opened[prefix_of, i]
                own += np.where((first == t) | (second == t), np.uint64(0), mixed[prefix_of, i])
        survivors: list[dict[int, tuple[list[int], int]]] = [{} for _ in batch]
        # an equal hash is a candidate only: the graph's own fingerprint decides, as in the walk of one by one
        members = self.multisets.members(own)
        kept = 0
        for j, k, i in zip(members.tolist(), prefix_of[members].tolist(), (rows[members] - table_starts[
                prefix_of[members]]).tolist(), strict=True):
            p = batch[k]
            new_fps = list(several[j]) if j in several else [int(found[j])]
            operands = p.table.row(i)[1]
            rest = [p.fps[t] for t in p.open_outputs if t not in operands]
            fingerprint = graph_fp(rest + new_fps)
            if keep_last(fingerprint) and not (self.filtering_below and rest  # type: ignore[misc]
                                               and self.reducible_last(operands, new_fps, p)):
                survivors[k][i] = (new_fps, fingerprint)
                kept += 1
        self.stats.applications += len(rows)
        self.stats.not_kept += len(rows) - kept
        for p, kept_rows in zip(batch, survivors, strict=True):
            if kept_rows:
                yield from self.last_visits(p, kept_rows)

    def last_visits(self, p: _LastPrefix, kept_rows: dict[int, tuple[list[int], int]]) -> Iterator[Visit]:
        """The graph of each kept last op of a queued prefix, built without applying it (nothing walks on from
        it), in the walk's order."""
        n_in = self.n_in
        existing = set(p.fps)
        n = len(p.fps)
        for i in sorted(kept_rows):
            app, operands, attrs = p.table.row(i)
            new_fps, fingerprint = kept_rows[i]
            if any(f in existing for f in new_fps) or len(set(new_fps)) < len(new_fps):
                self.stats.duplicate_tensor += 1
            outputs = (*(t for t in p.open_outputs if t not in operands), *range(n, n + len(new_fps)))
            inputs_used = frozenset(t for t in range(n_in) if p.used[t] or t in operands)
            self.stats.graphs += 1
            yield Visit((*p.graph, (app.op, attrs, operands)), fingerprint, outputs,
                        (*(p.fps[t] for t in outputs[:-len(new_fps)]), *new_fps), inputs_used,
                        p.code + op_code(app.key, operands))

    def walk(self, depth: int, live: list[int]) -> Iterator[Visit]:
        """The graphs below the current path, whose next op is at ``depth``; ``live``: the inner values of each
        reducible part below it (``reducible_parts``)."""
        shapes, weight, fps, used, graph, op_keys, n_in = (self.shapes, self.weight, self.fps, self.used, self.graph,
                                                           self.op_keys, self.n_in)
        # The last op must join every component: a graph of independent parts only yields rules that are
        # products of smaller ones (a disconnected graph of fewer ops is still enumerated as a target).
        last = depth == self.max_ops - 1
        components = component_tensors(graph, self.producers) if last and graph else None
        tuples: dict[str, list[tuple[tuple[int, ...], bool, tuple, bool]]] = {}  # per op, not per menu entry
        last_key = op_keys[-1] if graph else None
        filtering = last and self.keep_last is not None
        open_outputs = [t for t in range(n_in, len(shapes)) if self.consumers[t] == 0] if filtering else []
        required = 0
        if filtering and self.multi_output_tensors is not None:
            required = bit_mask(t for t in open_outputs if fps[t] not in self.multi_output_tensors)
            if required.bit_count() > 2:  # no op reads three tensors
                self.stats.open_output += 1
                return
        level = Level.of(shapes, components)
        if last and live:
            self.stats.reducible += 1
        # Everything the operand tuples depend on: prefixes of other ops with the same tensor shapes, kinds,
        # inputs used and components share them (most do: add, mul, sub and matmul all make a 4x4 tensor).
        level_key = (tuple(shapes[n_in:]), tuple(weight[n_in:]), tuple(u > 0 for u in used),
                     tuple(level.masks) if components is not None else None,
                     self.producers[-1] if graph else len(shapes), tuple(live) if last else (), required)
        if filtering and self.kept_multisets is not None and depth > 0:
            self.queue_last(level, level_key, live, required, open_outputs)
            if self.pending_rows >= LAST_BATCH_ROWS:
                yield from self.flush_last()
            return
        path_keys = {k for k, _ in op_keys}
        for app in APPLICATIONS:
            if depth == 0 and self.first_ops is not None and not self.first_ops(app.key):
                continue
            applicable = self.tuple_cache.get((app.key, level_key))
            if applicable is None:
                if app.op not in tuples:
                    tuples[app.op] = self.level_tuples(app.op, level, live if last else [], required)
                applicable = self.tuple_cache.keep((app.key, level_key), self.applications_of(app, tuples[app.op]))
            # an op independent of the previous one must come after it in (menu key, operands) order
            before = last_key is not None and app.key < last_key[0]
            same = last_key is not None and app.key == last_key[0]
            on_path = app.key in path_keys
            for operands, depends, attrs, out_shapes, is_w in applicable:
                if not depends and (before or (same and operands <= last_key[1])):
                    continue
                if on_path and (app.key, operands) in op_keys:
                    continue
                self.stats.applications += 1
                if last:
                    found = self.last_op_fps(app, operands, attrs, open_outputs, filtering)
                    if found is None:
                        self.stats.not_kept += 1
                        continue
                    outs, new_fps = found
                else:
                    outs, new_fps = self.evaluate(app, operands, attrs)
                yield from self.extend(app, operands, attrs, out_shapes, is_w, outs, new_fps, depth, live)

    def last_op_fps(self, app: Application, operands: tuple[int, ...], attrs: Attrs, open_outputs: list[int],
                    filtering: bool) -> tuple[list[None], list[int]] | None:
        """The last op's outputs (never needed: nothing reads them) and fingerprints, or None when its graph is
        not kept (``keep_last``) or ends a reducible part."""
        fps = self.fps
        memo_key = (app.key, fps[operands[0]] if operands else 0, fps[operands[1]] if len(operands) > 1 else 0)
        with np.errstate(over="ignore"):
            found = self.last_fps(app, operands, attrs, memo_key)
        new_fps = list(found) if isinstance(found, tuple) else [found]
        rest = [fps[t] for t in open_outputs if t not in operands]
        if filtering and not self.keep_last(graph_fp(rest + new_fps)):  # type: ignore[misc]
            return None
        if self.filtering_below and rest and self.reducible_last(operands, new_fps):
            return None
        return [None] * len(new_fps), new_fps

    def evaluate(self, app: Application, operands: tuple[int, ...], attrs: Attrs) -> tuple[list[np.ndarray], list[int]]:
        """The op's outputs on the path's tensors and their fingerprints, memoized by (menu key, the operands'
        fingerprints): three quarters of the applications repeat one already evaluated on other paths."""
        memo_key = (app.key, *map(self.fps.__getitem__, operands))
        memo = self.evaluated.get(memo_key)
        if memo is None:
            with np.errstate(over="ignore"):
                outs = OPS[app.op].evaluate_int(np, [self.values[t] for t in operands], attrs)
            memo = self.evaluated.keep(memo_key, (outs, [tensor_fp(o) for o in outs]))
        return memo


def component_tensors(graph: Sequence[Op], producers: Sequence[int]) -> list[set[int]]:
    """Per connected component of the ops of ``graph`` (joined by shared tensors; ``producers``: per op its first
    output tensor): the tensors it touches."""
    parent = list(range(len(graph)))
    toucher: dict[int, int] = {}
    for i, (op, attrs, operands) in enumerate(graph):
        first = producers[i]
        touched = list(operands) + list(range(first, first + OPS[op].num_outputs(attrs)))
        for t in touched:
            if t in toucher:
                parent[_root(parent, i)] = _root(parent, toucher[t])
            else:
                toucher[t] = i
    groups: dict[int, set[int]] = {}
    for t, i in toucher.items():
        groups.setdefault(_root(parent, i), set()).add(t)
    return list(groups.values())


def _root(parent: list[int], i: int) -> int:
    """The root of ``i`` in the union-find forest ``parent``, halving the path on the way."""
    while parent[i] != i:
        parent[i] = parent[parent[i]]
        i = parent[i]
    return i


def _joined(batch: list[_LastPrefix], rows: np.ndarray, field: str) -> np.ndarray:
    """One field of the batch's last-op tables, joined, at ``rows``."""
    return np.concatenate([getattr(p.table, field) for p in batch])[rows]


def operands_typed(op: str, kinds: tuple[Kind, ...]) -> bool:
    """TASO's typing of operands (what ``operand_tuples`` enumerates), one tuple of kinds at a time: an image is an
    activation (not a weight) and a kernel a weight, both rank 4; a scalar operand is the scalar input and scales a
    tensor that is not one; a menu with ``same_shapes`` takes equal shapes; ``weights_only`` ops take weights
    only. The op table's shape rule decides the rest."""
    entry = OPS[op]
    no_weights = entry.role(0) == "image" or entry.menu.activations_only  # type: ignore[union-attr]
    (shape_a, weight_a), rest = kinds[0], kinds[1:]
    if entry.weights_only and not all(w for _, w in kinds):
        return False
    if not rest:
        return not (no_weights and weight_a)
    ((shape_b, weight_b),) = rest
    if entry.menu.same_shapes:  # type: ignore[union-attr]
        return not (no_weights and weight_a) and shape_a == shape_b
    roles = (entry.role(0), entry.role(1))
    if roles[1] == "scalar":
        return shape_a != () and shape_b == ()
    if roles == ("image", "kernel"):
        return len(shape_a) == 4 and not weight_a and len(shape_b) == 4 and weight_b
    return True


class KindRows:
    """Which applications of one or two operands accept which operand kinds, as arrays grown as kinds appear
    (``accepted`` per application and pair of kinds: an index into ``results``, -1 for none), so the last op's
    rows of a level are found by array operations over its tensors' kinds (``rows_of``)."""

    def __init__(self, accepted: Callable[[Application, tuple[tuple[int, ...], ...], bool],
                                          tuple[Attrs, list[tuple[int, ...]]] | None]) -> None:
        self.accepted = accepted  # (application, operand shapes, all weights) -> (attrs, output shapes) or None
        self.kinds: dict[Kind, int] = {}
        self.by_index: list[Kind] = []
        self.results: list[Accepted] = []
        self.single: list[bool] = []  # per result: one output
        self.unary = [app for app in APPLICATIONS if arity(app.op) == 1]
        self.binary = [app for app in APPLICATIONS if arity(app.op) == 2]
        self.unary_keys = np.array([app.key for app in self.unary], np.int64)
        self.binary_keys = np.array([app.key for app in self.binary], np.int64)
        self.accepted_one = np.zeros((len(self.unary), 0), np.int32)
        self.accepted_two = np.zeros((len(self.binary), 0, 0), np.int32)
        self.known = np.zeros((0, 0), bool)
        self.index_ok: dict[int, np.ndarray] = {}

    def kind(self, kind: Kind) -> int:
        """The index of a kind (a new one gets the next)."""
        found = self.kinds.get(kind)
        if found is None:
            found = self.kinds[kind] = len(self.by_index)
            self.by_index.append(kind)
            self._grow(found + 1)
            self.accepted_one[:, found] = [self._accept(app, (kind,)) for app in self.unary]
        return found

    def _grow(self, size: int) -> None:
        have = self.known.shape[0]
        if size <= have:
            return
        new = max(size, 2 * have, 16)
        self.accepted_one = np.pad(self.accepted_one, ((0, 0), (0, new - have)), constant_values=-1)
        self.accepted_two = np.pad(self.accepted_two, ((0, 0), (0, new - have), (0, new - have)), constant_values=-1)
        self.known = np.pad(self.known, ((0, new - have), (0, new - have)))

    def _accept(self, app: Application, kinds: tuple[Kind, ...]) -> int:
        if not operands_typed(app.op, kinds):
            return -1
        all_weights = all(w for _, w in kinds)
        found = self.accepted(app, tuple(shape for shape, _ in kinds), all_weights)
        if found is None:
            return -1
        attrs, out_shapes = found
        self.results.append((attrs, out_shapes, all_weights))
        self.single.append(len(out_shapes) == 1)
        return len(self.results) - 1

    def _pairs_known(self, kinds: np.ndarray) -> None:
        present = np.unique(kinds)
        if self.known[np.ix_(present, present)].all():
            return
        for a in present.tolist():
            for b in present.tolist():
                if not self.known[a, b]:
                    pair = (self.by_index[a], self.by_index[b])
                    self.accepted_two[:, a, b] = [self._accept(app, pair) for app in self.binary]
                    self.known[a, b] = True

    def _index_ok(self, n: int) -> np.ndarray:
        """Per binary application, which operand index pairs (a, b) of n tensors it may read: a commutative op
        a <= b, one constant on equal inputs a != b."""
        found = self.index_ok.get(n)
        if found is None:
            a, b = np.indices((n, n))
            found = self.index_ok[n] = np.stack([
                ((a <= b) if OPS[app.op].commutative else np.ones((n, n), bool))
                & ((a != b) if OPS[app.op].constant_on_equal_inputs else np.ones((n, n), bool))
                for app in self.binary])
        return found

    def rows_of(self, tensor_kinds: list[int]) -> _LastRows:
        """The rows of every application of one or two operands over tensors of these kinds, in the walk's order
        (menu key, first operand, second)."""
        kinds = np.array(tensor_kinds, np.intp)
        self._pairs_known(kinds)
        n = len(kinds)
        two = np.where(self._index_ok(n), self.accepted_two[:, kinds[:, None], kinds[None, :]], -1)
        app2, first2, second2 = np.nonzero(two >= 0)
        one = self.accepted_one[:, kinds]
        app1, first1 = np.nonzero(one >= 0)
        keys = np.concatenate([self.binary_keys[app2], self.unary_keys[app1]])
        first = np.concatenate([first2, first1]).astype(np.int64)
        second = np.concatenate([second2, np.full(len(first1), -1)]).astype(np.int64)
        results = np.concatenate([two[app2, first2, second2], one[app1, first1]]).astype(np.int64)
        order = np.lexsort((second, first, keys))
        results = results[order]
        return _LastRows.of(self.results, keys[order], first[order], second[order], results,
                            np.array(self.single, bool)[results] if len(results) else np.zeros(0, bool))


@dataclass
class _LastPrefix:
    """A prefix of ``max_ops - 1`` ops queued for its last op (``enumerate_graphs``' ``kept_multisets``): its
    last-op rows (``table``, those tried at ``tried``) and the walk's state they read, copied: tensor fingerprints
    and values, open outputs, per input its readers count, per tensor its readers and producing op, per op its cone
    and first output, the ops and their code."""

    table: _LastRows
    tried: np.ndarray
    fps: list[int]
    values: list[np.ndarray]
    open_outputs: list[int]
    used: list[int]
    readers: list[int]
    op_cone: list[int]
    tensor_op: list[int]
    producers: list[int]
    graph: tuple
    code: bytes


@dataclass
class _LastRows:
    """The last op's candidate applications at one walk level, in the walk's order, as arrays: menu key, first and
    second operand (-1: none), the index of what the application gives (``results``: attributes, output shapes,
    all weights), whether it has one output."""

    results: list[Accepted]
    keys: np.ndarray
    first: np.ndarray
    second: np.ndarray
    result: np.ndarray
    single: np.ndarray
    code: np.ndarray  # (menu key, first + 1, second + 1) as one int64 ordered as the triple
    top: np.ndarray  # the larger operand
    key_tag: np.ndarray  # the menu key's term of ``FingerprintCache.address``

    @staticmethod
    def of(results: list[Accepted], keys: np.ndarray, first: np.ndarray, second: np.ndarray, result: np.ndarray,
           single: np.ndarray) -> _LastRows:
        return _LastRows(results, keys, first, second, result, single, _op_codes(keys, first, second),
                         np.maximum(first, second), key_tag(keys))

    def row(self, i: int) -> tuple[Application, tuple[int, ...], Attrs]:
        """Row ``i``'s application, operands and attributes."""
        first, second = int(self.first[i]), int(self.second[i])
        return (APPLICATIONS[int(self.keys[i])], (first,) if second < 0 else (first, second),
                self.results[int(self.result[i])][0])

    def subset(self, at: np.ndarray) -> _LastRows:
        """The rows at the positions ``at`` (ascending)."""
        return _LastRows(self.results, self.keys[at], self.first[at], self.second[at], self.result[at],
                         self.single[at], self.code[at], self.top[at], self.key_tag[at])

    def narrowed(self, used: np.ndarray, masks: list[int], full: int) -> _LastRows:
        """The rows of one level from those of its shapes and kinds: the graph uses the inputs ``used`` (a flag
        per input), each tensor touches the components of its bit mask in ``masks``, ``full`` is all of them. A row
        must touch every component (``operand_tuples``) and take an input only after the earlier ones of its
        family, used before or its first operand (``input_order_ok``)."""
        n_in = len(used)
        n = len(masks)
        # per tensor, plus a last entry for "no operand" (-1)
        prev = np.full(n + 1, -2, np.int64)
        prev[:n_in] = [-2 if p is None else p for p in FAMILY_PREV]
        in_order = np.ones(n + 1, bool)
        in_order[:n_in] = used | (prev[:n_in] < 0) | used[np.maximum(prev[:n_in], 0)]
        touched = np.zeros(n + 1, np.int64)
        touched[:n] = masks
        first, second = self.first, self.second
        keep = (in_order[first] & (in_order[second] | (prev[second] == first))
                & ((touched[first] | touched[second]) == full))
        return self.subset(np.flatnonzero(keep))

    def reading(self, required: int, live: list[int]) -> _LastRows:
        """The rows whose operands include every tensor of the bit mask ``required`` and one of each mask of
        ``live`` (``level_tuples``' narrowing, on the arrays)."""
        one = np.int64(1)
        read = (one << self.first) | np.where(self.second >= 0, one << np.maximum(self.second, 0), 0)
        keep = read & required == required
        for inner in live:
            keep &= read & inner != 0
        return self.subset(np.flatnonzero(keep))

    def tried(self, op_keys: list[tuple[int, tuple[int, ...]]], prev_first: int) -> np.ndarray:
        """Which rows the walk tries after the ops ``op_keys``, the last of which has its first output at
        ``prev_first``: an op independent of the previous one comes after it in (menu key, operands) order, and
        no op repeats one of the graph (an op of no operand is never a last op: it joins no component)."""
        codes = [_op_code_int(key, operands) for key, operands in op_keys if operands]
        skip = (self.top < prev_first) & (self.code <= _op_code_int(*op_keys[-1]))
        for code in codes:
            skip |= self.code == code
        return ~skip


def _op_code_int(key: int, operands: tuple[int, ...]) -> int:
    """An op's (menu key, operands) as ``_op_codes`` gives it."""
    first = operands[0] if operands else -1
    second = operands[1] if len(operands) > 1 else -1
    return key << 16 | (first + 1) << 8 | (second + 1)


def _op_codes(keys: np.ndarray, first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Ops as one int64 each, in the order of their (menu key, first operand, second operand; -1: none)."""
    return keys << 16 | (first + 1) << 8 | (second + 1)


_MIX = (np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))
_TAG = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F), np.uint64(0x165667B19E3779F9))


def key_tag(keys: np.ndarray) -> np.ndarray:
    """The menu keys' term of ``FingerprintCache.address``."""
    with np.errstate(over="ignore"):
        return keys.astype(np.uint64) * _TAG[2]


def multiset_hash(fingerprints: np.ndarray) -> np.ndarray:
    """Each tensor fingerprint mixed (splitmix64's finalizer; 0 stays 0): the sum over a graph's outputs is
    an order-independent hash of their multiset that arrays add up, where ``graph_fp`` hashes one at a time."""
    x = fingerprints.astype(np.uint64)
    x ^= x >> np.uint64(30)
    x *= _MIX[0]
    x ^= x >> np.uint64(27)
    x *= _MIX[1]
    x ^= x >> np.uint64(31)
    return x


#: log2 of the flags in front of the kept multiset hashes (``MultisetFilter``): 64 M one-byte flags; with the
#: 2.8 M hashes of the <= 3-op graphs, about 4% of the hashes a flag lets through are not kept.
MULTISET_FILTER_BITS = 26


@dataclass(frozen=True)
class MultisetFilter:
    """The kept multiset hashes (``kept``) and a flag per value of a hash's top ``MULTISET_FILTER_BITS`` bits
    (``flags``): whether a kept hash has them. The flags settle most of the last op's rows in one array lookup, a
    binary search the rest: in a third of the memory of a Python set of the hashes, and without a Python step per
    row."""

    kept: SortedFingerprints
    flags: np.ndarray

    @staticmethod
    def of(hashes: np.ndarray) -> MultisetFilter:
        """The filter of ``hashes`` (sorted and unique)."""
        flags = np.zeros(1 << MULTISET_FILTER_BITS, dtype=bool)
        flags[hashes >> np.uint64(64 - MULTISET_FILTER_BITS)] = True
        return MultisetFilter(SortedFingerprints(hashes), flags)

    def members(self, hashes: np.ndarray) -> np.ndarray:
        """The positions of ``hashes`` (uint64) that are kept hashes, ascending."""
        at = np.flatnonzero(self.flags[hashes >> np.uint64(64 - MULTISET_FILTER_BITS)])
        return at[self.kept.members(hashes[at])]


def output_multisets(outs: np.ndarray) -> np.ndarray:
    """The sorted multiset hashes of graphs given as rows of output fingerprints padded with 0 (``pack``'s
    ``outs``): ``enumerate_graphs``' ``kept_multisets``."""
    return np.unique(multiset_hash(outs).sum(axis=1, dtype=np.uint64))


@dataclass(frozen=True)
class FingerprintCache:
    """The fingerprints of op outputs by (menu key, operand fingerprints), direct-mapped: ``tags`` and ``values``
    hold ``2**bits`` slots, each the latest entry whose 64-bit tag (a hash of the key) falls in it, so the rows of
    a prefix are looked up and stored by a few array operations, and a miss is computed again."""

    tags: np.ndarray
    values: np.ndarray

    @staticmethod
    def of(bits: int) -> FingerprintCache:
        """An empty cache of ``2**bits`` slots (a tag is never 0)."""
        return FingerprintCache(np.zeros(1 << bits, np.uint64), np.zeros(1 << bits, np.uint64))

    def address(self, key_tags: np.ndarray, first_fps: np.ndarray, second_fps: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
        """The tags and slots of the keys: menu keys (as ``key_tag``) and operand fingerprints (0 for no second
        operand)."""
        with np.errstate(over="ignore"):
            mixed = first_fps * _TAG[0] + second_fps * _TAG[1] + key_tags
        tags = multiset_hash(mixed) | np.uint64(1)
        shift = np.uint64(64 - (len(self.tags).bit_length() - 1))
        return tags, (tags >> shift).astype(np.intp) if shift < 64 else np.zeros(len(tags), np.intp)

    def store(self, tags: np.ndarray, slots: np.ndarray, values: np.ndarray, rows: np.ndarray) -> None:
        """Store ``values`` of the ``rows`` given by their index into ``tags``/``slots``."""
        self.tags[slots[rows]] = tags[rows]
        self.values[slots[rows]] = values[rows]


@dataclass(frozen=True)
class SortedFingerprints:
    """A set of 64-bit fingerprints as one sorted array of them (``values``, unique uint64): membership by binary
    search, in a tenth of the memory of a Python set of millions."""

    values: np.ndarray

    def __contains__(self, fingerprint: object) -> bool:
        return isinstance(fingerprint, int) and self.position(fingerprint) is not None

    def position(self, fingerprint: int) -> int | None:
        """The index of ``fingerprint`` in ``values``, or None when it is not in the set."""
        if not 0 <= fingerprint < 1 << 64:
            return None
        values = self.values
        at = int(values.searchsorted(np.uint64(fingerprint)))  # the method: np.searchsorted's dispatch costs as much
        return at if at < len(values) and int(values[at]) == fingerprint else None

    def members(self, fingerprints: np.ndarray) -> np.ndarray:
        """Which of ``fingerprints`` (uint64) are in the set, as a boolean array."""
        if not len(self.values) or not len(fingerprints):
            return np.zeros(len(fingerprints), dtype=bool)
        found = np.minimum(self.values.searchsorted(fingerprints), len(self.values) - 1)
        return self.values[found] == fingerprints


@dataclass(frozen=True)
class FirstCodes:
    """Per tensor a single-output graph computes (``tensors``): the fewest ops computing it (``ops``) and the
    smallest code of a graph of that many ops computing it (``codes``: rows of 3 bytes an op, ``NO_OPERAND``-padded),
    so one graph of each tensor is the canonical one."""

    tensors: SortedFingerprints
    ops: np.ndarray
    codes: np.ndarray

    def code_of(self, fingerprint: int, size: int) -> bytes | None:
        """The canonical code of the tensor when its fewest ops are ``size``, else None."""
        at = self.tensors.position(fingerprint)
        if at is None or int(self.ops[at]) != size:
            return None
        return self.codes[at, :3 * size].tobytes()


def _input_sets(fps: list[int]) -> Iterator[Visit]:
    """Graphs of no op: canonical sets of 1..3 inputs (each its own output)."""
    from itertools import combinations

    n = len(INPUTS)
    for k in (1, 2, 3):
        for combo in combinations(range(n), k):
            chosen = set(combo)
            if any(FAMILY_PREV[t] is not None and FAMILY_PREV[t] not in chosen for t in combo):
                continue
            out_fps = tuple(fps[t] for t in combo)
            yield Visit((), graph_fp(list(out_fps)), combo, out_fps, frozenset(combo),
                        b"".join(op_code(INPUT_SET, (t,)) for t in combo))
