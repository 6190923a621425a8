"""Which of ONNX Runtime's own graph fusions cost time on a model, and which graph forms escape one.

    .venv/bin/python benchmarks/ort_fusions.py fires MODEL.onnx ...          # what each optimizer changes
    .venv/bin/python benchmarks/ort_fusions.py time --rounds 30 MODEL.onnx ...  # each firing one disabled
    .venv/bin/python benchmarks/ort_fusions.py forms --rounds 300            # Add+LayerNorm written other ways

``fires``: for each optimizer below, the op counts of ORT's optimized model (ORT_ENABLE_ALL, the session
settings xflow measures with) with that optimizer disabled, against all enabled; prints the differences.
``time``: end-to-end latency with all enabled against the same with each optimizer that fires on the model
disabled alone, interleaved rounds (the order reversed every other round), medians and how often each
variant was faster than all-enabled. ``forms``: a 1x128x768 residual Add + LayerNormalization as ORT fuses
it, with SkipLayerNormFusion disabled, and written as Sum, Sub(x, Neg(r)), or with a Reshape between.
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
import onnxruntime as ort
from onnx import TensorProto, helper

from xflow.ort import session_options

OPTIMIZERS = ("SkipLayerNormFusion", "LayerNormFusion", "SimplifiedLayerNormFusion", "GeluFusion", "BiasGeluFusion",
              "FastGeluFusion", "QuickGeluFusion", "MatMulAddFusion", "GemmActivationFusion", "AttentionFusion",
              "EmbedLayerNormFusion", "BiasSoftmaxFusion", "MatmulTransposeFusion", "MatMulScaleFusion",
              "NchwcTransformer", "ConvActivationFusion", "ConvAddFusion", "ConvMulFusion", "ConvBNFusion",
              "PadFusion", "TransposeOptimizer", "ReshapeFusion", "MatMulBnFusion")


def optimized_ops(model: str | bytes, disabled: list[str], threads: int) -> collections.Counter:
    """Op counts (domain-qualified) of ORT's optimized model with ``disabled`` optimizers off."""
    with tempfile.TemporaryDirectory() as tmp:
        opts = session_options(threads)
        opts.optimized_model_filepath = os.path.join(tmp, "optimized.onnx")
        opts.add_session_config_entry("session.optimized_model_external_initializers_file_name", "optimized.data")
        opts.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"], disabled_optimizers=disabled)
        optimized = onnx.load(opts.optimized_model_filepath, load_external_data=False)
    return collections.Counter(f"{n.domain}:{n.op_type}" if n.domain else n.op_type for n in optimized.graph.node)


def firing(model: str, threads: int) -> dict[str, dict[str, int]]:
    """Optimizer -> the op-count differences it makes on ``model`` (only those that change something)."""
    base = optimized_ops(model, [], threads)
    found = {}
    for name in OPTIMIZERS:
        ops = optimized_ops(model, [name], threads)
        if ops != base:
            found[name] = {k: base[k] - ops[k] for k in sorted(set(ops) | set(base)) if ops[k] != base[k]}
    return found


def feeds_for(session: ort.InferenceSession) -> dict[str, np.ndarray]:
    """Random float inputs, zero/one integer ones (token ids, masks), dynamic dims at 1."""
    rng = np.random.default_rng(0)
    feeds = {}
    for i in session.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in i.shape]
        if "int" in i.type:
            feeds[i.name] = (np.ones(shape) if "mask" in i.name else rng.integers(0, 100, shape)).astype(np.int64)
        else:
            feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def interleaved(variants: dict[str, tuple[str | bytes, list[str]]], rounds: int, threads: int) -> None:
    """Print each variant's median latency, its speedup over the first and how often it beat the first."""
    sessions = {label: ort.InferenceSession(model, session_options(threads), providers=["CPUExecutionProvider"],
                                            disabled_optimizers=disabled)
                for label, (model, disabled) in variants.items()}
    labels = list(sessions)
    feeds = feeds_for(sessions[labels[0]])
    outs = {label: s.run(None, feeds) for label, s in sessions.items()}
    times: dict[str, list[float]] = {label: [] for label in labels}
    for r in range(rounds):
        for label in labels if r % 2 == 0 else labels[::-1]:
            start = time.perf_counter()
            sessions[label].run(None, feeds)
            times[label].append(time.perf_counter() - start)
    base = statistics.median(times[labels[0]])
    for label in labels:
        diff = max(float(np.abs(a - b).max()) for a, b in zip(outs[label], outs[labels[0]], strict=True))
        wins = sum(a < b for a, b in zip(times[label], times[labels[0]], strict=True))
        print(f"| {label} | {statistics.median(times[label]) * 1e3:.3f} | {base / statistics.median(times[label]):.3f}x"
              f" | {wins}/{rounds} | {diff:.1e} |", flush=True)


