"""Fingerprints, candidate pairs and the float re-check.

Each graph is evaluated on fixed seeded random int64 tensors (wrap-around arithmetic) with the op table's
``evaluate_int`` kernels; its fingerprint hashes the multiset of its output tensors. Graphs with equal
fingerprints over the same inputs pair up (every pair of a bucket) and each pair is re-checked on float64
inputs in [-1, 1] with the reference kernels (relative threshold 1e-5).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

import numpy as np
from xflow.generator.enumerate import (
    APPLICATIONS,
    INPUT_SET,
    INPUTS,
    NO_OPERAND,
    Graph,
    IntEvaluator,
    Visit,
    resolve,
    tensor_fp,
)

from xflow.ops import OPS, ShapeError

N_IN = len(INPUTS)
INPUT_NAMES = tuple(name for name, _, _, _ in INPUTS)
REL_TOL = 1e-5


@dataclass(frozen=True)
class Entry:
    """A graph kept for pairing: ops, output tensor ids, their int fingerprints, inputs used, and the padded code
    it was decoded from (empty for a graph built otherwise)."""

    graph: Graph
    outputs: tuple[int, ...]
    output_fps: tuple[int, ...]
    inputs_used: frozenset[int]
    code: bytes = field(default=b"", compare=False)


@dataclass(frozen=True)
class Pair:
    """Two graphs computing the same outputs; ``a`` is the source (larger) side."""

    a: Entry
    b: Entry
    fingerprint: int


def evaluate(graph: Graph, inputs: Sequence[np.ndarray], integer: bool,
             override: Mapping[str, np.ndarray] | None = None) -> list[np.ndarray]:
    """Every tensor of the graph (inputs first). ``override`` replaces tensors by their canonical text."""
    return MemoEvaluator(inputs, integer, limit=0).values(graph, override)[0]  # type: ignore[index]


_OP_TEXT: dict[tuple[str, Any], tuple[str, bool, int]] = {}


def _op_text(op: str, attrs: Any) -> tuple[str, bool, int]:
    """(``op[attrs]`` prefix, commutative, output count) of one op application, cached: the generator
    renders the same few hundred applications millions of times."""
    key = (op, attrs)
    found = _OP_TEXT.get(key)
    if found is None:
        attr_text = ",".join(f"{k}={v}" for k, v in attrs.items())
        found = _OP_TEXT[key] = (f"{op}[{attr_text}]", OPS[op].commutative, OPS[op].num_outputs(attrs))
    return found


#: Most graphs whose texts ``expressions`` keeps (then it starts over): the pairing renders a bucket's smallest
#: graph for each of its pairs and each input renaming, and every graph again in each check.
EXPRESSION_MEMO = 20_000
_EXPRESSIONS: dict[tuple[Graph, tuple[str, ...]], tuple[str, ...]] = {}


def expressions(graph: Graph, names: tuple[str, ...] = INPUT_NAMES) -> tuple[str, ...]:
    """Canonical text of every tensor of the graph (commutative operands sorted), inputs named ``names``."""
    key = (graph, names)
    found = _EXPRESSIONS.get(key)
    if found is not None:
        return found
    texts = list(names)
    for op, attrs, operands in graph:
        prefix, commutative, n = _op_text(op, attrs)
        args = [texts[t] for t in operands]
        if commutative:
            args.sort()
        base = f"{prefix}({','.join(args)})"
        texts.extend([base] if n == 1 else [f"{base}#{k}" for k in range(n)])
    if len(_EXPRESSIONS) >= EXPRESSION_MEMO:
        _EXPRESSIONS.clear()
    found = _EXPRESSIONS[key] = tuple(texts)
    return found


def canonical_text(entry: Entry, names: tuple[str, ...] = INPUT_NAMES) -> str:
    """The graph's outputs as sorted canonical text (independent of op order)."""
    texts = expressions(entry.graph, names)
    return " ; ".join(sorted(texts[t] for t in entry.outputs))


CODE_WIDTH = 12  # bytes per graph code: up to 4 ops of 3 bytes (see ``enumerate.op_code``)


def padded_code(code: bytes) -> bytes:
    """A graph code padded to ``CODE_WIDTH`` bytes."""
    return code + bytes([NO_OPERAND] * (CODE_WIDTH - len(code)))


MAX_OUTPUTS = 8  # output fingerprints kept per enumerated graph


_REPLAYS: dict[tuple[int, tuple[tuple[int, ...], ...]], tuple[str, Any, list[tuple[int, ...]]] | None] = {}


