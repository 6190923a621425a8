"""Each ONNX Runtime fused kernel against its decomposition, one small model each, timed interleaved.

    .venv/bin/python benchmarks/fusion_kernels.py [--rounds 200] [--threads 2]

Both run at ORT_ENABLE_ALL on the CPU provider with the session settings ``xflow optimize`` measures with;
for the decomposition, ORT's own fusion of it is disabled (else ORT would run the same fused kernel).
Prints the median of each and their ratio: whether a fusion pays on this machine, the question the measured
cost model answers per node during a search.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from xflow.ort import session_options

FLOAT = TensorProto.FLOAT
MS = "com.microsoft"


def _model(nodes, inputs: dict[str, tuple[int, ...]], output: tuple[str, tuple[int, ...]], weights=()):  # noqa: ANN001
    rng = np.random.default_rng(0)
    inits = [helper.make_tensor(n, FLOAT, s, (rng.standard_normal(s) * 0.05).astype(np.float32).ravel())
             for n, s in weights]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(n, FLOAT, s) for n, s in inputs.items()],
                              [helper.make_tensor_value_info(output[0], FLOAT, output[1])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid(MS, 1)],
                             ir_version=10)


def _attention(batch: int, seq: int, heads: int, head_size: int) -> tuple:
    """Self-attention's core as transformers' exports write it (ViT, Whisper): heads split by Reshape and
    Transpose, Q and K each scaled by the root of the scale, Softmax, the context merged back; against
    com.microsoft MultiHeadAttention on the same (batch, seq, heads x head_size) Q, K and V."""
    make = helper.make_node
    hidden = (batch, seq, heads * head_size)
    split = np.array([batch, seq, heads, head_size], dtype=np.int64)
    root = np.array(head_size ** -0.25, dtype=np.float32)
    consts = [helper.make_tensor("split", TensorProto.INT64, [4], split),
              helper.make_tensor("merge", TensorProto.INT64, [3], np.array(hidden, dtype=np.int64)),
              helper.make_tensor("root", FLOAT, [], [float(root)])]
    nodes = [make("Reshape", ["q", "split"], ["q4"]), make("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]),
             make("Mul", ["qt", "root"], ["qs"]),
             make("Reshape", ["k", "split"], ["k4"]), make("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
             make("Mul", ["kt", "root"], ["ks"]),
             make("Reshape", ["v", "split"], ["v4"]), make("Transpose", ["v4"], ["vt"], perm=[0, 2, 1, 3]),
             make("MatMul", ["qs", "ks"], ["scores"]), make("Softmax", ["scores"], ["p"], axis=-1),
             make("MatMul", ["p", "vt"], ["c"]), make("Transpose", ["c"], ["ct"], perm=[0, 2, 1, 3]),
             make("Reshape", ["ct", "merge"], ["y"])]
    qkv = {"q": hidden, "k": hidden, "v": hidden}
    plain = _model(nodes, qkv, ("y", hidden))
    plain.graph.initializer.extend(consts)
    fused = _model([make("MultiHeadAttention", ["q", "k", "v"], ["y"], domain=MS, num_heads=heads)], qkv,
                   ("y", hidden))
    return plain, fused, "AttentionFusion"


def cases() -> dict[str, tuple]:
    """name -> (decomposition model, fused model, ORT's optimizer that would fuse the decomposition): BERT-base,
    ViT, Whisper and ConvNet sizes."""
    seq, hidden, ff = (1, 128, 768), 768, (1, 128, 3072)
    heads = (1, 12, 128, 64)
    img = (1, 64, 56, 56)
    make = helper.make_node
    return {
        "SkipLayerNormalization 1x128x768": (
            _model([make("Add", ["x", "r"], ["s"]),
                    make("LayerNormalization", ["s", "g", "b"], ["y"], axis=-1, epsilon=1e-12)],
                   {"x": seq, "r": seq}, ("y", seq), [("g", (hidden,)), ("b", (hidden,))]),
            _model([make("SkipLayerNormalization", ["x", "r", "g", "b"], ["y"], domain=MS, epsilon=1e-12)],
                   {"x": seq, "r": seq}, ("y", seq), [("g", (hidden,)), ("b", (hidden,))]), "SkipLayerNormFusion"),
        "Gelu (com.microsoft) 1x128x3072": (
            _model([make("Gelu", ["x"], ["y"])], {"x": ff}, ("y", ff)),
            _model([make("Gelu", ["x"], ["y"], domain=MS)], {"x": ff}, ("y", ff)), "GeluFusion"),
        "BiasGelu 1x128x3072": (
            _model([make("Add", ["x", "b"], ["s"]), make("Gelu", ["s"], ["y"])], {"x": ff}, ("y", ff),
                   [("b", (ff[-1],))]),
            _model([make("BiasGelu", ["x", "b"], ["y"], domain=MS)], {"x": ff}, ("y", ff), [("b", (ff[-1],))]),
            "BiasGeluFusion"),
        "FastGelu 1x128x3072": (
            _model([make("Gelu", ["x"], ["y"], approximate="tanh")], {"x": ff}, ("y", ff)),
            _model([make("FastGelu", ["x"], ["y"], domain=MS)], {"x": ff}, ("y", ff)), "FastGeluFusion"),
        "QuickGelu (SiLU) 1x64x56x56": (
            _model([make("Sigmoid", ["x"], ["s"]), make("Mul", ["x", "s"], ["y"])], {"x": img}, ("y", img)),
            _model([make("QuickGelu", ["x"], ["y"], domain=MS, alpha=1.0)], {"x": img}, ("y", img)), "QuickGeluFusion"),
        "FusedMatMul transB 1x12x128x64": (
            _model([make("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]), make("MatMul", ["q", "kt"], ["y"])],
                   {"q": heads, "k": heads}, ("y", (1, 12, 128, 128))),
            _model([make("FusedMatMul", ["q", "k"], ["y"], domain=MS, transB=1)], {"q": heads, "k": heads},
                   ("y", (1, 12, 128, 128))), "MatmulTransposeFusion"),
        "FusedConv Sigmoid 1x64x56x56": (
            _model([make("Conv", ["x", "w", "cb"], ["c"], pads=[1, 1, 1, 1]), make("Sigmoid", ["c"], ["y"])],
                   {"x": img}, ("y", img), [("w", (64, 64, 3, 3)), ("cb", (64,))]),
            _model([make("FusedConv", ["x", "w", "cb"], ["y"], domain=MS, pads=[1, 1, 1, 1], activation="Sigmoid")],
                   {"x": img}, ("y", img), [("w", (64, 64, 3, 3)), ("cb", (64,))]), "ConvActivationFusion"),
        "MultiHeadAttention 1x128x768, 12 heads (BERT-base)": _attention(1, 128, 12, 64),
        "MultiHeadAttention 1x197x768, 12 heads (ViT-base)": _attention(1, 197, 12, 64),
        "MultiHeadAttention 1x1500x384, 6 heads (Whisper-tiny's encoder)": _attention(1, 1500, 6, 64),
    }


def main() -> None:
    """Time every case and print a markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    print("| fusion | decomposition, ORT's fusion of it off (ms) | fused (ms) | fused / decomposition "
          "| fused faster in |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, (plain, fused, ort_fusion) in cases().items():
        sessions = [ort.InferenceSession(model.SerializeToString(), session_options(args.threads),
                                         providers=["CPUExecutionProvider"], disabled_optimizers=disabled)
                    for model, disabled in ((plain, [ort_fusion]), (fused, []))]
        rng = np.random.default_rng(1)
        feeds = {i.name: rng.standard_normal(i.shape).astype(np.float32) for i in sessions[0].get_inputs()}
        outs = [s.run(None, feeds)[0] for s in sessions]
        assert np.allclose(outs[0], outs[1], rtol=1e-4, atol=1e-4), name
        times: list[list[float]] = [[], []]
        for _ in range(args.rounds):
            for k, session in enumerate(sessions):
                t = time.perf_counter()
                session.run(None, feeds)
                times[k].append(time.perf_counter() - t)
        wins = sum(f < p for p, f in zip(*times, strict=True))
        plain_ms, fused_ms = (float(np.median(t)) * 1000 for t in times)
        print(f"| {name} | {plain_ms:.3f} | {fused_ms:.3f} | {fused_ms / plain_ms:.2f} | {wins}/{args.rounds} |",
              flush=True)


if __name__ == "__main__":
    main()
