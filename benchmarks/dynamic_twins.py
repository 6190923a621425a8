"""Dynamic-batch twins of the zoo against their static models: the same rewrites and speedup at the
profiled shape, and the optimized twin run at two other batch sizes against the original twin.

    .venv/bin/python benchmarks/dynamic_twins.py [NAME ...] [--full]
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
import onnx

from xflow import zoo
from xflow.pipeline import OptimizeOptions, optimize_file
from xflow.runtime import make_session


def run_pair(name: str, small: bool, folder: str) -> dict:
    """Optimize the static model and its twin; the twin's output compared at batch 2 and 5."""
    row: dict = {"model": name}
    for kind in ("static", "dynamic"):
        src, out = os.path.join(folder, f"{name}-{kind}.onnx"), os.path.join(folder, f"{name}-{kind}-opt.onnx")
        onnx.save(zoo.build(name, small=small, dynamic=kind == "dynamic"), src)
        # keep_if_slower: the optimized twin is written (and run below) whatever the A/B says
        options = OptimizeOptions(cost_db=os.path.join(folder, "costs.db"), keep_if_slower=True)
        report = optimize_file(src, out, options, say=lambda _m: None)
        chosen = [f["rewrites"] for f in report.finalists if f["chosen"]]
        row[kind] = {"rules": report.rules_applied, "explored": report.graphs_explored, "stop": report.search_stop,
                     "finalists": len(report.finalists), "chosen_rewrites": chosen, "speedup": report.speedup,
                     "faster": report.decision == "optimized" and (report.sign_test_p or 1) < 0.01,
                     "checked_at": report.checked_at}
        if kind == "dynamic":
            original, optimized = make_session(src), make_session(out)
            base = zoo.random_inputs(zoo.build(name, small=small), seed=1)
            diffs = {}
            for batch in (2, 5):
                feeds = {k: np.concatenate([v] * batch) for k, v in base.items()}
                a, b = original.run(None, feeds), optimized.run(None, feeds)
                diffs[batch] = max(float(np.abs(x - y).max()) for x, y in zip(a, b, strict=True))
            row["max_abs_diff_at_batch"] = diffs
            row["interface_kept"] = list(onnx.load(out).graph.input) == list(onnx.load(src).graph.input)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("names", nargs="*", default=sorted(zoo.MODELS))
    parser.add_argument("--full", action="store_true", help="full-size models (default: the small variants)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        for name in args.names:
            print(run_pair(name, not args.full, folder), flush=True)


if __name__ == "__main__":
    main()
