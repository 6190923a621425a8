"""Co-location groups (ColocRL): nodes that should run together are placed as one unit."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from xflow.placement.problem import Problem
from xflow.placement.topology import Topology


@dataclass(frozen=True, eq=False)
class Grouping:
    """``group_of[node]`` is the node's group; groups are numbered in topological order of their first
    node. ``allowed[g]`` is a boolean mask of devices the group may go to (pinned = one True)."""

    group_of: np.ndarray
    members: tuple[tuple[int, ...], ...]
    allowed: np.ndarray
    edges: tuple[tuple[int, int, float], ...]  # (from group, to group, bytes), one per ordered pair

    @property
    def count(self) -> int:
        """Number of groups."""
        return len(self.members)

    def expand(self, group_devices: np.ndarray | list[int]) -> list[int]:
        """Device per node from device per group."""
        return np.asarray(group_devices)[self.group_of].tolist()

    def project(self, node_devices: list[int]) -> np.ndarray:
        """Device per group from device per node (each group's first node decides)."""
        return np.asarray([node_devices[m[0]] for m in self.members])


class _UnionFind:
    def __init__(self, n: int) -> None:
        self.parent = list(range(n))

    def find(self, x: int) -> int:
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def make_groups(problem: Problem, topology: Topology, max_groups: int = 128) -> Grouping:
    """Group nodes: a node with its single consumer when that consumer has no other producer (chains),
    nodes sharing a weight, weight-only computations with their consumer, and nodes that only one
    device supports (pinned there); these merges only join nodes that the same devices support. Then merge
    the cheapest groups into their heaviest-traffic neighbour among those that share a device with them,
    until at most ``max_groups`` remain."""
    n = problem.size
    supports = np.array([[d.supports(op) for d in topology.devices] for op in problem.ops], dtype=bool)
    if n and not supports.any(axis=1).all():
        bad = problem.ops[int(np.argmin(supports.any(axis=1)))]
        raise ValueError(f"no device of topology {topology.name!r} supports {bad}")
    uf = _UnionFind(n)
    pin_key = [tuple(row) for row in supports]

    def join(a: int, b: int) -> None:
        if pin_key[a] == pin_key[b]:
            uf.union(a, b)

    node_preds: list[set[int]] = [set() for _ in range(n)]
    node_succs: list[set[int]] = [set() for _ in range(n)]
    for t in problem.tensors:
        for c in t.consumers:
            if t.producer >= 0 and c != t.producer:
                node_succs[t.producer].add(c)
                node_preds[c].add(t.producer)
    for u in range(n):
        if len(node_succs[u]) == 1:
            (v,) = node_succs[u]
            if len(node_preds[v]) == 1 or problem.costs[u] == 0.0:
                join(u, v)  # a chain link, or a weight-only computation folded into its consumer
    by_weight: dict[str, int] = {}
    for u, ws in enumerate(problem.weights):
        for w, _ in ws:
            if w in by_weight:
                join(by_weight[w], u)
            else:
                by_weight[w] = u
    roots = [uf.find(u) for u in range(n)]
    support = {r: supports[roots.index(r)].copy() for r in set(roots)}
    cost = {}
    for u, r in enumerate(roots):
        cost[r] = cost.get(r, 0.0) + problem.costs[u]
    traffic = _traffic(problem, roots)
    live = set(roots)
    while len(live) > max_groups:
        small = min(live, key=lambda r: (cost[r], r))
        neighbours = [(b, other) for (x, other), b in traffic.items()
                      if x == small and (support[other] & support[small]).any()]
        if not neighbours:
            cost[small] = float("inf")  # no neighbour shares a device with it; leave it alone
            if all(cost[r] == float("inf") for r in live):
                break
            continue
        _, into = max(neighbours)
        keep, gone = min(small, into), max(small, into)
        uf.union(keep, gone)
        cost[keep] = cost[keep] + cost.pop(gone)
        support[keep] = support[keep] & support.pop(gone)
        live.discard(gone)
        roots = [uf.find(u) for u in range(n)]
        traffic = _traffic(problem, roots)
    return _grouping(problem, [uf.find(u) for u in range(n)], supports)


def _traffic(problem: Problem, roots: list[int]) -> dict[tuple[int, int], float]:
    """Bytes between distinct groups, symmetric: (a, b) and (b, a) both hold the sum."""
    table: dict[tuple[int, int], float] = {}
    for t in problem.tensors:
        if t.producer < 0:
            continue
        a = roots[t.producer]
        for b in {roots[c] for c in t.consumers}:
            if a != b:
                table[(a, b)] = table.get((a, b), 0.0) + t.nbytes
                table[(b, a)] = table.get((b, a), 0.0) + t.nbytes
    return table


def _grouping(problem: Problem, roots: list[int], supports: np.ndarray) -> Grouping:
    order = list(dict.fromkeys(roots))  # roots in topological order of their first node
    number = {r: i for i, r in enumerate(order)}
    group_of = np.array([number[r] for r in roots], dtype=np.int64)
    members: list[list[int]] = [[] for _ in order]
    for u, g in enumerate(group_of):
        members[g].append(u)
    allowed = np.array([supports[m].all(axis=0) for m in members], dtype=bool).reshape(len(order), -1)
    edges: dict[tuple[int, int], float] = {}
    for t in problem.tensors:
        if t.producer < 0:
            continue
        a = int(group_of[t.producer])
        for b in {int(group_of[c]) for c in t.consumers}:
            if a != b:
                edges[(a, b)] = edges.get((a, b), 0.0) + t.nbytes
    return Grouping(group_of, tuple(tuple(m) for m in members), allowed,
                    tuple((a, b, nbytes) for (a, b), nbytes in sorted(edges.items())))
