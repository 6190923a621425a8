"""Speed and memory figures that used to be test thresholds (a loaded machine made them fail without a
bug): rule generation at two operators, and how far past ``--time-limit`` the search stops.

    .venv/bin/python benchmarks/resource_bounds.py [--repeats 3]

Prints a markdown table: generation seconds and RSS growth (the old test wanted < 40 s and < 400 MB),
and the search's seconds under a 0.5 s limit on the small Inception with the test rules (the old test
wanted < 1.5 s). Say in the figures whether the machine was idle.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

GENERATE = """
import json, resource, time
from xflow.generator import generate
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
generate(max_ops=2, seed=0)
print(json.dumps({"seconds": time.perf_counter() - start,
                  "grown_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024}))
"""


def generation() -> dict[str, float]:
    """One generation at two operators in a fresh process."""
    proc = subprocess.run([sys.executable, "-c", GENERATE], capture_output=True, text=True, cwd=ROOT, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def time_limited_search(folder: str) -> float:
    """The search's own seconds under --time-limit 0.5 (from --report)."""
    sys.path.insert(0, str(ROOT))
    from tests.test_determinism import rule_file

    src, out, report = (os.path.join(folder, n) for n in ("inception.onnx", "out.onnx", "r.json"))
    xflow = [sys.executable, "-m", "xflow.cli"]
    if not os.path.exists(src):
        subprocess.run([*xflow, "zoo", "inception_v3", src, "--small"], check=True, cwd=ROOT, capture_output=True)
    rules = rule_file(Path(folder) / "rules.json")
    subprocess.run([*xflow, "optimize", src, out, "--rules", rules, "--cost", "analytic", "--keep-if-slower",
                    "--budget", "100000", "--patience", "0", "--time-limit", "0.5", "--report", report],
                   check=True, cwd=ROOT, capture_output=True)
    return json.loads(Path(report).read_text())["search_ms"] / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    gens = [generation() for _ in range(args.repeats)]
    with tempfile.TemporaryDirectory() as folder:
        searches = [time_limited_search(folder) for _ in range(args.repeats)]
    print(f"load average at start: {load:.1f} on {os.cpu_count()} cores")
    print("| figure | median | max | old test bound |")
    print("|---|---|---|---|")
    print(f"| generate(max_ops=2) seconds | {statistics.median(g['seconds'] for g in gens):.1f} | "
          f"{max(g['seconds'] for g in gens):.1f} | < 40 |")
    print(f"| generate(max_ops=2) RSS growth MB | {statistics.median(g['grown_mb'] for g in gens):.0f} | "
          f"{max(g['grown_mb'] for g in gens):.0f} | < 400 |")
    print(f"| search seconds under --time-limit 0.5 | {statistics.median(searches):.2f} | {max(searches):.2f} "
          "| < 1.5 |")


if __name__ == "__main__":
    main()
