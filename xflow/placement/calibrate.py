"""Calibrate the simulator against the executor and check that it ranks placements like the real thing."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import numpy as np

from xflow.errors import XflowError
from xflow.placement.groups import Grouping
from xflow.placement.problem import Problem
from xflow.placement.simulator import SimParams, Simulator
from xflow.placement.topology import FieldProblems, Topology, read_json


def kendall_tau(a: Sequence[float], b: Sequence[float]) -> float:
    """Kendall's tau-b between two equally long sequences (ties counted as neither)."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError("kendall_tau needs two sequences of the same length >= 2")
    concordant = discordant = ties_a = ties_b = 0
    for i, j in itertools.combinations(range(len(a)), 2):
        da, db = a[i] - a[j], b[i] - b[j]
        if da == 0 and db == 0:
            continue
        if da == 0:
            ties_a += 1
        elif db == 0:
            ties_b += 1
        elif (da > 0) == (db > 0):
            concordant += 1
        else:
            discordant += 1
    denominator = math.sqrt((concordant + discordant + ties_a) * (concordant + discordant + ties_b))
    return (concordant - discordant) / denominator if denominator else 0.0


def random_plans(grouping: Grouping, count: int, seed: int = 0) -> list[list[int]]:
    """``count`` random placements with a spread of split ratios: each draws a per-device weight vector,
    then every group picks a device by those weights (only allowed devices)."""
    rng = np.random.default_rng(seed)
    devices = grouping.allowed.shape[1]
    plans = []
    for _ in range(count):
        weights = rng.dirichlet(np.full(devices, 0.5))
        probs = grouping.allowed * weights
        probs = np.where(probs.sum(axis=1, keepdims=True) > 0, probs, grouping.allowed)
        probs /= probs.sum(axis=1, keepdims=True)
        groups = [int(rng.choice(devices, p=row)) for row in probs]
        plans.append(grouping.expand(groups))
    return plans


@dataclass(frozen=True)
class Calibration:
    """Fitted parameters, the log-error of the fit, and the rank correlation of the fitted simulator."""

    params: SimParams
    log_rmse: float
    tau: float
    measured: tuple[float, ...]
    simulated: tuple[float, ...]


KNOBS = ("compute_scale", "node_overhead", "transfer_overhead", "bandwidth_scale", "segment_overhead")


def calibrate(problem: Problem, topology: Topology, plans: Sequence[Sequence[int]], measured: Sequence[float],
              rounds: int = 6, knobs: Sequence[str] = KNOBS) -> Calibration:
    """Fit ``SimParams`` (compute scale, per-node, per-transfer and per-segment overheads, bandwidth scale) so that
    simulated times match ``measured`` ones in log space: coordinate search over log-spaced factors. Only
    ``knobs`` are fitted; the others keep their defaults."""
    target = np.log(np.asarray(measured))

    def error(params: SimParams) -> float:
        sim = Simulator(problem, topology, params)
        predicted = np.log(np.maximum([sim.run(p).seconds for p in plans], 1e-12))
        return float(np.sqrt(np.mean((predicted - target) ** 2)))

    params = SimParams()
    best = error(params)
    typical = float(np.median([c for c in problem.costs if c > 0] or [1e-5]))  # overhead steps in node-cost units
    steps = {"compute_scale": 4.0, "node_overhead": typical, "transfer_overhead": 10 * typical,
             "bandwidth_scale": 4.0, "segment_overhead": 10 * typical}
    steps = {k: steps[k] for k in knobs}  # fitted in this order
    for _ in range(rounds):
        for name, step in steps.items():
            additive = name.endswith("overhead")
            for _ in range(12):
                current = getattr(params, name)
                options = ([current + step, max(current - step, 0.0)] if additive
                           else [v for v in (current * step, current / step) if 1e-3 <= v <= 1e3])
                scored = [(error(replace(params, **{name: v})), v) for v in options]
                value_err, value = min(scored)
                if value_err >= best:
                    break
                best, params = value_err, replace(params, **{name: value})
        steps = {k: (v / 2 if k.endswith("overhead") else math.sqrt(v)) for k, v in steps.items()}
    sim = Simulator(problem, topology, params)
    simulated = tuple(sim.run(p).seconds for p in plans)
    return Calibration(params, best, kendall_tau(simulated, list(measured)), tuple(measured), simulated)


def read_calibration(path: str) -> SimParams:
    """Simulator parameters from a ``place-calibrate --out`` file (or a bare object of them); XflowError
    naming the file when a parameter is unknown, not finite, or out of its physical range."""
    data = read_json(path, "calibration")
    params = data.get("params", data) if isinstance(data, dict) else None
    if not isinstance(params, dict):
        raise XflowError(path, "malformed calibration: expected an object of simulator parameters")
    problems = FieldProblems()
    problems.fields(params, tuple(f.name for f in fields(SimParams)), "calibration")
    result = SimParams(compute_scale=problems.number(params, "compute_scale", 1.0, "calibration", strict=True),
                       node_overhead=problems.number(params, "node_overhead", 0.0, "calibration", high=1.0),
                       transfer_overhead=problems.number(params, "transfer_overhead", 0.0, "calibration", high=1.0),
                       bandwidth_scale=problems.number(params, "bandwidth_scale", 1.0, "calibration", strict=True),
                       segment_overhead=problems.number(params, "segment_overhead", 0.0, "calibration", high=1.0))
    problems.raise_if_any(path, "calibration")
    return result
