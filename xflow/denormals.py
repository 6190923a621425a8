"""Whether a model's float arithmetic runs into denormals, measured: the model timed in ONNX Runtime with and
without ``session.set_denormal_as_zero`` (flush-to-zero and denormals-are-zero), and its outputs compared.

Denormals are the float32 values below the smallest normal (about 1.2e-38). An x86 core computes with them through a
microcode assist many times slower than normal arithmetic, so a model whose intermediate values fall there (a
softmax over scores masked with -100, as Swin's shifted windows are, gives probabilities near e**-100) can spend a
large part of its time on them. No rewrite of the graph can avoid that and compute the same function: the exact
values are themselves denormal. ONNX Runtime can flush them to zero, which changes only values below 1.2e-38; that
is a choice for the user, so xflow measures it and says so, and never writes it into a model.

ONNX Runtime applies the option to the calling thread once per process, from the first session created; later
sessions set only their own pool threads. So each side is timed in processes of its own (``python -m
xflow.denormals``), alternating, and compared over processes (an exact rank test), as a process's luck lasts its
life.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from xflow.errors import XflowError

#: ONNX Runtime's session option: "1" sets flush-to-zero and denormals-are-zero on the session's threads.
FLUSH_KEY = "session.set_denormal_as_zero"
#: Profiled runs a side where flushing is faster (to name the nodes it saves time in).
PROFILED_RUNS = 5


@dataclass(frozen=True)
class NodeTime:
    """One node's mean kernel time per run in ONNX Runtime's profile (after its graph optimizations), both ways."""

    name: str
    op_type: str
    default_ms: float
    flushed_ms: float


@dataclass
class DenormalCheck:
    """One model timed with and without flushing denormals, each side in ``processes`` processes of its own."""

    model: str
    threads: int
    inputs: str  # what the outputs were compared on: "seed N" or the .npz given
    default_ms: list[float] = field(default_factory=list)  # median run time of each default process
    flushed_ms: list[float] = field(default_factory=list)  # the same with FLUSH_KEY set
    max_abs_diff: dict[str, float] = field(default_factory=dict)  # per output, flushed against default
    identical: bool = True  # every output bit for bit the same
    # where flushing was faster: the nodes it saved the most time in, from one profiled process a side
    nodes: list[NodeTime] = field(default_factory=list)

    @property
    def speedup(self) -> float:
        """The default processes' median time over the flushed ones'."""
        return statistics.median(self.default_ms) / statistics.median(self.flushed_ms)

    @property
    def p_value(self) -> float:
        """One-sided exact rank test over processes: how likely flushed processes rank this fast by chance."""
        return rank_test_p(self.flushed_ms, self.default_ms)

    def faster(self, level: float = 0.01) -> bool:
        """Whether flushing denormals made the model faster, at ``level``."""
        return self.p_value < level

    def to_json(self) -> dict[str, object]:
        """Every figure, the derived ones included."""
        return {"model": self.model, "threads": self.threads, "inputs": self.inputs, "default_ms": self.default_ms,
                "flushed_ms": self.flushed_ms, "speedup": self.speedup, "p_value": self.p_value,
                "faster": self.faster(), "max_abs_diff": self.max_abs_diff, "identical": self.identical,
                "nodes": [vars(node) for node in self.nodes]}


def rank_test_p(low: list[float], high: list[float]) -> float:
    """Exact one-sided Mann-Whitney test: the chance that ``low`` ranks at least this far below ``high`` when
    both come from one distribution (every assignment of the pooled values to the two groups equally likely)."""
    pooled = low + high

    def below(group: tuple[int, ...]) -> float:  # pairs (l, h) with l < h, ties counted half
        chosen = set(group)
        lows = [pooled[i] for i in group]
        highs = [pooled[i] for i in range(len(pooled)) if i not in chosen]
        return sum((a < b) + 0.5 * (a == b) for a in lows for b in highs)

    observed = below(tuple(range(len(low))))
    splits = list(itertools.combinations(range(len(pooled)), len(low)))
    return sum(below(s) >= observed - 1e-9 for s in splits) / len(splits)


def check_denormals(path: str, threads: int, processes: int = 5, seconds: float = 2.0, seed: int = 0,
                    shapes: Mapping[str, tuple[int, ...]] | None = None, inputs_npz: str | None = None,
                    where: int = 5) -> DenormalCheck:
    """Time ``path`` in ``processes`` processes with denormals flushed and as many without, alternating (about
    ``seconds`` of runs each), and compare the outputs of the first two; where flushing is faster, profile one
    process a side and keep the ``where`` nodes it saved the most time in. XflowError naming the file when ONNX
    Runtime cannot run it."""
    check = DenormalCheck(path, threads, inputs_npz or f"seed {seed}")
    child = _Child(path, threads, seconds, seed, shapes or {}, inputs_npz)
    with tempfile.TemporaryDirectory(prefix="xflow-denormals-") as scratch:
        outputs: dict[bool, str] = {}
        for k in range(2 * processes):
            flushed = k % 2 == 1
            save = os.path.join(scratch, f"out{int(flushed)}.npz") if k < 2 else None
            (check.flushed_ms if flushed else check.default_ms).append(child.run(flushed, save=save)["median_ms"])
            if save:
                outputs[flushed] = save
        if where > 0 and check.faster():
            profiles = [child.run(flushed, profile=scratch)["nodes"] for flushed in (False, True)]
            check.nodes = _largest_savings(*profiles, where)
        with np.load(outputs[False]) as default, np.load(outputs[True]) as flushed_out:
            for name in default.files:
                a, b = default[name], flushed_out[name]
                same = a.shape == b.shape and a.tobytes() == b.tobytes()
                check.identical = check.identical and same
                if a.dtype.kind in "fc" and a.shape == b.shape:
                    diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
                    check.max_abs_diff[name] = float(np.nan_to_num(diff, nan=math.inf).max(initial=0.0))
                else:
                    check.max_abs_diff[name] = 0.0 if same else math.inf
    return check


def _largest_savings(default: Mapping[str, list], flushed: Mapping[str, list], count: int) -> list[NodeTime]:
    """The ``count`` nodes whose kernel time fell the most from the default profile to the flushed one."""
    both = [NodeTime(name, op, ms, flushed[name][1]) for name, (op, ms) in default.items() if name in flushed]
    both.sort(key=lambda node: node.flushed_ms - node.default_ms)
    return [node for node in both[:count] if node.flushed_ms < node.default_ms]


@dataclass(frozen=True)
class _Child:
    """How to start one side's process (``python -m xflow.denormals``) for a model."""

    path: str
    threads: int
    seconds: float
    seed: int
    shapes: Mapping[str, tuple[int, ...]]
    inputs_npz: str | None

    def run(self, flushed: bool, save: str | None = None, profile: str | None = None) -> dict:
        """The process's JSON answer: its median run time, or with ``profile`` its nodes' kernel times."""
        command = [sys.executable, "-m", "xflow.denormals", self.path, "--threads", str(self.threads),
                   "--seconds", str(self.seconds), "--seed", str(self.seed)] + (["--flush"] if flushed else [])
        command += [f"--input-shape={name}={'x'.join(map(str, dims))}" for name, dims in self.shapes.items()]
        command += ["--inputs", self.inputs_npz] if self.inputs_npz else []
        command += (["--save", save] if save else []) + (["--profile", profile] if profile else [])
        run = subprocess.run(command, capture_output=True, text=True, check=False)
        if run.returncode != 0:
            lines = run.stderr.strip().splitlines() or ["no message"]
            raise XflowError(self.path, f"ONNX Runtime cannot run it: {lines[-1]}")
        return json.loads(run.stdout)


