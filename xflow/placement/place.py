"""The placement stage end to end: graph -> groups -> environment (``measure``) -> baselines -> RL and the
improvement pass (``learn``) -> plan."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from xflow.cost import CostModel
from xflow.ir import Graph
from xflow.placement.baselines import all_baselines
from xflow.placement.groups import make_groups
from xflow.placement.learn import search_plans
from xflow.placement.measure import confirm_plan, make_env
from xflow.placement.options import PlaceOptions
from xflow.placement.plan import Plan, make_plan
from xflow.placement.policy import Policy
from xflow.placement.problem import build_problem
from xflow.placement.simulator import INFEASIBLE_SECONDS
from xflow.placement.topology import Topology


@dataclass
class PlacementResult:
    """What a placement run found: the plan to write, the trained policy, the training curve, and the
    time spent planning (groups, baselines, training, improvement) and measuring node costs before it."""

    plan: Plan
    policy: Policy
    curve: list[tuple[int, float, float]]
    seconds: float
    cost_seconds: float = 0.0


Progress = Callable[[str], None]
"""Receives one line saying what planning is doing now (a TTY shows it in place)."""


def place(graph: Graph, cost_model: CostModel | None, topology: Topology, options: PlaceOptions | None = None,
          name: str = "model", progress: Progress | None = None) -> PlacementResult:
    """Plan ``graph`` on ``topology``: every baseline, then RL (trained here, or the given policy zero-shot),
    then the improvement pass from every candidate (RL's best and each baseline's). The plan holds the
    fastest of them all, so it is never slower than a baseline the report prints. With
    ``options.time_limit`` > 0 the whole planning fits in it: training stops at ``1 - improve_share`` of
    it and the improvement pass gets the rest, read on ``options.train.clock`` (wall time by default); a
    fine-tune gives the improvement pass ``fine_tune_improve_share`` instead, most of it from the fastest start.
    Measuring node costs comes first and is not counted."""
    opts = options or PlaceOptions()
    clock = opts.train.clock
    cost_started = time.perf_counter()
    problem = build_problem(graph, cost_model, name)
    cost_seconds = time.perf_counter() - cost_started
    started = clock()
    budget = opts.time_limit if opts.time_limit > 0 else float("inf")
    grouping = make_groups(problem, topology, opts.max_groups)
    env, sim = make_env(problem, topology, opts)
    plans = all_baselines(grouping, sim)
    baselines = {k: float(env.runtime(v)) for k, v in plans.items()}
    found = search_plans(problem, grouping, env, sim, plans, baselines, opts, started, budget, progress)
    candidates, plans, policy, curve, rl = found.candidates, found.plans, found.policy, found.curve, found.report
    chosen = min(candidates, key=lambda k: candidates[k])
    seconds = clock() - started
    rl["planning_seconds"] = round(seconds, 3)
    if opts.env == "sim" and opts.confirm_rounds > 0:  # after the time limit: a real check, not planning
        confirmed = confirm_plan(problem, topology, plans, baselines, chosen, opts.confirm_rounds, opts.train.seed)
        if confirmed is not None:
            rl["confirmed"] = confirmed
            chosen = confirmed["kept"]
    plan = make_plan(name, problem, topology, opts.env, plans[chosen], candidates[chosen], chosen,
                     baselines=baselines, rl=rl,
                     extra={"feasible": bool(candidates[chosen] < INFEASIBLE_SECONDS),
                            "simulator": vars(opts.sim_params) if opts.env == "sim" else None,
                            "nodes": problem.size, "cost_model": getattr(cost_model, "name", "analytic"),
                            "cost_seconds": round(cost_seconds, 3)})
    return PlacementResult(plan, policy, curve, seconds, cost_seconds)


def training_curve_png(curve: list[tuple[int, float, float]], path: str, title: str = "") -> None:
    """Save the training curve (median of each batch's feasible samples and best so far, ms) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [c[0] for c in curve]
    median = np.array([c[1] for c in curve]) * 1e3
    best = np.array([c[2] for c in curve]) * 1e3
    fig, ax = plt.subplots(figsize=(6, 3.5))
    cap = INFEASIBLE_SECONDS * 1e3
    ax.plot(steps, np.where(median < cap, median, np.nan), label="batch median (feasible samples)", alpha=0.6)
    ax.plot(steps, np.where(best < cap, best, np.nan), label="best so far")
    ax.set_yscale("log")
    ax.set_xlabel("training step")
    ax.set_ylabel("step time (ms, log)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


