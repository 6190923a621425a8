"""Generate substitution rules: enumerate, fingerprint, pair, re-check, prune, emit.

``generate`` gives the candidates and the table of counts and times (TASO's Table 3); ``xflow generate-rules
--generate-only --save-candidates FILE`` writes them (for ``xflow generate-rules --candidates``) and prints the table.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from xflow.generator.enumerate import (
    APPLICATIONS,
    INPUT_SET,
    NO_OPERAND,
    FingerprintCache,
    FirstCodes,
    SortedFingerprints,
    output_multisets,
)
from xflow.generator.fingerprint import (
    BucketArrays,
    Buckets,
    FloatChecker,
    PackedPair,
    Pair,
    has_ops,
    pack,
    pack_pair,
    pairs_by_bucket,
    unpack_pair,
)
from xflow.generator.generalize import MostGeneral, canonical_key, const_slots, dedupe
from xflow.generator.packed import PackedRule, PackedRules
from xflow.generator.packed import pack as pack_rule
from xflow.generator.prune import CommonSubgraph, renaming_keys
from xflow.generator.to_rules import attribute_evaluator, pair_to_rule, rule_name, rule_variables
from xflow.generator.walk import LAST_CACHE_BITS, WalkStats, enumerate_graphs

from xflow.tasks import LocalTaskExecutor, Shared, TaskExecutor

Progress = Callable[[str, int, float], None]

#: From this many ops on, each graph pairs with its bucket's smallest graph only (see ``candidate_pairs``):
#: all pairs grow quadratically with the bucket (531k raw pairs at 3 ops).
STAR_FROM = 3
#: From this many ops on, the run pairs the widest graphs with smaller ones only (``_generate_wide``).
WIDE_FROM = 4
#: Memory a task of enumeration, pairing or emission declares to a cluster scheduler (its parts are sized,
#: ``PARTS_PER_WORKER`` per worker, so that one stays well under this at 4 ops).
PART_MEMORY_BYTES = 2**30
#: Parts of each step per worker: parts differ in cost (a conv-first walk is several times another), so the last
#: to finish leaves the other workers idle for about one part's time; a part's own start costs little.
PARTS_PER_WORKER = 16
#: The widest walk's kept graphs are packed into arrays this many at a time (millions in a part at 4 ops).
PACK_EVERY = 50_000


@dataclass
class GenerationResult:
    """The emitted rules (JSON dicts, deterministic order) and the (step, count, seconds) table."""

    rules: Sequence[dict[str, Any]]  # a ``PackedRules``: unpacked one by one
    table: list[tuple[str, int, float]] = field(default_factory=list)


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused for a step of the generator: each step builds millions of small
    acyclic objects (graphs, pairs, rule dicts) that a collection scans over and over and never frees (a fifth
    to a third of the walk's and the pairing's time went to it). Cycles made meanwhile are collected once it
    resumes."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _partition(jobs: int, index: int) -> Callable[[int], bool]:
    return lambda key: key % jobs == index


def _walk(args: tuple[int, int, int, int]) -> tuple[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    max_ops, seed, jobs, index = args
    count, kept = 0, []
    with collector_paused():
        for v in enumerate_graphs(max_ops, seed, first_ops=_partition(jobs, index)):
            count += 1
            if v.inputs_used:
                kept.append(v)
        return count, pack(kept)


def balanced_parts(weights: Sequence[int], parts: int) -> list[frozenset[int]]:
    """The first-op keys ``0..len(weights)-1`` dealt into at most ``parts`` parts of about equal total weight
    (longest processing time first: the heaviest key to the lightest part), heaviest part first: handed out in
    that order, the last parts to finish are light ones, not a slow part started last."""
    loads = [[0, i, set()] for i in range(min(parts, len(weights)))]
    for key in sorted(range(len(weights)), key=lambda k: (-weights[k], k)):
        lightest = min(loads, key=lambda load: (load[0], load[1]))
        lightest[0] += weights[key]
        lightest[2].add(key)
    return [frozenset(keys) for _, _, keys in sorted(loads, key=lambda load: (-load[0], load[1])) if keys]


@dataclass(frozen=True)
class WalkFilters:
    """What the widest walk's parts know of the smaller run, as arrays (sent to every worker): the kept
    fingerprints (sorted), the fewest ops of the tensors a reducible part can be replaced by, the canonical
    graphs of the tensors a part of as many ops can be replaced by, the tensors of multi-output graphs (sorted)
    and the kept multiset hashes (see ``enumerate_graphs``)."""

    kept: np.ndarray
    fewer: tuple[np.ndarray, np.ndarray]
    first: FirstCodes
    multi: np.ndarray
    multisets: np.ndarray

    @staticmethod
    def of(fps: np.ndarray, codes: np.ndarray, outs: np.ndarray, max_ops: int) -> WalkFilters:
        """The filters of the walk of ``max_ops`` ops over the smaller run's rows."""
        several = outs[outs[:, 1] != 0]
        # a reducible part lies below the last op, so it has max_ops - 1 ops at most and is replaced by fewer or
        # by as many
        first = first_codes(fps, codes, outs, most=max_ops - 1)
        return WalkFilters(np.unique(fps), _fewest(first, most=max_ops - 2), first, np.unique(several[several != 0]),
                           output_multisets(outs))

    def walk_kwargs(self) -> dict[str, Any]:
        """``enumerate_graphs``' filter arguments. The fingerprints are looked up by binary search in the sorted
        arrays (a tenth of a Python set's memory): a kept one only for the few graphs whose outputs' multiset hash
        matches, a tensor once per last-op prefix."""
        fewer_fps, fewer_counts = self.fewer
        return {"keep_last": SortedFingerprints(self.kept).__contains__,
                "fewer_ops": dict(zip(fewer_fps.tolist(), fewer_counts.tolist(), strict=True)),
                "multi_output_tensors": SortedFingerprints(self.multi), "kept_multisets": self.multisets,
                "first_codes": self.first}


