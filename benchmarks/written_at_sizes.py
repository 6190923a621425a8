"""Run a dynamic model and a model written from it at several sizes: outputs, interface, node counts.

    .venv/bin/python benchmarks/written_at_sizes.py SRC.onnx OUT.onnx
    .venv/bin/python benchmarks/written_at_sizes.py SRC.onnx --reencode   # OUT: SRC loaded and written with
                                                                        # every op-table node re-encoded

With ``--reencode`` no original proto is reused (``save(..., reuse_protos=False)``), so every Reshape and Expand
in the algebra is written by the op table's encoder: targets one constant cannot say are computed at run time.
Token inputs (int64) get random ids below 1000 (masks: ones) at (batch, seq) = (1, 128), (4, 128), (4, 37),
(1, 5); other inputs are float32 normal at batch 1 and 4 with their static dims.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
import onnx

from xflow.onnx_io import load, save
from xflow.ort import open_session

SIZES = ((1, 128), (4, 128), (4, 37), (1, 5))


def _feeds(session, batch: int, seq: int, seed: int) -> dict[str, np.ndarray] | None:  # noqa: ANN001
    rng = np.random.default_rng(seed)
    feeds = {}
    for inp in session.get_inputs():
        dims = [batch if k == 0 else (seq if not isinstance(d, int) else d) for k, d in enumerate(inp.shape)]
        if "int64" in inp.type:
            feeds[inp.name] = np.ones(dims, np.int64) if "mask" in inp.name else \
                rng.integers(0, 1000, dims).astype(np.int64)
        elif len(dims) > 1 and not isinstance(inp.shape[1], int):
            feeds[inp.name] = rng.standard_normal(dims).astype(np.float32)
        elif seq != 128:
            return None  # no sequence dim: the batch sizes only
        else:
            feeds[inp.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds


def compare(src: str, out: str) -> dict:
    """Interface identity (byte for byte) and the max abs output difference at each size."""
    original, written = onnx.load(src, load_external_data=False), onnx.load(out, load_external_data=False)
    row: dict = {"nodes": (len(original.graph.node), len(written.graph.node))}
    for field in ("input", "output", "opset_import"):
        a = getattr(original.graph, field) if field != "opset_import" else original.opset_import
        b = getattr(written.graph, field) if field != "opset_import" else written.opset_import
        row[f"{field}_identical"] = [x.SerializeToString() for x in a] == [x.SerializeToString() for x in b]
    a, b = open_session(src), open_session(out)
    for batch, seq in SIZES:
        feeds = _feeds(a, batch, seq, batch * 1000 + seq)
        if feeds is None:
            continue
        ra, rb = a.run(None, feeds), b.run(None, feeds)
        tokens = any(len(i.shape) > 1 and not isinstance(i.shape[1], int) for i in a.get_inputs())
        label = f"batch={batch} seq={seq}" if tokens else f"batch={batch}"
        row[label] = max(float(np.abs(x.astype(np.float64) - y).max()) for x, y in zip(ra, rb, strict=True))
    return row


def new_computed_targets(src: str, out: str) -> int:
    """Reshapes and Expands of ``out`` whose target a node that ``src`` does not have computes."""
    original = {o for n in onnx.load(src, load_external_data=False).graph.node for o in n.output}
    written = onnx.load(out, load_external_data=False).graph
    produced = {o for n in written.node for o in n.output}
    return sum(1 for n in written.node if n.op_type in ("Reshape", "Expand") and len(n.input) > 1
               and n.input[1] in produced and n.input[1] not in original)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src")
    parser.add_argument("out", nargs="?")
    parser.add_argument("--reencode", action="store_true", help="write SRC with every op-table node re-encoded")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        out = args.out
        if args.reencode:
            out = os.path.join(folder, "reencoded.onnx")
            save(load(args.src), out, reuse_protos=False)
            print({"new_computed_targets": new_computed_targets(args.src, out)})
        if out is None:
            parser.error("give OUT.onnx or --reencode")
        print(compare(args.src, out))


if __name__ == "__main__":
    main()
