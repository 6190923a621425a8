"""How much of each model is in xflow's algebra: nodes decoded into the op table vs left opaque.

    .venv/bin/python benchmarks/algebra_coverage.py build/real/*.onnx [--json FILE] [--shapes]

Per model: the ONNX file's nodes, the IR's nodes after load, how many stay opaque (outside the algebra:
carried through, never rewritten), how many of those are ``Constant`` nodes (data, whose values the decoders
read) or only compute parameters the decoders folded into attributes (shape computations on fixed dims), and
the rest, which compute at run time outside the algebra, with their ONNX types. With ``--shapes``, also the same
after the shape arithmetic over symbolic dims is folded, shared and deleted (``xflow.rewrite.shapes``, what
``optimize``'s finalize pass does), and the ONNX nodes of the shape ops before and after.
"""

from __future__ import annotations

import argparse
import collections
import json
import os

from xflow.onnx_io import load

#: the ONNX ops of shape arithmetic counted with ``--shapes``
SHAPE_OPS = ("Shape", "Gather", "Unsqueeze", "Concat", "Slice", "Range", "Squeeze", "Cast")


def coverage(path: str, shapes: bool = False) -> dict[str, object]:
    """The figures of one model (``shapes``: also after ``share_shapes``)."""
    import onnx

    model = onnx.load(path, load_external_data=False)
    onnx_nodes = len(model.graph.node)
    graph = load(path)
    row = _figures(path, onnx_nodes, graph)
    if shapes:
        from xflow.onnx_io import to_model_proto
        from xflow.rewrite.shapes import share_shapes

        step = share_shapes(graph)
        shaped = step.graph if step is not None else graph
        written = to_model_proto(shaped)
        after = _figures(path, len(written.graph.node), shaped)
        before_ops = collections.Counter(n.op_type for n in model.graph.node)
        after_ops = collections.Counter(n.op_type for n in written.graph.node)
        row["after_shapes"] = {**after, "shape_ops_before": {op: before_ops[op] for op in SHAPE_OPS},
                               "shape_ops_after": {op: after_ops[op] for op in SHAPE_OPS}}
    return row


def _figures(path: str, onnx_nodes: int, graph) -> dict[str, object]:  # noqa: ANN001 - an xflow Graph
    dead = graph.parameter_only_opaque()
    opaque = collections.Counter(n.onnx_type for n in graph.nodes if n.is_opaque)
    computing = collections.Counter(n.onnx_type for n in graph.opaque_computing())
    total = len(graph.nodes)
    return {"model": os.path.splitext(os.path.basename(path))[0], "onnx_nodes": onnx_nodes, "ir_nodes": total,
            "opaque": sum(opaque.values()), "opaque_share": sum(opaque.values()) / total if total else 0.0,
            "constant_nodes": opaque.get("Constant", 0), "parameter_only": len(dead),
            "computing_opaque": sum(computing.values()),
            "computing_share": sum(computing.values()) / total if total else 0.0,
            "opaque_types": dict(computing.most_common())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="ONNX files")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    parser.add_argument("--shapes", action="store_true",
                        help="also after the shape arithmetic is folded, shared and deleted")
    args = parser.parse_args()
    rows = [coverage(p, args.shapes) for p in args.models]
    if args.shapes:  # each model twice: as loaded, then with its shape arithmetic folded, shared and deleted
        rows = [r for row in rows for r in (row, {**row.pop("after_shapes"),  # type: ignore[dict-item]
                                                  "model": f"{row['model']} (shapes shared)"})]
    print("| model | ONNX nodes | IR nodes | opaque | of which Constant nodes | of which only feeding folded "
          "parameters | opaque and computing at run time | their types |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        types = ", ".join(f"{k} {v}" for k, v in r["opaque_types"].items()) or "—"  # type: ignore[union-attr]
        print(f"| {r['model']} | {r['onnx_nodes']} | {r['ir_nodes']} | {r['opaque']} "  # type: ignore[operator]
              f"({100 * r['opaque_share']:.1f}%) | {r['constant_nodes']} | {r['parameter_only']} | "  # type: ignore[operator]
              f"{r['computing_opaque']} ({100 * r['computing_share']:.1f}%) | {types} |")  # type: ignore[operator]
        if "shape_ops_after" in r:
            pairs = ", ".join(f"{op} {r['shape_ops_before'][op]} -> {n}"  # type: ignore[index]
                              for op, n in r["shape_ops_after"].items())  # type: ignore[union-attr]
            print(f"|   ONNX nodes of the shape ops: {pairs} | | | | | | | |")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