def _replay(key: int, in_shapes: tuple[tuple[int, ...], ...]) -> tuple[str, Any, list[tuple[int, ...]]] | None:
    """(op, attributes, output shapes) of menu application ``key`` on these operand shapes, cached."""
    found = _REPLAYS.get((key, in_shapes), False)
    if found is False:
        app = APPLICATIONS[key]
        attrs = resolve(app.op, app.params, in_shapes)
        found = None if attrs is None else (app.op, attrs, [tuple(s) for s in OPS[app.op].infer(in_shapes, attrs)])
        _REPLAYS[(key, in_shapes)] = found
    return found


def decode(code: bytes, output_fps: Sequence[int]) -> Entry:
    """Rebuild the enumerated graph of a code (replaying the op table's shape rules; no evaluation)."""
    shapes = [shape for _, _, _, shape in INPUTS]
    graph: list[tuple[str, Any, tuple[int, ...]]] = []
    consumed: set[int] = set()
    chosen: list[int] = []
    for i in range(0, len(code), 3):
        key, a, b = code[i], code[i + 1], code[i + 2]
        if key == NO_OPERAND:
            break
        if key == INPUT_SET:
            chosen.append(a)
            continue
        operands = tuple(t for t in (a, b) if t != NO_OPERAND)
        replayed = _replay(key, tuple(shapes[t] for t in operands))
        if replayed is None:
            raise ValueError(f"code {code.hex()} does not replay")
        op, attrs, out_shapes = replayed
        shapes.extend(out_shapes)
        consumed.update(operands)
        graph.append((op, attrs, operands))
    if chosen:
        outputs = tuple(chosen)
        used = frozenset(chosen)
    else:
        outputs = tuple(t for t in range(N_IN, len(shapes)) if t not in consumed)
        used = frozenset(t for t in consumed if t < N_IN)
    return Entry(tuple(graph), outputs, tuple(int(f) for f in output_fps[:len(outputs)]), used, code)


