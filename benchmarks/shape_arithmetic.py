"""The shape arithmetic of decoders with a KV cache folded, shared and deleted (``xflow.rewrite.shapes``), alone:
node counts, the step re-derived as ``xflow check`` does, outputs at batch 1 and 4 × past 0, 1 and 127, and the
decode step (batch 1, past 127) timed interleaved against the input with feeds that keep ``total = past + new``
(``xflow bench``'s fill every dynamic dim with 1 does not)::

    .venv/bin/python benchmarks/shape_arithmetic.py /work/build/real-dec/*.onnx [--rounds 20]
    .venv/bin/python benchmarks/shape_arithmetic.py --zoo   # the zoo's 4-layer Llama and GPT-2 steps
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import tempfile
import time

import numpy as np
import onnx

from xflow.onnx_io import load, save
from xflow.ort import open_session
from xflow.rewrite.shapes import check_step, shape_node_count, share_shapes

OPS = ("Shape", "Gather", "Unsqueeze", "Concat", "Slice", "Range", "Equal", "Where", "ConstantOfShape", "Expand")


def feeds(model: onnx.ModelProto, batch: int, past: int, seed: int = 0) -> dict[str, np.ndarray]:
    """One new token per row after ``past`` cached ones: ids, a mask of ones, position ids, a random cache."""
    rng = np.random.default_rng(seed)
    vocab = 1000
    for vi in model.graph.output:
        if vi.name == "logits" and vi.type.tensor_type.shape.dim[-1].dim_value:
            vocab = vi.type.tensor_type.shape.dim[-1].dim_value
    out: dict[str, np.ndarray] = {}
    for vi in model.graph.input:
        dims = vi.type.tensor_type.shape.dim
        if vi.name == "input_ids":
            out[vi.name] = rng.integers(0, vocab, (batch, 1)).astype(np.int64)
        elif vi.name == "attention_mask":
            out[vi.name] = np.ones((batch, past + 1), np.int64)
        elif vi.name == "position_ids":
            out[vi.name] = np.full((batch, 1), past, np.int64)
        elif "past" in vi.name:
            out[vi.name] = rng.uniform(-1, 1, (batch, dims[1].dim_value, past, dims[3].dim_value)).astype(np.float32)
    return out


def interleaved(files: list[str], feed: dict[str, np.ndarray], rounds: int, runs: int = 5) -> list[float]:
    """Median latency of each file's session (one each, 2 threads), rounds alternating their order."""
    sessions = [open_session(f, threads=2) for f in files]
    for s in sessions:
        for _ in range(3):
            s.run(None, feed)
    medians: list[list[float]] = [[] for _ in files]
    for r in range(rounds):
        for i in (range(len(files)) if r % 2 == 0 else reversed(range(len(files)))):
            times = []
            for _ in range(runs):
                start = time.perf_counter()
                sessions[i].run(None, feed)
                times.append(time.perf_counter() - start)
            medians[i].append(statistics.median(times))
    return [statistics.median(m) for m in medians]


def one(path: str, folder: str, rounds: int) -> None:
    """Print the figures of one model."""
    name = os.path.splitext(os.path.basename(path))[0]
    graph = load(path)
    start = time.perf_counter()
    step = share_shapes(graph)
    took = time.perf_counter() - start
    if step is None:
        print(f"{name}: no shape arithmetic to fold, share or delete")
        return
    start = time.perf_counter()
    check_step(graph, step.record())
    checked = time.perf_counter() - start
    out = os.path.join(folder, f"{name}.shapes.onnx")
    save(step.graph, out)
    before, after = onnx.load(path, load_external_data=False), onnx.load(out, load_external_data=False)
    cb = collections.Counter(n.op_type for n in before.graph.node)
    ca = collections.Counter(n.op_type for n in after.graph.node)
    print(f"{name}: ONNX nodes {len(before.graph.node)} -> {len(after.graph.node)}; shape-arithmetic nodes "
          f"{shape_node_count(graph)} -> {shape_node_count(step.graph)}; {len(step.constants)} folded, "
          f"{len(step.shared)} shared, {len(step.removed)} deleted; pass {took:.2f} s, re-derived in {checked:.2f} s")
    print("  " + ", ".join(f"{op} {cb[op]} -> {ca[op]}" for op in OPS))
    same = [vi.SerializeToString() for vi in (*before.graph.input, *before.graph.output)] == \
        [vi.SerializeToString() for vi in (*after.graph.input, *after.graph.output)]
    print(f"  interface byte-identical: {same}")
    del graph, step
    a, b = open_session(path, threads=2), open_session(out, threads=2)
    for batch in (1, 4):
        for past in (0, 1, 127):
            feed = feeds(before, batch, past)
            diff = max((float(np.max(np.abs(x - y))) if x.size else 0.0)
                       for x, y in zip(a.run(None, feed), b.run(None, feed), strict=True))
            print(f"  batch {batch} past {past}: max abs diff {diff:.3g}")
    del a, b
    if rounds:
        t0, t1 = interleaved([path, out], feeds(before, 1, 127), rounds)
        print(f"  decode step (batch 1, past 127, 2 threads, {rounds} interleaved rounds): {t0 * 1e3:.3f} ms -> "
              f"{t1 * 1e3:.3f} ms ({t0 / t1:.3f}x)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help="decoder ONNX files")
    parser.add_argument("--zoo", action="store_true", help="also the zoo's 4-layer Llama and GPT-2 decode steps")
    parser.add_argument("--rounds", type=int, default=20, help="interleaved timing rounds (0: no timing)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        paths = list(args.models)
        if args.zoo:
            from xflow.zoo.decoder import DecoderConfig, gpt2_decoder, llama_decoder

            for name, model in (("llama_decoder", llama_decoder(DecoderConfig(layers=4))),
                                ("gpt2_decoder", gpt2_decoder(DecoderConfig(layers=4, kv_heads=4,
                                                                            max_positions=256)))):
                paths.append(os.path.join(folder, f"{name}.onnx"))
                onnx.save(model, paths[-1])
        for path in paths:
            one(path, folder, args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
