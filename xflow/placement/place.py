"""The placement stage end to end: graph -> groups -> environment -> baselines and RL -> plan."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from xflow.cost import CostModel
from xflow.ir import Graph
from xflow.placement.baselines import all_baselines
from xflow.placement.features import BASE_FEATURES
from xflow.placement.groups import Grouping, make_groups
from xflow.placement.improve import Start, improve_all
from xflow.placement.options import PlaceOptions
from xflow.placement.plan import Plan, make_plan
from xflow.placement.policy import HINT_FASTEST_BASELINE, Policy
from xflow.placement.problem import Problem, build_problem
from xflow.placement.simulator import INFEASIBLE_SECONDS, Simulator
from xflow.placement.topology import Topology
from xflow.placement.train import Environment, TrainOptions, TrainTask, place_with, train


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
    deadline = started + budget
    grouping = make_groups(problem, topology, opts.max_groups)
    env, sim = make_env(problem, topology, opts)
    plans = all_baselines(grouping, sim)
    baselines = {k: float(env.runtime(v)) for k, v in plans.items()}
    task = TrainTask(problem, grouping, env, sim=sim)
    if opts.policy is not None and opts.policy.hint:
        task.hint = hint_of(opts.policy.hint, grouping, plans, baselines)
    rl: dict = {"groups": grouping.count}
    fine_tuning = opts.policy is not None and opts.fine_tune
    improve_share = opts.fine_tune_improve_share if fine_tuning else opts.improve_share
    train_until = started + budget * (1 - improve_share if opts.improve_sweeps > 0 else 1.0)

    def train_options() -> TrainOptions:
        """``opts.train`` with the time left for training now (within the planning time limit)."""
        if opts.time_limit <= 0:
            return opts.train
        left = max(train_until - clock(), 1e-3)
        return replace(opts.train, time_limit=min(opts.train.time_limit or left, left))

    report = (lambda step, best: progress(f"training: step {step}, best {best * 1e3:.3f} ms")) if progress else None
    if fine_tuning:
        # the transferred policy's own placement (the fastest of its most likely one and ``zero_shot_samples``
        # sampled, as zero-shot) and the fastest baseline's are both starts: imitation moves the per-group logits
        # onto the faster one, the shared network keeps what transfer learnt
        zero_seconds, zero_plan = place_with(opts.policy, task, opts.zero_shot_samples, opts.train.seed,
                                             zero_shot_temperature(opts))
        fastest = min(baselines, key=lambda k: baselines[k])
        start = "zero-shot" if zero_seconds <= baselines[fastest] else fastest
        task.imitate = grouping.project(zero_plan if start == "zero-shot" else plans[fastest])
        task.best, task.best_groups = float(zero_seconds), grouping.project(zero_plan)
        result = train([task], len(topology.devices), fine_tune_options(train_options()), policy=opts.policy.copy(),
                       progress=report)
        rl_seconds, rl_plan, policy, curve = result.best_seconds[0], result.best_plans[0], result.policy, result.curve
        rl.update(mode="fine-tuned", zero_shot_seconds=float(zero_seconds), warm_start=start, steps=result.steps,
                  evaluations=result.evaluations, train_seconds=round(result.seconds, 3),
                  imitation_steps=result.imitation_steps)
    elif opts.policy is not None:
        temperature = zero_shot_temperature(opts)
        rl_seconds, rl_plan = place_with(opts.policy, task, opts.zero_shot_samples, opts.train.seed, temperature)
        greedy_seconds = place_with(opts.policy, task)[0] if opts.zero_shot_samples else rl_seconds
        policy, curve = opts.policy, []
        rl.update(mode="zero-shot", samples=opts.zero_shot_samples, temperature=temperature,
                  greedy_seconds=float(greedy_seconds))
    else:
        if opts.warm_start:
            fastest = min(baselines, key=lambda k: baselines[k])
            task.imitate = grouping.project(plans[fastest])
            rl["warm_start"] = fastest
        result = train([task], len(topology.devices), train_options(), progress=report)
        rl_seconds, rl_plan, policy, curve = result.best_seconds[0], result.best_plans[0], result.policy, result.curve
        rl.update(mode="trained", steps=result.steps, evaluations=result.evaluations,
                  train_seconds=round(result.seconds, 3), imitation_steps=result.imitation_steps)
    rl["seconds"] = float(rl_seconds)
    candidates = dict(baselines)
    if rl_plan:
        candidates["rl"] = float(rl_seconds)
        plans["rl"] = rl_plan
    if opts.improve_sweeps > 0:
        starts = [Start(k, candidates[k], grouping.project(plans[k])) for k in candidates]
        improved = improve_all(task, starts, opts.improve_sweeps, deadline, opts.train.seed, progress, clock,
                               opts.fine_tune_focus if fine_tuning else 0.0)
        rl["improved_from"] = {r.start: float(r.seconds) for r in improved}
        rl["improve_seconds"] = {r.start: round(r.spent, 3) for r in improved}
        for r in improved:
            candidates[f"{r.start}+improve"] = float(r.seconds)
            plans[f"{r.start}+improve"] = grouping.expand(r.groups)
        if "rl+improve" in candidates:
            rl["improved_seconds"] = candidates["rl+improve"]
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


def train_across(graphs: dict[str, Graph], topology: Topology, options: PlaceOptions | None = None,
                 cost_model: CostModel | None = None,
                 progress: Progress | None = None) -> tuple[Policy, dict[str, float]]:
    """Train one policy on several graphs at once (GO-style); returns it and each graph's best seconds.
    Only the shared network is trained (no per-graph logits, no restarts), gently (``transfer_options``),
    for ``transfer_steps`` steps and no time limit: the same seed gives the same policy on any machine."""
    opts = options or PlaceOptions()
    tasks = []
    for name, graph in graphs.items():
        problem = build_problem(graph, cost_model, name)
        grouping = make_groups(problem, topology, opts.max_groups)
        env, sim = make_env(problem, topology, opts)
        task = TrainTask(problem, grouping, env, sim=sim)
        if opts.transfer_hint:
            plans = all_baselines(grouping, sim)
            task.hint = hint_of(opts.transfer_hint, grouping, plans, {k: env.runtime(v) for k, v in plans.items()})
        tasks.append(task)
    steps_only = transfer_options(replace(opts.train, steps=opts.transfer_steps, time_limit=0.0), opts.transfer_decoder)
    devices = len(topology.devices)
    policy = Policy.create(BASE_FEATURES + devices, devices, steps_only.hidden, steps_only.rounds, steps_only.seed,
                           steps_only.logit_clip, opts.transfer_hint, opts.transfer_decoder)
    report = (lambda step, best: progress(f"training across {len(tasks)} graphs: step {step}/{steps_only.steps}, "
                                          f"best on the first {best * 1e3:.3f} ms")) if progress else None
    result = train(tasks, devices, steps_only, policy=policy, progress=report)
    return result.policy, dict(zip(graphs, result.best_seconds, strict=True))


def zero_shot_temperature(options: PlaceOptions) -> float:
    """The temperature a given policy's placements are sampled at: ``options.zero_shot_temperature``, or when
    0 the policy's own: 1.0 for a schedule decoder (trained at 1.0; its samples are spread by what it reads),
    0.3 for an independent policy (near uniform across graphs: sharpened, or its samples are noise)."""
    if options.zero_shot_temperature > 0:
        return options.zero_shot_temperature
    return 1.0 if options.policy is not None and options.policy.decoder else 0.3


def hint_of(kind: str, grouping: Grouping, plans: dict[str, list[int]], seconds: dict[str, float]) -> np.ndarray:
    """The placement (device per group) a policy with ``Policy.hint`` == ``kind`` reads as features: for
    ``HINT_FASTEST_BASELINE``, the fastest of the baselines ``plans`` (their step times in ``seconds``)."""
    if kind != HINT_FASTEST_BASELINE:
        raise ValueError(f"unknown policy hint {kind!r}")
    return grouping.project(plans[min(seconds, key=lambda k: seconds[k])])


def transfer_options(base: TrainOptions, decoder: str = "") -> TrainOptions:
    """Settings for a policy meant to transfer: no per-graph logits or restarts, a small learning rate and
    logit clip so the shared network does not collapse onto one graph's optimum. For a schedule ``decoder``,
    advantages are normalised and the entropy bonus is larger (0.05): an independent policy, which cannot tell
    parallel branches apart, collapses onto a few devices with normalised advantages (nasnet_a zero-shot 9.97 ms
    against 7.68 without, seed 0), while the decoder learns from the sharper signal, and the larger bonus keeps
    its samples spread on graphs it was not trained on (docs/lab-notes/2026-11-25-placement-zero-shot.md)."""
    return replace(base, group_logits=False, restart_patience=0, learning_rate=0.01,
                   entropy_weight=0.05 if decoder else 0.02, logit_clip=3.0, normalize=bool(decoder))


def fine_tune_options(base: TrainOptions) -> TrainOptions:
    """Settings for training a transferred policy further on one graph: per-group logits on (they start at zero,
    so the first placements are the transferred policy's), no restarts (a restart would throw the transferred
    network away), and the transfer's gentle learning rate for the shared network."""
    return replace(base, group_logits=True, restart_patience=0, learning_rate=0.01)


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
    from xflow.placement.calibrate import calibrate, kendall_tau, random_plans
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
