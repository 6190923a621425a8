"""Dynamic-batch twins of the zoo against their static models: the same rewrites and speedup at the
profiled shape, and the optimized twin run at two other batch sizes against the original twin.

    .venv/bin/python benchmarks/dynamic_twins.py [NAME ...] [--full]

With ``--exports STATIC_DIR DYNAMIC_DIR`` the pairs are real exports of the same model (``export_real.py``
with and without ``--dynamic``; every ``NAME.onnx`` in both folders, or the NAMEs given): both searched with
analytic costs (deterministic, so the rewrite lists can be compared) and the same budget, the dynamic one at
the static one's sizes (batch 1, seq 128), and the optimized dynamic model compared with the original one at
batch 1 and 4 and, for token inputs, sequence 128 and 64::

    .venv/bin/python benchmarks/dynamic_twins.py --exports /tmp/real /tmp/real-dyn --rules rules/default.json
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
import onnx

from xflow import zoo
from xflow.optimize import OptimizeOptions, optimize_file
from xflow.ort import open_session


def run_pair(name: str, small: bool, folder: str) -> dict:
    """Optimize the static model and its twin; the twin's output compared at batch 2 and 5."""
    row: dict = {"model": name}
    for kind in ("static", "dynamic"):
        src, out = os.path.join(folder, f"{name}-{kind}.onnx"), os.path.join(folder, f"{name}-{kind}-opt.onnx")
        onnx.save(zoo.build(name, small=small, dynamic=kind == "dynamic"), src)
        # keep_if_slower: the optimized twin is written (and run below) whatever the A/B says
        options = OptimizeOptions.of(cost_db=os.path.join(folder, "costs.db"), keep_if_slower=True)
        report = optimize_file(src, out, options, say=lambda _m: None)
        chosen = [f["rewrites"] for f in report.finalists if f["chosen"]]
        row[kind] = {"rules": report.rules_applied, "explored": report.graphs_explored, "stop": report.search_stop,
                     "finalists": len(report.finalists), "chosen_rewrites": chosen, "speedup": report.speedup,
                     "faster": report.decision == "optimized" and (report.rank_test_p or 1) < 0.01,
                     "checked_at": report.checked_at}
        if kind == "dynamic":
            original, optimized = open_session(src), open_session(out)
            base = zoo.random_inputs(zoo.build(name, small=small), seed=1)
            diffs = {}
            for batch in (2, 5):
                feeds = {k: np.concatenate([v] * batch) for k, v in base.items()}
                a, b = original.run(None, feeds), optimized.run(None, feeds)
                diffs[batch] = max(float(np.abs(x - y).max()) for x, y in zip(a, b, strict=True))
            row["max_abs_diff_at_batch"] = diffs
            row["interface_kept"] = list(onnx.load(out).graph.input) == list(onnx.load(src).graph.input)
    return row


def run_exports(name: str, static_dir: str, dynamic_dir: str, rules: str | None, folder: str, budget: int) -> dict:
    """Optimize a static export and its dynamic twin alike; the optimized twin checked at other sizes."""
    from xflow.equivalence import check_equivalence
    from xflow.runtime import random_feeds

    row: dict = {"model": name}
    for kind, src in (("static", os.path.join(static_dir, f"{name}.onnx")),
                      ("dynamic", os.path.join(dynamic_dir, f"{name}.onnx"))):
        out = os.path.join(folder, f"{name}-{kind}-opt.onnx")
        options = OptimizeOptions.of(rules_path=rules, cost="analytic", measure=False, verify=False, budget=budget,
                                  time_limit=3600.0, keep_if_slower=True)
        report = optimize_file(src, out, options, say=lambda _m: None)
        row[kind] = {"rules": report.rules_applied, "explored": report.graphs_explored, "stop": report.search_stop,
                     "opaque": report.nodes_opaque, "ir_nodes": report.ir_nodes_before,
                     "seconds": round(report.search_ms / 1e3, 1), "matches": _matches(src, rules)}
        if kind == "dynamic":
            written, source = onnx.load(out, load_external_data=False), onnx.load(src, load_external_data=False)
            row["interface_kept"] = all(  # byte for byte
                [vi.SerializeToString() for vi in getattr(written.graph, field)] ==
                [vi.SerializeToString() for vi in getattr(source.graph, field)] for field in ("input", "output"))
            original, optimized = open_session(src), open_session(out)
            checked = []
            for inp_sizes in _check_sizes(original):
                feeds = random_feeds(original, 1, inp_sizes)
                label = " ".join(f"{k}={'x'.join(map(str, v))}" for k, v in inp_sizes.items())
                check_equivalence(original, optimized, feeds, label,
                                  lambda j, s=inp_sizes, o=original: random_feeds(o, 10 + j, s))
                checked.append(label)
            row["equal_at"] = checked
    row["same_rewrites"] = row["static"]["rules"] == row["dynamic"]["rules"]
    row["same_matches"] = row["static"]["matches"] == row["dynamic"]["matches"]
    return row


def _matches(path: str, rules_path: str | None) -> dict[str, int]:
    """How many matches each rule has in the loaded model (the algebra the search starts from)."""
    from collections import Counter

    from xflow.onnx_io import load
    from xflow.rewrite import RuleIndex
    from xflow.rules import load_rules

    return dict(sorted(Counter(m.rule.name for m in RuleIndex(load_rules(rules_path)).all_matches(load(path))).items()))


def _check_sizes(session) -> list[dict[str, tuple[int, ...]]]:  # noqa: ANN001 - an ORT session
    """Input shapes at batch 1 and 4 and, where the second dim is dynamic (tokens), sequence 128 and 64."""
    found = []
    for batch, seq in ((1, 128), (4, 128), (4, 64), (1, 64)):
        shapes = {}
        for inp in session.get_inputs():
            dims = list(inp.shape)
            if len(dims) > 1 and not isinstance(dims[1], int):
                dims[1] = seq
            elif seq != 128:
                break
            dims[0] = batch
            shapes[inp.name] = tuple(int(d) for d in dims)
        else:
            found.append(shapes)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("names", nargs="*", default=sorted(zoo.MODELS))
    parser.add_argument("--full", action="store_true", help="full-size models (default: the small variants)")
    parser.add_argument("--exports", nargs=2, metavar=("STATIC_DIR", "DYNAMIC_DIR"),
                        help="pairs of real exports instead of the zoo")
    parser.add_argument("--rules", help="rule file (default: the shipped one)")
    parser.add_argument("--budget", type=int, default=40, help="graphs expanded per search (--exports)")
    args = parser.parse_args()
    if args.exports:
        names = args.names if args.names != sorted(zoo.MODELS) else sorted(
            f[:-5] for f in os.listdir(args.exports[1]) if f.endswith(".onnx")
            and os.path.exists(os.path.join(args.exports[0], f)))
        with tempfile.TemporaryDirectory() as folder:
            for name in names:
                print(run_exports(name, *args.exports, args.rules, folder, args.budget), flush=True)
        return
    with tempfile.TemporaryDirectory() as folder:
        for name in args.names:
            print(run_pair(name, not args.full, folder), flush=True)


if __name__ == "__main__":
    main()
