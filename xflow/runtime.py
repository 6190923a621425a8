"""Running and timing ONNX Runtime sessions (made by ``xflow.ort.Sessions``): random feeds, interleaved timing,
the A/B decision, and the successive halving of the select pass: every timing rule of xflow is here."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: The scales inputs are drawn at (``random_feeds``): ``unit`` is every run's own draw (floats in [-1, 1],
#: integers in [0, 2)); the others are the equivalence check's extra draws, so that a rewrite true only on
#: small inputs (clip(x, -1, 1) -> x) cannot pass: ``wide`` floats normal with standard deviation 8 and
#: integers in [-128, 128), ``large`` floats of magnitude 100 to 10,000 (10 to 1,000 in float16) and
#: integers over their dtype's whole range.
FEED_SCALES = ("unit", "wide", "large")


def random_feeds(session, seed: int = 0, shapes: Mapping[str, tuple[int, ...]] | None = None,  # noqa: ANN001
                 scale: str = "unit", ranges: Mapping[str, tuple[float, float]] | None = None,
                 scaled_integers: Collection[str] = ()) -> dict[str, np.ndarray]:
    """Seeded random inputs for a session at a scale of ``FEED_SCALES`` (default: floats in [-1, 1], integers
    in [0, 2), booleans); an input named in ``ranges`` is drawn uniformly in its (low, high) instead. Integer
    inputs take the scale only when named in ``scaled_integers`` (data that only arithmetic reads: elsewhere
    an integer is a count, a size or an index, and a large one runs a Loop or allocates without bound), else
    the unit draw's values. Every value is an ndarray, rank 0 included (ORT refuses numpy scalars)."""
    if scale not in FEED_SCALES:
        raise ValueError(f"unknown scale {scale!r}; one of {FEED_SCALES}")
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for inp in session.get_inputs():
        shape = (shapes or {}).get(inp.name) or tuple(d if isinstance(d, int) and d >= 0 else 1 for d in inp.shape)
        kind = inp.type.removeprefix("tensor(").removesuffix(")")
        np_type = {"float": np.float32, "double": np.float64, "float16": np.float16, "bool": np.bool_,
                   "int64": np.int64, "int32": np.int32, "int8": np.int8, "uint8": np.uint8, "int16": np.int16,
                   "uint16": np.uint16, "uint32": np.uint32, "uint64": np.uint64}.get(kind)
        if np_type is None:
            raise ValueError(f"input {inp.name!r} has type {inp.type}, which random inputs cannot fill")
        span = (ranges or {}).get(inp.name)
        at = scale if not np.issubdtype(np_type, np.integer) or inp.name in scaled_integers else "unit"
        feeds[inp.name] = np.asarray(_draw(rng, np.dtype(np_type), tuple(shape), at, span), dtype=np_type)
    return feeds


def _draw(rng: np.random.Generator, dtype: np.dtype, shape: tuple[int, ...], scale: str,
          span: tuple[float, float] | None) -> np.ndarray:
    """One input's values: booleans, integers or floats at ``scale`` (or uniformly in ``span``)."""
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(dtype, np.integer):
        if span is None and scale == "unit":
            return rng.integers(0, 2, size=shape)
        info = np.iinfo(dtype)
        if span is not None:
            low, high = max(int(np.floor(span[0])), int(info.min)), min(int(np.ceil(span[1])), int(info.max))
        else:
            low, high = {"unit": (0, 1), "wide": (max(-128, int(info.min)), 127),
                         "large": (int(info.min), int(info.max))}[scale]
        return rng.integers(low, high, size=shape, dtype=dtype, endpoint=True)
    if span is not None:
        return rng.uniform(span[0], span[1], size=shape)
    if scale == "wide":
        return rng.normal(0.0, 8.0, size=shape)
    if scale == "large":
        top = 1e3 if dtype == np.float16 else 1e4
        return rng.choice([-1.0, 1.0], size=shape) * rng.uniform(top / 100, top, size=shape)
    return rng.uniform(-1, 1, size=shape)


@dataclass(frozen=True)
class ABResult:
    """Interleaved A/B latency: medians in seconds, how many timed runs each, and in how many of the
    rounds (one run of each, back to back) B was the faster."""

    a_median: float
    b_median: float
    runs: int
    b_wins: int = 0

    @property
    def speedup(self) -> float:
        """a / b: above 1 means b is faster."""
        return self.a_median / self.b_median if self.b_median > 0 else float("inf")

    @property
    def p_value(self) -> float:
        """One-sided sign test: the chance of B winning at least ``b_wins`` of ``runs`` rounds if it were
        no faster than A. Rounds compare runs made back to back, so the VM's drift cancels out."""
        return sign_test(self.b_wins, self.runs)

    def b_is_faster(self, level: float = 0.01) -> bool:
        """B measured faster: a lower median, and more rounds won than chance gives at ``level``."""
        return self.b_median < self.a_median and self.p_value < level


