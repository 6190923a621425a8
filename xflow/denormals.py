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
                "faster": self.faster(), "max_abs_diff": self.max_abs_diff, "identical": self.identical}


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
                    shapes: Mapping[str, tuple[int, ...]] | None = None, inputs_npz: str | None = None
                    ) -> DenormalCheck:
    """Time ``path`` in ``processes`` processes with denormals flushed and as many without, alternating (about
    ``seconds`` of runs each), and compare the outputs of the first two; XflowError naming the file when ONNX
    Runtime cannot run it."""
    check = DenormalCheck(path, threads, inputs_npz or f"seed {seed}")
    with tempfile.TemporaryDirectory(prefix="xflow-denormals-") as scratch:
        outputs: dict[bool, str] = {}
        for k in range(2 * processes):
            flushed = k % 2 == 1
            save = os.path.join(scratch, f"out{int(flushed)}.npz") if k < 2 else None
            times = _time_in_child(path, flushed, threads, seconds, seed, shapes or {}, inputs_npz, save)
            (check.flushed_ms if flushed else check.default_ms).append(times)
            if save:
                outputs[flushed] = save
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


def _time_in_child(path: str, flushed: bool, threads: int, seconds: float, seed: int,
                   shapes: Mapping[str, tuple[int, ...]], inputs_npz: str | None, save: str | None) -> float:
    command = [sys.executable, "-m", "xflow.denormals", path, "--threads", str(threads), "--seconds", str(seconds),
               "--seed", str(seed)] + (["--flush"] if flushed else [])
    command += [f"--input-shape={name}={'x'.join(map(str, dims))}" for name, dims in shapes.items()]
    command += (["--inputs", inputs_npz] if inputs_npz else []) + (["--save", save] if save else [])
    run = subprocess.run(command, capture_output=True, text=True, check=False)
    if run.returncode != 0:
        lines = run.stderr.strip().splitlines() or ["no message"]
        raise XflowError(path, f"ONNX Runtime cannot run it: {lines[-1]}")
    return float(json.loads(run.stdout)["median_ms"])


def _child(argv: list[str]) -> int:
    """One side of the comparison: a session with or without the flush, timed; the median on stdout as JSON."""
    import onnxruntime as ort

    from xflow.runtime import random_feeds, session_options

    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--flush", action="store_true")
    parser.add_argument("--input-shape", action="append", default=[])
    parser.add_argument("--inputs")
    parser.add_argument("--save")
    args = parser.parse_args(argv)
    options = session_options(args.threads)
    options.add_session_config_entry(FLUSH_KEY, "1" if args.flush else "0")
    try:
        session = ort.InferenceSession(args.model, sess_options=options, providers=["CPUExecutionProvider"])
        if args.inputs:
            from xflow.pipeline import read_inputs  # only here: the pipeline's imports are slow to load

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
    times: list[float] = []
    started = time.perf_counter()
    while len(times) < 5 or time.perf_counter() - started < args.seconds:
        t0 = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - t0)
    print(json.dumps({"median_ms": 1e3 * statistics.median(times), "runs": len(times)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(_child(sys.argv[1:]))
