"""Compare two decoder-step ONNX files (an export and xflow's rewrite of it) at decode steps and a prefill.

    .venv/bin/python benchmarks/compare_decoders.py build/real-dec/smollm2_135m.onnx out.onnx [--long]

Inputs as a generation step has them: token ids in the vocabulary, the attention mask all ones but for two leading
zeros in the first row at batch 4 (left padding), position ids continuing the cache, a random cache. Points: batch
1 and 4 over pasts of 0, 1 and 127 with one new token, a prefill of 128 at batch 1 (``--long``: past 1023 too).
Prints whether the interfaces are identical and, per point, the largest output difference.
"""

from __future__ import annotations

import argparse

import numpy as np
import onnx
import onnxruntime as ort

POINTS = [(1, 1, 0), (1, 1, 1), (1, 1, 127), (4, 1, 0), (4, 1, 1), (4, 1, 127), (1, 128, 0)]
LONG = [(1, 1, 1023), (4, 1, 1023)]


def step_feeds(session: ort.InferenceSession, vocab: int, batch: int, seq: int, past: int,
               rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One step's inputs (names as ``export_decoders.py`` writes them; any other input is taken as a cache)."""
    feeds = {}
    for i in session.get_inputs():
        if i.name == "input_ids":
            feeds[i.name] = rng.integers(0, vocab, (batch, seq)).astype(np.int64)
        elif i.name == "attention_mask":
            mask = np.ones((batch, past + seq), np.int64)
            if batch > 1 and past + seq > 2:
                mask[0, :2] = 0
            feeds[i.name] = mask
        elif i.name == "position_ids":
            feeds[i.name] = np.broadcast_to(np.arange(past, past + seq), (batch, seq)).astype(np.int64).copy()
        else:
            feeds[i.name] = rng.standard_normal((batch, i.shape[1], past, i.shape[3])).astype(np.float32)
    return feeds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("original")
    parser.add_argument("other")
    parser.add_argument("--long", action="store_true", help="also past 1023")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    a, b = onnx.load(args.original, load_external_data=False), onnx.load(args.other, load_external_data=False)
    same = list(a.graph.input) == list(b.graph.input) and list(a.graph.output) == list(b.graph.output)
    print(f"interface identical: {same}; nodes {len(a.graph.node)} -> {len(b.graph.node)}")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    sa, sb = (ort.InferenceSession(p, opts, providers=["CPUExecutionProvider"]) for p in (args.original, args.other))
    vocab = a.graph.output[0].type.tensor_type.shape.dim[2].dim_value
    rng = np.random.default_rng(0)
    for batch, seq, past in POINTS + (LONG if args.long else []):
        feeds = step_feeds(sa, vocab, batch, seq, past, rng)
        ra, rb = sa.run(None, feeds), sb.run(None, feeds)
        diff = max(float(np.abs(x - y).max()) if x.size else 0.0 for x, y in zip(ra, rb, strict=True))
        shapes = all(x.shape == y.shape for x, y in zip(ra, rb, strict=True))
        print(f"batch={batch} seq={seq} past={past}: max |diff| {diff:.2e}, shapes equal: {shapes}", flush=True)


if __name__ == "__main__":
    main()
