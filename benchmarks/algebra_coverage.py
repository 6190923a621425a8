"""How much of each model is in xflow's algebra: nodes decoded into the op table vs left opaque.

    .venv/bin/python benchmarks/algebra_coverage.py build/real/*.onnx [--json FILE]

Per model: the ONNX file's nodes, the IR's nodes after load (constants and shape computations on fixed dims
folded, op-table ops decoded), how many IR nodes stay opaque (outside the algebra: carried through, never
rewritten) and their share, and the ONNX types of the opaque nodes, most frequent first.
"""

from __future__ import annotations

import argparse
import collections
import json
import os

from xflow.onnx_io import load


def coverage(path: str) -> dict[str, object]:
    """The figures of one model."""
    import onnx

    onnx_nodes = len(onnx.load(path, load_external_data=False).graph.node)
    graph = load(path)
    opaque = collections.Counter(n.onnx_type for n in graph.nodes if n.is_opaque)
    total = len(graph.nodes)
    return {"model": os.path.splitext(os.path.basename(path))[0], "onnx_nodes": onnx_nodes, "ir_nodes": total,
            "opaque": sum(opaque.values()), "opaque_share": sum(opaque.values()) / total if total else 0.0,
            "opaque_types": dict(opaque.most_common())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="ONNX files")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args()
    rows = [coverage(p) for p in args.models]
    print("| model | ONNX nodes | IR nodes | outside the algebra | opaque types |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        types = ", ".join(f"{k} {v}" for k, v in r["opaque_types"].items()) or "—"  # type: ignore[union-attr]
        print(f"| {r['model']} | {r['onnx_nodes']} | {r['ir_nodes']} | {r['opaque']} "
              f"({100 * r['opaque_share']:.1f}%) | {types} |")  # type: ignore[operator]
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
