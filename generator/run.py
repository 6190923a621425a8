"""Generate substitution rules: enumerate, fingerprint, pair, re-check, prune, emit.

``python -m generator.run --max-ops 2 --out rules.json`` writes an xflow rule file and prints the table
of counts and times (TASO's Table 3).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from generator.enumerate import APPLICATIONS, enumerate_graphs
from generator.fingerprint import BucketArrays, Buckets, FloatChecker, Pair, bucket_pairs, pack
from generator.generalize import canonical_key, dedupe
from generator.prune import CommonSubgraph, renaming_key
from generator.to_rules import pair_to_rule, rule_variables

Progress = Callable[[str, int, float], None]

#: From this many ops on, each graph pairs with its bucket's smallest graph only (see ``candidate_pairs``):
#: all pairs grow quadratically with the bucket (531k raw pairs at 3 ops).
STAR_FROM = 3


@dataclass
class GenerationResult:
    """The emitted rules (JSON dicts, deterministic order) and the (step, count, seconds) table."""

    rules: list[dict[str, Any]]
    table: list[tuple[str, int, float]] = field(default_factory=list)


def _partition(jobs: int, index: int) -> Callable[[int], bool]:
    return lambda key: key % jobs == index


def _walk(args: tuple[int, int, int, int]) -> tuple[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    max_ops, seed, jobs, index = args
    count, kept = 0, []
    for v in enumerate_graphs(max_ops, seed, first_ops=_partition(jobs, index)):
        count += 1
        if v.inputs_used:
            kept.append(v)
    return count, pack(kept)


def _collect(max_ops: int, seed: int, jobs: int, pool: Any) -> Buckets:
    buckets = Buckets(seed)
    if pool is None:
        buckets.extend(enumerate_graphs(max_ops, seed))
    else:
        # Many more parts than workers: the parts differ a lot in size (conv-first walks are slow).
        parts = [(max_ops, seed, jobs * 8, i) for i in range(jobs * 8)]
        for count, arrays in pool.imap_unordered(_walk, parts):
            buckets.add_arrays(arrays, count)
    return buckets


def _chunks(items: list[Any], parts: int) -> list[list[Any]]:
    size = max(1, -(-len(items) // parts))
    return [items[i:i + size] for i in range(0, len(items), size)]


def _pair_and_check(args: tuple[int, bool, BucketArrays]) -> tuple[int, int, list[tuple[tuple[str, str], Pair]]]:
    """Pair the graphs of some buckets and re-check the pairs on floats: (raw candidate pairs, pairs of
    distinct graphs, (input-renaming key, pair) of each pair that passes, in fingerprint order)."""
    seed, star, arrays = args
    raw, pairs = bucket_pairs(arrays, star=star)
    checker = FloatChecker(seed)
    return raw, len(pairs), [(renaming_key(p), p) for p in pairs if checker.check(p)]


def _emit(args: tuple[int, int, list[Pair]]) -> tuple[int, list[dict[str, Any]]]:
    """(pairs without a common subgraph, their rules in both directions)."""
    seed, max_ops, pairs = args
    cs = CommonSubgraph(seed)
    kept = [p for p in pairs if cs.reason(p) is None]
    # Both directions: the smaller side is not always the faster one (merging two matmuls that share an
    # input takes more ops), so the search gets both and the cost model decides.
    rules = []
    for p in kept:
        variables = rule_variables(p, seed)  # the same both ways: evaluated once
        rules.append(pair_to_rule(p, seed, max_ops, variables))
        if p.b.graph:
            rules.append(pair_to_rule(Pair(p.b, p.a, p.fingerprint), seed, max_ops, variables))
    return len(kept), rules


def _map(pool: Any, fn: Callable[[Any], Any], work: list[Any]) -> list[Any]:
    """``fn`` over ``work`` in order, in the pool when there is one."""
    return list(pool.imap(fn, work)) if pool is not None else [fn(w) for w in work]


def generate(max_ops: int = 3, seed: int = 0, jobs: int = 1, progress: Progress | None = None) -> GenerationResult:
    """Run the whole generator; the same ``seed`` and ``max_ops`` give the same rule list."""
    table: list[tuple[str, int, float]] = []

    def step(name: str, count: int, start: float) -> float:
        now = time.perf_counter()
        table.append((name, count, round(now - start, 3)))
        if progress is not None:
            progress(name, count, now - start)
        return now

    import multiprocessing

    pool = multiprocessing.get_context("spawn").Pool(jobs) if jobs > 1 else None
    try:
        return _generate(max_ops, seed, jobs, pool, step, table)
    finally:
        if pool is not None:
            pool.terminate()


def _generate(max_ops: int, seed: int, jobs: int, pool: Any, step: Callable[[str, int, float], float],
              table: list[tuple[str, int, float]]) -> GenerationResult:
    t = time.perf_counter()
    buckets = _collect(max_ops, seed, jobs, pool)
    t = step("graphs enumerated", buckets.graphs, t)
    star = max_ops >= STAR_FROM
    parts = max(1, jobs * 8)
    colliding = buckets.colliding_arrays()
    del buckets
    # pairing and the float re-check run together in the workers, part by part (a part never cuts a bucket)
    raw = distinct = checked = 0
    by_key: dict[tuple[str, str], Pair] = {}
    for part_raw, part_pairs, part_checked in _map(pool, _pair_and_check,
                                                   [(seed, star, a) for a in colliding.parts(parts)]):
        raw, distinct, checked = raw + part_raw, distinct + part_pairs, checked + len(part_checked)
        for k, p in part_checked:
            by_key.setdefault(k, p)
    del colliding
    t = step("candidates (equal fingerprint)", raw, t)
    step("after trivial (same graph)" + (", star" if star else ""), distinct, t)
    step("after float re-check", checked, t)
    pairs = [by_key[k] for k in sorted(by_key)]
    t = step("after input renaming", len(pairs), t)
    del by_key
    # Streamed: the emitted rules (with all their variants) are the largest objects of the run, so ``dedupe``
    # consumes them as the chunks arrive and only the best rule per shape-generic key is ever held.
    work = [(seed, max_ops, c) for c in _chunks(pairs, parts)]
    del pairs
    counts = {"kept": 0, "emitted": 0}

    def fresh_rules() -> Iterator[dict[str, Any]]:
        names: set[str] = set()
        for kept, rules in (pool.imap(_emit, work) if pool is not None else map(_emit, work)):
            counts["kept"] += kept
            for r in rules:
                if r["name"] not in names:
                    names.add(r["name"])
                    counts["emitted"] += 1
                    yield r

    unique = dedupe(fresh_rules(), key=lambda r: canonical_key(r["variants"][0]))
    t = step("after common subgraph", counts["kept"], t)
    t = step("rules emitted (both directions)", counts["emitted"], t)
    step("after generalized dedupe", len(unique), t)
    return GenerationResult(unique, table)


def format_table(table: list[tuple[str, int, float]]) -> str:
    """The table as aligned text."""
    return "\n".join(f"{name:<34} {count:>10} {secs:>9.2f} s" for name, count, secs in table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m generator.run", description=__doc__)
    parser.add_argument("--max-ops", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--out", help="write an xflow rule file here")
    args = parser.parse_args(argv)
    result = generate(args.max_ops, args.seed, args.jobs,
                      progress=lambda n, c, s: print(f"{n:<34} {c:>10} {s:>9.2f} s", file=sys.stderr))
    if args.out:
        from xflow.rules import rules_from_json
        from xflow.rules.io import dump_rules

        dump_rules(rules_from_json(result.rules), args.out,
                   meta={"generator": {"max_ops": args.max_ops, "seed": args.seed, "menu": len(APPLICATIONS)}})
    print(format_table(result.table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
