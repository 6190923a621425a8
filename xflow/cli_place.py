"""Placement commands: ``xflow place`` and ``xflow run --plan``."""

from __future__ import annotations

import glob
import os
import sys
import time
import typing
from collections.abc import Callable
from dataclasses import fields
from typing import Any

import click

from xflow.cli_common import check_writable, fail, save_model, user_errors, write_json
from xflow.errors import XflowError
from xflow.files import check_distinct


def _load_graph(path: str):  # noqa: ANN202 - Graph
    from xflow.onnx_io import load

    if not os.path.exists(path):
        raise XflowError(path, "no such file")
    try:
        return load(path)
    except XflowError:
        raise
    except Exception as exc:  # onnx raises many types for a corrupt file
        raise XflowError(path, f"cannot load model: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
                         ) from None


def _cost_model(kind: str, cost_db: str | None):  # noqa: ANN202 - CostModel
    from xflow.cost import AnalyticCost

    if kind == "analytic":
        return AnalyticCost()
    from xflow.cost.cache import CostCache
    from xflow.cost.measured import MeasuredCost

    return MeasuredCost("cpu", cache=CostCache(cost_db))


class _StatusLine:
    """One line on stderr rewritten in place (at most ten times a second); only on a TTY."""

    def __init__(self) -> None:
        self.shown = 0
        self.last = 0.0

    def __call__(self, message: str) -> None:
        now = time.monotonic()
        if now - self.last < 0.1:
            return
        self.last = now
        click.echo("\r" + message.ljust(self.shown), err=True, nl=False)
        self.shown = len(message)

    def clear(self) -> None:
        """Erase the line (before the report is printed)."""
        if self.shown:
            click.echo("\r" + " " * self.shown + "\r", err=True, nl=False)
            self.shown = 0


def _progress(quiet: bool) -> _StatusLine | None:
    return None if quiet or not sys.stderr.isatty() else _StatusLine()


def _done(progress: _StatusLine | None) -> None:
    if progress is not None:
        progress.clear()


def _expand(patterns: tuple[str, ...]) -> list[str]:
    paths: list[str] = []
    for pattern in patterns:
        found = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        if not found:
            raise XflowError(pattern, "matches no file")
        paths.extend(found)
    return paths


def print_report(plan, echo: Callable[[str], None] = click.echo) -> None:  # noqa: ANN001 - Plan
    """Baselines and RL side by side, fastest marked."""
    from xflow.placement.simulator import INFEASIBLE_SECONDS

    def fmt(seconds: float) -> str:
        return "infeasible" if seconds >= INFEASIBLE_SECONDS else f"{seconds * 1e3:.3f} ms"

    rows = dict(plan.baselines)
    rows["rl"] = plan.rl.get("seconds", float("inf"))
    improved = {f"{start}+improve": s for start, s in plan.rl.get("improved_from", {}).items()}
    if "rl+improve" in improved:
        rows["rl+improve"] = improved.pop("rl+improve")
    if improved:  # the best of the other starts (all of them are in the plan file)
        best = plan.chosen if plan.chosen in improved else min(improved, key=lambda k: improved[k])
        rows[best] = improved[best]
    echo(f"{plan.model} on {plan.topology.name} ({plan.env}, {plan.rl.get('groups', '?')} groups):")
    for name, seconds in rows.items():
        echo(f"  {'*' if name == plan.chosen else ' '} {name:<20} {fmt(seconds)}")
    confirmed = plan.rl.get("confirmed")
    if confirmed:
        times = ", ".join(f"{name} {fmt(seconds)}" for name, seconds in confirmed["measured"].items())
        echo(f"  measured here ({confirmed['rounds']} interleaved rounds, {confirmed['seconds']:.1f} s): {times}; "
             f"kept {confirmed['kept']}")