def sign_test(wins: int, rounds: int) -> float:
    """P(X >= wins) for X ~ Binomial(rounds, 1/2)."""
    if rounds == 0:
        return 1.0
    return sum(math.comb(rounds, k) for k in range(wins, rounds + 1)) / 2 ** rounds


def measure_ab(session_a, session_b, feeds: Mapping[str, np.ndarray], min_runs: int = 10,  # noqa: ANN001
               max_runs: int = 200, target_seconds: float = 3.0, warmup: int = 3,
               undecided_seconds: float = 9.0) -> ABResult:
    """Median latencies of two sessions over interleaved rounds (A then B, B then A, ...) after warm-up.
    At least ``min_runs`` rounds and about ``target_seconds``; while B's median is lower but the sign
    test does not yet say B is faster, rounds go on up to ``undecided_seconds`` in all."""
    for _ in range(warmup):
        session_a.run(None, dict(feeds))
        session_b.run(None, dict(feeds))
    times_a: list[float] = []
    times_b: list[float] = []

    def result() -> ABResult:
        wins = sum(1 for a, b in zip(times_a, times_b, strict=True) if b < a)
        return ABResult(statistics.median(times_a), statistics.median(times_b), len(times_a), wins)

    start = time.perf_counter()
    while len(times_a) < max_runs:
        elapsed = time.perf_counter() - start
        if len(times_a) >= min_runs and elapsed >= target_seconds:
            current = result()
            if elapsed >= undecided_seconds or current.b_is_faster() or current.b_median >= current.a_median:
                break
        first, second, t_first, t_second = ((session_a, session_b, times_a, times_b) if len(times_a) % 2 == 0
                                            else (session_b, session_a, times_b, times_a))
        for sess, times in ((first, t_first), (second, t_second)):
            t0 = time.perf_counter()
            sess.run(None, dict(feeds))
            times.append(time.perf_counter() - t0)
    return result()


def signed_rank_p(diffs: Sequence[float]) -> float:
    """One-sided exact Wilcoxon signed-rank test: the chance, if each difference were as likely negative as
    positive, that the negative ones' rank sum (ranks of |d|, ties in input order) is at most the one seen.
    A zero difference counts as negative (a tie is no evidence for B)."""
    if not diffs:
        return 1.0
    return _rank_sum_cdf(len(diffs), _lost_rank_sum(diffs))


def _lost_rank_sum(diffs: Sequence[float]) -> int:
    """The sum of the ranks of |d| (1 the smallest, ties in input order) of the differences at or below 0."""
    order = sorted(range(len(diffs)), key=lambda i: abs(diffs[i]))
    return sum(rank + 1 for rank, i in enumerate(order) if diffs[i] <= 0)


