"""The walk: every operator graph of up to ``max_ops`` operators over the menu of ``generator.enumerate``.

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

import itertools
from collections.abc import Callable, Container, Iterator, Mapping, Sequence
from dataclasses import astuple, dataclass
from typing import Any

import numpy as np
from xflow.generator.enumerate import (
    APPLICATIONS,
    BY_OP,
    FAMILY_PREV,
    INPUT_SET,
    INPUTS,
    MIN_SPATIAL,
    WEIGHT_INPUT,
    Accepted,
    Application,
    FingerprintCache,
    FirstCodes,
    IntEvaluator,
    Kind,
    KindRows,
    LastPrefix,
    LastRows,
    MultisetFilter,
    Op,
    Visit,
    arity,
    bit_mask,
    graph_fp,
    multiset_hash,
    op_code,
    operands_typed,
    resolve,
    tensor_fp,
)

from xflow.ir import Attrs
from xflow.ops import OPS, ShapeError

#: Most memoized op applications one walk keeps (then the memo starts over): bounds memory at 4 ops.
MEMO_ENTRIES = 400_000
#: The same for the last op's fingerprints where ``FingerprintCache`` does not hold them (an op of several outputs,
#: the walk of one application at a time): ints, no arrays, about 100 bytes an entry.
LAST_MEMO_ENTRIES = 2_000_000
#: The last op's fingerprints of one output are cached in 2**LAST_CACHE_BITS slots (16 bytes each).
LAST_CACHE_BITS = 24
#: Most operand-tuple lists one walk keeps for reuse by prefixes of equal shapes (then it starts over).
TUPLE_CACHE_ENTRIES = 50_000
#: Most walk levels whose last-op rows one walk keeps as arrays (``LastRows``, a few kilobytes each).
LAST_LEVEL_ENTRIES = 5_000
#: The same for the rows of the levels' tensor shapes and kinds, which the levels' own rows are narrowed from.
SHAPE_LEVEL_ENTRIES = 2_000
#: The last op is tried on the rows of queued prefixes at once once they reach this many (``flush_last``): a
#: prefix has a few hundred, and each array operation's own cost then falls on hundreds of prefixes.
LAST_BATCH_ROWS = 50_000

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
        self.pending: list[LastPrefix] = []  # prefixes queued for their last op (``queue_last``)
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

    def outputs_of(self, i: int, prefix: LastPrefix | None = None) -> range:
        """The tensor indices of op ``i``'s outputs (in ``prefix``, a queued prefix, or the walk's current one)."""
        starts, n = (self.producers, len(self.shapes)) if prefix is None else (prefix.producers, len(prefix.fps))
        return range(starts[i], starts[i + 1] if i + 1 < len(starts) else n)

    def reducible_parts(self, i: int, cone: int, live: list[int]) -> list[int]:
        """``live`` without the parts op ``i`` reads an inner value of, plus the reducible parts ending at op
        ``i``'s outputs (each as the bit mask of its inner values)."""
        graph, fps, readers = self.graph, self.fps, self.readers
        fewer_ops, first_codes = self.fewer_ops, self.first_codes
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

    def reducible_last(self, operands: tuple[int, ...], new_fps: list[int], prefix: LastPrefix | None = None
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

    def last_rows(self, level: Level, level_key: tuple, live: list[int], required: int) -> LastRows:
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

    def shape_rows(self) -> LastRows:
        """The last op's rows of every level with these tensor shapes and kinds, whatever inputs the graph uses and
        however its components lie (``LastRows.narrowed`` picks a level's own): array operations over
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
        self.pending.append(LastPrefix(table, tried, self.fps.copy(), self.values.copy(), open_outputs,
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

    def last_visits(self, p: LastPrefix, kept_rows: dict[int, tuple[list[int], int]]) -> Iterator[Visit]:
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


def _joined(batch: list[LastPrefix], rows: np.ndarray, field: str) -> np.ndarray:
    """One field of the batch's last-op tables, joined, at ``rows``."""
    return np.concatenate([getattr(p.table, field) for p in batch])[rows]


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
