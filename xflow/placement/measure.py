"""The environments placement plans in, and the checks that run plans for real: a simulator, or the executor
behind the simulator's feasibility check; a chosen plan timed against the fastest baseline; the simulator
validated against measured placements."""

from __future__ import annotations

import time

import numpy as np

from xflow.cost import CostModel
from xflow.ir import Graph
from xflow.placement.calibrate import calibrate, kendall_tau, random_plans
from xflow.placement.groups import make_groups
from xflow.placement.options import PlaceOptions
from xflow.placement.problem import Problem, build_problem
from xflow.placement.simulator import INFEASIBLE_SECONDS, Simulator
from xflow.placement.topology import Topology
from xflow.placement.train import Environment


def make_env(problem: Problem, topology: Topology, options: PlaceOptions) -> tuple[Environment, Simulator]:
    """The environment to plan in, and a simulator (for the heuristics' cost estimates and memory)."""
    sim = Simulator(problem, topology, options.sim_params)
    if options.env == "sim":
        return sim, sim
    from xflow.placement.executor import Executor

    return _Guarded(Executor(problem, topology, runs=options.runs), sim), sim


class _Guarded:
    """The executor behind a feasibility check: plans the simulator finds over memory or unsupported
    are charged the infeasible constant without running them."""

    def __init__(self, executor: Environment, sim: Simulator) -> None:
        self.executor, self.sim = executor, sim

    def runtime(self, plan: list[int]) -> float:
        result = self.sim.run(plan)
        return self.executor.runtime(plan) if result.feasible else INFEASIBLE_SECONDS


def confirm_plan(problem: Problem, topology: Topology, plans: dict[str, list[int]], baselines: dict[str, float],
                 chosen: str, rounds: int, seed: int = 0) -> dict | None:
    """Time the ``chosen`` plan against the fastest baseline for real (``rounds`` interleaved rounds,
    ``Executor.measure_interleaved``) where this machine runs ``topology`` and the two differ: the measured
    step times (seconds) by name and ``kept``, the faster. None where there is nothing to confirm."""
    from xflow.placement.executor import Executor, can_run

    fastest = min(baselines, key=lambda k: baselines[k])
    if chosen == fastest or list(plans[chosen]) == list(plans[fastest]) or not can_run(topology):
        return None
    started = time.perf_counter()
    executor = Executor(problem, topology, runs=5, seed=seed)
    try:
        plan_time, baseline_time = (m.seconds for m in executor.measure_interleaved(
            [plans[chosen], plans[fastest]], rounds, seed))
    finally:
        executor.close()
    return {"measured": {chosen: plan_time, fastest: baseline_time}, "rounds": rounds,
            "kept": chosen if plan_time <= baseline_time else fastest,
            "seconds": round(time.perf_counter() - started, 3)}


def validate_simulator(graph: Graph, topology: Topology, cost_model: CostModel | None = None, placements: int = 12,
                       runs: int = 5, seed: int = 0, fit_placements: int = 12, rounds: int = 20,
                       pool: int = 400) -> dict:
    """Measure placements with the executor, fit the simulator on some, and report Kendall's tau between
    simulated and measured times on others. Fit set: every single-device placement plus ``fit_placements``
    random ones. Test set: ``placements`` others, drawn from ``pool`` random placements at times of the fitted
    simulator evenly spaced on a log scale (``spread_plans``, chosen before any of them is measured), so that
    they differ by more than the measurement noise. Each set is timed interleaved (``rounds`` rounds of ``runs`` runs of
    every placement, ``Executor.measure_interleaved``). Also reported: tau before the fit, and the
    measurements' own split-half tau (odd against even rounds), the most any simulator could reach on this
    machine at this load."""
    from xflow.placement.executor import Executor

    problem = build_problem(graph, cost_model)
    grouping = make_groups(problem, topology)
    fit_plans = [grouping.expand([d] * grouping.count) for d in range(len(topology.devices))]
    fit_plans += random_plans(grouping, fit_placements, seed + 1)
    executor = Executor(problem, topology, runs=runs, seed=seed)
    try:
        fit_measured = [m.seconds for m in executor.measure_interleaved(fit_plans, rounds, seed)]
        fit = calibrate(problem, topology, fit_plans, fit_measured)
        fitted = Simulator(problem, topology, fit.params)
        test_plans = spread_plans(fitted, random_plans(grouping, pool, seed), placements, fit_plans)
        test_runs = [m.times for m in executor.measure_interleaved(test_plans, rounds, seed + 1)]
    finally:
        executor.close()
    test_measured = [float(np.median(t)) for t in test_runs]
    # how well the measurements rank the placements against themselves (odd vs even rounds): no simulator
    # can agree with them better than they agree with each other
    split_half = kendall_tau([float(np.median(t[::2])) for t in test_runs],
                             [float(np.median(t[1::2])) for t in test_runs]) if rounds >= 2 else float("nan")
    raw = Simulator(problem, topology)
    before = kendall_tau([raw.run(p).seconds for p in test_plans], test_measured)
    simulated = [fitted.run(p).seconds for p in test_plans]
    errors = np.log(np.asarray(simulated)) - np.log(np.asarray(test_measured))
    return {"model": problem.name, "topology": topology.name, "fit_placements": len(fit_plans),
            "placements": len(test_plans), "runs": runs, "rounds": rounds, "tau_uncalibrated": before,
            "tau": kendall_tau(simulated, test_measured), "tau_fit_set": fit.tau, "log_rmse": fit.log_rmse,
            "tau_measurement_split_half": split_half,
            "log_rmse_validation": float(np.sqrt(np.mean(errors ** 2))), "params": vars(fit.params),
            "measured": test_measured, "simulated": simulated}


def spread_plans(sim: Simulator, candidates: list[list[int]], count: int, exclude: list[list[int]]) -> list[list[int]]:
    """``count`` distinct placements out of ``candidates`` (none of ``exclude``) from the fastest to the slowest of
    ``sim``'s step times, each the nearest to one of ``count`` times evenly spaced on a log scale: neighbours then
    differ by about one ratio. (Evenly spaced quantiles crowd them where most random placements fall, a few per
    cent apart, within the measurement noise.)"""
    seen = {tuple(p) for p in exclude}
    unique = []
    for p in candidates:
        if tuple(p) not in seen:
            seen.add(tuple(p))
            unique.append(p)
    times = [sim.run(p).seconds for p in unique]
    order = sorted(range(len(unique)), key=lambda i: times[i])
    if len(order) <= count:
        return [unique[i] for i in order]
    logs = np.log([times[i] for i in order])
    chosen: set[int] = set()
    for target in np.linspace(logs[0], logs[-1], count):
        chosen.add(min((k for k in range(len(order)) if k not in chosen), key=lambda k: (abs(logs[k] - target), k)))
    return [unique[order[k]] for k in sorted(chosen)]
