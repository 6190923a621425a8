"""A layered layout of a small directed acyclic graph, top to bottom (Sugiyama's steps, kept small: the subgraphs a
rewrite matches have a handful of nodes): layers by longest path, a waypoint on every layer an edge crosses,
crossings reduced by barycentre sweeps, then each node pulled toward its neighbours without overlapping."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

LAYER_GAP = 46.0  # vertical space between one layer's bottom and the next one's top
NODE_GAP = 22.0  # horizontal space between neighbours in a layer
WAYPOINT_WIDTH = 8.0
SWEEPS = 6


@dataclass(frozen=True)
class Box:
    """A vertex to place: its id and size."""

    id: str
    width: float
    height: float


@dataclass
class Placed:
    """The layout: each box's centre, each edge's points (source bottom, waypoints, target top), the extent."""

    centres: dict[str, tuple[float, float]] = field(default_factory=dict)
    edges: list[tuple[str, str, list[tuple[float, float]]]] = field(default_factory=list)
    width: float = 0.0
    height: float = 0.0


def layout(boxes: Sequence[Box], edges: Sequence[tuple[str, str]]) -> Placed:
    """Place ``boxes`` (in the order given when nothing else decides) with ``edges`` (source id, target id) going
    downward. The graph must be acyclic; an edge naming an unknown box is ignored."""
    size = {b.id: b for b in boxes}
    edges = [(a, b) for a, b in edges if a in size and b in size and a != b]
    layer = _layers([b.id for b in boxes], edges)
    # every edge longer than one layer gets a waypoint per layer between, so it is routed past the boxes there
    chains: list[tuple[str, str, list[str]]] = []
    rank: dict[str, int] = dict(layer)
    links: list[tuple[str, str]] = []
    for k, (a, b) in enumerate(edges):
        points = [f"\0{k}.{r}" for r in range(layer[a] + 1, layer[b])]
        for r, p in zip(range(layer[a] + 1, layer[b]), points, strict=True):
            rank[p] = r
        path = [a, *points, b]
        links += list(zip(path, path[1:], strict=False))
        chains.append((a, b, points))
    rows: list[list[str]] = [[] for _ in range(max(rank.values(), default=-1) + 1)]
    for v in [b.id for b in boxes] + [p for _, _, ps in chains for p in ps]:
        rows[rank[v]].append(v)
    up = {v: [a for a, b in links if b == v] for v in rank}
    down = {v: [b for a, b in links if a == v] for v in rank}
    _order(rows, up, down)

    def width(v: str) -> float:
        return size[v].width if v in size else WAYPOINT_WIDTH

    def height(v: str) -> float:
        return size[v].height if v in size else 0.0

    xs = _xs(rows, up, down, width)
    placed = Placed()
    y = 0.0
    tops: dict[str, float] = {}
    for row in rows:
        tall = max((height(v) for v in row), default=0.0)
        for v in row:
            tops[v] = y + (tall - height(v)) / 2
            placed.centres[v] = (xs[v], y + tall / 2)
        y += tall + LAYER_GAP
    left = min((xs[v] - width(v) / 2 for v in rank), default=0.0)
    placed.centres = {v: (x - left, cy) for v, (x, cy) in placed.centres.items()}
    placed.width = max((xs[v] + width(v) / 2 - left for v in rank), default=0.0)
    placed.height = max(y - LAYER_GAP, 0.0)
    for a, b, points in chains:
        ax, ay = placed.centres[a]
        bx, by = placed.centres[b]
        path = [(ax, ay + height(a) / 2), *(placed.centres[p] for p in points), (bx, by - height(b) / 2)]
        placed.edges.append((a, b, path))
    placed.centres = {v: c for v, c in placed.centres.items() if v in size}
    return placed


def _layers(ids: list[str], edges: list[tuple[str, str]]) -> dict[str, int]:
    """Each vertex's layer: the longest path to it from a source; a source then moves down to just above its first
    reader (ValueError on a cycle)."""
    preds = {v: [a for a, b in edges if b == v] for v in ids}
    layer: dict[str, int] = {}

    def of(v: str, seen: frozenset[str] = frozenset()) -> int:
        if v not in layer:
            if v in seen:
                raise ValueError(f"the graph to lay out has a cycle through {v!r}")
            layer[v] = max((of(p, seen | {v}) + 1 for p in preds[v]), default=0)
        return layer[v]

    for v in ids:
        of(v)
    # a source feeding only later layers sits just above its first reader (a weight beside the node reading it)
    succs = {v: [b for a, b in edges if a == v] for v in ids}
    for v in ids:
        if not preds[v] and succs[v]:
            layer[v] = min(layer[s] for s in succs[v]) - 1
    return layer


def _order(rows: list[list[str]], up: dict[str, list[str]], down: dict[str, list[str]]) -> None:
    """Barycentre sweeps, down then up, keeping the order with the fewest crossings seen (in place)."""
    best = [list(r) for r in rows]
    fewest = _crossings(rows, down)
    for sweep in range(SWEEPS):
        downward = sweep % 2 == 0
        indices = range(1, len(rows)) if downward else range(len(rows) - 2, -1, -1)
        for i in indices:
            fixed = rows[i - 1] if downward else rows[i + 1]
            where = {v: k for k, v in enumerate(fixed)}
            around = up if downward else down

            def centre(v: str, k: int, where: dict[str, int] = where, around: dict[str, list[str]] = around
                       ) -> float:
                near = [where[n] for n in around[v] if n in where]
                return sum(near) / len(near) if near else float(k)

            keyed = {v: centre(v, k) for k, v in enumerate(rows[i])}
            rows[i].sort(key=keyed.__getitem__)
        count = _crossings(rows, down)
        if count < fewest:
            fewest, best = count, [list(r) for r in rows]
    rows[:] = best


def _crossings(rows: list[list[str]], down: dict[str, list[str]]) -> int:
    total = 0
    for upper, lower in zip(rows, rows[1:], strict=False):
        where = {v: k for k, v in enumerate(lower)}
        pairs = [(i, where[b]) for i, a in enumerate(upper) for b in down[a] if b in where]
        total += sum(1 for k, (a1, b1) in enumerate(pairs) for a2, b2 in pairs[k + 1:]
                     if (a1 - a2) * (b1 - b2) < 0)
    return total


def _xs(rows: list[list[str]], up: dict[str, list[str]], down: dict[str, list[str]], width) -> dict[str, float]:  # noqa: ANN001
    """Horizontal centres: packed left to right, then each row pulled toward its neighbours' centres (down and
    up, a few times) with the order kept and no overlap."""
    xs: dict[str, float] = {}
    for row in rows:
        x = 0.0
        for v in row:
            xs[v] = x + width(v) / 2
            x += width(v) + NODE_GAP
    widest = max((xs[r[-1]] + width(r[-1]) / 2 for r in rows if r), default=0.0)
    for row in rows:  # centre each row under the widest to start with
        if row:
            shift = (widest - (xs[row[-1]] + width(row[-1]) / 2)) / 2
            for v in row:
                xs[v] += shift
    for sweep in range(4):
        ordered = rows if sweep % 2 == 0 else rows[::-1]
        around = up if sweep % 2 == 0 else down
        for row in ordered:
            wanted = [sum(xs[n] for n in around[v]) / len(around[v]) if around[v] else xs[v] for v in row]
            _fit(row, wanted, xs, width)
    return xs


def _fit(row: list[str], wanted: list[float], xs: dict[str, float], width) -> None:  # noqa: ANN001
    """Put each vertex of ``row`` as near ``wanted`` as the order and the gaps allow: left to right, then right to
    left, and the mean of the two."""
    right: list[float] = []
    for k, v in enumerate(row):
        x = wanted[k]
        if k:
            x = max(x, right[-1] + (width(row[k - 1]) + width(v)) / 2 + NODE_GAP)
        right.append(x)
    left: list[float] = [0.0] * len(row)
    for k in range(len(row) - 1, -1, -1):
        x = wanted[k]
        if k < len(row) - 1:
            x = min(x, left[k + 1] - (width(row[k + 1]) + width(row[k])) / 2 - NODE_GAP)
        left[k] = x
    for k, v in enumerate(row):
        xs[v] = (right[k] + left[k]) / 2