def _settings_flags(func: Callable) -> Callable:
    """One click option per ``PlaceSettings`` field, named, typed and documented by the field."""
    from xflow.placement.options import PlaceSettings

    hints = typing.get_type_hints(PlaceSettings)
    for f in reversed(fields(PlaceSettings)):
        meta = f.metadata
        if meta["switch"]:
            option = click.option(meta["switch"], f.name, default=f.default, show_default=True, help=meta["help"])
        else:
            kind = click.Choice(meta["choices"]) if meta["choices"] else \
                next(t for t in (*typing.get_args(hints[f.name]), hints[f.name]) if t is not type(None))
            option = click.option(meta["flag"] or f"--{f.name.replace('_', '-')}", f.name, type=kind,
                                  default=f.default, show_default=f.default is not None, help=meta["help"],
                                  metavar=meta["metavar"] or None)
        func = option(func)
    return func


@click.command()
@click.argument("in_path", metavar="IN.onnx", type=click.Path(dir_okay=False), required=False)
@click.option("--topology", "topology_spec", required=True, metavar="NAME|FILE",
              help="Built-in topology (cpu, cpu+cuda, 4xgpu-pcie, 2xgpu-memcap, 8xgpu-nvlink) or a JSON file.")
@_settings_flags
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
    from xflow.placement.options import PlaceSettings
    from xflow.placement.place import place as plan_placement
    from xflow.placement.place import train_across, training_curve_png
    from xflow.placement.topology import load_topology

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
    graph = _load_graph(in_path) if in_path else None
    cost_model = _cost_model(cost_kind, cost_db)
    say = (lambda _m: None) if quiet else click.echo
    if train_on:
        graphs = {os.path.basename(p): _load_graph(p) for p in _expand(train_on)}
        progress = _progress(quiet)
        trained, best = train_across(graphs, topology, options, cost_model, progress)
        _done(progress)
        for name, seconds in best.items():
            say(f"trained on {name}: best {seconds * 1e3:.3f} ms")
        if save_policy:
            trained.save(save_policy, {"topology": topology.name, "trained_on": list(graphs)})
            say(f"wrote {save_policy}")
        options.policy = trained
    if graph is None:
        return
    progress = _progress(quiet)
    outcome = plan_placement(graph, cost_model, topology, options, os.path.basename(in_path or ""), progress)
    _done(progress)
    if not quiet:
        print_report(outcome.plan, say)
        say(f"  planning took {outcome.seconds:.1f} s (measuring node costs before it {outcome.cost_seconds:.1f} s)")
    if out_path:
        write_json(out_path, outcome.plan.to_json())
        say(f"wrote {out_path}")
    if onnx_out:
        _write_annotated(graph, outcome.plan, onnx_out, cost_model)
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


def _write_annotated(graph, plan, path: str, cost_model) -> None:  # noqa: ANN001
    from xflow.placement.plan import annotate_model
    from xflow.placement.problem import build_problem

    model = annotate_model(build_problem(graph, cost_model), plan)
    save_model(model, path)


@click.command("run")
@click.argument("model_path", metavar="MODEL.onnx", type=click.Path(dir_okay=False))
@click.option("--plan", "plan_path", required=True, type=click.Path(dir_okay=False), help="A plan from `xflow place`.")
@click.option("--runs", type=int, default=20, show_default=True, help="Timed runs (median reported).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for random inputs.")
@user_errors
def run(model_path: str, plan_path: str, runs: int, seed: int) -> None:
    """Execute MODEL.onnx placed by a plan (one ORT session per device segment) and print its latency.

    Outputs are checked against the unplaced model first."""
    from xflow.cost import AnalyticCost
    from xflow.placement.executor import Executor, require_runnable
    from xflow.placement.plan import read_plan
    from xflow.placement.problem import build_problem

    plan = read_plan(plan_path)
    graph = _load_graph(model_path)
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


@click.command("place-calibrate")
@click.argument("in_path", metavar="IN.onnx", type=click.Path(dir_okay=False))
@click.option("--topology", "topology_spec", default="cpu", show_default=True, metavar="NAME|FILE",
              help="A topology whose devices exist here (cpu; cpu+cuda with a GPU).")
@click.option("--placements", type=int, default=12, show_default=True,
              help="Placements to validate on (measured; tau is computed over these), spread from the fastest to "
                   "the slowest the fitted simulator predicts among random ones.")
@click.option("--fit-placements", type=int, default=12, show_default=True,
              help="Other random placements to fit the parameters on (plus each single device).")
