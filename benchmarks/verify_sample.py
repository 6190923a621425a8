"""Verify every STEP-th candidate of a saved candidate file and say where the verifier's time goes.

    python benchmarks/verify_sample.py CANDIDATES.json --rlimit 150000 --step 4 [--generation] [--jobs 2]

Prints, per outcome (proved / refuted / unknown / ...), the number of candidates, their CPU seconds (each worker's
``time.process_time``) and z3 resource units, and the units the proofs needed (median, 90th and 98th percentile,
max). ``--generation`` verifies as generate-rules does (its rounds, replay and wider numeric check) instead of as
verify-rules does. Candidate files
come from ``xflow generate-rules --save-candidates``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from typing import Any


def _one(args: tuple[dict[str, Any], int, bool]) -> tuple[str, int, float]:
    from xflow.verifier.batch import GENERATION_ROUNDS, WIDE_TRIALS, verify_candidate

    candidate, rlimit, generation = args
    start = time.process_time()
    if generation:
        outcome = verify_candidate(candidate, rlimit=rlimit, rounds=GENERATION_ROUNDS, replay=True,
                                   wide_trials=WIDE_TRIALS)
    else:
        outcome = verify_candidate(candidate, rlimit=rlimit)
    return outcome.status, outcome.rlimit_used, time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("candidates")
    parser.add_argument("--rlimit", type=int, default=150_000)
    parser.add_argument("--step", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--generation", action="store_true")
    args = parser.parse_args()
    with open(args.candidates, encoding="utf-8") as f:
        candidates = json.load(f)["candidates"][::args.step]
    start = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        results = list(pool.map(_one, [(c, args.rlimit, args.generation) for c in candidates], chunksize=2))
    count, cpu, units = Counter(), Counter(), Counter()
    for status, used, seconds in results:
        count[status] += 1
        cpu[status] += seconds
        units[status] += used
    print(f"{len(candidates)} candidates in {time.perf_counter() - start:.1f} s wall, "
          f"{sum(cpu.values()):.1f} s CPU (workers)")
    for status in sorted(count):
        print(f"  {status:<12} {count[status]:>6}  {cpu[status]:8.1f} s CPU  {units[status]:>13,} units")
    proved = sorted(used for status, used, _ in results if status == "proved")
    if proved:
        at = [proved[int(q * (len(proved) - 1))] for q in (0.5, 0.9, 0.98, 1.0)]
        print("  proofs' units: median {:,}, 90% {:,}, 98% {:,}, max {:,}".format(*at))


if __name__ == "__main__":
    main()
