"""Options more than one command takes, and the defaults they share with the library.

``OPTIMIZE_DEFAULTS`` is the one place this package reads the library's defaults (``xflow.optimize.options``): the
settings' defaults shown by ``optimize`` and ``bench`` are its fields, not numbers written again here."""

from __future__ import annotations

import typing
from collections.abc import Callable
from dataclasses import fields
from typing import Any

import click

from xflow.bench import BenchSettings
from xflow.cli.common import fail
from xflow.errors import XflowError
from xflow.optimize.options import DEFAULTS

#: ``xflow optimize``'s defaults, in their groups (``search``, ``runtime``, ``cost``, ``inputs``, ``checks``)
OPTIMIZE_DEFAULTS = DEFAULTS
#: ``xflow bench``'s own defaults (how long and over how many sessions each model is timed)
BENCH_DEFAULTS = BenchSettings()

RULES_HELP = "Rule file (default: the shipped rules/default.json)."
THREADS_HELP = "ORT intra-op threads (default: all cores)."


def _default_rlimit() -> int:
    from xflow.verifier.prove import DEFAULT_RLIMIT

    return DEFAULT_RLIMIT


def _generation_rlimit() -> int:
    from xflow.verifier.prove import GENERATION_RLIMIT

    return GENERATION_RLIMIT


def _default_guard() -> float:
    from xflow.verifier.prove import DEFAULT_GUARD_S

    return DEFAULT_GUARD_S


def proof_budget_options(func: Any, generation: bool = False) -> Any:
    """``--rlimit`` and ``--guard``: the z3 budget of a rule, shared by ``generate-rules`` and ``verify-rules``.
    The defaults are the verifier's, read when a command runs (importing z3 is not ``xflow``'s to pay);
    ``generation`` takes the smaller budget of candidates (``GENERATION_RLIMIT``)."""
    func = click.option("--guard", "guard_s", type=click.FloatRange(min=0, min_open=True), default=_default_guard,
                        show_default="1200",
                        help="Last-resort wall-clock limit of one proof in seconds; a proof it stops is reported "
                             "as 'timeout' (a load-dependent answer), never as proved.")(func)
    same = "(z3's own step count, so the answer is the same on any machine at any load)"
    if generation:
        default, shown = _generation_rlimit, "150000"
        help_ = (f"z3 resource units per candidate {same}; a spent budget = unknown = not written. Smaller than "
                 "verify-rules' default: a candidate the axioms cannot prove spends all of it.")
    else:
        default, shown = _default_rlimit, "10000000"
        help_ = f"z3 resource units per rule {same}; a spent budget = unknown = not proved."
    return click.option("--rlimit", type=click.IntRange(min=1), default=default, show_default=shown,
                        help=help_)(func)


def generation_budget_options(func: Any) -> Any:
    """``proof_budget_options`` with the candidates' budget (``generate-rules``)."""
    return proof_budget_options(func, generation=True)


def executor_options(func: Any) -> Any:
    """``--executor`` and ``--address``: where generation and proof tasks run."""
    from xflow.tasks import EXECUTORS

    func = click.option("--address", default=None,
                        help="Ray cluster to join (e.g. auto, or ray://HOST:10001); default: start a local "
                             "Ray instance of --jobs CPUs.")(func)
    return click.option("--executor", type=click.Choice(EXECUTORS), default="local", show_default=True,
                        help="local: --jobs processes on this machine; ray: Ray tasks (pip install "
                             "'xflow-opt[ray]'), the same rule file for the same seed.")(func)


def batching_option(func: Any) -> Any:
    """``--keep-independent-batching``, the same in ``generate-rules`` and ``rules merge``."""
    return click.option("--keep-independent-batching", is_flag=True,
                        help="Also write rules that batch unconnected elementwise ops (relu(a) ; relu(b) -> "
                             "split(relu(concat(a, b)))); left out by default: they match every pair of such ops and "
                             "flood the search, and concat + split only add copies on a CPU.")(func)


def place_option(func: Callable) -> Callable:
    """Add ``--place NAME|FILE`` and ``--place-time-limit`` to ``xflow optimize``: the topology is checked
    before anything runs (``placing.place_request``); placement is the last pass before write."""
    from xflow.placement.options import PlaceOptions

    func = click.option("--place-time-limit", type=float, default=PlaceOptions.time_limit, show_default=True,
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


def placement_settings_options(func: Callable) -> Callable:
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
