"""Where one ``xflow optimize`` run's time goes: the wall time of each phase (load, search, finalize, select,
verify's equivalence check, its A/B, certify, write), the sessions ORT built and the process's peak memory.

Each phase is timed by wrapping the function that runs it (nothing else changes: the same CLI run), so phases that
nest (the A/B inside verify) are listed inside their parent. With ``--profile FILE`` the run is also profiled with
cProfile (``python -m pstats FILE``). Use a fresh ``--cost-db`` for a cold cost cache.

    .venv/bin/python benchmarks/run_phases.py IN.onnx [--profile run.prof] [-- xflow optimize options...]

Under load the figures are indicative only. The peak memory is the process's (``ru_maxrss``), as ``/usr/bin/time``
gives it for ``xflow optimize`` alone.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import os
import resource
import sys
import tempfile
import time
from collections import defaultdict

#: (module, function, phase): what each phase runs, wrapped where its callers look it up.
PHASES = [
    ("xflow.optimize.run", "load", "load_source", "load"),
    ("xflow.optimize.chain", "search", "search", "search"),
    ("xflow.optimize.chain", "load", "try_original", "original's run"),
    ("xflow.optimize.chain", "finalize", "finalize", "finalize"),
    ("xflow.optimize.chain", "select", "select", "select (finalists timed)"),
    ("xflow.optimize.select", None, "screen", "  screen (each alone)"),
    ("xflow.optimize.select", None, "successive_halving", "  successive halving"),
    ("xflow.optimize.chain", "verify", "verify", "verify (all)"),
    ("xflow.optimize.verify", None, "verify_against_original", "  equivalence at the run's shapes"),
    ("xflow.optimize.verify", None, "check_other_sizes", "  equivalence at other sizes"),
    # ``_ab``, not ``decide_ab``: a wrapper's arguments live as long as its call, and decide_ab lets go of the first
    # pair it is given before its fresh pairs (``_ab`` hands them over in a list it empties)
    ("xflow.optimize.verify", None, "_ab", "  A/B (decide_ab)"),
    ("xflow.optimize.verify", None, "time_other_points", "  A/B at other points"),
    ("xflow.equivalence", None, "float64_reference", "    float64 reference session"),
    ("xflow.optimize.run", None, "_certificate", "certify"),
    ("xflow.optimize.run", "write", "write", "write"),
]


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _wrap(times: dict[str, float], counts: dict[str, int], phase: str, fn, peaks: dict[str, float] | None = None):  # noqa: ANN001, ANN202
    @functools.wraps(fn)
    def timed(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        start, before = time.perf_counter(), _peak_mb()
        try:
            return fn(*args, **kwargs)
        finally:
            times[phase] += time.perf_counter() - start
            counts[phase] += 1
            if peaks is not None and _peak_mb() > before:  # the process's peak rose inside this phase
                peaks[phase] = _peak_mb()
    return timed


def install(times: dict[str, float], counts: dict[str, int], peaks: dict[str, float]) -> None:
    """Wrap every phase's function where its caller looks it up (a module attribute)."""
    import importlib

    for module_name, attr, name, phase in PHASES:
        module = importlib.import_module(module_name)
        holder = getattr(module, attr) if attr else module
        setattr(holder, name, _wrap(times, counts, phase, getattr(holder, name), peaks))
    from xflow.ort.sessions import Sessions
    Sessions.open = _wrap(times, counts, "(ORT sessions built, inside the phases)", Sessions.open)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--profile", help="write cProfile stats here")
    args, rest = parser.parse_known_args()  # the rest: more `xflow optimize` options
    times: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    peaks: dict[str, float] = {}
    install(times, counts, peaks)
    from xflow.cli import main as cli

    with tempfile.TemporaryDirectory() as folder:
        rest = [a for a in rest if a != "--"]
        if "--cost-db" not in rest:
            rest += ["--cost-db", os.path.join(folder, "costs.sqlite")]  # cold
        argv = ["optimize", args.model, os.path.join(folder, "out.onnx"), *rest]
        profiler = cProfile.Profile() if args.profile else None
        start = time.perf_counter()
        try:
            if profiler is not None:
                profiler.enable()
            cli.main(argv, standalone_mode=False)
        finally:
            if profiler is not None:
                profiler.disable()
                profiler.dump_stats(args.profile)
        total = time.perf_counter() - start
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("\n| phase | s | calls | the peak RSS rose to (MB) |\n|---|---|---|---|", file=sys.stderr)
    for _, _, _, phase in PHASES:
        if counts[phase]:
            rose = f"{peaks[phase]:.0f}" if phase in peaks else ""
            print(f"| {phase} | {times[phase]:.2f} | {counts[phase]} | {rose} |", file=sys.stderr)
    sessions = "(ORT sessions built, inside the phases)"
    print(f"| {sessions} | {times[sessions]:.2f} | {counts[sessions]} | |", file=sys.stderr)
    print(f"| total | {total:.2f} | |\npeak RSS {peak_mb:.0f} MB", file=sys.stderr)


if __name__ == "__main__":
    main()
