"""The learning part of placement: the RL stage (a policy trained on the graph, a transferred one fine-tuned, or
one placing zero-shot) followed by the improvement pass, and the training settings of transfer and fine-tuning."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from xflow.placement.groups import Grouping
from xflow.placement.improve import Start, improve_all
from xflow.placement.options import PlaceOptions
from xflow.placement.policy import HINT_FASTEST_BASELINE, Policy
from xflow.placement.problem import Problem
from xflow.placement.simulator import Simulator
from xflow.placement.train import Environment, TrainOptions, TrainTask, place_with, train


@dataclass
class Searched:
    """What the RL stage and the improvement pass found: step time and plan per candidate (the baselines', RL's,
    and each improved one's, ``+improve``), the policy with its training curve, and the report's ``rl`` part."""

    candidates: dict[str, float]
    plans: dict[str, list[int]]
    policy: Policy
    curve: list[tuple[int, float, float]]
    report: dict


def search_plans(problem: Problem, grouping: Grouping, env: Environment, sim: Simulator, plans: dict[str, list[int]],
                 baselines: dict[str, float], opts: PlaceOptions, started: float, budget: float,
                 progress: Callable[[str], None] | None) -> Searched:
    """RL (trained here, fine-tuned, or the given policy zero-shot), then the improvement pass from every candidate
    (RL's best and each baseline's ``plans``, timed ``baselines``), within the planning time that started at
    ``started`` and lasts ``budget`` seconds on ``opts.train.clock`` (see ``place.place``)."""
    clock = opts.train.clock
    deadline = started + budget
    devices = len(sim.topology.devices)
    plans = dict(plans)
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
        result = train([task], devices, fine_tune_options(train_options()), policy=opts.policy.copy(),
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
        result = train([task], devices, train_options(), progress=report)
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
    return Searched(candidates, plans, policy, curve, rl)


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
