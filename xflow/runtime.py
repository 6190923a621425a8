"""ONNX Runtime helpers: sessions with fair timing settings, random feeds, A/B latency."""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


def session_options(threads: int | None = None, optimization: str = "all"):  # noqa: ANN201 - ort type
    """Session options used for every measurement: intra-op spinning off (two sessions in one
    process otherwise steal each other's cores), a fixed thread count, ORT_ENABLE_ALL."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads or os.cpu_count() or 1
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
    level = {"all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
             "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
             "none": ort.GraphOptimizationLevel.ORT_DISABLE_ALL}[optimization]
    opts.graph_optimization_level = level
    # Fatal only: every error ORT logs also comes back as the exception xflow reports in one line
    opts.log_severity_level = 4
    return opts


def make_session(model: onnx.ModelProto | str | bytes, provider: str = "cpu", threads: int | None = None,
                 optimization: str = "all"):  # noqa: ANN201 - ort type
    """An InferenceSession on ``provider`` with the measurement settings."""
    import onnxruntime as ort

    ort.set_default_logger_severity(4)  # the environment's own logger, which some load errors go through
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    providers = [PROVIDERS[provider]] + (["CPUExecutionProvider"] if provider != "cpu" else [])
    return ort.InferenceSession(source, sess_options=session_options(threads, optimization), providers=providers)


_INT_DTYPES = (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)


def random_feeds(session, seed: int = 0, shapes: Mapping[str, tuple[int, ...]] | None = None  # noqa: ANN001
                 ) -> dict[str, np.ndarray]:
    """Seeded random inputs for a session: floats in [-1, 1], integers in [0, 2), booleans."""
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
        if np_type is np.bool_:
            feeds[inp.name] = rng.random(shape) < 0.5
        elif np_type in _INT_DTYPES:
            feeds[inp.name] = rng.integers(0, 2, size=shape).astype(np_type)
        else:
            feeds[inp.name] = rng.uniform(-1, 1, size=shape).astype(np_type)
    return feeds


@dataclass(frozen=True)
class ABResult:
    """Interleaved A/B latency: medians in seconds, how many timed runs each, and in how many of the
    rounds (one run of each, back to back) B was the faster."""

    a_median: float
    b_median: float
    runs: int
    b_wins: int = 0
    pairs: int = 1  # session pairs measured (``decide_ab`` confirms a "faster" on a fresh pair)

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


def decide_ab(session_a, session_b, feeds: Mapping[str, np.ndarray],  # noqa: ANN001
              fresh_pair: Callable[[], tuple[Any, Any]], **timing: Any) -> ABResult:
    """``measure_ab`` on the given session pair, then on fresh pairs from ``fresh_pair``: B is faster when the
    first two pairs say so, or, when those two split, both of the next two; it is not once two pairs say
    otherwise. Where each session's buffers land in memory can make one of two identical models 1-3%
    faster (BERT-base: up to 6%) for the session's whole life, which no number of rounds averages out; each
    new pair draws that luck again. With ``p`` the chance that one pair keeps an identical copy (3 in 100
    on the zoo's SqueezeNet; 25-30 in 100 on a sub-millisecond NasRNN, whose sessions differ the most), this
    keeps it with about p^2 (1 + 2p), as demanding two of two did, and a gain one pair finds three times in
    four is kept 77 times in 100 instead of 56 (two of two turned BERT-base's 5% away in one bench of two).
    The result is the last pair's, which cast the deciding vote, with how many pairs were measured."""
    faster = slower = 0
    result = measure_ab(session_a, session_b, feeds, **timing)
    measured = 1
    while True:
        if result.b_is_faster():
            faster += 1
        else:
            slower += 1
        if slower >= 2 or faster >= 3 or (faster == 2 and slower == 0):
            break
        again_a, again_b = fresh_pair()
        result = measure_ab(again_a, again_b, feeds, **timing)
        measured += 1
    return ABResult(result.a_median, result.b_median, result.runs, result.b_wins, pairs=measured)


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
