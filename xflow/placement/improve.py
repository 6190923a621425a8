"""Placeto-style iterative improvement of a placement, from one start or from every candidate."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from xflow.placement.simulator import INFEASIBLE_SECONDS
from xflow.placement.train import TrainTask


def improve(task: TrainTask, plan_groups: np.ndarray, sweeps: int = 16, time_limit: float = 30.0,
            kicks: int = 64, seed: int = 0, clock: Callable[[], float] = time.perf_counter) -> tuple[float, np.ndarray]:
    """Iterative improvement (Placeto order): visit groups in topological order and move each to the device
    that makes the step fastest given all other groups' devices. When a whole pass moves nothing, try pair
    moves over neighbouring groups (joined by an edge or adjacent in topological order): both to one
    device, or swapped; then back to single moves. One group at a time cannot cross a memory limit that
    needs another group to leave the device first, nor move a branch together with its join; a pair
    can. Each descent makes at most ``sweeps`` passes. Then iterated local search: ``kicks`` times, move
    a few random groups (seeded) of the best placement to random devices and descend again, keeping the
    result when it is faster. Stops after ``time_limit`` seconds on ``clock``."""
    grouping = task.grouping
    allowed = grouping.allowed
    deadline = clock() + time_limit
    pairs = sorted({(a, b) for a, b, _ in grouping.edges} | {(g, g + 1) for g in range(grouping.count - 1)})

    def moves_of(kind: str, current: np.ndarray) -> Iterator[tuple[list[int], list[int]]]:
        """(groups, devices) to try; pairs read ``current`` as it is when they are reached."""
        if kind == "single":
            for g in range(grouping.count):
                for d in np.flatnonzero(allowed[g]):
                    yield [g], [d]
            return
        for a, b in pairs:
            for d in np.flatnonzero(allowed[a] & allowed[b]):
                yield [a, b], [d, d]
            if allowed[a, current[b]] and allowed[b, current[a]]:
                yield [a, b], [current[b], current[a]]

    def descend(current: np.ndarray, best: float) -> tuple[float, np.ndarray]:
        for _ in range(sweeps):
            changed = False
            for kind in ("single", "pair"):
                for groups, devs in moves_of(kind, current):
                    if np.array_equal(current[groups], devs):
                        continue
                    trial = current.copy()
                    trial[groups] = devs
                    seconds = task.env.runtime(grouping.expand(trial))
                    if seconds < best:
                        best, current, changed = seconds, trial, True
                    if clock() > deadline:
                        return best, current
                if changed:
                    break  # back to single moves
            if not changed:
                break
        return best, current

    start = np.array(plan_groups)
    best, current = descend(start, task.env.runtime(grouping.expand(start)))
    rng = np.random.default_rng(seed)
    size = max(2, grouping.count // 16)
    for _ in range(kicks):
        if clock() > deadline:
            break
        kicked = current.copy()
        for g in rng.choice(grouping.count, size=min(size, grouping.count), replace=False):
            kicked[g] = rng.choice(np.flatnonzero(allowed[g]))
        seconds, found = descend(kicked, task.env.runtime(grouping.expand(kicked)))
        if seconds < best:
            best, current = seconds, found
    return best, current


@dataclass(frozen=True)
class Start:
    """A placement the improvement pass starts from: its name (``rl``, ``m-etf``...), step time and groups."""

    name: str
    seconds: float
    groups: np.ndarray


@dataclass(frozen=True)
class Improved:
    """Where the improvement pass went from one start: the start's name and time, then its best."""

    start: str
    start_seconds: float
    seconds: float
    groups: np.ndarray
    spent: float = 0.0  # time the pass spent from this start, on its clock


def improve_all(task: TrainTask, starts: list[Start], sweeps: int = 16, deadline: float = float("inf"),
                seed: int = 0, progress: Callable[[str], None] | None = None,
                clock: Callable[[], float] = time.perf_counter, first_share: float = 0.0) -> list[Improved]:
    """Run ``improve`` from every distinct start, fastest first, so that the plan can keep the best whatever
    it started from (a learned placement or a heuristic's). Infeasible starts are skipped when a feasible
    one exists (a descent over constant infeasible times has no slope); single-device starts with the same
    step time are taken once (on identical devices they are one placement relabelled). Each start gets an equal
    share of the time left before ``deadline`` (on ``clock``); a start that converges early leaves its rest to
    the next. With ``first_share`` > 0 the fastest start gets that share of the time left when the pass begins
    and the others share the rest equally: where one start is far ahead (a fine-tuned policy's placement), a
    longer descent from it pays more than short ones from every start."""
    feasible = [s for s in starts if s.seconds < INFEASIBLE_SECONDS]
    chosen: list[Start] = []
    seen_times: set[float] = set()
    seen_plans: set[bytes] = set()
    for s in sorted(feasible or starts, key=lambda s: (s.seconds, s.name != "rl")):
        key = np.asarray(s.groups, dtype=np.int16).tobytes()
        single = s.name.startswith("single:")
        if key in seen_plans or (single and s.seconds in seen_times):
            continue
        seen_plans.add(key)
        if single:
            seen_times.add(s.seconds)
        chosen.append(s)
    results: list[Improved] = []
    for i, s in enumerate(chosen):
        began = clock()
        left = deadline - began
        if left <= 0:
            break
        if progress:
            best = min([s.seconds, *(r.seconds for r in results)])
            progress(f"improving from {s.name} ({i + 1}/{len(chosen)}), best {best * 1e3:.3f} ms")
        share = left * first_share if i == 0 and first_share > 0 and len(chosen) > 1 else left / (len(chosen) - i)
        seconds, groups = improve(task, s.groups, sweeps, share, seed=seed, clock=clock)
        results.append(Improved(s.name, s.seconds, min(seconds, s.seconds), groups if seconds <= s.seconds
                                else s.groups, clock() - began))
    return results
