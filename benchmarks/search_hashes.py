"""Structural hashes of the search's best graph and of the finalists on the zoo, with a fixed cost model.

A refactor of the search, the rewrite engine or optimize's finalize pass must leave them as they
are. Run it before and after a change and compare the two files:

    PYTHONHASHSEED=0 python benchmarks/search_hashes.py > before.json      # on the old commit
    PYTHONHASHSEED=0 python benchmarks/search_hashes.py > after.json       # on the new one
    cmp before.json after.json

``--fused`` costs a head and the epilogues ORT fuses into it as one group (the fusion code path).
PYTHONHASHSEED matters: a graph's hash sums Python's hash of its outputs' names. The search runs on
expansions, never on wall time (no time limit), so the result does not depend on the machine's load.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from xflow import zoo
from xflow.cost import AnalyticCost, GraphCoster
from xflow.onnx_io import graph_from_model
from xflow.optimize.finalize import finalists
from xflow.rules import load_rules
from xflow.search import SearchLimits, backtracking_search


def main(argv: list[str] | None = None) -> int:
    """Print the JSON of hashes per zoo model (small and full) to stdout; timings go to stderr."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fused", action="store_true", help="cost fused groups (AnalyticCost(fuses=True))")
    parser.add_argument("--rules", default=None, help="rule file (default: the shipped one)")
    args = parser.parse_args(argv)
    rules = load_rules(args.rules)
    limits = SearchLimits(alpha=1.05, budget=300, time_limit=float("inf"), patience=10, branches=2)
    out: dict[str, dict] = {}
    for small in (True, False):
        for name in sorted(zoo.MODELS):
            graph = graph_from_model(zoo.build(name, small=small))
            started = time.perf_counter()
            coster = GraphCoster(AnalyticCost(fuses=args.fused))
            result = backtracking_search(graph, rules, coster, limits)
            found = finalists(result, True, coster, rules)
            key = f"{name}{'-small' if small else ''}"
            out[key] = {"best": result.graph.structural_hash, "cost": result.best_cost,
                        "stop": str(result.stop_reason), "explored": result.explored,
                        "generated": result.generated,
                        "alternatives": [a.graph.structural_hash for a in result.branches],
                        "finalists": [f.simplified.graph.structural_hash for f in found]}
            print(f"{key}: {time.perf_counter() - started:.1f} s, {out[key]['stop']}", file=sys.stderr, flush=True)
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
