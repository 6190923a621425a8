"""The select pass: time the finalists end to end and keep the fastest: a cheap screen of each alone
(``xflow.runtime.screen``), then the fastest two by successive halving (``xflow.runtime.successive_halving``)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from xflow.onnx_io.shared_weights import SharedWeightsFiles, weights_in_memory, write_sharing_weights
from xflow.optimize.finalize import Finalist
from xflow.optimize.load import OriginalNotRunnable, OriginalRun
from xflow.optimize.passes import PassResult
from xflow.optimize.remembered import Remembered
from xflow.optimize.size import graph_size
from xflow.ort import Sessions
from xflow.ort.graphs import session_maker
from xflow.runtime import screen, successive_halving

#: Finalists the screen hands on to successive halving: the fastest two, and up to ``SCREEN_MOST`` where more are
#: within ``SCREEN_CLOSE`` of the fastest (one session's luck moves a model up to ~12% for its life, so a screen of
#: one session each cannot order finalists closer than that); the rest are dropped on one short timing each. The
#: halving interleaves the sessions of every finalist it times, so this also bounds the sessions alive at once.
SCREEN_KEEP, SCREEN_MOST, SCREEN_CLOSE = 2, 3, 0.10
#: Seconds the screen may spend before it stops beginning finalists (taken cheapest estimate first; it times at least
#: ``SCREEN_MOST``): a 330 MB model's finalist costs about 2 s to make and time, and eight of them were half a run.
SCREEN_BUDGET_S = 4.0
#: Finalists timed at all, the cheapest estimates first: the screen's budget reaches about this many on a model of
#: 100-400 MB, and writing the files of the rest costs seconds (BERT-base: twelve finalists, 6 s of writing).
SELECT_MOST = 8
#: Finalists whose end-to-end figure is within this of the fastest one's are as fast as the halving can tell apart
#: (one session's luck moves a model by more): of those, the one with the fewest computing nodes is chosen, the
#: simpler model, which the A/B writes where it is not slower than the original.
SELECT_TIE = 0.01


@dataclass
class Picked:
    """Which finalist measured fastest end to end, and each one's median latency (s; None: ORT refused it)."""

    index: int
    medians: list[float | None]
    from_cache: bool = False  # read from the cost cache (``xflow.optimize.remembered``), not timed in this run


@dataclass(kw_only=True)
class Selected(PassResult):
    """The select pass's result: the finalist chosen (None: none), and the timing when there was a choice."""

    chosen: Finalist | None = None
    picked: Picked | None = None


def select(finalists: list[Finalist], original: OriginalRun | OriginalNotRunnable | None,
           sessions: Sessions, memo: Remembered | None = None) -> Selected:
    """The select pass: with more than one finalist and the original's inputs to run them on, the fastest end to
    end (``select_by_latency``; with ``memo``, as the cost cache remembers it from an earlier run); else the first
    finalist (the search's best)."""
    picked = None
    if len(finalists) > 1 and isinstance(original, OriginalRun):
        feeds = original.feeds

        def timed() -> Picked:
            return select_by_latency(finalists, feeds, sessions)
        picked = timed() if memo is None else memo.pick(
            [f.graph for f in finalists], feeds, timed, lambda p: {"index": p.index, "medians": p.medians},
            lambda d: Picked(int(d["index"]), [None if m is None else float(m) for m in d["medians"]], True))
    chosen = finalists[picked.index if picked is not None else 0] if finalists else None
    return Selected(graph=chosen.graph if chosen is not None else None, modified=chosen is not None,
                    chosen=chosen, picked=picked)


