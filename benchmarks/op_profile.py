"""Where ONNX Runtime spends a model's time, by kernel type, after its own graph optimizations.

    .venv/bin/python benchmarks/op_profile.py build/real/*.onnx [--runs 15]

Runs each model with ORT's profiler under the settings ``xflow optimize`` measures with (ORT_ENABLE_ALL,
one thread per core, spinning off) and prints, per model, the share of kernel time in each class:

- contraction: Gemm, MatMul, Conv and ORT's fused forms of them. A graph substitution can restructure
  this work (merge two matmuls into one) but not remove it;
- norm / activation: LayerNormalization, Softmax, Gelu and the like, which ORT has already fused;
- layout: Transpose, Reshape, Concat, Split, Pad, NCHWc reorders, gathers: the only work a substitution can
  remove outright;
- elementwise: the remaining Add, Mul, Where, ... kernels.

This bounds what rewriting the graph can gain on a model: with the contraction at 85% of the time, even
deleting every layout kernel gains a few percent. Two ceilings are printed per model and as a geomean over the
models: the speedup of the kernel time if every layout and elementwise kernel were deleted, and if everything but the
contractions were (norms and activations too). Neither is reachable by a rewrite that keeps the function (a residual
Add or an attention's head transposes remain); they say how much room there is at most.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import tempfile

from xflow.bench import geomean
from xflow.ort import session_options
from xflow.runtime import random_feeds

CLASSES = {
    "contraction": {"Gemm", "MatMul", "FusedMatMul", "Conv", "FusedConv", "FusedGemm", "MatMulInteger",
                    "QLinearConv", "ConvTranspose"},
    "norm / activation": {"LayerNormalization", "SkipLayerNormalization", "SimplifiedLayerNormalization",
                          "BatchNormalization", "Softmax", "Gelu", "FastGelu", "BiasGelu", "Relu", "Sigmoid",
                          "Tanh", "Erf", "Clip", "HardSigmoid", "GlobalAveragePool", "AveragePool", "MaxPool"},
    "layout": {"Transpose", "Reshape", "Concat", "Split", "Slice", "ReorderInput", "ReorderOutput", "Gather",
               "Squeeze", "Unsqueeze", "Flatten", "Expand", "Identity", "Pad"},
}


def op_class(op_type: str) -> str:
    """The class (see the module docstring) an ORT kernel type belongs to."""
    for name, ops in CLASSES.items():
        if op_type in ops:
            return name
    return "elementwise"


def profile(path: str, runs: int) -> dict[str, float]:
    """Mean kernel time per run (ms) of each ORT kernel type in the model at ``path``."""
    import onnxruntime as ort

    options = session_options()
    options.enable_profiling = True
    with tempfile.TemporaryDirectory() as folder:
        options.profile_file_prefix = os.path.join(folder, "profile")
        session = ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])
        feeds = random_feeds(session)
        for _ in range(3):
            session.run(None, feeds)
        session.end_profiling()  # drop the warm-up runs
        session = ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])
        for _ in range(runs + 1):
            session.run(None, feeds)
        with open(session.end_profiling()) as handle:
            events = json.load(handle)
    per_op: collections.Counter[str] = collections.Counter()
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            per_op[event["args"]["op_name"]] += event["dur"]
    return {op: micros / (runs + 1) / 1000 for op, micros in per_op.items()}


def ceilings(shares: dict[str, float]) -> tuple[float, float]:
    """Kernel-time speedups with every layout and elementwise kernel deleted, and with all but contractions deleted."""
    kept_without_layout = shares.get("contraction", 0.0) + shares.get("norm / activation", 0.0)
    contraction = shares.get("contraction", 0.0)
    return 1 / max(kept_without_layout, 1e-9), 1 / max(contraction, 1e-9)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="ONNX files")
    parser.add_argument("--runs", type=int, default=15, help="profiled runs per model")
    parser.add_argument("--top", type=int, default=6, help="kernel types listed per model")
    args = parser.parse_args()
    columns = ["model", "kernel time (ms)", *CLASSES, "elementwise", "ceiling: layout + elementwise deleted",
               "ceiling: all but contractions deleted", "largest kernel types"]
    print("| " + " | ".join(columns) + " |")
    print("|" + " --- |" * len(columns))
    rows: list[tuple[float, float]] = []
    for path in args.models:
        per_op = profile(path, args.runs)
        total = sum(per_op.values())
        shares = collections.Counter()
        for op, ms in per_op.items():
            shares[op_class(op)] += ms / total
        top = ", ".join(f"{op} {100 * ms / total:.1f}%" for op, ms in collections.Counter(per_op).most_common(args.top))
        name = os.path.splitext(os.path.basename(path))[0]
        cells = " | ".join(f"{100 * shares[c]:.1f}%" for c in [*CLASSES, "elementwise"])
        rows.append(ceilings(shares))
        print(f"| {name} | {total:.1f} | {cells} | {rows[-1][0]:.3f}x | {rows[-1][1]:.3f}x | {top} |", flush=True)
    means = [f"**{geomean([row[k] for row in rows]):.3f}x**" for k in range(2)]
    print("| " + " | ".join(["**geomean**", "", *[""] * (len(CLASSES) + 1), *means, ""]) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
