"""The order a placed graph runs in on real devices, and where it is cut into per-device segments."""

from __future__ import annotations

from collections.abc import Sequence

from xflow.placement.problem import Problem


def segment_order(problem: Problem, plan: Sequence[int]) -> list[int]:
    """A topological order of the nodes that stays on one device as long as it can, so segments are few.
    Any topological order cut at device changes gives segments without cycles between them."""
    pending = [len(ins) for ins in problem.inputs_of]
    ready: set[int] = {u for u in range(problem.size) if pending[u] == 0}
    for t in problem.tensors:  # graph inputs are available from the start
        if t.producer < 0:
            for c in t.consumers:
                pending[c] -= 1
                if pending[c] == 0:
                    ready.add(c)
    order: list[int] = []
    current = plan[min(ready)] if ready else 0
    while ready:
        same = [u for u in ready if plan[u] == current]
        u = min(same) if same else min(ready)
        current = plan[u]
        ready.discard(u)
        order.append(u)
        for t in problem.outputs_of[u]:
            for c in problem.tensors[t].consumers:
                pending[c] -= 1
                if pending[c] == 0:
                    ready.add(c)
    if len(order) != problem.size:
        raise ValueError("graph has a cycle")
    return order


def segment_starts(problem: Problem, plan: Sequence[int]) -> list[bool]:
    """Per node: whether it begins a segment (one ORT session run) in ``segment_order``."""
    starts = [False] * problem.size
    previous = -1
    for u in segment_order(problem, plan):
        starts[u] = plan[u] != previous
        previous = plan[u]
    return starts
