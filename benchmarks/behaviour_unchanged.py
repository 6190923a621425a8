"""Is a refactor behaviour-preserving? Deterministic optimize runs of one tree, and their comparison with another's.

    PYTHONPATH=TREE python benchmarks/behaviour_unchanged.py run OUT [--cache-dir D]
    python benchmarks/behaviour_unchanged.py compare BEFORE AFTER

``run`` writes, for four zoo models (``--small``), the model and report of ``optimize`` through the Python API
with ``measure=False`` (no finalist timing, no A/B: nothing depends on the clock) at analytic costs and at
measured costs read from a cost cache filled once and copied for every run, plus ``search_hashes.py``'s output.
``compare`` prints, per run, whether the written model bytes and every report key but the timings are the same.
The tree before ``xflow/optimize/`` (``xflow.pipeline``) is accepted too, so a refactor can be checked against its
parent commit."""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence

MODELS = ("squeezenet", "resnet50", "bert", "nasrnn")
KINDS = ("analytic", "measured")
#: report keys that are clock readings, folders, or keys the renovation added
UNCOMPARED = {"search_seconds", "total_seconds", "measure_seconds", "search_ms", "total_ms", "measure_ms",
              "latency_before_ms", "latency_after_ms",
              "speedup", "timed_runs", "session_pairs", "faster_pairs", "rank_test_p", "profile_points",
              "session_scale", "output", "cost_db", "rules_file", "input", "outcome"}


def _api():  # noqa: ANN202 - (options maker, optimize_file) of whichever tree is on the path
    try:
        from xflow.optimize import OptimizeOptions, optimize_file

        return OptimizeOptions.of, optimize_file
    except ImportError:
        from xflow.pipeline import OptimizeOptions, optimize_file

        return OptimizeOptions, optimize_file


def run(out: str, cache_dir: str, models: Sequence[str] = MODELS) -> None:
    """Write the runs of the tree on the path into ``out``; zoo models and filled caches are kept in ``cache_dir``.
    ``models``: zoo names, or paths of ONNX files (named by their file name)."""
    make, optimize_file = _api()
    os.makedirs(out, exist_ok=True)
    os.makedirs(cache_dir, exist_ok=True)
    import xflow

    root = os.path.dirname(os.path.dirname(os.path.abspath(xflow.__file__)))  # the tree being run
    with open(os.path.join(out, "hashes.json"), "w") as hashes:
        subprocess.run([sys.executable, os.path.join(root, "benchmarks", "search_hashes.py")], stdout=hashes,
                       check=True, env={**os.environ, "PYTHONHASHSEED": "0"})
    xflow = os.path.join(os.path.dirname(sys.executable), "xflow")
    for given in models:
        model = os.path.splitext(os.path.basename(given))[0]
        source = given if given.endswith(".onnx") else os.path.join(cache_dir, f"{model}.onnx")
        if not os.path.exists(source):
            subprocess.run([xflow, "zoo", "--small", model, source], check=True)
        for kind in KINDS:
            extra = {}
            if kind == "measured":
                filled = os.path.join(cache_dir, f"{model}.costs.sqlite")
                if not os.path.exists(filled):  # measured once (by a process of its own, so the cache is closed
                    # and whole when copied), then every run reads a copy of the same cache
                    subprocess.run([xflow, "optimize", source, os.path.join(cache_dir, f"{model}.fill.onnx"),
                                    "--cost-db", filled, "--keep-if-slower", "-q"], check=True)
                extra = {"cost_db": shutil.copy(filled, os.path.join(out, f"{model}.costs.sqlite"))}
            name = os.path.join(out, f"{model}.{kind}")
            try:  # the certificate (a tree that writes one) is left out: its bytes name the run's files
                options = make(cost=kind, measure=False, certificate=False, **extra)
            except TypeError:
                options = make(cost=kind, measure=False, **extra)
            report = optimize_file(source, name + ".onnx", options, say=lambda _m: None)
            with open(name + ".json", "w") as f:
                json.dump(report.to_json(), f, indent=1, sort_keys=True)
            print(f"{model} {kind}: {report.decision}", flush=True)


def compare(before: str, after: str) -> bool:
    """Print the comparison of two ``run`` folders (the runs ``after`` holds); True when all compared is the same."""
    same_hashes = filecmp.cmp(os.path.join(before, "hashes.json"), os.path.join(after, "hashes.json"), shallow=False)
    print(f"search hashes: {'identical' if same_hashes else 'DIFFERENT'}")
    ok = same_hashes
    for name in sorted(f[:-5] for f in os.listdir(after) if f.endswith(".json") and f != "hashes.json"):
        with open(os.path.join(before, name + ".json")) as b, open(os.path.join(after, name + ".json")) as a:
            old, new = json.load(b), json.load(a)
        keys = (set(old) | set(new)) - UNCOMPARED
        differ = [k for k in sorted(keys) if old.get(k, "<missing>") != new.get(k, "<missing>")]
        same_bytes = filecmp.cmp(os.path.join(before, name + ".onnx"), os.path.join(after, name + ".onnx"),
                                 shallow=False)
        ok &= same_bytes and not differ
        print(f"{name}: model bytes {'identical' if same_bytes else 'DIFFERENT'}; {len(keys)} report keys "
              f"{'the same' if not differ else 'differ: ' + ', '.join(differ)}; {new.get('decision')!r}")
    print("ALL THE SAME" if ok else "SOME DIFFER")
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    runs = commands.add_parser("run")
    runs.add_argument("out")
    runs.add_argument("--cache-dir", default="build/behaviour-unchanged")
    runs.add_argument("--model", dest="models", action="append", help="a zoo name or an ONNX file (repeatable; "
                      f"default: {', '.join(MODELS)})")
    comparing = commands.add_parser("compare")
    comparing.add_argument("before")
    comparing.add_argument("after")
    args = parser.parse_args()
    if args.command == "run":
        run(args.out, args.cache_dir, args.models or MODELS)
    else:
        sys.exit(0 if compare(args.before, args.after) else 1)


if __name__ == "__main__":
    main()