WalkPart = tuple[int, int, frozenset[int], Shared]  # the filters (a WalkFilters), shared by every part


@dataclass
class _WorkerCaches:
    """What a worker process keeps from one walk part to the next: the last op's fingerprints by (menu key,
    operand fingerprints) for one seed. Parts of other first ops still apply the same last ops to many of the same
    tensors (a tenth of a part's evaluations); the cache's memory is fixed. Only fingerprints of a deterministic
    evaluation are kept, so a part's result does not depend on the parts the worker walked before."""

    seed: int = -1
    last_fingerprints: FingerprintCache | None = None

    def for_seed(self, seed: int) -> FingerprintCache:
        """The cache for ``seed`` (a fresh one when the seed changes)."""
        if self.last_fingerprints is None or seed != self.seed:
            self.seed, self.last_fingerprints = seed, FingerprintCache.of(LAST_CACHE_BITS)
        return self.last_fingerprints

    def release(self) -> None:
        """Drop the cache (the walk is over once a worker pairs or emits: 268 MB a worker otherwise held to the
        end of the run, when the parent holds the most)."""
        self.seed, self.last_fingerprints = -1, None


_WORKER = _WorkerCaches()


def _walk_kept(args: WalkPart) -> tuple[WalkStats, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """One part of the widest walk: (its counts, rows of the ``max_ops``-op graphs whose fingerprint is one
    of the smaller run's and that have no reducible part: see ``enumerate_graphs``' ``fewer_ops``)."""
    max_ops, seed, first_ops, shared = args
    filters: WalkFilters = shared.get()
    stats = WalkStats()
    packed, rows = [], []
    with collector_paused():
        for v in enumerate_graphs(max_ops, seed, first_ops=first_ops.__contains__, stats=stats,
                                  last_fingerprints=_WORKER.for_seed(seed), **filters.walk_kwargs()):
            if len(v.graph) == max_ops and v.inputs_used:
                rows.append(v)
                if len(rows) == PACK_EVERY:  # a packed row is a tenth of a graph's objects
                    packed.append(pack(rows))
                    rows = []
        packed.append(pack(rows))
        rows.clear()  # before the collector resumes: it would traverse them
        return stats, tuple(np.concatenate(arrays) for arrays in zip(*packed, strict=True))  # type: ignore[return-value]


def first_codes(fps: np.ndarray, codes: np.ndarray, outs: np.ndarray, most: int | None = None) -> FirstCodes:
    """Per tensor over the rows of single-output graphs: the fewest ops computing it and the smallest code among
    the graphs of that many ops; with ``most``, only the tensors computed with at most that many ops."""
    keys = codes[:, 0::3]
    ops = ((keys != NO_OPERAND) & (keys != INPUT_SET)).sum(axis=1)
    single = outs[:, 1] == 0
    tensors, counts, rows = outs[single, 0], ops[single], codes[single]
    order = np.lexsort((*rows.T[::-1], counts, tensors))
    tensors, counts, rows = tensors[order], counts[order], rows[order]
    first = np.r_[True, tensors[1:] != tensors[:-1]] if len(tensors) else np.zeros(0, bool)
    if most is not None:
        first &= counts <= most
    return FirstCodes(SortedFingerprints(tensors[first]), counts[first].astype(np.uint8), rows[first])


def fewest_ops(fps: np.ndarray, codes: np.ndarray, outs: np.ndarray, most: int | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
    """(tensor fingerprints, fewest ops computing each) over the rows of single-output graphs; with ``most``, only
    the tensors computed with at most that many ops."""
    return _fewest(first_codes(fps, codes, outs, most))


def found_in(values: np.ndarray, found: np.ndarray) -> np.ndarray:
    """Which of ``values`` occur in ``found`` (both uint64), as a boolean array: ``np.isin`` with each side
    sorted once, the distinct values looked up in ascending order (a quarter of ``np.isin``'s 3-4 s at 4 ops, which
    one process spends while the workers wait)."""
    unique, inverse = np.unique(values, return_inverse=True)
    # sorted, not made unique: a binary search finds a repeated value as well (``np.unique`` of 5 M is 3 s here)
    return SortedFingerprints(np.sort(found)).members(unique)[inverse.reshape(-1)]


def _fewest(found: FirstCodes, most: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    small = found.ops <= most if most is not None else slice(None)
    return found.tensors.values[small], found.ops[small]


def _collect(max_ops: int, seed: int, jobs: int, executor: TaskExecutor) -> Buckets:
    buckets = Buckets(seed)
    if jobs <= 1:
        buckets.extend(enumerate_graphs(max_ops, seed))
    else:
        # Many more parts than workers: the parts differ a lot in size (conv-first walks are slow). The
        # buckets sort their rows, so the order parts finish in does not matter.
        parts = [(max_ops, seed, jobs * 8, i) for i in range(jobs * 8)]
        for count, arrays in executor.imap_unordered(_walk, parts, memory_bytes=PART_MEMORY_BYTES):
            buckets.add_arrays(arrays, count)
    return buckets


def _drained(items: list[Any]) -> Iterator[Any]:
    """The items, each dropped from the list as it is handed out: a task's pairs are not held once it is sent
    (they were a tenth of the parent's peak, reached when the emitted rules accumulate)."""
    items.reverse()
    while items:
        yield items.pop()


def _chunks(items: list[Any], parts: int) -> list[list[Any]]:
    size = max(1, -(-len(items) // parts))
    return [items[i:i + size] for i in range(0, len(items), size)]


@dataclass(frozen=True)
class PartCounts:
    """What one part of the pairing kept at each step (see ``_pair_and_check``)."""

    raw: int
    distinct: int
    uncommon: int
    checked: int

    def __add__(self, other: PartCounts) -> PartCounts:
        return PartCounts(self.raw + other.raw, self.distinct + other.distinct, self.uncommon + other.uncommon,
                          self.checked + other.checked)


Keys = tuple[tuple[str, str], tuple[str, str]]


def _pair_and_check(args: tuple[int, bool, BucketArrays, int]) -> tuple[PartCounts, list[tuple[Keys, PackedPair]]]:
    """Pair the graphs of some buckets, prune the pairs with a common subgraph and re-check the rest on floats:
    (the counts, (input-renaming keys of the pair and of its reverse, pair) of each pair kept, in fingerprint
    order). Only pairs whose larger side has at least ``min_ops`` ops are kept (the others are a smaller run's).
    The cheap common-subgraph test on ints comes first: it drops most pairs, so the float re-check and the
    renaming key run on the rest only, and only kept pairs travel back to the parent."""
    seed, star, arrays, min_ops = args
    _WORKER.release()
    common, checker = CommonSubgraph(seed), FloatChecker(seed)
    raw = distinct = uncommon = 0
    kept: list[tuple[Keys, PackedPair]] = []
    with collector_paused():
        # bucket by bucket: a bucket's graphs are rendered and evaluated once for all the steps (see
        # ``expressions``' memo), and no list of the part's pairs is held
        for bucket_raw, pairs in pairs_by_bucket(arrays, star=star):
            raw += bucket_raw
            for p in pairs:
                if len(p.a.graph) < min_ops:
                    continue
                distinct += 1
                if common.reason(p) is None:
                    uncommon += 1
                    if checker.check(p):
                        kept.append((renaming_keys(p), pack_pair(p)))
        del common, checker  # their memos freed before the collector resumes: it would traverse them
        return PartCounts(raw, distinct, uncommon, len(kept)), kept


#: A kept pair to emit: its renaming keys both ways, the pair, and which of its two rules to emit (forward, backward).
Emission = tuple[Keys, PackedPair, bool, bool]


def _emissions(keyed: list[tuple[Keys, PackedPair]], max_ops: int) -> list[Emission]:
    """The kept pairs (in order) with the rules to emit: each direction whose rule name no rule before it has (the
    reverse of a pair can be another pair's rule). A pair without ops on its smaller side has no backward rule."""
    names: set[str] = set()

    def fresh(key: tuple[str, str]) -> bool:
        name = rule_name(key, max_ops)
        if name in names:
            return False
        names.add(name)
        return True

    out = []
    for keys, packed_pair in keyed:
        forward = fresh(keys[0])
        backward = has_ops(packed_pair[3]) and fresh(keys[1])
        if forward or backward:
            out.append((keys, packed_pair, forward, backward))
    return out


def _emit(args: tuple[int, int, list[Emission]]) -> list[PackedRule]:
    """The rules of kept pairs (``Emission``), packed with the fields the parent's dedupe reads
    (``generator.packed``), in the pairs' order; those a more general rule emitted before them here leaves out of
    that dedupe are not packed (a third of them at 4 ops): with every rule's name its own, what one chunk's dedupe
    leaves out the dedupe of all chunks leaves out too."""
    seed, max_ops, emissions = args
    _WORKER.release()
    # Both directions: the smaller side is not always the faster one (merging two matmuls that share an
    # input takes more ops), so the search gets both and the cost model decides.
    packed_rules: list[PackedRule] = []
    evaluator = attribute_evaluator(seed)
    seen = MostGeneral[None]()  # the parent's dedupe of this chunk so far

    def add(rule: dict[str, Any]) -> None:
        key, consts = canonical_key(rule["variants"][0]), const_slots(rule)
        if seen.offer(key, consts, rule["name"], None):
            # at once: a rule dict with its variants is about 25 KB of objects, a chunk tens of thousands of them
            packed_rules.append(pack_rule(rule, key, consts))

    with collector_paused():
        for (forward_key, backward_key), packed_pair, forward, backward in emissions:
            p = unpack_pair(packed_pair)
            variables = rule_variables(p, seed, evaluator)  # the same both ways: evaluated once
            if forward:
                add(pair_to_rule(p, seed, max_ops, variables, forward_key))
            if backward:
                add(pair_to_rule(Pair(p.b, p.a, p.fingerprint), seed, max_ops, variables, backward_key))
        del evaluator
        seen.best.clear()  # both freed before the collector resumes (see ``_pair_and_check``)
    return packed_rules


def generate(max_ops: int = 3, seed: int = 0, jobs: int = 1, progress: Progress | None = None,
             executor: TaskExecutor | None = None) -> GenerationResult:
    """Run the whole generator; the same ``seed`` and ``max_ops`` give the same rule list, on any executor
    (default: ``jobs`` local processes). From ``WIDE_FROM`` ops on, only the pairs with a side of ``max_ops``
    ops are made (see ``_generate_wide``)."""
    table: list[tuple[str, int, float]] = []

    def step(name: str, count: int, start: float) -> float:
        now = time.perf_counter()
        table.append((name, count, round(now - start, 3)))
        if progress is not None:
            progress(name, count, now - start)
        return now

    own = executor is None
    pool = LocalTaskExecutor(jobs) if executor is None else executor
    jobs = pool.jobs
    try:
        with collector_paused():  # the parent collects pairs and rules the same way
            if max_ops >= WIDE_FROM:
                return _generate_wide(max_ops, seed, jobs, pool, step, table, progress)
            return _generate(max_ops, seed, jobs, pool, step, table)
    finally:
        if own:
            pool.close()


def _generate(max_ops: int, seed: int, jobs: int, pool: TaskExecutor, step: Callable[[str, int, float], float],
              table: list[tuple[str, int, float]]) -> GenerationResult:
    t = time.perf_counter()
    buckets = _collect(max_ops, seed, jobs, pool)
    step("graphs enumerated", buckets.graphs, t)
    colliding = [buckets.colliding_arrays()]
    del buckets
    return _rules_of_buckets(colliding, max_ops, seed, jobs, pool, step, table, min_ops=0)


def _generate_wide(max_ops: int, seed: int, jobs: int, pool: TaskExecutor, step: Callable[[str, int, float], float],
                   table: list[tuple[str, int, float]], progress: Progress | None) -> GenerationResult:
    """The run of ``max_ops`` >= 4 ops, with memory bounded by pruning while enumerating.

    The graphs of up to ``max_ops - 1`` ops are enumerated first (the smaller run, all kept); then the walk
    of ``max_ops`` ops keeps only the graphs whose fingerprint one of those has, without building the rest
    (97-98% of them at 4 ops). So every kept pair has a side of ``max_ops`` ops and a smaller side: a bucket of
    widest graphs alone is left out. Such pairs trade ``max_ops`` ops for as many (a rewrite that does not
    shrink or grow the graph); the ones that matter (merges whose target needs a fourth op, such as a kernel
    enlarged before two convs merge) have a smaller side."""
    t = time.perf_counter()
    smaller = _collect(max_ops - 1, seed, jobs, pool)
    t = step(f"graphs of <= {max_ops - 1} ops enumerated", smaller.graphs, t)
    small_fps, small_codes, small_outs = smaller.arrays()
    del smaller
    filters = WalkFilters.of(small_fps, small_codes, small_outs, max_ops)
    # a part per first op (at least), weighed by the smaller graphs that start with them (conv-first walks are
    # several times the others), handed out heaviest first: the last parts are the lightest first ops, a few
    # seconds each (parts of several first ops each left a worker idle for the last one's ~30 s); a part's start
    # costs a tenth of a second
    starts = small_codes[:, 0]
    weights = np.bincount(starts[starts < len(APPLICATIONS)], minlength=len(APPLICATIONS)).tolist()
    shared = pool.share(filters)  # 37 MB at 4 ops: once in a cluster's object store, not once per part
    parts = [(max_ops, seed, keys, shared)
             for keys in balanced_parts(weights, max(jobs * PARTS_PER_WORKER, len(weights)))]
    walked, rows, wide_fps, counts = 0, Buckets(seed), [], WalkStats()
    work = pool.imap_unordered(_walk_kept, parts, memory_bytes=PART_MEMORY_BYTES)
    for done, (stats, arrays) in enumerate(work, 1):
        counts += stats
        walked += stats.graphs + stats.not_kept
        rows.add_arrays(arrays, 0)
        wide_fps.append(arrays[0])
        if progress is not None:
            progress(f"walking {max_ops} ops: part {done}/{len(parts)}", walked, time.perf_counter() - t)
    t = step(f"graphs of {max_ops} ops walked (with smaller ones)", walked, t)
    step("  kept: a smaller graph has the fingerprint", sum(len(f) for f in wide_fps), t)
    step("  prefixes with a reducible part (the last op must undo it, or none can)", counts.reducible, t)
    step("  prefixes left out: 3 outputs no kept graph has", counts.open_output, t)
    step("  left out: the last op ends a part fewer ops compute", counts.reducible_last, t)
    partners = found_in(small_fps, np.concatenate(wide_fps))
    rows.add_arrays((small_fps[partners], small_codes[partners], small_outs[partners]), 0)
    del small_fps, small_codes, small_outs, wide_fps
    colliding = [rows.colliding_arrays()]
    del rows, parts, filters, shared  # the chunks are a gigabyte at 4 ops
    return _rules_of_buckets(colliding, max_ops, seed, jobs, pool, step, table, min_ops=max_ops)


def _rules_of_buckets(colliding: list[BucketArrays], max_ops: int, seed: int, jobs: int, pool: TaskExecutor,
                      step: Callable[[str, int, float], float], table: list[tuple[str, int, float]],
                      min_ops: int) -> GenerationResult:
    """Pair, re-check, prune and emit the rules of the colliding rows (see ``_pair_and_check``). ``colliding``
    holds them and is emptied here, so that they are freed once paired, before the emission."""
    t = time.perf_counter()
    star = max_ops >= STAR_FROM
    parts = max(1, jobs * PARTS_PER_WORKER)
    work = [(seed, star, a, min_ops) for a in colliding.pop().parts(parts)]
    # pairing, pruning and the float re-check run together in the workers, part by part (a part never cuts a
    # bucket); the parent keeps the first pair of each renaming key, in fingerprint order
    totals = PartCounts(0, 0, 0, 0)
    by_key: dict[tuple[str, str], tuple[Keys, PackedPair]] = {}
    for counts, part_kept in pool.imap(_pair_and_check, _drained(work), memory_bytes=PART_MEMORY_BYTES):
        totals += counts
        for keys, p in part_kept:
            by_key.setdefault(keys[0], (keys, p))
    t = step("candidates (equal fingerprint)", totals.raw, t)
    step("after trivial (same graph)" + (", star" if star else "")
         + (f", {min_ops} ops on one side" if min_ops else ""), totals.distinct, t)
    step("after common subgraph", totals.uncommon, t)
    step("after float re-check", totals.checked, t)
    keyed = [by_key[k] for k in sorted(by_key)]
    t = step("after input renaming", len(keyed), t)
    del by_key
    emissions = _emissions(keyed, max_ops)
    del keyed
    emitted = sum(forward + backward for _, _, forward, backward in emissions)
    # Streamed: the emitted rules (with all their variants) are the largest objects of the run, so ``dedupe``
    # consumes them as the chunks arrive and only the best rule per shape-generic key is ever held.
    work = [(seed, max_ops, c) for c in _chunks(emissions, parts)]
    del emissions

    def emitted_rules() -> Iterator[PackedRule]:
        for rules in pool.imap(_emit, _drained(work), memory_bytes=PART_MEMORY_BYTES):
            yield from rules

    unique = dedupe(emitted_rules(), key=lambda r: r.key, slots=lambda r: r.consts, name=lambda r: r.name)
    t = step("rules emitted (both directions)", emitted, t)
    step("after generalized dedupe", len(unique), t)
    return GenerationResult(PackedRules([r.blob for r in unique]), table)


def format_table(table: list[tuple[str, int, float]]) -> str:
    """The table as aligned text."""
    return "\n".join(f"{name:<34} {count:>10} {secs:>9.2f} s" for name, count, secs in table)

