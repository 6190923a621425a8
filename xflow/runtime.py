"""Running and timing ONNX Runtime sessions (made by ``xflow.ort.Sessions``): random feeds, interleaved timing,
the A/B decision, and the successive halving of the select pass: every timing rule of xflow is here."""

from __future__ import annotations

import functools
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


#: The fewest timed rounds of a pair or a stage, however slow the model (``_rounds_for``).
FEWEST_ROUNDS = 3


def measure_ab(session_a, session_b, feeds: Mapping[str, np.ndarray], min_runs: int = 10,  # noqa: ANN001
               max_runs: int = 200, target_seconds: float = 3.0, warmup: int = 3,
               undecided_seconds: float = 9.0, fewest_runs: int = FEWEST_ROUNDS) -> ABResult:
    """Median latencies of two sessions over interleaved rounds (A then B, B then A, ...) after warm-up.
    At least ``min_runs`` rounds and about ``target_seconds``; while B's median is lower but the sign
    test does not yet say B is faster, rounds go on up to ``undecided_seconds`` in all. A model so slow that
    ``min_runs`` rounds would take well over ``target_seconds`` is warmed up and timed less (``_rounds_for``,
    down to ``fewest_runs`` rounds): what varies between its runs is small beside what varies between sessions,
    which more pairs, not more rounds, average out."""
    pair = {"a": session_a, "b": session_b}
    min_runs = _rounds_for(pair, feeds, warmup, min_runs, fewest_runs, target_seconds)
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


def _rounds_for(sessions: Mapping[Any, Any], feeds: Mapping[str, np.ndarray], warmup: int, rounds: int,
                fewest: int, seconds: float) -> int:
    """Warm ``sessions`` up (``warmup`` rounds, each running every session once, stopping after the first round
    that takes over half of ``seconds``) and say how many timed rounds to ask for: ``rounds``, or fewer (not below
    ``fewest``) where that many would take more than ``seconds``, judged by the last warm-up round."""
    last = 0.0
    for _ in range(warmup):
        t0 = time.perf_counter()
        for session in sessions.values():
            session.run(None, dict(feeds))
        last = time.perf_counter() - t0
        if last > seconds / 2:
            break
    if last <= 0:
        return rounds
    return max(min(fewest, rounds), min(rounds, math.ceil(seconds / last)))


def signed_rank_p(diffs: Sequence[float]) -> float:
    """One-sided exact Wilcoxon signed-rank test: the chance, if each difference were as likely negative as
    positive, that the negative ones' rank sum (ranks of |d|, ties in input order) is at most the one seen.
    A zero difference counts as negative (a tie is no evidence for B)."""
    if not diffs:
        return 1.0
    return _rank_sum_cdf(len(diffs), _lost_rank_sum(diffs))


def _lost_rank_sum(diffs: Sequence[float], trim: int = 0) -> int:
    """The sum of the ranks of |d| (1 the smallest, ties in input order) of the differences at or below 0, the
    ``trim`` largest |d| left out."""
    order = sorted(range(len(diffs)), key=lambda i: abs(diffs[i]))
    return sum(rank + 1 for rank, i in enumerate(order[:len(order) - trim]) if diffs[i] <= 0)


