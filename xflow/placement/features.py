"""Per-group features for the policy: op mix, cost, bytes, weights, position, current device."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from xflow.ops import OPS
from xflow.ops.base import FAMILIES
from xflow.placement.groups import Grouping
from xflow.placement.problem import Problem
from xflow.placement.simulator import Simulator


def _family_columns() -> dict[str, int]:
    """Op-mix column per op as ``Node.onnx_type`` names it, lower case: an op-table node by its op name, an
    opaque node by its ONNX type (domain-qualified outside the default domain), both from the op table's
    ``family`` (an opaque node of a type the table decodes, a Gemm it could not, has the family of its op)."""
    columns: dict[str, int] = {}
    for entry in OPS.values():
        if entry.family:
            for onnx_type in entry.onnx_types:
                key = f"{entry.domain}::{onnx_type}" if entry.domain else onnx_type
                columns.setdefault(key.lower(), FAMILIES.index(entry.family))
    columns.update({name: FAMILIES.index(entry.family) for name, entry in OPS.items() if entry.family})
    return columns


# Op-mix feature columns: the op table's families (by IR op name or ONNX type, lower case), then "other".
OP_FAMILIES: tuple[str, ...] = FAMILIES
_FAMILY = _family_columns()
BASE_FEATURES = len(OP_FAMILIES) + 1 + 10


def path_levels(problem: Problem) -> tuple[np.ndarray, np.ndarray]:
    """Per node: the longest cost path from the graph's start to it (top level) and from it to the end
    including itself (bottom level), in seconds; nodes are already in topological order."""
    cost = np.asarray(problem.costs)
    top = np.zeros(problem.size)
    bottom = cost.copy()
    for u in range(problem.size):
        for t in problem.outputs_of[u]:
            for c in problem.tensors[t].consumers:
                top[c] = max(top[c], top[u] + cost[u])
    for u in reversed(range(problem.size)):
        for t in problem.outputs_of[u]:
            for c in problem.tensors[t].consumers:
                bottom[u] = max(bottom[u], cost[u] + bottom[c])
    return top, bottom


def group_features(problem: Problem, grouping: Grouping, devices: int,
                   current: np.ndarray | None = None) -> np.ndarray:
    """A (groups x features) matrix. Scale-free where possible (fractions of the graph's totals) so a
    policy trained on some graphs reads others. ``current`` (device per group) fills the one-hot
    "current device" columns (zeros when None)."""
    g = grouping.count
    fam = np.zeros((g, len(OP_FAMILIES) + 1))
    cost = np.zeros(g)
    weights = np.zeros(g)
    out_bytes = np.zeros(g)
    position = np.zeros(g)
    for gi, members in enumerate(grouping.members):
        for u in members:
            fam[gi, _FAMILY.get(problem.ops[u].lower(), len(OP_FAMILIES))] += 1
            cost[gi] += problem.costs[u]
            weights[gi] += sum(b for _, b in problem.weights[u])
        position[gi] = np.mean(members) / max(problem.size - 1, 1)
    for a, _, nbytes in grouping.edges:
        out_bytes[a] += nbytes
    fam /= np.maximum(fam.sum(axis=1, keepdims=True), 1)
    indeg = np.zeros(g)
    outdeg = np.zeros(g)
    for a, b, _ in grouping.edges:
        outdeg[a] += 1
        indeg[b] += 1
    total_cost = max(cost.sum(), 1e-12)
    top, bottom = path_levels(problem)
    critical = max(float(bottom.max(initial=0.0)), 1e-12)
    g_top = np.array([top[list(m)].min() for m in grouping.members]) / critical
    g_bottom = np.array([bottom[list(m)].max() for m in grouping.members]) / critical
    columns = [
        cost / total_cost * g,  # 1.0 = an average group
        np.log1p(cost * 1e6) / 10,  # absolute microseconds, log-scaled
        np.log1p(out_bytes / 1e3) / 10,
        np.log1p(weights / 1e3) / 10,
        position,
        np.log1p(indeg),
        np.log1p(outdeg),
        g_top,  # where the group sits on the critical path: branches share top/bottom levels
        g_bottom,
        np.full(g, total_cost / critical / 10),  # the graph's parallelism (0.1 = a chain)
    ]
    onehot = np.zeros((g, devices))
    if current is not None:
        onehot[np.arange(g), np.asarray(current)] = 1.0
    return np.column_stack([fam, *columns, onehot])


def adjacency(grouping: Grouping) -> tuple[np.ndarray, np.ndarray]:
    """Row-normalised predecessor and successor matrices of the group graph (mean aggregation)."""
    g = grouping.count
    pred = np.zeros((g, g))
    succ = np.zeros((g, g))
    for a, b, _ in grouping.edges:
        pred[b, a] = 1.0
        succ[a, b] = 1.0
    for m in (pred, succ):
        rows = m.sum(axis=1, keepdims=True)
        np.divide(m, rows, out=m, where=rows > 0)
    return pred, succ


#: Per (group, device) features the schedule decoder reads as it places groups one by one (see ``decoder_features``).
DECODER_FEATURES = 6


@dataclass(frozen=True)
class Schedule:
    """What the schedule decoder needs to list-schedule groups as it places them (``Policy.decoder``): each
    group's seconds on each device, its earlier predecessors with the seconds their edge's bytes take from
    each device to each other (zero on the diagonal), and a time scale (the mean group time on its fastest
    device) that makes the decoder's time features scale-free across graphs."""

    time: np.ndarray  # (groups, devices)
    preds: tuple[tuple[tuple[int, np.ndarray, float], ...], ...]  # per group: (group, (devices, devices) s, bytes)
    scale: float


def schedule_view(grouping: Grouping, sim: Simulator) -> Schedule:
    """The ``Schedule`` of ``grouping`` on ``sim``'s topology, with ``sim``'s node times and link parameters.
    Only predecessors numbered before a group are kept (merged groups can form cycles; the decoder places
    groups in number order, which is topological order of their first node)."""
    times = np.asarray(sim.node_times)
    time = np.array([[times[d, list(m)].sum() for d in range(times.shape[0])] for m in grouping.members])
    n_dev = time.shape[1]
    latency = np.zeros((n_dev, n_dev))
    bandwidth = np.ones((n_dev, n_dev))
    for a in range(n_dev):
        for b in range(n_dev):
            if a != b:
                link = sim.topology.link(a, b)
                latency[a, b] = link.latency + sim.params.transfer_overhead
                bandwidth[a, b] = link.bandwidth * sim.params.bandwidth_scale
    preds: list[list[tuple[int, np.ndarray, float]]] = [[] for _ in range(grouping.count)]
    for a, b, nbytes in grouping.edges:
        if a < b:
            preds[b].append((a, np.where(np.eye(n_dev, dtype=bool), 0.0, latency + nbytes / bandwidth), nbytes))
    scale = float(time.min(axis=1).mean()) if grouping.count else 1.0
    return Schedule(time, tuple(tuple(p) for p in preds), max(scale, 1e-9))


def decoder_features(ready: np.ndarray, free: np.ndarray, busy: np.ndarray, local: np.ndarray, time: np.ndarray,
                     allowed: np.ndarray, scale: float) -> np.ndarray:
    """(samples, devices, ``DECODER_FEATURES``) for the next group, given where its inputs are ready on each
    device (``ready``, s), when each device is free (``free``, s), the seconds of work placed on each so far
    (``busy``), the bytes of its inputs already on each (``local``), its own seconds per device (``time``) and
    the devices it may go to. Scale-free: times in units of ``scale``, log-compressed; the rest fractions.
    Columns: how much later than the best device it would finish (earliest finish time), how much later its
    inputs arrive than on the best device (transfers), how long it would wait for the device to be free,
    the fraction of its input bytes already there, the device's share of the work placed so far, and
    whether the device is still unused."""
    start = np.maximum(ready, free)
    finish = start + time[None]
    big = np.where(allowed[None], 0.0, np.inf)
    eft_gap = finish - (finish + big).min(axis=1, keepdims=True)
    ready_gap = ready - (ready + big).min(axis=1, keepdims=True)
    total_in = local.sum(axis=1, keepdims=True)
    total_busy = busy.sum(axis=1, keepdims=True)
    columns = [
        np.log1p(np.maximum(eft_gap, 0) / scale),
        np.log1p(np.maximum(ready_gap, 0) / scale),
        np.log1p((start - ready) / scale),
        np.divide(local, total_in, out=np.zeros_like(local), where=total_in > 0),
        np.divide(busy, total_busy, out=np.zeros_like(busy), where=total_busy > 0),
        (busy == 0).astype(float),
    ]
    return np.where(allowed[None, :, None], np.stack(columns, axis=-1), 0.0)
