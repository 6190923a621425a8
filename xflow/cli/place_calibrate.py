"""``xflow place-calibrate IN``: fit the placement simulator to real runs (``validate_simulator``)."""

from __future__ import annotations

import os

import click

from xflow.cli.common import (
    check_writable,
    cost_model,
    load_graph,
    require_onnxruntime,
    user_errors,
    write_json,
)
from xflow.errors import XflowError
from xflow.files import check_distinct


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
    require_onnxruntime()
    from xflow.placement.measure import validate_simulator
    from xflow.placement.topology import load_topology

    check_distinct({"IN.onnx": in_path, "--cost-db": cost_db, "--out": out_path,
                    "--topology": topology_spec if os.path.isfile(topology_spec) else None})
    topology = load_topology(topology_spec)
    if out_path:
        check_writable(out_path)
    graph = load_graph(in_path)
    for name, value in (("placements", placements), ("runs", runs), ("rounds", rounds)):
        if value < (2 if name != "runs" else 1):
            raise XflowError(None, f"--{name} must be at least {2 if name != 'runs' else 1} (got {value})")
    report = validate_simulator(graph, topology, cost_model(cost_kind, cost_db), placements=placements, runs=runs,
                                seed=seed, fit_placements=fit_placements, rounds=rounds)
    click.echo(f"{in_path} on {topology.name}: {report['placements']} placements, Kendall tau "
               f"{report['tau_uncalibrated']:.3f} uncalibrated, {report['tau']:.3f} calibrated "
               f"on held-out placements (log RMSE {report['log_rmse_validation']:.3f}; the measurements agree with "
               f"themselves, odd vs even rounds, at tau {report['tau_measurement_split_half']:.3f}); "
               f"parameters {report['params']}")
    if out_path:
        write_json(out_path, report)
        click.echo(f"wrote {out_path}")


COMMANDS: list[click.Command] = [place_calibrate]