@click.option("--runs", type=int, default=5, show_default=True, help="Timed runs per placement in each round.")
@click.option("--rounds", type=int, default=20, show_default=True,
              help="Rounds: each times every placement (shuffled order); a placement's time is the median of its "
                   "rounds' medians.")
@click.option("--cost", "cost_kind", type=click.Choice(["measured", "analytic"]), default="measured",
              show_default=True)
@click.option("--cost-db", type=click.Path(), default=None)
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None,
              help="Write fitted parameters, tau and every measurement (JSON).")
@click.option("--seed", type=int, default=0, show_default=True)
@user_errors
def place_calibrate(in_path: str, topology_spec: str, placements: int, fit_placements: int, runs: int, rounds: int,
                    cost_kind: str, cost_db: str | None, out_path: str | None, seed: int) -> None:
    """Fit the simulator to real runs of random placements and report Kendall's tau between them."""
    from xflow.placement.place import validate_simulator
    from xflow.placement.topology import load_topology

    check_distinct({"IN.onnx": in_path, "--cost-db": cost_db, "--out": out_path,
                    "--topology": topology_spec if os.path.isfile(topology_spec) else None})
    topology = load_topology(topology_spec)
    if out_path:
        check_writable(out_path)
    graph = _load_graph(in_path)
    for name, value in (("placements", placements), ("runs", runs), ("rounds", rounds)):
        if value < (2 if name != "runs" else 1):
            raise XflowError(None, f"--{name} must be at least {2 if name != 'runs' else 1} (got {value})")
    report = validate_simulator(graph, topology, _cost_model(cost_kind, cost_db), placements=placements, runs=runs,
                                seed=seed, fit_placements=fit_placements, rounds=rounds)
    click.echo(f"{in_path} on {topology.name}: {report['placements']} placements, Kendall tau "
               f"{report['tau_uncalibrated']:.3f} uncalibrated, {report['tau']:.3f} calibrated "
               f"on held-out placements (log RMSE {report['log_rmse_validation']:.3f}; the measurements agree with "
               f"themselves, odd vs even rounds, at tau {report['tau_measurement_split_half']:.3f}); "
               f"parameters {report['params']}")
    if out_path:
        write_json(out_path, report)
        click.echo(f"wrote {out_path}")


def place_option(func: Callable) -> Callable:
    """Add ``--place NAME|FILE`` and ``--place-time-limit`` to ``xflow optimize``: the topology is checked
    before anything runs (``place_request``); placement is the pipeline's last stage."""
    func = click.option("--place-time-limit", type=float, default=60.0, show_default=True,
                        help="Planning time limit of --place (s): baselines, training and improvement.")(func)
    return click.option("--place", "place_topology", metavar="NAME|FILE", default=None,
                        callback=_check_topology, help="Then plan device placement of the optimized model on "
                        "this topology and write OUT.plan.json (see `xflow place`).")(func)


def _check_topology(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    from xflow.placement.topology import load_topology

    if value is not None:
        try:
            load_topology(value)
        except XflowError as exc:
            fail(str(exc))
    return value


def place_request(spec: str | None, time_limit: float, out_path: str, quiet: bool):  # noqa: ANN201 - PlaceRequest
    """What ``xflow optimize --place`` asks of the pipeline's place stage (None without ``--place``): the
    topology, the options, ``OUT.plan.json``, and the table of baselines and RL printed once it is written."""
    if not spec:
        return None
    from xflow.pipeline import PlaceRequest
    from xflow.placement.options import PlaceOptions
    from xflow.placement.topology import load_topology

    plan_path = f"{os.path.splitext(out_path)[0]}.plan.json"
    check_writable(plan_path)
    options = PlaceOptions(time_limit=time_limit)
    progress = _progress(quiet)

    def show(plan: Any) -> None:
        _done(progress)
        if quiet:
            return
        print_report(plan)
        click.echo(f"  wrote {plan_path}")

    return PlaceRequest(load_topology(spec), options, plan_path, progress, show)


COMMANDS: list[click.Command] = [place, run, place_calibrate]
