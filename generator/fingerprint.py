"""Fingerprints, candidate pairs and the float re-check.

Each graph is evaluated on fixed seeded random int64 tensors (wrap-around arithmetic) with the op table's
``evaluate_int`` kernels; its fingerprint hashes the multiset of its output tensors. Graphs with equal
fingerprints over the same inputs pair up (every pair of a bucket) and each pair is re-checked on float64
inputs in [-1, 1] with the reference kernels (relative threshold 1e-5).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np

from generator.enumerate import INPUTS, Graph, IntEvaluator, Visit, tensor_fp
from xflow.ops import OPS

N_IN = len(INPUTS)
INPUT_NAMES = tuple(name for name, _, _, _ in INPUTS)
REL_TOL = 1e-5


@dataclass(frozen=True)
class Entry:
    """A graph kept for pairing: ops, output tensor ids, their int fingerprints, inputs used."""

    graph: Graph
    outputs: tuple[int, ...]
    output_fps: tuple[int, ...]
    inputs_used: frozenset[int]


@dataclass(frozen=True)
class Pair:
    """Two graphs computing the same outputs; ``a`` is the source (larger) side."""

    a: Entry
    b: Entry
    fingerprint: int


def evaluate(graph: Graph, inputs: Sequence[np.ndarray], integer: bool,
             override: Mapping[str, np.ndarray] | None = None) -> list[np.ndarray]:
    """Every tensor of the graph (inputs first). ``override`` replaces tensors by their canonical text."""
    values = list(inputs)
    texts = expressions(graph) if override else None
    with np.errstate(over="ignore", invalid="ignore"):
        for op, attrs, operands in graph:
            entry = OPS[op]
            args = [values[t] for t in operands]
            outs = entry.evaluate_int(np, args, attrs) if integer else entry.evaluate(np, args, attrs)
            start = len(values)
            for k, o in enumerate(outs):
                if texts is not None and texts[start + k] in override:
                    o = override[texts[start + k]]
                values.append(np.asarray(o))
    return values


def expressions(graph: Graph, names: Sequence[str] = INPUT_NAMES) -> list[str]:
    """Canonical text of every tensor of the graph (commutative operands sorted)."""
    texts = list(names)
    for op, attrs, operands in graph:
        args = [texts[t] for t in operands]
        if OPS[op].commutative:
            args.sort()
        attr_text = ",".join(f"{k}={v}" for k, v in attrs.items())
        base = f"{op}[{attr_text}]({','.join(args)})"
        n = OPS[op].num_outputs(attrs)
        texts.extend([base] if n == 1 else [f"{base}#{k}" for k in range(n)])
    return texts


def canonical_text(entry: Entry, names: Sequence[str] = INPUT_NAMES) -> str:
    """The graph's outputs as sorted canonical text (independent of op order)."""
    texts = expressions(entry.graph, names)
    return " ; ".join(sorted(texts[t] for t in entry.outputs))


class Buckets:
    """Graphs grouped by fingerprint (only compact tuples are kept)."""

    def __init__(self) -> None:
        self.by_fp: dict[int, list[Entry]] = {}
        self.graphs = 0

    def add(self, visit: Visit) -> None:
        self.graphs += 1
        if not visit.inputs_used:
            return  # graphs of constants only cannot become rules
        self.by_fp.setdefault(visit.fingerprint, []).append(
            Entry(visit.graph, visit.outputs, visit.output_fps, visit.inputs_used))

    def extend(self, visits: Iterable[Visit]) -> Buckets:
        for v in visits:
            self.add(v)
        return self


def candidate_pairs(buckets: Buckets) -> tuple[int, list[Pair]]:
    """(number of raw candidate pairs, pairs of distinct graphs): all pairs of a bucket over the same inputs.
    Graphs with equal canonical text (the same graph in another op order) count as candidates but are
    trivial and not returned."""
    raw = 0
    pairs: list[Pair] = []
    for fp in sorted(buckets.by_fp):
        bucket = buckets.by_fp[fp]
        if len(bucket) < 2:
            continue
        groups: dict[frozenset[int], list[Entry]] = {}
        for e in bucket:
            groups.setdefault(e.inputs_used, []).append(e)
        for group in groups.values():
            raw += len(group) * (len(group) - 1) // 2
            distinct: dict[str, Entry] = {}
            for e in group:
                distinct.setdefault(canonical_text(e), e)
            ordered = sorted(distinct.items(), key=lambda kv: (len(kv[1].graph), kv[0]))
            for (_, small), (_, big) in combinations(ordered, 2):
                pairs.append(Pair(big, small, fp))
    return raw, pairs


def match_outputs(a: Entry, b: Entry) -> list[tuple[int, int]] | None:
    """Pair each output of ``a`` with an output of ``b`` of the same int fingerprint (in order)."""
    if sorted(a.output_fps) != sorted(b.output_fps):
        return None
    free: dict[int, list[int]] = {}
    for t, f in zip(b.outputs, b.output_fps, strict=True):
        free.setdefault(f, []).append(t)
    return [(t, free[f].pop(0)) for t, f in zip(a.outputs, a.output_fps, strict=True)]


class FloatChecker:
    """Re-test candidate pairs on seeded float64 inputs in [-1, 1]."""

    def __init__(self, seed: int = 0) -> None:
        rng = np.random.default_rng(seed + 1_000_003)
        self.inputs = [rng.uniform(-1.0, 1.0, size=shape) for _, _, _, shape in INPUTS]

    def check(self, pair: Pair) -> bool:
        mapping = match_outputs(pair.a, pair.b)
        if mapping is None:
            return False
        va = evaluate(pair.a.graph, self.inputs, integer=False)
        vb = evaluate(pair.b.graph, self.inputs, integer=False)
        for ta, tb in mapping:
            x, y = np.asarray(va[ta], dtype=np.float64), np.asarray(vb[tb], dtype=np.float64)
            if x.shape != y.shape or not np.all(np.isfinite(x)) or not np.all(np.isfinite(y)):
                return False
            scale = max(1.0, float(np.max(np.abs(y), initial=0.0)))
            if float(np.max(np.abs(x - y), initial=0.0)) > REL_TOL * scale:
                return False
        return True


def int_values(graph: Graph, seed: int) -> list[np.ndarray]:
    """Every tensor of the graph on the seeded int inputs."""
    return evaluate(graph, IntEvaluator(seed).inputs, integer=True)


def fps_of(values: Sequence[np.ndarray]) -> list[int]:
    """Tensor fingerprints of a list of values."""
    return [tensor_fp(v) for v in values]
