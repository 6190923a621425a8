"""Measured decisions kept in the cost cache, so that a run with the same cache and seed writes the same model.

The search's costs come from the cost cache already; what else a run measures afresh, and what decides the model
written, is the end-to-end timing of the finalists (``select``) and the A/B of the chosen one against the original
(``verify``). ``Remembered`` wraps those calls: the first run with a cache measures them and stores the outcome
(``CostCache.put_decision``) under a key of everything that decides it (the graphs compared, the inputs they ran on,
the session settings the costs are keyed by, the test's margin); a later run reads it back instead of timing again.
A fresh cache (``--cost-db`` elsewhere) measures as the first run did. Outputs are still compared every run: only
speed is remembered, never equivalence."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from xflow.cost.base import CostModel
from xflow.cost.cache import CostCache
from xflow.digest import feeds_digest
from xflow.ir import Graph
from xflow.runtime import ABDecision, ABResult

#: Part of every key: bumped when what a stored decision means changes (a new test over the pairs, other timing).
FORMAT = "xflow.decision/3"  # 2: the A/B a group-sequential test, finalists screened first; 3: close ones kept

T = TypeVar("T")


def graph_identity(graph: Graph) -> str:
    """What a timed graph is, for a key: its structural hash (nodes on values) with its interface and every
    value's type, so graphs alike but for their shapes (``--input-shape``) are told apart. Weight values are not
    in it: they do not move a kernel's time (the value sweep's denormal lifts are other graphs)."""
    types = sorted((name, str(t)) for name, t in graph.types.items())
    text = repr((graph.structural_hash, tuple(graph.inputs), tuple(graph.outputs), types))
    return hashlib.blake2b(text.encode(), digest_size=20).hexdigest()


@dataclass
class Remembered:
    """The run's measured decisions in ``cache``, keyed with the environment ``env`` (provider, device, ORT
    version, threads: ``MeasuredCost.env``); ``read`` and ``measured`` count what this run took from the cache and
    what it timed."""

    cache: CostCache
    env: str
    read: list[str] = field(default_factory=list)
    measured: list[str] = field(default_factory=list)

    def key(self, kind: str, parts: Mapping[str, Any]) -> str:
        text = json.dumps([FORMAT, kind, self.env, parts], sort_keys=True, separators=(",", ":"))
        return hashlib.blake2b(text.encode(), digest_size=20).hexdigest()

    def recall(self, kind: str, parts: Mapping[str, Any], measure: Callable[[], T],
               dump: Callable[[T], Any], load: Callable[[Any], T]) -> T:
        """The decision of ``kind`` keyed by ``parts``: read from the cache, else ``measure()``d and stored. A stored
        value this code cannot read back (another layout) is measured again and replaced."""
        key = self.key(kind, parts)
        text = self.cache.get_decision(key)
        if text is not None:
            try:
                value = load(json.loads(text))
            except (TypeError, ValueError, KeyError):
                pass
            else:
                self.read.append(kind)
                return value
        value = measure()
        self.measured.append(kind)
        try:
            stored = json.dumps(dump(value), separators=(",", ":"))
        except (TypeError, ValueError):  # not JSON (a figure of another type): measured again next time
            return value
        self.cache.put_decision(key, kind, self.env, stored)
        return value

    def ab(self, a: Graph, b: Graph, feeds: Mapping[str, np.ndarray], margin: float | None,
           measure: Callable[[], ABDecision]) -> ABDecision:
        """The A/B of ``a`` (the original) against ``b`` on ``feeds`` with non-inferiority ``margin``."""
        parts = {"a": graph_identity(a), "b": graph_identity(b), "feeds": feeds_digest(feeds), "margin": margin}
        return self.recall("ab", parts, measure, _plain, _ab_decision)

    def pick(self, graphs: Sequence[Graph], feeds: Mapping[str, np.ndarray], measure: Callable[[], T],
             dump: Callable[[T], Any], load: Callable[[Any], T]) -> T:
        """The finalists' end-to-end timing (which one is fastest), ``graphs`` in the order they are offered."""
        parts = {"finalists": [graph_identity(g) for g in graphs], "feeds": feeds_digest(feeds)}
        return self.recall("select", parts, measure, dump, load)


def remembered(model: CostModel | None) -> Remembered | None:
    """The decisions of a run whose cost model is measured with a cache (None otherwise: analytic costs, or none
    cached, measure every decision afresh)."""
    from xflow.cost.measured import MeasuredCost
    from xflow.cost.profile_mean import ProfileCost

    if isinstance(model, ProfileCost):
        model = model.model
    if isinstance(model, MeasuredCost) and model.cache is not None:
        return Remembered(model.cache, model.env)
    return None


def _plain(value: Any) -> Any:
    """A dataclass (nested, tuples as lists) as JSON data."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def _ab_decision(data: Any) -> ABDecision:
    """An ``ABDecision`` back from ``_plain``'s data (TypeError / KeyError when it is of another layout)."""
    results = tuple(ABResult(**r) for r in data["results"])
    return ABDecision(**{**data, "results": results})


__all__ = ["FORMAT", "Remembered", "feeds_digest", "graph_identity", "remembered"]