def _rank_sum_cdf(n: int, w: int) -> float:
    """P(W <= w) where W is the sum of a uniformly random subset of the ranks 1..n."""
    counts = [1] + [0] * (n * (n + 1) // 2)  # counts[s]: subsets of the ranks so far with sum s
    for rank in range(1, n + 1):
        for total in range(len(counts) - 1, rank - 1, -1):
            counts[total] += counts[total - rank]
    return sum(counts[:w + 1]) / 2 ** n


#: The sequential A/B's looks and its spending of the level (``sequential_design``): the first look after
#: ``FIRST_LOOK`` pairs (the fewest at which B winning every pair can pass at 0.01 and leave most of the level for
#: later looks: 2^-8 of it), then one every ``LOOK_EVERY`` pairs and one at the last planned pair; by the look after
#: k of n pairs at most level * (k / n) ** ``SPENDING_POWER`` has been spent.
FIRST_LOOK, LOOK_EVERY, SPENDING_POWER = 8, 2, 2

#: The pairs farthest from even that the looks after the first leave out of the rank sum (``SequentialDesign.trim``):
#: one session in ten or so is 20-35% slower or faster for its whole life, and that one pair, ranked highest, would
#: rule a consistent 6-10% gain out on its own (Whisper's encoder: pair ratios 0.98-1.20 and one 0.75). Leaving out
#: the largest |log ratio| whatever its sign is a function of the pairs' signs listed by size, as the rank sum is, so
#: the exact null computation is unchanged; the first look keeps every pair (B winning all 8 passes there).
TRIM_AFTER_FIRST = 1


def planned_looks(pairs: int) -> tuple[int, ...]:
    """The pair counts at which a sequential A/B of at most ``pairs`` pairs looks: 8, 10, ..., ``pairs``."""
    first = min(FIRST_LOOK, pairs)
    return (*range(first, pairs, LOOK_EVERY), pairs)


@dataclass(frozen=True)
class SequentialDesign:
    """A group-sequential one-sided signed-rank test: at the look after ``looks[j]`` pairs it rejects ("B is
    faster") when the lost pairs' rank sum is at most ``bounds[j]`` (-1: it cannot reject there). ``spent[j]`` is
    the chance, were every pair's log ratio as likely negative as positive, of a rejection at the looks before j,
    and ``survivors[j][w]`` that of reaching look j unrejected with a rank sum of at most w there."""

    looks: tuple[int, ...]
    level: float
    bounds: tuple[int, ...]
    spent: tuple[float, ...]
    survivors: tuple[tuple[float, ...], ...]

    @staticmethod
    def trim(j: int) -> int:
        """The largest |log ratio|s the look ``j`` leaves out of its rank sum (``TRIM_AFTER_FIRST``)."""
        return 0 if j == 0 else TRIM_AFTER_FIRST

    @property
    def error(self) -> float:
        """The procedure's overall chance of calling an identical copy faster (at most ``level``)."""
        last = self.bounds[-1]
        return self.spent[-1] + (self.survivors[-1][last] if last >= 0 else 0.0)

    def crossed(self, diffs: Sequence[float]) -> int | None:
        """The first look (its index) at which the pairs' log ratios ``diffs`` (in the order measured) cross
        the bound, or None."""
        for j, (k, bound) in enumerate(zip(self.looks, self.bounds, strict=True)):
            if k > len(diffs):
                break
            if _lost_rank_sum(diffs[:k], self.trim(j)) <= bound:
                return j
        return None

    def reachable(self, diffs: Sequence[float]) -> bool:
        """Whether more pairs could still cross a later bound: a pair added only raises the lost ones' ranks (or
        adds its own, or, as the new largest, brings the one it displaces into a trimmed sum), so each look's rank
        sum never falls."""
        return any(k >= len(diffs) and _lost_rank_sum(diffs, self.trim(j)) <= bound
                   for j, (k, bound) in enumerate(zip(self.looks, self.bounds, strict=True)))

    def p_value(self, diffs: Sequence[float]) -> float:
        """The stage-wise ordering p-value: at the look crossed, the chance under the null of crossing at an
        earlier look or there with a rank sum at most the one seen; uncrossed, the same at the last look with the
        rank sum now (the best the pairs left could keep it at). Below ``level`` exactly when a bound was crossed."""
        if not diffs:
            return 1.0
        j = self.crossed(diffs)
        k = len(diffs) if j is None else self.looks[j]
        j = len(self.looks) - 1 if j is None else j
        w = _lost_rank_sum(diffs[:k], self.trim(j))
        cdf = self.survivors[j]
        return min(1.0, self.spent[j] + cdf[min(w, len(cdf) - 1)])


@functools.lru_cache(maxsize=64)
def sequential_design(looks: tuple[int, ...], level: float) -> SequentialDesign:
    """The bounds of a group-sequential signed-rank test with ``looks`` (pair counts, increasing) whose overall
    type-I error is at most ``level``, computed exactly.

    Under the null, each pair's log ratio is drawn independently from one continuous distribution symmetric
    about 0: its sign is a fair coin independent of its size, and the rank of its size among the sizes so far is
    uniform and independent of the earlier ones (Renyi's sequential ranks). So the pairs' signs listed by size
    after k pairs (the string the rank sum reads) grow by one fair bit inserted at a uniform position of k + 1,
    and the chance of every string is propagated exactly from look to look (2^n strings of n pairs), the strings
    rejected at a look removed before the next. At each look the bound is the largest rank sum (after the first
    look, of every pair but the one farthest from even: ``TRIM_AFTER_FIRST``) whose rejections,
    added to the earlier looks', keep the total at most ``level * (k / n) ** SPENDING_POWER`` (an alpha-spending
    function; at the last look, the whole level). Stopping for any other reason (the bound out of reach, the
    other test of the A/B settled) only removes chances to reject, so the error stays at most ``level``; ties and
    zero differences, counted as lost pairs, only lower it."""
    import numpy as np

    n = looks[-1]
    mass = np.ones(1)
    k = 0
    spent = 0.0
    bounds: list[int] = []
    spent_before: list[float] = []
    survivors: list[tuple[float, ...]] = []
    for j, look in enumerate(looks):
        while k < look:
            mass = _insert_pair(mass, k)
            k += 1
        sums = _string_rank_sums(k, SequentialDesign.trim(j))
        by_sum = np.bincount(sums, weights=mass, minlength=k * (k + 1) // 2 + 1)
        cdf = np.cumsum(by_sum)
        allowed = level * (look / n) ** SPENDING_POWER if look < n else level
        within = np.nonzero(spent + cdf <= allowed * (1 + 1e-12))[0]
        bound = int(within[-1]) if within.size else -1
        bounds.append(bound)
        spent_before.append(spent)
        survivors.append(tuple(float(c) for c in cdf))
        if bound >= 0:
            spent += float(cdf[bound])
            mass = np.where(sums <= bound, 0.0, mass)
    return SequentialDesign(tuple(looks), level, tuple(bounds), tuple(spent_before), tuple(survivors))


def _insert_pair(mass: Any, k: int) -> Any:
    """The chances of the sign strings (bit i: the pair with the i-th smallest |log ratio| was lost) after one more
    pair, from those after ``k``: its bit, lost or won with chance 1/2, inserted at each of k + 1 places alike."""
    import numpy as np

    strings = np.arange(1 << k)
    after = np.zeros(1 << (k + 1))
    share = mass / (2 * (k + 1))
    for place in range(k + 1):
        low, high = strings & ((1 << place) - 1), (strings >> place) << (place + 1)
        for bit in (0, 1):
            np.add.at(after, low | (bit << place) | high, share)
    return after


def _string_rank_sums(k: int, trim: int = 0) -> Any:
    """The lost rank sum of every sign string of ``k`` pairs (bit i set: rank i + 1 lost), the ``trim`` highest
    ranks left out."""
    import numpy as np

    strings = np.arange(1 << k)
    kept = max(0, k - trim)
    return sum(((strings >> i) & 1) * (i + 1) for i in range(kept)) if kept else np.zeros(1 << k, dtype=np.int64)


#: The non-inferiority margin of the A/B and its level: the optimized model counts as "not slower" when its latency
#: is at most this much above the original's (2%: 1.02x its time). Tested like "faster", over the session pairs: the
#: same sequential signed-rank test, at ``NON_INFERIORITY_LEVEL``, on the pairs' log ratios shifted by
#: log(1 + margin), that is of the null hypothesis "the optimized model is more than 2% slower". It is asked only of a
#: simpler model (fewer nodes or weight bytes, ``xflow.optimize.size``), never of an identical copy, so the level of
#: "faster" (what keeps copies out) is untouched. Why not 1% at 0.01: sessions of one model differ by 1-3% on this
#: class of machine, and at that noise an equal model passed 1% at 0.01 in 12-54 of 100 seeded simulations of 12
#: pairs; 2% at 0.05 passes it in 86-100 (at 2% and 1% noise), and writes a model 2% slower at most 5 in 100.
NON_INFERIORITY_MARGIN, NON_INFERIORITY_LEVEL = 0.02, 0.05


@dataclass(frozen=True)
class ABDecision:
    """``decide_ab``'s answer: one ``ABResult`` per pair of fresh sessions, in the order measured, and the most
    pairs the test was planned for. B is faster when the pairs' log latency ratios cross a bound of the
    group-sequential one-sided signed-rank test at ``level`` (``sequential_design`` over ``planned_looks``): the
    session pair is the unit of replication, not the round (a session's luck lasts its whole life). With a
    ``margin``, B is also tested for being not slower: at most ``margin`` slower than A (the same test on the ratios
    shifted by it)."""

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

    def design(self, level: float | None = None) -> SequentialDesign:
        """The sequential test's looks and bounds for this decision's planned pairs (at ``level``, default its own)."""
        return sequential_design(planned_looks(self.planned), self.level if level is None else level)

    @property
    def p_value(self) -> float:
        """The sequential test's p-value (stage-wise ordering): below ``level`` exactly when B was found faster."""
        return self.design().p_value(self.diffs)

    @property
    def not_slower_p(self) -> float | None:
        """The non-inferiority test's p: the chance of ratios this good if B were more than ``margin`` slower
        (None: no margin, not tested)."""
        return None if self.margin is None else self.design(NON_INFERIORITY_LEVEL).p_value(self.shifted_diffs)

    def b_is_faster(self, level: float | None = None) -> bool:
        """The pairs' ratios crossed a bound of the sequential test and the median pair's ratio is above 1."""
        return self.speedup > 1.0 and self.design(level).crossed(self.diffs) is not None

    def b_is_not_slower(self, level: float | None = None) -> bool:
        """The median pair's ratio within ``margin``, and the shifted ratios crossed a bound of the sequential test
        at ``level`` (default ``NON_INFERIORITY_LEVEL``): B at most ``margin`` slower (always False without a
        margin)."""
        return (self.margin is not None and self.speedup > 1.0 / (1.0 + self.margin)
                and self.design(level or NON_INFERIORITY_LEVEL).crossed(self.shifted_diffs) is not None)

    @property
    def settled(self) -> bool:
        """Nothing more pairs could change: "faster" found, or out of reach and (with a margin) "not slower" found
        or out of reach too; or every planned pair measured."""
        design, diffs = self.design(), self.diffs
        if self.pairs >= self.planned or design.crossed(diffs) is not None:
            return True
        if design.reachable(diffs):
            return False
        tolerant = self.design(NON_INFERIORITY_LEVEL)
        return self.margin is None or tolerant.crossed(self.shifted_diffs) is not None \
            or not tolerant.reachable(self.shifted_diffs)


#: Pairs of sessions a decision measures at most. Eight is the fewest with which B winning them all passes with
#: most of the level left for later looks (2^-8); with ten to twelve, one or two lost pairs whose ratios are the
#: closest to 1 still pass (BERT-base's real 4-5% gain: pair ratios 0.98-1.13), twelve where pairs are quick. Sixteen
#: gave Swin-T's 4% more chances but kept a matmul chain's identical copy 4 and 5 times in 100 (twelve: 0-1): pairs
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

    The test is sequential (``sequential_design``): the most pairs are planned from the first pair's cost
    (``min_pairs`` to ``max_pairs``, about ``pairs_budget_s`` in all) and the pairs are looked at after 8, 10, ...
    of them and the last (``planned_looks``), each look with a bound that keeps the chance of calling an identical
    copy faster at any look at most ``level`` overall. The decision stops at the first look that finds B faster (a
    consistent 10% gain: after 8 pairs), or as soon as the pairs B lost rule "faster" out at every look left (an
    identical copy: after about 6, 3 or 4 at the fewest), and, with a non-inferiority ``margin``
    (``NON_INFERIORITY_MARGIN``), once "not slower" is settled too; only a close call takes every planned pair.
    The test of "faster" is the same with or without a margin: an identical copy passes it no more often. The plan
    reads the first pair's duration, the sum of both sides' runs, which swapping A and B leaves as it is: under the
    null it says nothing of the pairs' signs."""
    timing = {"min_runs": 5, "target_seconds": 0.3, "undecided_seconds": 0.3} | timing
    started = time.perf_counter()
    results = [measure_ab(session_a, session_b, feeds, **timing)]
    per_pair = time.perf_counter() - started
    session_a = session_b = None  # not held through the fresh pairs: released here where the caller let them go
    planned = max(min_pairs, min(max_pairs, int(pairs_budget_s / max(per_pair, 1e-9))))
    while not ABDecision(tuple(results), planned, level, margin).settled:
        first_a = len(results) % 2 == 0
        made = {side: fresh(side) for side in (("a", "b") if first_a else ("b", "a"))}
        results.append(measure_ab(made["a"], made["b"], feeds, **timing))
        del made  # released before the next pair is made: two pairs of a large model need not fit at once
    return ABDecision(tuple(results), planned, level, margin)


def measure_interleaved(sessions: Mapping[Any, Any], feeds: Mapping[str, np.ndarray], min_runs: int,
                        seconds: float, warmup: int = 3) -> tuple[dict[str, float], int]:
    """Median seconds per session over interleaved rounds (each round runs every session once, the
    order rotating), after warm-up; at least ``min_runs`` rounds and about ``seconds`` in all."""
    times, rounds = interleaved_times(sessions, feeds, min_runs, seconds, warmup)
    return {name: statistics.median(values) for name, values in times.items()}, rounds


def interleaved_times(sessions: Mapping[Any, Any], feeds: Mapping[str, np.ndarray], min_runs: int,
                      seconds: float, warmup: int = 3) -> tuple[dict[Any, list[float]], int]:
    """``measure_interleaved``'s timed runs themselves: seconds per run, per session (a slow model's warm-up
    shorter and its rounds fewer, as ``measure_ab``'s: ``_rounds_for``)."""
    names = list(sessions)
    min_runs = _rounds_for(sessions, feeds, warmup, min_runs, FEWEST_ROUNDS, seconds)
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


def screen(makers: Mapping[int, Callable[[], Any]], feeds: Mapping[str, np.ndarray], runs: int = 3,
           seconds: float = 0.25, warmup: int = 1, budget_s: float | None = None, fewest: int = 3
           ) -> dict[int, float]:
    """A cheap first timing of several models: each on one session of its own, made, run ``warmup`` times, timed
    over at least ``runs`` runs and about ``seconds``, and released before the next is made, so that one session is
    alive at a time (a finalist's session holds about its weights again in prepacked copies). Each model's median
    (s); a model whose session ORT refuses to make or run is left out. Runs are not interleaved: the figures are
    good for dropping the clearly slower, and ``successive_halving`` decides between the rest. With ``budget_s``,
    no model is begun after that many seconds once ``fewest`` have figures: the rest are left out, so order
    ``makers`` by what is likeliest to be fastest."""
    medians: dict[int, float] = {}
    started = time.perf_counter()
    for i, make in makers.items():
        if budget_s is not None and len(medians) >= fewest and time.perf_counter() - started > budget_s:
            break  # the rest (later in ``makers``' order) are not timed
        try:
            session = make()
            for _ in range(warmup):
                session.run(None, dict(feeds))
        except Exception:  # noqa: BLE001 - ORT's own types: a model it refuses is not timed
            continue
        times: list[float] = []
        start = time.perf_counter()
        while len(times) < runs or (time.perf_counter() - start < seconds and len(times) < 100):
            t0 = time.perf_counter()
            session.run(None, dict(feeds))
            times.append(time.perf_counter() - t0)
        medians[i] = statistics.median(times)
        del session  # released before the next one is made
    return medians


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