class Buckets:
    """Enumerated graphs as compact (fingerprint, code) arrays; only colliding fingerprints are decoded."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.graphs = 0
        self._fps: list[np.ndarray] = []
        self._codes: list[np.ndarray] = []
        self._outs: list[np.ndarray] = []
        self._pending: list[Visit] = []

    def add(self, visit: Visit) -> None:
        self.graphs += 1
        if not visit.inputs_used:
            return  # graphs of constants only cannot become rules
        self._pending.append(visit)

    def extend(self, visits: Iterable[Visit]) -> Buckets:
        for v in visits:
            self.add(v)
        return self

    def add_arrays(self, arrays: tuple[np.ndarray, np.ndarray, np.ndarray], graphs: int) -> None:
        """Add a worker's arrays (see ``pack``)."""
        self._fps.append(arrays[0])
        self._codes.append(arrays[1])
        self._outs.append(arrays[2])
        self.graphs += graphs

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All (fingerprints, codes, output fingerprints) kept so far."""
        fps, codes, outs = pack(self._pending)
        return (np.concatenate([*self._fps, fps]), np.concatenate([*self._codes, codes]),
                np.concatenate([*self._outs, outs]))

    def colliding_arrays(self) -> BucketArrays:
        """The rows of the graphs whose fingerprint is shared by another, sorted by fingerprint. Each array is
        gathered once, for the shared rows only, and the output fingerprints (three quarters of a row's bytes)
        are gathered from the workers' chunks, never joined: at 4 ops, joining, sorting and then filtering all
        the rows held four copies of 11 M rows at once."""
        fps, codes, outs = pack(self._pending)
        fps = np.concatenate([*self._fps, fps])
        codes = np.concatenate([*self._codes, codes])
        order = np.lexsort((*codes.T[::-1], fps))
        sorted_fps = fps[order]
        sizes = np.diff(bucket_bounds(sorted_fps))
        del sorted_fps
        shared = order[np.repeat(sizes > 1, sizes)]
        del order
        return BucketArrays(fps[shared], codes[shared], _gather_rows([*self._outs, outs], shared))


def bucket_bounds(fps: np.ndarray) -> np.ndarray:
    """Where each run of equal fingerprints starts in sorted ``fps``, plus the end."""
    return np.r_[np.flatnonzero(np.r_[True, fps[1:] != fps[:-1]]), len(fps)] if len(fps) else np.zeros(1, int)


def _gather_rows(chunks: Sequence[np.ndarray], rows: np.ndarray) -> np.ndarray:
    """``np.concatenate(chunks)[rows]`` without the concatenated copy."""
    out = np.empty((len(rows), *chunks[0].shape[1:]), dtype=chunks[0].dtype)
    start = 0
    for chunk in chunks:
        inside = (rows >= start) & (rows < start + len(chunk))
        out[inside] = chunk[rows[inside] - start]
        start += len(chunk)
    return out


@dataclass(frozen=True)
class BucketArrays:
    """Rows of enumerated graphs sorted by fingerprint (equal fingerprints adjacent)."""

    fps: np.ndarray
    codes: np.ndarray
    outs: np.ndarray

    def bounds(self) -> np.ndarray:
        """Row index where each bucket starts, plus the end."""
        return bucket_bounds(self.fps)

    def parts(self, count: int) -> list[BucketArrays]:
        """About ``count`` slices of similar size, never cutting a bucket."""
        bounds = self.bounds()
        total = int(bounds[-1])
        cuts = sorted({int(bounds[np.searchsorted(bounds, total * k // count)]) for k in range(1, count)} | {0, total})
        return [BucketArrays(self.fps[a:b], self.codes[a:b], self.outs[a:b])
                for a, b in itertools.pairwise(cuts) if b > a]


_OP_REPR: dict[tuple[str, Any, tuple[int, ...]], str] = {}


def graph_repr(graph: Graph) -> str:
    """``repr(graph)``, from cached reprs of its ops (the pairing sorts every bucket by it)."""
    parts = []
    for op in graph:
        text = _OP_REPR.get(op)
        if text is None:
            text = _OP_REPR[op] = repr(op)
        parts.append(text)
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


def decode_buckets(arrays: BucketArrays) -> Iterator[tuple[int, list[Entry]]]:
    """(fingerprint, decoded entries in a deterministic order) per bucket of ``arrays``."""
    bounds = arrays.bounds()
    codes = arrays.codes.tobytes()  # one conversion for all rows: row by row it cost as much as the decoding
    outs = arrays.outs.tolist()
    width = arrays.codes.shape[1]
    for start, end in itertools.pairwise(bounds.tolist()):
        entries = [decode(codes[i * width:(i + 1) * width], outs[i]) for i in range(start, end)]
        yield int(arrays.fps[start]), sorted(entries, key=lambda e: graph_repr(e.graph))


def pack(visits: Sequence[Visit]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fingerprints, padded codes and output fingerprints of visits as numpy arrays (compact to keep and to
    send between processes)."""
    n = len(visits)
    outs = np.zeros((n, MAX_OUTPUTS), dtype=np.uint64)
    for i, v in enumerate(visits):
        if len(v.output_fps) > MAX_OUTPUTS:
            raise ValueError(f"graph with {len(v.output_fps)} outputs; at most {MAX_OUTPUTS} are kept")
        outs[i, :len(v.output_fps)] = v.output_fps
    return (np.fromiter((v.fingerprint for v in visits), dtype=np.uint64, count=n),
            np.frombuffer(b"".join(padded_code(v.code) for v in visits), dtype=np.uint8).reshape(n, CODE_WIDTH),
            outs)


def candidate_pairs(buckets: Buckets, star: bool = False) -> tuple[int, list[Pair]]:
    """(number of raw candidate pairs, pairs of distinct graphs): all pairs of a bucket over the same inputs.
    Graphs with equal canonical text (the same graph in another op order) count as candidates but are
    trivial and not returned. With ``star``, each graph pairs only with the bucket's smallest graph: rules
    are emitted in both directions, so any other pair of the bucket is two rewrites through that graph."""
    return bucket_pairs(buckets.colliding_arrays(), star)


def bucket_pairs(arrays: BucketArrays, star: bool = False) -> tuple[int, list[Pair]]:
    """``candidate_pairs`` over the buckets of ``arrays`` (in fingerprint order)."""
    raw = 0
    pairs: list[Pair] = []
    for bucket_raw, bucket in pairs_by_bucket(arrays, star):
        raw += bucket_raw
        pairs.extend(bucket)
    return raw, pairs


def pairs_by_bucket(arrays: BucketArrays, star: bool = False) -> Iterator[tuple[int, list[Pair]]]:
    """``bucket_pairs`` one bucket at a time: (its raw candidate pairs, its pairs of distinct graphs)."""
    for fp, bucket in decode_buckets(arrays):
        raw = 0
        pairs: list[Pair] = []
        groups: dict[frozenset[int], list[Entry]] = {}
        for e in bucket:
            groups.setdefault(e.inputs_used, []).append(e)
        for group in groups.values():
            raw += len(group) * (len(group) - 1) // 2
            distinct: dict[str, Entry] = {}
            for e in group:
                distinct.setdefault(canonical_text(e), e)
            ordered = sorted(distinct.items(), key=lambda kv: (len(kv[1].graph), kv[0]))
            if star:
                pairs.extend(Pair(big, ordered[0][1], fp) for _, big in ordered[1:])
                continue
            for (_, small), (_, big) in combinations(ordered, 2):
                pairs.append(Pair(big, small, fp))
        yield raw, pairs


#: A ``Pair`` as (fingerprint, code and output fingerprints of ``a``, the same of ``b``): what a pair kept by the
#: pairing travels and waits as (a tenth of the decoded pair's memory; ``unpack_pair`` decodes it again).
PackedPair = tuple[int, bytes, tuple[int, ...], bytes, tuple[int, ...]]


def pack_pair(pair: Pair) -> PackedPair:
    """The pair of two decoded entries as their codes (see ``PackedPair``)."""
    if not pair.a.code or not pair.b.code:
        raise ValueError("only a pair of decoded entries can be packed")
    return pair.fingerprint, pair.a.code, pair.a.output_fps, pair.b.code, pair.b.output_fps


def has_ops(code: bytes) -> bool:
    """Whether the graph of ``code`` has an op (not only inputs as its outputs)."""
    return bool(code) and code[0] not in (INPUT_SET, NO_OPERAND)


def unpack_pair(packed: PackedPair) -> Pair:
    """The pair ``pack_pair`` packed, decoded again."""
    fingerprint, code_a, fps_a, code_b, fps_b = packed
    return Pair(decode(code_a, fps_a), decode(code_b, fps_b), fingerprint)


def match_outputs(a: Entry, b: Entry) -> list[tuple[int, int]] | None:
    """Pair each output of ``a`` with an output of ``b`` of the same int fingerprint (in order)."""
    if sorted(a.output_fps) != sorted(b.output_fps):
        return None
    free: dict[int, list[int]] = {}
    for t, f in zip(b.outputs, b.output_fps, strict=True):
        free.setdefault(f, []).append(t)
    return [(t, free[f].pop(0)) for t, f in zip(a.outputs, a.output_fps, strict=True)]


#: Most tensors a ``MemoEvaluator`` keeps (then it starts over): a few hundred bytes each.
MEMO_TENSORS = 200_000


class MemoEvaluator:
    """Every tensor of a graph on fixed inputs, memoized by canonical text (``limit`` tensors at most, then it
    starts over; 0: no memo): the pairs a worker checks share most of their subexpressions (the same conv of an
    input appears in thousands of graphs). With ``check_shapes``, each op's shape rule is applied first and a
    graph it rejects has no values."""

    def __init__(self, inputs: Sequence[np.ndarray], integer: bool, limit: int = MEMO_TENSORS,
                 check_shapes: bool = False) -> None:
        self.inputs = list(inputs)
        self.integer = integer
        self.limit = limit
        self.check_shapes = check_shapes
        self.memo: dict[str, list[np.ndarray] | None] = {}

    def values(self, graph: Graph, override: Mapping[str, np.ndarray] | None = None
               ) -> tuple[list[np.ndarray], tuple[str, ...]] | None:
        """(every tensor of the graph, inputs first; their canonical texts), or None when ``check_shapes``
        and an op's shape rule rejects its operands. ``override`` replaces tensors by their canonical text;
        the memo then serves the ops that read no replaced tensor nor one computed from it, and keeps none of
        the others (a tensor downstream of a replaced one has its usual text)."""
        texts = expressions(graph)
        values = list(self.inputs)
        memo = self.memo if self.limit else None
        changed: set[int] = set()  # with ``override``: the tensors replaced or computed from a replaced one
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            for op, attrs, operands in graph:
                start = len(values)
                key = texts[start]  # the first output's text names the application
                usual = not changed or changed.isdisjoint(operands)
                if usual and memo is not None and key in memo:
                    outs = memo[key]
                else:
                    outs = self._apply(op, attrs, [values[t] for t in operands])
                    if usual and memo is not None:
                        if len(memo) >= self.limit:
                            memo.clear()
                        memo[key] = outs
                if outs is None:
                    return None
                if override:
                    replaced = [override.get(texts[start + k]) for k in range(len(outs))]
                    for k in range(len(outs)):
                        if not usual or replaced[k] is not None:
                            changed.add(start + k)
                    outs = [o if r is None else r for o, r in zip(outs, replaced, strict=True)]
                values.extend(outs)
        return values, texts

    def _apply(self, op: str, attrs: Any, args: list[np.ndarray]) -> list[np.ndarray] | None:
        entry = OPS[op]
        if self.check_shapes:
            try:
                entry.infer([a.shape for a in args], attrs)
            except ShapeError:
                return None
        kernel = entry.evaluate_int if self.integer else entry.evaluate
        return [np.asarray(o) for o in kernel(np, args, attrs)]


class FloatChecker:
    """Re-test candidate pairs on seeded float64 inputs in [-1, 1]."""

    def __init__(self, seed: int = 0) -> None:
        rng = np.random.default_rng(seed + 1_000_003)
        self.inputs = [rng.uniform(-1.0, 1.0, size=shape) for _, _, _, shape in INPUTS]
        self.evaluator = MemoEvaluator(self.inputs, integer=False)

    def check(self, pair: Pair) -> bool:
        mapping = match_outputs(pair.a, pair.b)
        if mapping is None:
            return False
        va, _ = self.evaluator.values(pair.a.graph)  # type: ignore[misc]
        vb, _ = self.evaluator.values(pair.b.graph)  # type: ignore[misc]
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
