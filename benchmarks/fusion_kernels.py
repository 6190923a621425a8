"""Each ONNX Runtime fused kernel against its decomposition, one small model each, timed interleaved.

    .venv/bin/python benchmarks/fusion_kernels.py [--rounds 200] [--threads 2] [--decoder]

Both run at ORT_ENABLE_ALL on the CPU provider with the session settings ``xflow optimize`` measures with;
for the decomposition, ORT's own fusion of it is disabled (else ORT would run the same fused kernel).
Prints the median of each and their ratio: whether a fusion pays on this machine, the question the measured
cost model answers per node during a search. ``--decoder``: the decoder block's pieces instead (RMSNorm, the
residual RMSNorm, rotary, SwiGLU's SiLU) at a SmolLM2-135M-like block's sizes, decode step and prefill.
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


def _rms_parts(x: str, out: str, tag: str = "") -> list:
    """RMSNorm as transformers' legacy export writes Llama's: Pow, ReduceMean, Add, Sqrt, Reciprocal, Mul, Mul."""
    make = helper.make_node
    return [make("Pow", [x, "two"], [f"sq{tag}"]), make("ReduceMean", [f"sq{tag}", "axes"], [f"ms{tag}"]),
            make("Add", [f"ms{tag}", "eps"], [f"mse{tag}"]), make("Sqrt", [f"mse{tag}"], [f"rms{tag}"]),
            make("Reciprocal", [f"rms{tag}"], [f"inv{tag}"]), make("Mul", [x, f"inv{tag}"], [f"n{tag}"]),
            make("Mul", ["g", f"n{tag}"], [out])]


def _scalars(model, **values: float):  # noqa: ANN001, ANN202
    model.graph.initializer.extend(helper.make_tensor(n, FLOAT, [], [v]) for n, v in values.items())
    model.graph.initializer.append(helper.make_tensor("axes", TensorProto.INT64, [1], [-1]))
    return model


def _rotary(batch: int, heads: int, seq: int, head_dim: int, max_pos: int = 2048) -> tuple:
    """Rotate-half rotary as transformers' exports write it (the cos/sin rows gathered by position once per
    model, so given here), against com.microsoft RotaryEmbedding on (batch, heads, seq, head_dim) with its
    half-width caches and the position ids."""
    make = helper.make_node
    half = head_dim // 2
    shape, table = (batch, heads, seq, head_dim), (batch, 1, seq, head_dim)
    ints = {"zero": [0], "halfw": [half], "end": [np.iinfo(np.int64).max], "last": [-1], "one": [1]}
    nodes = [make("Slice", ["x", "zero", "halfw", "last", "one"], ["x1"]),
             make("Slice", ["x", "halfw", "end", "last", "one"], ["x2"]), make("Neg", ["x2"], ["nx2"]),
             make("Concat", ["nx2", "x1"], ["rot"], axis=-1), make("Mul", ["x", "cos"], ["xc"]),
             make("Mul", ["rot", "sin"], ["rs"]), make("Add", ["xc", "rs"], ["y"])]
    plain = _model(nodes, {"x": shape, "cos": table, "sin": table}, ("y", shape))
    plain.graph.initializer.extend(helper.make_tensor(n, TensorProto.INT64, [1], v) for n, v in ints.items())
    angles = np.outer(np.arange(max_pos), 1.0 / 10000.0 ** (np.arange(0, head_dim, 2) / head_dim))
    fused = _model([make("RotaryEmbedding", ["x", "pos", "cos_cache", "sin_cache"], ["y"], domain=MS)],
                   {"x": shape}, ("y", shape))
    fused.graph.input.append(helper.make_tensor_value_info("pos", TensorProto.INT64, [batch, seq]))
    fused.graph.initializer.extend([
        helper.make_tensor("cos_cache", FLOAT, [max_pos, half], np.cos(angles).astype(np.float32).ravel()),
        helper.make_tensor("sin_cache", FLOAT, [max_pos, half], np.sin(angles).astype(np.float32).ravel())])
    return plain, fused, "RotaryEmbeddingFusion"


def decoder_cases() -> dict[str, tuple]:
    """The decoder block's pieces at a SmolLM2-135M-like block's sizes (hidden 576, 9 heads and 3 key/value
    heads of 64, MLP 1536): a decode step (1 token) and a 128-token prefill."""
    make = helper.make_node
    hidden, ff = 576, 1536
    out: dict[str, tuple] = {}
    for seq in (1, 128):
        x, m = (1, seq, hidden), (1, seq, ff)
        out[f"SimplifiedLayerNormalization 1x{seq}x{hidden}"] = (
            _scalars(_model(_rms_parts("x", "y"), {"x": x}, ("y", x), [("g", (hidden,))]), two=2.0, eps=1e-5),
            _model([make("SimplifiedLayerNormalization", ["x", "g"], ["y"], axis=-1, epsilon=1e-5)], {"x": x},
                   ("y", x), [("g", (hidden,))]), "SimplifiedLayerNormFusion")
        out[f"SkipSimplifiedLayerNormalization 1x{seq}x{hidden}"] = (
            _scalars(_model([make("Add", ["x", "r"], ["s"]), *_rms_parts("s", "y")], {"x": x, "r": x}, ("y", x),
                            [("g", (hidden,))]), two=2.0, eps=1e-5),
            _model([make("SkipSimplifiedLayerNormalization", ["x", "r", "g"], ["y"], domain=MS, epsilon=1e-5)],
                   {"x": x, "r": x}, ("y", x), [("g", (hidden,))]), "SimplifiedLayerNormFusion")
        out[f"SimplifiedLayerNormalization, Add apart 1x{seq}x{hidden}"] = (
            _model([make("Add", ["x", "r"], ["s"]),
                    make("SimplifiedLayerNormalization", ["s", "g"], ["y"], axis=-1, epsilon=1e-5)],
                   {"x": x, "r": x}, ("y", x), [("g", (hidden,))]),
            _model([make("SkipSimplifiedLayerNormalization", ["x", "r", "g"], ["y"], domain=MS, epsilon=1e-5)],
                   {"x": x, "r": x}, ("y", x), [("g", (hidden,))]), "SkipLayerNormFusion")
        for heads in (9, 3):
            out[f"RotaryEmbedding 1x{heads}x{seq}x64"] = _rotary(1, heads, seq, 64)
        out[f"SwiGLU's SiLU as QuickGelu 1x{seq}x{ff}"] = (
            _model([make("Sigmoid", ["gate"], ["sg"]), make("Mul", ["gate", "sg"], ["a"]),
                    make("Mul", ["a", "up"], ["y"])], {"gate": m, "up": m}, ("y", m)),
            _model([make("QuickGelu", ["gate"], ["a"], domain=MS, alpha=1.0), make("Mul", ["a", "up"], ["y"])],
                   {"gate": m, "up": m}, ("y", m)), "QuickGeluFusion")
    return out


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
    parser.add_argument("--decoder", action="store_true", help="the decoder block's pieces (decode and prefill)")
    args = parser.parse_args()
    print("| fusion | decomposition, ORT's fusion of it off (ms) | fused (ms) | fused / decomposition "
          "| fused faster in |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, (plain, fused, ort_fusion) in (decoder_cases() if args.decoder else cases()).items():
        sessions = [ort.InferenceSession(model.SerializeToString(), session_options(args.threads),
                                         providers=["CPUExecutionProvider"], disabled_optimizers=disabled)
                    for model, disabled in ((plain, [ort_fusion]), (fused, []))]
        rng = np.random.default_rng(1)
        feeds = {i.name: rng.standard_normal(i.shape).astype(np.float32) for i in sessions[0].get_inputs()}
        positions = {i.name: i.shape for i in sessions[1].get_inputs() if i.type == "tensor(int64)"}
        if positions:  # rotary: the step's position ids, and the cache rows they pick as the decomposition's cos/sin
            (pos_name, (batch, seq)), = positions.items()
            pos = np.arange(127, 127 + seq, dtype=np.int64)[None].repeat(batch, 0)
            caches = {t.name: np.frombuffer(t.raw_data, np.float32).reshape(t.dims) if t.raw_data else
                      np.array(t.float_data, np.float32).reshape(t.dims) for t in fused.graph.initializer}
            for kind in ("cos", "sin"):
                rows = caches[f"{kind}_cache"][pos]  # (batch, seq, half)
                feeds[kind] = np.concatenate([rows, rows], -1)[:, None]
            fused_feeds = {"x": feeds["x"], pos_name: pos}
        else:
            fused_feeds = feeds
        all_feeds = (feeds, fused_feeds)
        outs = [s.run(None, f)[0] for s, f in zip(sessions, all_feeds, strict=True)]
        assert np.allclose(outs[0], outs[1], rtol=1e-4, atol=1e-4), name
        times: list[list[float]] = [[], []]
        for _ in range(args.rounds):
            for k, session in enumerate(sessions):
                t = time.perf_counter()
                session.run(None, all_feeds[k])
                times[k].append(time.perf_counter() - t)
        wins = sum(f < p for p, f in zip(*times, strict=True))
        plain_ms, fused_ms = (float(np.median(t)) * 1000 for t in times)
        print(f"| {name} | {plain_ms:.3f} | {fused_ms:.3f} | {fused_ms / plain_ms:.2f} | {wins}/{args.rounds} |",
              flush=True)


if __name__ == "__main__":
    main()
