"""Time ONNX files against the first one, interleaved in one process: a long, steady second opinion on a ratio
the bench's shorter columns leave in doubt (a peer's output against the export, say).

Each file gets one ONNX Runtime session with the measurement settings (``xflow.ort.open_session``: ORT_ENABLE_ALL,
spinning off) and the same seeded random inputs. A round runs every file ``--runs`` times and keeps the median;
rounds alternate the order of the files. Printed per file: the median of its round medians, and the median over
rounds of (first file's round median / its own) with the rounds in which it was faster. One session per file means
a session's own luck is not averaged out, as ``xflow optimize``'s A/B over fresh session pairs does::

    .venv/bin/python benchmarks/interleave.py --rounds 60 model.onnx model.slim.onnx model.opt.onnx
"""

from __future__ import annotations

import argparse
import statistics
import time

from xflow.ort import open_session
from xflow.runtime import random_feeds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="ONNX files; the first is the baseline")
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--runs", type=int, default=5, help="runs of each file per round")
    parser.add_argument("--threads", type=int, default=2, help="ORT intra-op threads")
    args = parser.parse_args()
    sessions = [open_session(f, threads=args.threads) for f in args.files]
    feeds = random_feeds(sessions[0], seed=0)
    for session in sessions:
        for _ in range(3):
            session.run(None, feeds)
    medians: list[list[float]] = [[] for _ in args.files]
    for r in range(args.rounds):
        order = range(len(args.files)) if r % 2 == 0 else reversed(range(len(args.files)))
        for i in order:
            times = []
            for _ in range(args.runs):
                start = time.perf_counter()
                sessions[i].run(None, feeds)
                times.append(time.perf_counter() - start)
            medians[i].append(1000 * statistics.median(times))
    for path, own in zip(args.files, medians, strict=True):
        ratios = [b / m for b, m in zip(medians[0], own, strict=True)]
        faster = sum(1 for x in ratios if x > 1)
        print(f"{path}: {statistics.median(own):.2f} ms, {statistics.median(ratios):.3f}x the first, "
              f"faster in {faster}/{args.rounds} rounds")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
