"""``xflow run MODEL --plan PLAN``: execute a placed model (``xflow.placement.executor``) and time it."""

from __future__ import annotations

import os

import click

from xflow.cli.common import load_graph, require_onnxruntime, user_errors


@click.command("run")
@click.argument("model_path", metavar="MODEL.onnx", type=click.Path(dir_okay=False))
@click.option("--plan", "plan_path", required=True, type=click.Path(dir_okay=False), help="A plan from `xflow place`.")
@click.option("--runs", type=int, default=20, show_default=True, help="Timed runs (median reported).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for random inputs.")
@user_errors
def run(model_path: str, plan_path: str, runs: int, seed: int) -> None:
    """Execute MODEL.onnx placed by a plan (one ORT session per device segment) and print its latency.

    Outputs are checked against the unplaced model first."""
    require_onnxruntime()
    from xflow.cost import AnalyticCost
    from xflow.placement.executor import Executor, require_runnable
    from xflow.placement.plan import read_plan
    from xflow.placement.problem import build_problem

    plan = read_plan(plan_path)
    graph = load_graph(model_path)
    problem = build_problem(graph, AnalyticCost(), os.path.basename(model_path))
    devices = plan.devices_for(problem, plan_path)
    require_runnable(plan.topology, plan_path, devices)  # the plan's devices, not the topology, are at fault
    executor = Executor(problem, plan.topology, runs=runs, seed=seed)
    try:
        m = executor.measure(devices)
    finally:
        executor.close()
    used = sorted({plan.topology.devices[d].name for d in devices})
    click.echo(f"{model_path}: {m.seconds * 1e3:.3f} ms median of {runs} runs, {m.segments} segments on "
               f"{', '.join(used)} (outputs match, max abs diff {m.max_abs_diff:.1e})")


COMMANDS: list[click.Command] = [run]
