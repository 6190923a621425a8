"""``xflow place IN``: plan device placement (``xflow.placement.place``), with or without training first."""

from __future__ import annotations

import glob
import os
from typing import Any

import click

from xflow.cli.common import (
    check_writable,
    cost_model,
    load_graph,
    require_onnxruntime,
    save_model,
    user_errors,
    write_json,
)
from xflow.cli.options import placement_settings_options
from xflow.cli.placing import print_report
from xflow.cli.progress import clear_status, status_line
from xflow.errors import XflowError
from xflow.files import check_distinct


def _expand(patterns: tuple[str, ...]) -> list[str]:
    paths: list[str] = []
    for pattern in patterns:
        found = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        if not found:
            raise XflowError(pattern, "matches no file")
        paths.extend(found)
    return paths


@click.command()
@click.argument("in_path", metavar="IN.onnx", type=click.Path(dir_okay=False), required=False)
@click.option("--topology", "topology_spec", required=True, metavar="NAME|FILE",
              help="Built-in topology (cpu, cpu+cuda, 4xgpu-pcie, 2xgpu-memcap, 8xgpu-nvlink) or a JSON file.")
@placement_settings_options
@click.option("--cost", "cost_kind", type=click.Choice(["measured", "analytic"]), default="measured",
              show_default=True, help="Node costs: measured with ONNX Runtime (cached) or analytic.")
@click.option("--cost-db", type=click.Path(), default=None, help="SQLite cache of measured costs.")
@click.option("--train-on", "train_on", multiple=True, metavar="GLOB",
              help="Train one policy across these models (repeatable, globs allowed); needs --save-policy.")
@click.option("--save-policy", type=click.Path(dir_okay=False), default=None, help="Write the trained policy (.npz).")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None, help="Write the plan (JSON).")
@click.option("--onnx-out", type=click.Path(dir_okay=False), default=None,
              help="Also write the model with each node's device in its metadata (xflow.device).")
@click.option("--curve", "curve_path", type=click.Path(dir_okay=False), default=None,
              help="Save the training curve as PNG.")
@click.option("-q", "--quiet", is_flag=True, help="Print only errors.")
@user_errors
def place(in_path: str | None, topology_spec: str, cost_kind: str, cost_db: str | None, train_on: tuple[str, ...],
          save_policy: str | None, out_path: str | None, onnx_out: str | None, curve_path: str | None, quiet: bool,
          **chosen: Any) -> None:
    """Plan where each node of IN.onnx runs on a topology, with RL beside the classic heuristics.

    Prints every baseline (each single device, round-robin, min-cut, m-ETF/HEFT) and the RL result; the
    improvement pass starts from each of them and the plan holds the fastest, so it is never slower than
    a baseline printed. With --train-on, one policy is trained across several models first and saved;
    IN.onnx (if given) is then placed with it zero-shot.
    """
    if cost_kind == "measured" or chosen.get("env") == "real":  # the simulator on analytic costs needs no ORT
        require_onnxruntime()
    from xflow.placement.options import PlaceSettings
    from xflow.placement.place import place as plan_placement
    from xflow.placement.place import training_curve_png
    from xflow.placement.topology import load_topology
    from xflow.placement.transfer import train_across

    check_distinct(place_files(in_path, topology_spec, cost_db, train_on, chosen,
                               {"--out": out_path, "--onnx-out": onnx_out, "--curve": curve_path,
                                "--save-policy": save_policy}))
    topology = load_topology(topology_spec)
    if in_path is None and not train_on:
        raise XflowError(None, "give IN.onnx to place, or --train-on models to train a policy")
    if train_on and not save_policy and in_path is None:
        raise XflowError(None, "--train-on needs --save-policy (or IN.onnx to place with the trained policy)")
    for path in (out_path, onnx_out, curve_path, save_policy):
        if path:
            check_writable(path)
    options = PlaceSettings(**chosen).options(len(topology.devices), topology.name)
    graph = load_graph(in_path) if in_path else None
    costs = cost_model(cost_kind, cost_db)
    say = (lambda _m: None) if quiet else click.echo
    if train_on:
        graphs = {os.path.basename(p): load_graph(p) for p in _expand(train_on)}
        progress = status_line(quiet)
        trained, best = train_across(graphs, topology, options, costs, progress)
        clear_status(progress)
        for name, seconds in best.items():
            say(f"trained on {name}: best {seconds * 1e3:.3f} ms")
        if save_policy:
            trained.save(save_policy, {"topology": topology.name, "trained_on": list(graphs)})
            say(f"wrote {save_policy}")
        options.policy = trained
    if graph is None:
        return
    progress = status_line(quiet)
    outcome = plan_placement(graph, costs, topology, options, os.path.basename(in_path or ""), progress)
    clear_status(progress)
    if not quiet:
        print_report(outcome.plan, say)
        say(f"  planning took {outcome.seconds:.1f} s (measuring node costs before it {outcome.cost_seconds:.1f} s)")
    if out_path:
        write_json(out_path, outcome.plan.to_json())
        say(f"wrote {out_path}")
    if onnx_out:
        _write_annotated(graph, outcome.plan, onnx_out, costs)
        say(f"wrote {onnx_out}")
    if curve_path and outcome.curve:
        training_curve_png(outcome.curve, curve_path, f"{outcome.plan.model} on {topology.name}")
        say(f"wrote {curve_path}")


def place_files(in_path: str | None, topology_spec: str, cost_db: str | None, train_on: tuple[str, ...],
                chosen: dict[str, Any], outputs: dict[str, str | None]) -> dict[str, str | None]:
    """Every file ``xflow place`` reads or writes, by role, for ``check_distinct``: no output may be written over
    the model, the topology, a model trained on, the calibration or policy read, the cost cache or another output."""
    reads: dict[str, str | None] = {"IN.onnx": in_path, "--cost-db": cost_db,
                                    "--calibration": chosen.get("calibration"), "--policy": chosen.get("policy")}
    if os.path.isfile(topology_spec):
        reads["--topology"] = topology_spec
    for pattern in train_on:
        for i, path in enumerate(sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]):
            reads[f"--train-on {pattern} ({i + 1})" if glob.has_magic(pattern) else f"--train-on {path}"] = path
    return {**reads, **outputs}


def _write_annotated(graph, plan, path: str, costs) -> None:  # noqa: ANN001
    from xflow.placement.plan import annotate_model
    from xflow.placement.problem import build_problem

    model = annotate_model(build_problem(graph, costs), plan)
    save_model(model, path)


COMMANDS: list[click.Command] = [place]
