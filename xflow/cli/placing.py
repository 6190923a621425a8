"""What ``xflow place`` and ``xflow optimize --place`` share: the table of baselines and RL, and the request
``optimize`` hands its place pass."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import click

from xflow.cli.common import check_writable
from xflow.cli.progress import clear_status, status_line


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


def place_request(spec: str | None, time_limit: float, out_path: str, quiet: bool):  # noqa: ANN201 - PlaceRequest
    """What ``xflow optimize --place`` asks of the place pass (None without ``--place``): the
    topology, the options, ``OUT.plan.json``, and the table of baselines and RL printed once it is written."""
    if not spec:
        return None
    from xflow.optimize import PlaceRequest
    from xflow.placement.options import PlaceOptions
    from xflow.placement.topology import load_topology

    plan_path = f"{os.path.splitext(out_path)[0]}.plan.json"
    check_writable(plan_path)
    options = PlaceOptions(time_limit=time_limit)
    progress = status_line(quiet)

    def show(plan: Any) -> None:
        clear_status(progress)
        if quiet:
            return
        print_report(plan)
        click.echo(f"  wrote {plan_path}")

    return PlaceRequest(load_topology(spec), options, plan_path, progress, show)
