"""Training one policy across several graphs (GO-style), for zero-shot placement or fine-tuning on others."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from xflow.cost import CostModel
from xflow.ir import Graph
from xflow.placement.baselines import all_baselines
from xflow.placement.features import BASE_FEATURES
from xflow.placement.groups import make_groups
from xflow.placement.learn import hint_of, transfer_options
from xflow.placement.measure import make_env
from xflow.placement.options import PlaceOptions
from xflow.placement.policy import Policy
from xflow.placement.problem import build_problem
from xflow.placement.topology import Topology
from xflow.placement.train import TrainTask, train


def train_across(graphs: dict[str, Graph], topology: Topology, options: PlaceOptions | None = None,
                 cost_model: CostModel | None = None,
                 progress: Callable[[str], None] | None = None) -> tuple[Policy, dict[str, float]]:
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