def select_by_latency(finalists: list[Finalist], feeds: dict[str, np.ndarray], sessions: Sessions,
                      rounds: int = 5, seconds: float = 1.0) -> Picked:
    """Time the finalists end to end on the original's inputs and pick the fastest: with more than ``SCREEN_KEEP``,
    each is first timed alone on one session (``screen``: a few runs, one session alive at a time) and only the
    fastest ``SCREEN_KEEP`` go on to successive halving (``successive_halving``, ``rounds`` rounds and about
    ``seconds`` a stage; the finalists worth telling apart are often within 2-3% of each other, about what one
    session's luck moves a model). A finalist the screen drops is reported with its screen figure. The chosen one
    is then verified and timed against the original as any other; a finalist ORT cannot run is not timed (and the
    best one is still verified), nor are those the screen's budget leaves out (``SCREEN_BUDGET_S``)."""
    # the cheapest estimates first (stable: the search's best first on a tie), at most SELECT_MOST of them
    timed = sorted(range(len(finalists)), key=lambda i: finalists[i].cost)[:SELECT_MOST]
    graphs = [finalists[i].graph for i in timed]
    shared = None
    if sessions.scratch is not None and all(weights_in_memory(g) for g in graphs):
        with contextlib.suppress(OSError):  # no room for the files: each session from bytes, as below
            shared = write_sharing_weights(graphs, sessions.scratch, "finalist")
    try:
        return _time_finalists(finalists, timed, shared, feeds, sessions, rounds, seconds)
    finally:
        if shared is not None:
            shared.remove()


def screened(figures: dict[int, float]) -> list[int]:
    """The finalists the screen's figures (seconds, by finalist) hand on to the halving, fastest first: the fastest
    ``SCREEN_KEEP``, and those within ``SCREEN_CLOSE`` of the fastest, at most ``SCREEN_MOST``."""
    order = sorted(figures, key=figures.__getitem__)
    if not order:
        return []
    close = [i for i in order if figures[i] <= figures[order[0]] * (1 + SCREEN_CLOSE)]
    return order[:max(SCREEN_KEEP, min(SCREEN_MOST, len(close)))]


def _time_finalists(finalists: list[Finalist], timed: list[int], shared: SharedWeightsFiles | None,
                    feeds: dict[str, np.ndarray], sessions: Sessions, rounds: int, seconds: float) -> Picked:
    """``select_by_latency``'s timing, its sessions made from ``shared``'s files where written."""
    # keyed by the finalist's index; in ``timed``'s order (the cheapest estimate first), which the screen keeps
    makers: dict[int, Callable[[], Any]] = {
        i: functools.partial(sessions.open, shared.model_paths[k]) if shared is not None else
        session_maker(sessions, finalists[i].graph, f"finalist{i}", lambda f=finalists[i]: f.serialized)
        for k, i in enumerate(timed)}
    figures: dict[int, float] = {}
    alive = list(makers)
    if len(alive) > SCREEN_KEEP:
        figures = screen(makers, feeds, budget_s=SCREEN_BUDGET_S, fewest=SCREEN_MOST)
        alive = screened(figures)
    opened: dict[int, Any] = {}
    for i in alive:
        try:
            opened[i] = makers[i]()
            opened[i].run(None, dict(feeds))
        except Exception:  # noqa: BLE001 - one that does not run is not chosen
            opened.pop(i, None)
    if not opened:
        return Picked(0, [None] * len(finalists))
    fastest, halved = successive_halving({i: makers[i] for i in opened}, opened, feeds, rounds, seconds)
    figures |= halved
    return Picked(simplest_of_the_fastest(fastest, halved, finalists), [figures.get(i) for i in range(len(finalists))])


def simplest_of_the_fastest(fastest: int, figures: dict[int, float], finalists: list[Finalist]) -> int:
    """Of the finalists whose ``figures`` (s, by finalist) are within ``SELECT_TIE`` of ``fastest``'s, the one with
    the fewest computing nodes (ties: the faster figure)."""
    tied = [i for i, figure in figures.items() if figure <= figures[fastest] * (1 + SELECT_TIE)]
    if len(tied) < 2:
        return fastest
    return min(tied, key=lambda i: (graph_size(finalists[i].graph).computing_nodes, figures[i]))
