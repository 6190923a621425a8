"""Hand-written forms of the zoo's NasRNN (hidden 512, 8 steps, 8 gates, tied weights), timed end to end,
to see how far `xflow optimize` is from what its rules can reach.

    .venv/bin/python benchmarks/nasrnn_variants.py [--rounds 60]

- original: per step and gate, x_t @ Wx_g + h @ Wh_g (128 MatMuls of [1,512] x [512,512]);
- gate merge: per step, x_t @ [Wx_0 .. Wx_7] + h @ [Wh_0 .. Wh_7], one add, one 8-way split;
- fused: per step, [x_t, h] @ [[Wx], [Wh]] (one [1,1024] x [1024,4096] MatMul), one split;
- batched x: all steps' x @ [Wx_0 .. Wx_7] in one [8,512] x [512,4096] MatMul, then per step h @ [Wh_*].

All four compute the same h_final (checked); medians over interleaved rounds, ORT's settings as in
``xflow optimize`` (2 threads where the machine has 2 cores, spinning off, ORT_ENABLE_ALL).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from xflow.ort import open_session

HIDDEN, STEPS, GATES = 512, 8, 8


class _Builder:
    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def op(self, op_type: str, inputs: list[str], outputs: int = 1, **attrs: object) -> str | list[str]:
        names = [f"v{self.count}_{k}" for k in range(outputs)]
        self.count += 1
        self.nodes.append(helper.make_node(op_type, inputs, names, **attrs))
        return names if outputs > 1 else names[0]

    def const(self, name: str, array: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(array, name))
        return name


def _cell(b: _Builder, t: list[str]) -> str:
    """The zoo's NasRNN cell (xflow/zoo/nas.py) on the eight gate pre-activations."""
    def act(op: str, v: str) -> str:
        return b.op(op, [v])  # type: ignore[return-value]

    m0 = b.op("Add", [act("Relu", t[0]), act("Sigmoid", t[3])])
    m1 = b.op("Add", [act("Sigmoid", t[1]), act("Tanh", t[2])])
    m2 = b.op("Mul", [act("Sigmoid", t[4]), act("Tanh", t[5])])
    m3 = b.op("Mul", [act("Sigmoid", t[6]), act("Relu", t[7])])
    m4 = b.op("Mul", [act("Sigmoid", m1), act("Tanh", m2)])  # type: ignore[arg-type]
    m5 = b.op("Mul", [act("Tanh", m0), act("Tanh", m3)])  # type: ignore[arg-type]
    m6 = b.op("Mul", [act("Tanh", m4), act("Tanh", m5)])  # type: ignore[arg-type]
    return act("Tanh", m6)  # type: ignore[arg-type]


def variant(name: str, wx: list[np.ndarray], wh: list[np.ndarray]) -> onnx.ModelProto:
    """One of the four forms (see the module doc)."""
    b = _Builder()
    xs = [f"x_{t}" for t in range(STEPS)]
    gate_sizes = b.const("gate_sizes", np.full(GATES, HIDDEN, dtype=np.int64))
    step_sizes = b.const("step_sizes", np.ones(STEPS, dtype=np.int64))
    wx_all = np.concatenate(wx, axis=1)
    wh_all = np.concatenate(wh, axis=1)
    h = "h_0"
    rows: list[str] = []
    if name == "batched x":
        x_proj = b.op("MatMul", [b.op("Concat", xs, axis=0), b.const("wx_all", wx_all)])  # type: ignore[list-item]
        rows = b.op("Split", [x_proj, step_sizes], STEPS, axis=0)  # type: ignore[assignment,arg-type]
    for t in range(STEPS):
        if name == "original":
            wx_names = [f"wx{g}" for g in range(GATES)]
            wh_names = [f"wh{g}" for g in range(GATES)]
            if t == 0:
                for g in range(GATES):
                    b.const(wx_names[g], wx[g])
                    b.const(wh_names[g], wh[g])
            gates = [b.op("Add", [b.op("MatMul", [xs[t], wx_names[g]]), b.op("MatMul", [h, wh_names[g]])])
                     for g in range(GATES)]  # type: ignore[list-item]
        else:
            if name == "gate merge":
                wxa = "wx_all" if t else b.const("wx_all", wx_all)
                wha = "wh_all" if t else b.const("wh_all", wh_all)
                pre = b.op("Add", [b.op("MatMul", [xs[t], wxa]), b.op("MatMul", [h, wha])])  # type: ignore[list-item]
            elif name == "fused":
                w = "w_all" if t else b.const("w_all", np.concatenate([wx_all, wh_all], axis=0))
                pre = b.op("MatMul", [b.op("Concat", [xs[t], h], axis=1), w])  # type: ignore[list-item]
            elif name == "batched x":
                wha = "wh_all" if t else b.const("wh_all", wh_all)
                pre = b.op("Add", [rows[t], b.op("MatMul", [h, wha])])  # type: ignore[list-item]
            else:
                raise ValueError(name)
            gates = b.op("Split", [pre, gate_sizes], GATES, axis=1)  # type: ignore[assignment,list-item]
        h = _cell(b, gates)  # type: ignore[arg-type]
    graph = helper.make_graph(
        b.nodes, "nasrnn", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, HIDDEN]) for n in (*xs, "h_0")],
        [helper.make_tensor_value_info(h, TensorProto.FLOAT, [1, HIDDEN])], b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    scale = 1 / np.sqrt(HIDDEN)
    wx = [(rng.standard_normal((HIDDEN, HIDDEN)) * scale).astype(np.float32) for _ in range(GATES)]
    wh = [(rng.standard_normal((HIDDEN, HIDDEN)) * scale).astype(np.float32) for _ in range(GATES)]
    names = ["original", "gate merge", "fused", "batched x"]
    sessions = {n: open_session(variant(n, wx, wh)) for n in names}
    feeds = {f"x_{t}": rng.standard_normal((1, HIDDEN)).astype(np.float32) for t in range(STEPS)}
    feeds["h_0"] = rng.standard_normal((1, HIDDEN)).astype(np.float32)
    want = sessions["original"].run(None, feeds)[0]
    for n in names:
        np.testing.assert_allclose(sessions[n].run(None, feeds)[0], want, rtol=1e-4, atol=1e-5)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            sessions[n].run(None, feeds)
            times[n].append(time.perf_counter() - t0)
    base = statistics.median(times["original"])
    print("| form | median (ms) | speedup |\n| --- | --- | --- |")
    for n in names:
        m = statistics.median(times[n])
        print(f"| {n} | {m * 1e3:.3f} | {base / m:.2f}× |")


if __name__ == "__main__":
    main()
