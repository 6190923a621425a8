"""One part of the <= 4-op walk (the ``max_ops``-op graphs kept against the smaller run), measured alone.

    python benchmarks/walk_part.py --parts 41 --index 40                # filters of generator.run
    python benchmarks/walk_part.py --parts 41 --index 40 --plain        # keep_last only (the old walk)
    python benchmarks/walk_part.py --parts 41 --index 29 --profile 60   # cProfile for 60 CPU seconds

With ``--parts`` equal to the number of menu entries, a part is one first op. The smaller run's arrays are
computed once and saved (``--small``, default /tmp/xflow-small3.npz). Prints the walk's counts, CPU
seconds and the sha256 prefix of the kept graphs' codes (equal codes: the same graphs kept).
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import os
import pstats
import resource
import signal
import time

import numpy as np
from xflow.generator.run import WalkFilters, _collect, _partition, collector_paused
from xflow.generator.walk import WalkStats, enumerate_graphs

from xflow.tasks import LocalTaskExecutor


class _Stop(Exception):
    pass


def _small(path: str, max_ops: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if not os.path.exists(path):
        pool = LocalTaskExecutor(1)
        try:
            fps, codes, outs = _collect(max_ops - 1, 0, 1, pool).arrays()
        finally:
            pool.close()
        np.savez(path, fps=fps, codes=codes, outs=outs)
    data = np.load(path)
    return data["fps"], data["codes"], data["outs"]


def main(argv: list[str] | None = None) -> int:
    """Walk one part and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-ops", type=int, default=4)
    parser.add_argument("--parts", type=int, default=41)
    parser.add_argument("--index", type=int, default=40)
    parser.add_argument("--plain", action="store_true", help="keep_last only, no other filter")
    parser.add_argument("--profile", type=float, default=0.0, help="profile this many CPU seconds, then stop")
    parser.add_argument("--small", default="/tmp/xflow-small3.npz")
    args = parser.parse_args(argv)
    fps, codes, outs = _small(args.small, args.max_ops)
    filters = WalkFilters.of(fps, codes, outs, args.max_ops).walk_kwargs()  # as generator.run's workers walk
    if args.plain:
        filters = {"keep_last": filters["keep_last"]}
    stats = WalkStats()
    rows: list[bytes] = []
    profiler = cProfile.Profile() if args.profile else None
    if profiler is not None:
        signal.signal(signal.SIGVTALRM, lambda *_: (_ for _ in ()).throw(_Stop()))
        signal.setitimer(signal.ITIMER_VIRTUAL, args.profile)
        profiler.enable()
    started = time.process_time()
    try:
        with collector_paused():  # as the run's workers walk
            for v in enumerate_graphs(args.max_ops, 0, first_ops=_partition(args.parts, args.index), stats=stats,
                                      **filters):
                if len(v.graph) == args.max_ops and v.inputs_used:
                    rows.append(v.code)
    except _Stop:
        pass
    cpu = time.process_time() - started
    if profiler is not None:
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(20)
    print(f"kept {len(rows)}  {stats}  cpu {cpu:.1f} s  peak RSS "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB  "
          f"codes {hashlib.sha256(b''.join(sorted(rows))).hexdigest()[:16]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