def _rank_sum_cdf(n: int, w: int) -> float:
    """P(W <= w) where W is the sum of a uniformly random subset of the ranks 1..n."""
    counts = [1] + [0] * (n * (n + 1) // 2)  # counts[s]: subsets of the ranks so far with sum s
    for rank in range(1, n + 1):
        for total in range(len(counts) - 1, rank - 1, -1):
            counts[total] += counts[total - rank]
    return sum(counts[:w + 1]) / 2 ** n


#: The non-inferiority margin of the A/B: the optimized model counts as "not slower" when its latency is at most
#: this much above the original's (1%: 1.01x its time). Tested like "faster", over the session pairs: a one-sided
#: signed-rank test at the same level on the pairs' log ratios shifted by log(1 + margin), that is of the null
#: hypothesis "the optimized model is more than 1% slower". It is asked only of a simpler model (fewer nodes or weight
#: bytes, ``xflow.optimize.size``).
NON_INFERIORITY_MARGIN = 0.01


@dataclass(frozen=True)
class ABDecision:
    """``decide_ab``'s answer: one ``ABResult`` per pair of fresh sessions, in the order measured, and the
    number of pairs the test was planned for. B is faster when the pairs' log latency ratios pass a
    one-sided signed-rank test at ``level`` over all planned pairs (the session pair is the unit of
    replication, not the round: a session's luck lasts its whole life). With a ``margin``, B is also tested
    for being not slower: at most ``margin`` slower than A (the same test on the ratios shifted by it)."""

    results: tuple[ABResult, ...]
    planned: int
    level: float = 0.01
    margin: float | None = None

    @property
    def diffs(self) -> list[float]:
        """log(A / B) of each pair's medians: above 0 where B was faster."""
        return [math.log(r.a_median / r.b_median) for r in self.results]

    @property
    def shifted_diffs(self) -> list[float]:
        """log(A / B) + log(1 + margin) of each pair: above 0 where B was at most ``margin`` slower."""
        shift = math.log1p(self.margin or 0.0)
        return [d + shift for d in self.diffs]

    @property
    def a_median(self) -> float:
        return statistics.median(r.a_median for r in self.results)

    @property
    def b_median(self) -> float:
        return statistics.median(r.b_median for r in self.results)

    @property
    def speedup(self) -> float:
        """The median pair's ratio A / B: above 1 means B is faster."""
        return math.exp(statistics.median(self.diffs))

    @property
    def runs(self) -> int:
        """Timed rounds over all pairs."""
        return sum(r.runs for r in self.results)

    @property
    def pairs(self) -> int:
        return len(self.results)

    @property
    def b_wins(self) -> int:
        """Pairs in which B's median was the lower."""
        return sum(d > 0 for d in self.diffs)

    @property
    def p_value(self) -> float:
        return signed_rank_p(self.diffs)

    @property
    def not_slower_p(self) -> float | None:
        """The non-inferiority test's p: the chance of ratios this good if B were more than ``margin`` slower
        (None: no margin, not tested)."""
        return None if self.margin is None else signed_rank_p(self.shifted_diffs)

    def b_is_faster(self, level: float | None = None) -> bool:
        """Every planned pair measured, and the signed-rank test says B is faster."""
        return (self.pairs >= self.planned and self.speedup > 1.0
                and self.p_value < (self.level if level is None else level))

    def b_is_not_slower(self, level: float | None = None) -> bool:
        """Every planned pair measured, the median pair's ratio within ``margin``, and the non-inferiority test says
        B is at most ``margin`` slower (always False without a margin)."""
        p = self.not_slower_p
        return (p is not None and self.pairs >= self.planned and self.speedup > 1.0 / (1.0 + (self.margin or 0.0))
                and p < (self.level if level is None else level))


#: Pairs of sessions a decision measures. Eight is the fewest with which B winning them all is rarer than
#: 1 in 100 by chance (2^-8); with ten, one or two lost pairs whose ratios are the closest to 1 still pass
#: (BERT-base's real 4-5% gain: pair ratios 0.98-1.13), and up to twelve where pairs are quick. Sixteen gave
#: Swin-T's 4% more chances but kept a matmul chain's identical copy 4 and 5 times in 100 (twelve: 0-1): pairs
#: made one after another in one process are not independent enough for a longer decision.
MIN_PAIRS, MAX_PAIRS = 10, 12


def decide_ab(session_a, session_b, feeds: Mapping[str, np.ndarray],  # noqa: ANN001
              fresh: Callable[[str], Any], level: float = 0.01, pairs_budget_s: float = 20.0,
              min_pairs: int = MIN_PAIRS, max_pairs: int = MAX_PAIRS, margin: float | None = None,
              **timing: Any) -> ABDecision:
    """Whether B runs faster than A, decided over pairs of sessions: the given pair, then pairs of fresh
    sessions from ``fresh("a")`` / ``fresh("b")`` (made in alternating order, so neither side is always
    the newer), each timed by ``measure_ab``. Where each session's buffers land in memory can make one of
    two identical models 1-12% faster for the session's whole life (sub-millisecond models the most), which
    no number of rounds averages out, so a test over rounds keeps identical copies far more often than its
    level says; over pairs, an identical copy passes a signed-rank test at ``level`` at most that often.
    The number of pairs is planned from the first pair's cost (``min_pairs`` to ``max_pairs``, about
    ``pairs_budget_s`` in all); the decision stops early once the pairs B lost already rule "faster" out, and,
    with a non-inferiority ``margin`` (``NON_INFERIORITY_MARGIN``), "not slower" too. The test of "faster" is the
    same with or without a margin: an identical copy passes it no more often."""
    timing = {"min_runs": 8, "target_seconds": 0.5, "undecided_seconds": 0.5} | timing
    started = time.perf_counter()
    results = [measure_ab(session_a, session_b, feeds, **timing)]
    per_pair = time.perf_counter() - started
    planned = max(min_pairs, min(max_pairs, int(pairs_budget_s / max(per_pair, 1e-9))))
    critical = _critical_rank_sum(planned, level)
    while len(results) < planned:
        so_far = ABDecision(tuple(results), planned, level, margin)
        # more pairs can only add ranks above these: the lost ones' rank sum cannot fall to the bound
        if _lost_rank_sum(so_far.diffs) > critical and (
                margin is None or _lost_rank_sum(so_far.shifted_diffs) > critical):
            break
        first_a = len(results) % 2 == 0
        made = {side: fresh(side) for side in (("a", "b") if first_a else ("b", "a"))}
        results.append(measure_ab(made["a"], made["b"], feeds, **timing))
        del made  # released before the next pair is made: two pairs of a large model need not fit at once
    return ABDecision(tuple(results), planned, level, margin)


def _critical_rank_sum(n: int, level: float) -> int:
    """The largest rank sum of lost pairs that still passes the test at ``level`` with ``n`` pairs (-1: none)."""
    w = -1
    while _rank_sum_cdf(n, w + 1) < level:
        w += 1
    return w


def measure_interleaved(sessions: Mapping[Any, Any], feeds: Mapping[str, np.ndarray], min_runs: int,
                        seconds: float, warmup: int = 3) -> tuple[dict[str, float], int]:
    """Median seconds per session over interleaved rounds (each round runs every session once, the
    order rotating), after warm-up; at least ``min_runs`` rounds and about ``seconds`` in all."""
    times, rounds = interleaved_times(sessions, feeds, min_runs, seconds, warmup)
    return {name: statistics.median(values) for name, values in times.items()}, rounds


def interleaved_times(sessions: Mapping[Any, Any], feeds: Mapping[str, np.ndarray], min_runs: int,
                      seconds: float, warmup: int = 3) -> tuple[dict[Any, list[float]], int]:
    """``measure_interleaved``'s timed runs themselves: seconds per run, per session."""
    names = list(sessions)
    for _ in range(warmup):
        for name in names:
            sessions[name].run(None, dict(feeds))
    times: dict[str, list[float]] = {name: [] for name in names}
    start = time.perf_counter()
    rounds = 0
    while rounds < min_runs or (time.perf_counter() - start < seconds and rounds < 500):
        shift = rounds % len(names)
        for name in names[shift:] + names[:shift]:
            t0 = time.perf_counter()
            sessions[name].run(None, dict(feeds))
            times[name].append(time.perf_counter() - t0)
        rounds += 1
    return times, rounds


def median_latency(session, feeds: Mapping[str, np.ndarray], runs: int = 20, warmup: int = 3) -> float:  # noqa: ANN001
    """Median latency of one session in seconds."""
    for _ in range(warmup):
        session.run(None, dict(feeds))
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        session.run(None, dict(feeds))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def successive_halving(makers: Mapping[int, Callable[[], Any]], sessions: dict[int, Any],
                       feeds: Mapping[str, np.ndarray], rounds: int, seconds: float) -> tuple[int, dict[int, float]]:
    """The fastest of several models end to end, by successive halving: ``sessions`` (one per model, made by its
    maker in ``makers``) are timed in interleaved rounds (``interleaved_times``); after each stage of at least
    ``rounds`` rounds and about ``seconds``, the slower half is dropped and the rest timed again on fresh sessions,
    until two are left and each has been timed on two sessions. A model's figure is the median over its sessions
    of each session's median (a session's luck, where its buffers land, lasts its whole life, and every stage draws
    it again). The fastest one's key and each timed model's figure (s)."""
    makers = dict(makers)
    session_medians: dict[int, list[float]] = {i: [] for i in sessions}

    def figure(i: int) -> float:
        return statistics.median(session_medians[i])

    alive = list(sessions)
    while True:
        timed, _ = interleaved_times({i: sessions[i] for i in alive}, feeds, rounds, seconds)
        for i, values in timed.items():
            session_medians[i].append(statistics.median(values))
        if len(alive) <= 2 and all(len(session_medians[i]) >= 2 for i in alive) or len(alive) == 1:
            break
        alive = sorted(alive, key=figure)[:max(2, (len(alive) + 1) // 2)]
        for i in list(sessions):
            del sessions[i]  # released before its fresh one is made: one model's weights fewer at a time
            if i not in alive:
                del makers[i]
        for i in alive:
            sessions[i] = makers[i]()  # a fresh draw of the session's luck
    return min(alive, key=figure), {i: figure(i) for i in session_medians}
