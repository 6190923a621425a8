"""REINFORCE training of the placement policy (ColocRL seeds), one graph or several (GO/Placeto transfer)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from xflow.placement.features import BASE_FEATURES, adjacency, group_features, schedule_view
from xflow.placement.groups import Grouping
from xflow.placement.policy import GraphInput, Policy, policy_gradient
from xflow.placement.problem import Problem
from xflow.placement.simulator import INFEASIBLE_SECONDS, Simulator


class Environment(Protocol):
    """Anything that runs a placement (device index per node) and says how long a step takes."""

    def runtime(self, plan: Sequence[int]) -> float:
        """Step time in seconds; a large constant when the plan is infeasible."""
        ...


@dataclass
class TrainOptions:
    """REINFORCE settings. Reward is -sqrt(runtime / reference), the reference being the median
    feasible runtime of the first batch (scale-free across graphs); infeasible = ``infeasible_factor``
    x reference; with ``normalize`` advantages are divided by the batch's reward spread (late in training
    the spread is small, and the entropy bonus would otherwise drown the signal). ``time_limit`` (seconds;
    0 = none, so that ``steps`` alone ends training and a seed gives the same policy on any machine) and
    ``patience`` (steps without a new best) end training early;
    ``restart_patience`` steps without a new best restart from a fresh policy (REINFORCE settles in a
    local optimum within tens of steps; restarts spend the rest of the budget elsewhere). With
    ``group_logits`` each graph also gets free per-group logits (``group_learning_rate``). A task with an
    ``imitate`` placement is first learnt by imitation (cross-entropy steps, at most ``imitation_steps``,
    until the policy gives its devices ``imitation_confidence`` mean probability), then by REINFORCE.
    ``clock`` is what time limits are read on: wall time for a user; a benchmark on a shared machine can
    pass ``time.process_time`` so that time the process spends paused or waiting for a core is not counted
    against a run (and two runs compared get the same CPU time, whatever the load did meanwhile)."""

    steps: int = 100_000
    samples: int = 16
    learning_rate: float = 0.03
    baseline_decay: float = 0.9
    entropy_weight: float = 0.01
    grad_clip: float = 1.0
    infeasible_factor: float = 10.0
    hidden: int = 32
    rounds: int = 2
    logit_clip: float = 8.0
    normalize: bool = True
    group_logits: bool = True
    group_learning_rate: float = 0.3
    seed: int = 0
    time_limit: float = 60.0
    patience: int = 0
    restart_patience: int = 40
    imitation_steps: int = 200
    imitation_confidence: float = 0.8
    clock: Callable[[], float] = time.perf_counter


@dataclass
class TrainTask:
    """One graph to train on: its problem, groups and environment."""

    problem: Problem
    grouping: Grouping
    env: Environment
    inp: GraphInput | None = None
    bias: np.ndarray | None = None  # free per-group logits, trained with the policy (not transferred)
    reference: float = 0.0
    baseline: float | None = None
    best: float = float("inf")
    best_groups: np.ndarray | None = None
    cache: dict[bytes, float] = field(default_factory=dict)
    imitate: np.ndarray | None = None  # a placement (device per group) to learn before REINFORCE
    hint: np.ndarray | None = None  # a placement (device per group) the policy reads as features (Policy.hint)
    sim: Simulator | None = None  # node times and links for a schedule decoder (default: ``env`` when a Simulator)


@dataclass
class TrainResult:
    """The best placement found per task, the training curve, and effort spent."""

    policy: Policy
    best_seconds: list[float]
    best_plans: list[list[int]]
    curve: list[tuple[int, float, float]]  # (step, median feasible runtime of the batch, best so far), task 0
    steps: int
    evaluations: int
    seconds: float
    restarts: int = 0
    imitation_steps: int = 0


class Adam:
    """Adam over a dict of arrays, with global-norm gradient clipping."""

    def __init__(self, params: dict[str, np.ndarray], lr: float, clip: float,
                 lr_of: dict[str, float] | None = None) -> None:
        self.params, self.lr, self.clip, self.t = params, lr, clip, 0
        self.lr_of = lr_of or {}
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}

    def step(self, grads: dict[str, np.ndarray]) -> None:
        """One update (in place)."""
        norm = np.sqrt(sum(float((g * g).sum()) for g in grads.values()))
        scale = min(1.0, self.clip / norm) if norm > 0 else 1.0
        self.t += 1
        for k, g in grads.items():
            g = g * scale
            self.m[k] = 0.9 * self.m[k] + 0.1 * g
            self.v[k] = 0.999 * self.v[k] + 0.001 * g * g
            mhat = self.m[k] / (1 - 0.9 ** self.t)
            vhat = self.v[k] / (1 - 0.999 ** self.t)
            self.params[k] -= self.lr_of.get(k, self.lr) * mhat / (np.sqrt(vhat) + 1e-8)


def graph_input(task: TrainTask, devices: int) -> GraphInput:
    """The policy's view of a task's graph."""
    pred, succ = adjacency(task.grouping)
    features = group_features(task.problem, task.grouping, devices, task.hint)
    sim = task.sim if task.sim is not None else task.env if isinstance(task.env, Simulator) else None
    schedule = schedule_view(task.grouping, sim) if sim is not None else None
    return GraphInput(features, pred, succ, task.grouping.allowed, schedule)


def train(tasks: Sequence[TrainTask], devices: int, options: TrainOptions | None = None,
          policy: Policy | None = None, progress: Callable[[int, float], None] | None = None) -> TrainResult:
    """Train one policy on ``tasks`` (every step samples a batch on each task) and return the best
    placement each task reached. ``progress(step, best seconds of task 0)`` is called every step."""
    opt = options or TrainOptions()
    rng = np.random.default_rng(opt.seed)
    for task in tasks:
        task.inp = task.inp or graph_input(task, devices)
    restarts = 0
    hint = policy.hint if policy is not None else ""
    decoder = policy.decoder if policy is not None else ""

    def fresh(given: Policy | None) -> tuple[Policy, Adam]:
        """A new policy (or ``given``), zero group logits, reset baselines, and its optimizer."""
        new = given or Policy.create(BASE_FEATURES + devices, devices, opt.hidden, opt.rounds, opt.seed + restarts,
                                     opt.logit_clip, hint, decoder)
        trained = dict(new.params)
        for t_index, task in enumerate(tasks):
            task.baseline = None
            if opt.group_logits:
                task.bias = np.zeros((task.grouping.count, devices))
                trained[f"bias{t_index}"] = task.bias
        return new, Adam(trained, opt.learning_rate, opt.grad_clip,
                         {k: opt.group_learning_rate for k in trained if k.startswith("bias")})

    policy, adam = fresh(policy)
    imitation_steps = _imitate(policy, adam, tasks, opt)
    best_params = {k: v.copy() for k, v in policy.params.items()}
    started = opt.clock()
    curve: list[tuple[int, float, float]] = []
    evaluations = 0
    since_best = 0
    step = 0
    for step in range(1, opt.steps + 1):
        grads: dict[str, np.ndarray] = {}
        improved = False
        for t_index, task in enumerate(tasks):
            if policy.decoder:
                actions, logp, cache = policy.decode(task.inp, opt.samples, rng, task.bias)
            else:
                logp, cache = policy.forward(task.inp, task.bias)
                actions = _sample(np.exp(logp), opt.samples, rng)
            runtimes = np.empty(opt.samples)
            for s in range(opt.samples):
                key = actions[s].astype(np.int16).tobytes()
                if key not in task.cache:
                    task.cache[key] = task.env.runtime(task.grouping.expand(actions[s]))
                    evaluations += 1
                runtimes[s] = task.cache[key]
                if runtimes[s] < task.best:
                    task.best, task.best_groups, improved = runtimes[s], actions[s].copy(), True
            rewards = _rewards(task, runtimes, opt)
            if task.baseline is None:
                task.baseline = float(rewards.mean())
            advantages = rewards - task.baseline
            if opt.normalize:
                advantages = advantages / (rewards.std() + 1e-3)
            task.baseline = opt.baseline_decay * task.baseline + (1 - opt.baseline_decay) * float(rewards.mean())
            _accumulate(grads, _gradients(policy, task.inp, cache, logp, actions, advantages, opt.entropy_weight),
                        task, t_index, len(tasks))
            if t_index == 0:
                feasible = runtimes[runtimes < INFEASIBLE_SECONDS]
                curve.append((step, float(np.median(feasible)) if feasible.size else INFEASIBLE_SECONDS, task.best))
        if improved:
            best_params = {k: v.copy() for k, v in policy.params.items()}
        adam.step(grads)
        since_best = 0 if improved else since_best + 1
        if progress is not None:
            progress(step, tasks[0].best)
        out_of_time = opt.time_limit > 0 and opt.clock() - started > opt.time_limit
        if out_of_time or (opt.patience and since_best >= opt.patience):
            break
        if opt.restart_patience and since_best >= opt.restart_patience:
            restarts += 1  # stuck in a local optimum: start a fresh policy, keep the best placements found
            policy, adam = fresh(None)
            since_best = 0
    plans = [t.grouping.expand(t.best_groups) if t.best_groups is not None else [] for t in tasks]
    best_policy = Policy(best_params, policy.rounds, policy.clip, policy.hint, policy.decoder)
    return TrainResult(best_policy, [t.best for t in tasks], plans, curve, step, evaluations,
                       opt.clock() - started, restarts, imitation_steps)


def _imitate(policy: Policy, adam: Adam, tasks: Sequence[TrainTask], opt: TrainOptions) -> int:
    """Cross-entropy steps towards each task's ``imitate`` placement (a warm start from a heuristic);
    returns how many were taken."""
    targets = [(i, t) for i, t in enumerate(tasks) if t.imitate is not None]
    for step in range(opt.imitation_steps if targets else 0):
        grads: dict[str, np.ndarray] = {}
        confidence = []
        for t_index, task in targets:
            target = np.asarray(task.imitate)[None]
            if policy.decoder:  # teacher forcing: the target's devices decide the partial schedules
                _, logp, cache = policy.decode(task.inp, 1, bias=task.bias, actions=target)
            else:
                logp, cache = policy.forward(task.inp, task.bias)
            chosen = (logp[0] if policy.decoder else logp)[np.arange(target.shape[1]), target[0]]
            confidence.append(float(np.exp(chosen).mean()))
            _accumulate(grads, _gradients(policy, task.inp, cache, logp, target, np.ones(1), 0.0), task, t_index,
                        len(targets))
        if min(confidence) >= opt.imitation_confidence:
            return step
        adam.step(grads)
    return opt.imitation_steps if targets else 0


def _gradients(policy: Policy, inp: GraphInput, cache: dict, logp: np.ndarray, actions: np.ndarray,
               advantages: np.ndarray, entropy_weight: float) -> dict[str, np.ndarray]:
    """The REINFORCE gradients of one task's batch: ``logp`` is (groups x devices) for an independent
    policy, (samples x groups x devices) for a schedule decoder (each sample has its own distributions)."""
    if not policy.decoder:
        _, dlogits, _ = policy_gradient(logp, actions, advantages, inp.allowed, entropy_weight)
        return policy.backward(inp, cache, dlogits)
    samples = actions.shape[0]
    dlogits = np.stack([policy_gradient(logp[s], actions[s:s + 1], advantages[s:s + 1], inp.allowed,
                                        entropy_weight)[1] for s in range(samples)]) / samples
    return policy.backward_decode(inp, cache, dlogits)


def _accumulate(grads: dict[str, np.ndarray], task_grads: dict[str, np.ndarray], task: TrainTask, t_index: int,
                tasks: int) -> None:
    """Add one task's gradients: the shared network's averaged over ``tasks``, its own group logits apart."""
    for k, g in task_grads.items():
        if k == "bias":
            if task.bias is not None:
                grads[f"bias{t_index}"] = g
        else:
            grads[k] = grads.get(k, 0) + g / tasks


def _sample(probs: np.ndarray, samples: int, rng: np.random.Generator) -> np.ndarray:
    """(samples x groups) device choices drawn from per-group distributions."""
    cdf = np.cumsum(probs, axis=1)
    draws = rng.random((samples, probs.shape[0], 1))
    return np.minimum((draws > cdf[None]).sum(axis=2), probs.shape[1] - 1)


def _rewards(task: TrainTask, runtimes: np.ndarray, opt: TrainOptions) -> np.ndarray:
    feasible = runtimes[runtimes < INFEASIBLE_SECONDS]
    if task.reference <= 0 and feasible.size:
        task.reference = float(np.median(feasible))
    reference = task.reference if task.reference > 0 else INFEASIBLE_SECONDS
    effective = np.where(runtimes < INFEASIBLE_SECONDS, runtimes, opt.infeasible_factor * reference)
    return -np.sqrt(effective / reference)


def place_with(policy: Policy, task: TrainTask, samples: int = 0, seed: int = 0,
               temperature: float = 1.0) -> tuple[float, list[int]]:
    """Zero-shot placement with a trained policy (no gradient step on this graph): the most likely device
    per group, and with ``samples`` > 0 also that many placements sampled from the policy's distribution
    sharpened by ``temperature`` (< 1 = closer to the most likely device), keeping the fastest in the
    task's environment. Returns (seconds, device per node)."""
    devices = policy.devices
    task.inp = task.inp or graph_input(task, devices)
    if policy.decoder:
        candidates = list(policy.decode(task.inp, 1, greedy=True)[0])
        if samples:
            candidates.extend(policy.decode(task.inp, samples, np.random.default_rng(seed), temperature=temperature)[0])
        best = min(((task.env.runtime(task.grouping.expand(c)), i) for i, c in enumerate(candidates)))
        return best[0], task.grouping.expand(candidates[best[1]])
    logp, _ = policy.forward(task.inp)
    candidates = [logp.argmax(axis=1)]
    if samples:
        scaled = np.where(task.inp.allowed, logp / temperature, -np.inf)
        probs = np.exp(scaled - scaled.max(axis=1, keepdims=True))
        candidates.extend(_sample(probs / probs.sum(axis=1, keepdims=True), samples, np.random.default_rng(seed)))
    best = min(((task.env.runtime(task.grouping.expand(c)), i) for i, c in enumerate(candidates)))
    return best[0], task.grouping.expand(candidates[best[1]])