def forms() -> dict[str, tuple[bytes, list[str]]]:
    """The residual Add + LayerNormalization (1x128x768, BERT-base) in the forms compared by ``forms``."""
    seq = (1, 128, 768)
    rng = np.random.default_rng(0)
    make = helper.make_node
    gamma = (1 + 0.1 * rng.standard_normal(768)).astype(np.float32)
    params = [helper.make_tensor("g", TensorProto.FLOAT, (768,), gamma),
              helper.make_tensor("b", TensorProto.FLOAT, (768,), (0.1 * rng.standard_normal(768)).astype(np.float32)),
              helper.make_tensor("s2", TensorProto.INT64, (2,), [-1, 768]),
              helper.make_tensor("s3", TensorProto.INT64, (3,), list(seq))]

    def model(nodes: list[onnx.NodeProto], norm_in: str = "s", norm_out: str = "y") -> bytes:
        nodes = [*nodes, make("LayerNormalization", [norm_in, "g", "b"], [norm_out], axis=-1, epsilon=1e-12)]
        if norm_out != "y":
            nodes.append(make("Reshape", [norm_out, "s3"], ["y"]))
        graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(n, TensorProto.FLOAT, seq) for n in "xr"],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, seq)], params)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()

    add = [make("Add", ["x", "r"], ["s"])]
    return {"Add + LayerNorm (ORT fuses: SkipLayerNormalization)": (model(add), []),
            "Add + LayerNorm, SkipLayerNormFusion disabled": (model(add), ["SkipLayerNormFusion"]),
            "Sum + LayerNorm": (model([make("Sum", ["x", "r"], ["s"])]), []),
            "Sub(x, Neg(r)) + LayerNorm": (model([make("Neg", ["r"], ["n"]), make("Sub", ["x", "n"], ["s"])]), []),
            "Add + Reshape 2-D + LayerNorm + Reshape": (model([*add, make("Reshape", ["s", "s2"], ["s_"])], "s_", "y_"),
                                                         [])}


def main() -> None:
    """Run one of the three reports."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("fires", "time", "forms"))
    parser.add_argument("models", nargs="*")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--also", action="append", default=[], metavar="LABEL=PATH",
                        help="time: another model timed in the same rounds (e.g. xflow's rewrite of MODEL)")
    parser.add_argument("--only", nargs="*", default=None, metavar="OPTIMIZER",
                        help="time: disable only these optimizers (default: each one that fires)")
    args = parser.parse_args()
    if args.what == "forms":
        for label, (model, disabled) in forms().items():
            print(label, dict(optimized_ops(model, disabled, args.threads)))
        print("| form | median ms | speedup | faster in | max abs diff |\n|---|---:|---:|---:|---:|")
        variants = forms()
        first = "Add + LayerNorm, SkipLayerNormFusion disabled"
        interleaved({first: variants.pop(first), **variants}, args.rounds, args.threads)
        return
    for path in args.models:
        fired = firing(path, args.threads) if args.only is None else dict.fromkeys(args.only)
        print(f"## {os.path.basename(path)}")
        if args.what == "fires":
            for name, diff in fired.items():
                print(f"- {name}: {diff}")
            continue
        print("| variant | median ms | speedup | faster in | max abs diff |\n|---|---:|---:|---:|---:|")
        others = {label: (other, []) for label, _, other in (a.partition("=") for a in args.also)}
        interleaved({"all enabled": (path, []), **{f"{name} disabled": (path, [name]) for name in fired}, **others},
                    args.rounds, args.threads)


if __name__ == "__main__":
    main()