def _child(argv: list[str]) -> int:
    """One side of the comparison: a session with or without the flush, timed; the median on stdout as JSON."""
    from xflow.ort import Profiling, Sessions
    from xflow.runtime import random_feeds

    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--flush", action="store_true")
    parser.add_argument("--input-shape", action="append", default=[])
    parser.add_argument("--inputs")
    parser.add_argument("--save")
    parser.add_argument("--profile", help="a folder for ORT's profile: print each node's kernel time instead")
    args = parser.parse_args(argv)
    profiling = Profiling(os.path.join(args.profile, f"profile{int(args.flush)}")) if args.profile else None
    try:
        session = Sessions("cpu", args.threads).open(args.model, config={FLUSH_KEY: "1" if args.flush else "0"},
                                                     profiling=profiling)
        if args.inputs:
            from xflow.optimize import read_inputs  # only here: optimize's imports are slow to load

            feeds = read_inputs(args.inputs)
        elif args.input_shape:
            from xflow.onnx_io import parse_input_shapes

            feeds = random_feeds(session, args.seed, parse_input_shapes(args.input_shape))
        else:
            feeds = random_feeds(session, args.seed)
        outputs = session.run(None, feeds)
    except Exception as exc:  # noqa: BLE001 - ORT's own types; the parent reports the last line
        print(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__, file=sys.stderr)
        return 1
    if args.save:
        np.savez(args.save, **{o.name: v for o, v in zip(session.get_outputs(), outputs, strict=True)})
    session.run(None, feeds)  # a second warm-up run
    if args.profile:
        print(json.dumps({"nodes": _profiled_nodes(session, feeds, PROFILED_RUNS)}))
        return 0
    times: list[float] = []
    started = time.perf_counter()
    while len(times) < 5 or time.perf_counter() - started < args.seconds:
        t0 = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - t0)
    print(json.dumps({"median_ms": 1e3 * statistics.median(times), "runs": len(times)}))
    return 0


def _profiled_nodes(session, feeds: Mapping[str, np.ndarray], runs: int) -> dict[str, list]:  # noqa: ANN001
    """Each node's op type and mean kernel milliseconds over ``runs`` runs (the warm-up runs included in the
    profile are dropped: only the last ``runs`` occurrences of each node count)."""
    for _ in range(runs):
        session.run(None, feeds)
    profile = session.end_profiling()
    with open(profile, encoding="utf-8") as handle:
        events = json.load(handle)
    os.remove(profile)
    durations: dict[str, list[float]] = {}
    op_types: dict[str, str] = {}
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            name = event["name"].removesuffix("_kernel_time")
            durations.setdefault(name, []).append(event["dur"] / 1e3)
            op_types[name] = event["args"]["op_name"]
    return {name: [op_types[name], statistics.fmean(ms[-runs:])] for name, ms in durations.items()}


if __name__ == "__main__":
    raise SystemExit(_child(sys.argv[1:]))
