"""Rule candidates between ONNX Runtime's fused kernels and their decompositions, in both directions.

    .venv/bin/python benchmarks/fusion_candidates.py --out /tmp/fusion_candidates.json
    .venv/bin/xflow generate-rules --candidates /tmp/fusion_candidates.json --max-ops 3 --jobs 2 \\
        --out rules/new-fusion.json

Each fused op of the op table (``xflow/ops/_contrib.py`` and the files using it) means its decomposition;
the candidates below state that decomposition as a rule (decomposition -> fused op) and its reverse
(fused op -> decomposition), and the normal verify path (``generate-rules --candidates``) proves each from
the axioms of ``verifier/axioms.py`` with z3 and checks it numerically, writing only the proved ones. Which
direction a search takes on a model is left to the measured cost model and the end-to-end A/B.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from xflow.generator.candidate_file import CANDIDATES_FORMAT

from xflow.ops.attention import TO_HEADS, TO_HEADS_T


def node(op: str, inputs: list[str], out: str, **attrs: Any) -> dict[str, Any]:
    """One pattern node in the rule file's JSON form."""
    return {"op": op, "in": inputs, "out": [out], "attrs": attrs}


@dataclass
class Fusion:
    """A decomposition (``parts``, ending in the value ``result``) and the fused node that computes it."""

    name: str
    inputs: dict[str, str]  # name -> "any" or "const"
    parts: list[dict[str, Any]]
    fused: dict[str, Any]
    found_on: dict[str, list[int]]
    where: list[str] = field(default_factory=list)  # conditions on the decomposition's attributes
    reverse_attrs: dict[str, Any] = field(default_factory=dict)  # attributes of the parts as written back


def _doc(nodes: list[dict[str, Any]]) -> str:
    def attrs(n: dict[str, Any]) -> str:
        return f"[{','.join(f'{k}={v}' for k, v in sorted(n['attrs'].items()))}]" if n["attrs"] else ""
    return " ; ".join(f"{n['op']}{attrs(n)}({', '.join(n['in'])})" for n in nodes)


def _rule(name: str, inputs: dict[str, str], src: list[dict[str, Any]], dst: list[dict[str, Any]],
          found_on: dict[str, list[int]], where: list[str]) -> dict[str, Any]:
    rename = {n["out"][0]: f"s{i}" for i, n in enumerate(src)} | {n["out"][0]: f"d{i}" for i, n in enumerate(dst)}
    src = [{**n, "in": [rename.get(i, i) for i in n["in"]], "out": [rename[n["out"][0]]]} for n in src]
    dst = [{**n, "in": [rename.get(i, i) for i in n["in"]], "out": [rename[n["out"][0]]]} for n in dst]
    result = dst[-1]["out"][0] if dst else src[0]["in"][0]  # an empty right side: the node computes its input
    # a condition may read an intermediate tensor of the source (``dtype(n)``): by its new name
    where = [re.sub(r"\b(rank|dim|shape|value|dtype)\((\w+)", lambda m: f"{m[1]}({rename.get(m[2], m[2])}", w)
             for w in where]
    return {"name": name, "doc": f"{_doc(src)} -> {_doc(dst) or result}", "inputs": inputs, "src": src, "dst": dst,
            "outputs": {src[-1]["out"][0]: result}, "where": where,
            "provenance": {"generator": {"kind": "fusion", "script": "benchmarks/fusion_candidates.py"},
                           "found_on": found_on}}


def candidates(fusion: Fusion) -> Iterator[dict[str, Any]]:
    """decomposition -> fused op, and fused op -> decomposition (its attributes computed from the fused one's)."""
    fused = {**fusion.fused, "out": ["fused"]}
    yield _rule(f"fuse_{fusion.name}", fusion.inputs, fusion.parts, [fused], fusion.found_on, fusion.where)
    parts = [{**p, "attrs": {**p["attrs"], **fusion.reverse_attrs.get(p["out"][0], {})}} for p in fusion.parts]
    yield _rule(f"unfuse_{fusion.name}", fusion.inputs, [fused], parts, fusion.found_on, [])


def _skip_norms() -> Iterator[Fusion]:
    for norm, fused_op, params in (("layernorm", "skip_layernorm", ["g", "b"]), ("layernorm", "skip_layernorm", ["g"]),
                                   ("rmsnorm", "skip_rmsnorm", ["g"])):
        yield Fusion(
            f"{fused_op}_{2 + len(params)}", {"x": "any", "s": "any", **{p: "const" for p in params}},
            [node("add", ["x", "s"], "t"), node(norm, ["t", *params], "y", axis="?ax", epsilon="?eps")],
            node(fused_op, ["x", "s", *params], "f", epsilon="?eps"),
            {"x": [2, 3, 8], "s": [2, 3, 8], **{p: [8] for p in params}}, ["ax == rank(x) - 1"],
            {"y": {"axis": "=rank(x) - 1"}})


def _gelus() -> Iterator[Fusion]:
    yield Fusion("ms_gelu", {"x": "any"}, [node("gelu", ["x"], "y", approximate="none")], node("ms_gelu", ["x"], "f"),
                 {"x": [2, 3, 8]})
    yield Fusion("fast_gelu", {"x": "any"}, [node("gelu", ["x"], "y", approximate="tanh")],
                 node("fast_gelu", ["x"], "f"), {"x": [2, 3, 8]})
    for approximate, fused_op in (("none", "bias_gelu"), ("tanh", "fast_gelu")):
        yield Fusion(f"{fused_op}_bias", {"x": "any", "b": "const"},
                     [node("add", ["x", "b"], "t"), node("gelu", ["t"], "y", approximate=approximate)],
                     node(fused_op, ["x", "b"], "f"), {"x": [2, 3, 8], "b": [8]})
    yield Fusion("quick_gelu_silu", {"x": "any"}, [node("sigmoid", ["x"], "t"), node("mul", ["x", "t"], "y")],
                 node("quick_gelu", ["x"], "f", alpha=1.0), {"x": [2, 3, 8]})


def _fused_matmuls() -> Iterator[Fusion]:
    # rank 4 (attention's K^T) proves in 1-4 million z3 units; rank 2 stays unknown within the default 10 million
    # and rank 3 within 60 million (left out: its proofs only spend the budget)
    shapes = {2: ([3, 4], [5, 4]), 4: ([1, 2, 3, 4], [1, 2, 5, 4])}
    for rank, (x, y) in shapes.items():
        perm = [*range(rank - 2), rank - 1, rank - 2]
        yield Fusion(f"fused_matmul_trans_b_{rank}", {"x": "any", "y": "any"},
                     [node("transpose", ["y"], "t", perm=perm), node("matmul", ["x", "t"], "z")],
                     node("fused_matmul", ["x", "y"], "f", alpha=1.0, transA=0, transB=1), {"x": x, "y": y})
        yield Fusion(f"fused_matmul_trans_a_{rank}", {"x": "any", "y": "any"},
                     [node("transpose", ["x"], "t", perm=perm), node("matmul", ["t", "y"], "z")],
                     node("fused_matmul", ["x", "y"], "f", alpha=1.0, transA=1, transB=0),
                     {"x": [*x[:-2], x[-1], x[-2]], "y": [*y[:-2], y[-1], y[-2]]})


def _fused_convs() -> Iterator[Fusion]:
    geometry = {"strides": "?cs", "pads": "?cp", "group": "?g"}
    for activation in ("Relu", "Sigmoid", "Tanh"):
        for inputs in (["x", "w"], ["x", "w", "b"]):
            kinds = {"x": "any", "w": "const", **({"b": "const"} if len(inputs) == 3 else {})}
            found = {"x": [1, 4, 7, 7], "w": [6, 4, 3, 3], **({"b": [6]} if len(inputs) == 3 else {})}
            fused = node("fused_conv", inputs, "f", activation=activation, **geometry)
            yield Fusion(f"fused_conv_{activation.lower()}_{len(inputs)}", kinds,
                         [node("conv", inputs, "c", act="none", **geometry), node(activation.lower(), ["c"], "y")],
                         fused, found)
            if activation == "Relu":  # TASO's conv with the relu folded in
                yield Fusion(f"fused_conv_act_relu_{len(inputs)}", kinds,
                             [node("conv", inputs, "y", act="relu", **geometry)], fused, found)


def _unfusable_forms() -> Iterator[dict[str, Any]]:
    """Forms of a graph that ONNX Runtime's fusions do not match, where their fused kernels are the slower
    ones on some CPUs: a residual sum before a layer normalization written as ONNX Sum instead of Add
    (SkipLayerNormFusion matches only the Add), a matmul's bias given a leading unit axis. The two forms run
    different kernels; the measured cost model and the end-to-end timing choose between them. One direction
    only: exports write the fusable form, which ORT fuses where fusing pays, and the reverse rule would let a
    completion sweep (``complete_sweeps``) undo every rewrite right after making it."""
    for params in (["g", "b"], ["g"]):
        inputs = {"x": "any", "s": "any", **{p: "const" for p in params}}
        found = {"x": [2, 3, 8], "s": [2, 3, 8], **{p: [8] for p in params}}
        src = [node("add", ["x", "s"], "t"), node("layernorm", ["t", *params], "y", axis="?ax", epsilon="?eps")]
        dst = [node("sum", ["x", "s"], "u"), node("layernorm", ["u", *params], "z", axis="?ax", epsilon="?eps")]
        yield _rule(f"add_to_sum_layernorm_{2 + len(params)}", inputs, src, dst, found, [])
    # A Linear layer's bias given a leading unit axis: ORT's MatMulAddFusion turns a batched MatMul + Add into
    # Reshape, Gemm, Reshape (a copy of the product), the slower form on some CPUs, and takes the bias only
    # when it has rank 1; the Add kernel runs as fast with either shape. (Written as Sum instead, the bias
    # escapes the fusion too, but ORT's Sum kernel broadcasts more slowly than its Add.)
    src = [node("matmul", ["x", "w"], "m"), node("add", ["m", "b"], "y")]
    dst = [node("matmul", ["x", "w"], "u"), node("unsqueeze", ["b"], "c", axes=[0]), node("add", ["u", "c"], "z")]
    yield _rule("bias_add_leading_axis", {"x": "any", "w": "const", "b": "const"}, src, dst,
                {"x": [2, 3, 8], "w": [8, 5], "b": [5]}, ["rank(b) == 1", "rank(x) >= 3"])


def _folded_scales() -> Iterator[dict[str, Any]]:
    """A per-column scale after a Linear layer (ConvNeXt's layer scale gamma) folded into its weight and bias:
    both products are of constants, which fold when the model is written, so the Mul kernel goes."""
    found = {"x": [2, 3, 8], "w": [8, 5], "b": [5], "g": [5]}
    where = ["rank(w) == 2", "rank(g) == 1", "rank(b) == 1"]
    src = [node("matmul", ["x", "w"], "m"), node("add", ["m", "b"], "a"), node("mul", ["a", "g"], "y")]
    dst = [node("mul", ["w", "g"], "wg"), node("mul", ["b", "g"], "bg"), node("matmul", ["x", "wg"], "u"),
           node("add", ["u", "bg"], "z")]
    yield _rule("fold_column_scale_biased", {"x": "any", "w": "const", "b": "const", "g": "const"}, src, dst,
                found, where)
    src = [node("matmul", ["x", "w"], "m"), node("mul", ["m", "g"], "y")]
    dst = [node("mul", ["w", "g"], "wg"), node("matmul", ["x", "wg"], "z")]
    yield _rule("fold_column_scale", {"x": "any", "w": "const", "g": "const"}, src, dst,
                {k: v for k, v in found.items() if k != "b"}, where[:2])


def _denormal_lifts() -> Iterator[dict[str, Any]]:
    """Softmax probabilities scaled by 2**64 before the matmul that reads them and the other operand by 2**-64:
    exact, and the masked probabilities (e**-100 under Swin's -100 window mask, float32 denormals that an x86 core
    multiplies through a microcode assist) become normal numbers."""
    src = [node("softmax", ["x"], "p", axis="?ax"), node("matmul", ["p", "v"], "y")]
    dst = [node("softmax", ["x"], "q", axis="?ax"), node("pow2_scale", ["q"], "up", exponent=64),
           node("pow2_scale", ["v"], "down", exponent=-64), node("matmul", ["up", "down"], "z")]
    yield _rule("lift_softmax_out_of_denormals", {"x": "any", "v": "any"}, src, dst,
                {"x": [2, 3, 4, 4], "v": [2, 3, 4, 5]}, [])


def _identities() -> Iterator[dict[str, Any]]:
    """Nodes that compute their input: an Identity, a Cast to its own type, a one-input Concat, which
    transformers' exports write where a cache of past keys and values would be concatenated (GPT-2: 24) and which
    ONNX Runtime runs as a copy."""
    yield _rule("single_input_concat", {"x": "any"}, [node("concat", ["x"], "y", axis="?ax")], [],
                {"x": [1, 2, 4, 3]}, [])
    # a Cast to the type its input has (transformers' .to(torch.float32) of a float32 tensor: Llama's norms and
    # softmax, 76 in a 12-layer export), which onnxslim and ONNX Runtime's optimizer delete
    yield _rule("cast_same_type", {"x": "any"}, [node("cast", ["x"], "y", to="?t")], [], {"x": [1, 12, 8, 8]},
                ["dtype(x) == t"])
    # an Identity, which exports write where one weight is read by several layers (ALBERT's shared layers: 66),
    # and which ONNX Runtime and onnxslim delete
    yield _rule("identity", {"x": "any"}, [node("identity", ["x"], "y")], [], {"x": [1, 12, 8, 8]}, [])
    # a product with a constant one (Whisper's attention scales Q and K by 1.0 after splitting the heads: 24 Muls
    # in its export), which onnxslim deletes
    yield _rule("scalar_mul_by_one", {"x": "any", "o": "const"}, [node("smul", ["x", "o"], "y")], [],
                {"x": [1, 6, 8, 8], "o": []}, ["value(o) == 1"])


def _attentions() -> Iterator[dict[str, Any]]:
    """Self- and cross-attention as transformers' exports write it, into one MultiHeadAttention: Q, K and V
    reshaped to heads and transposed (K straight to Kᵀ), Q Kᵀ, softmax, times V, the heads merged back (in the
    exports the context is first reshaped to the (B, H, S, Dv) it already has: both forms). Where the exports
    scale Q and K by constants after splitting the heads (ViT: head_size^-1/4 each; Whisper: 1), the rule keeps
    the two scalar Muls on the unsplit Q and K and gives the fused op scale 1: a rule's attributes cannot be
    computed from constant values. A mask between the matmuls (causal, padding, transformers' fully-masked-row
    guard) is another function: no match there. One direction only: the reverse would need the heads' shapes
    written from dims, and measurement keeps the decomposition wherever the fused kernel is slower."""
    heads, heads_perm = ["?b", "?s", "?h", "?d"], list(TO_HEADS)  # mha's own head layout (xflow/ops/attention.py)
    where = ["rank(q) == 3", "rank(k) == 3", "rank(v) == 3", "h >= 1",
             "b == dim(q, 0)", "s == dim(q, 1)", "d == dim(q, 2) // h", "h * d == dim(q, 2)",
             "dim(k, 0) == b", "l == dim(k, 1)", "dim(k, 2) == h * d",
             "dim(v, 0) == b", "dim(v, 1) == l", "dv == dim(v, 2) // h", "h * dv == dim(v, 2)", "e == dim(v, 2)"]
    found = {"q": [2, 3, 8], "k": [2, 5, 8], "v": [2, 5, 6]}
    for scaled in (True, False):
        for context_reshaped in (True, False):
            q, k = ("sq", "sk") if scaled else ("tq", "tk")
            src = [node("reshape", ["q"], "rq", shape=heads), node("transpose", ["rq"], "tq", perm=heads_perm),
                   node("reshape", ["k"], "rk", shape=["?b", "?l", "?h", "?d"]),
                   node("transpose", ["rk"], "tk", perm=list(TO_HEADS_T)),
                   *([node("smul", ["tq", "a"], "sq"), node("smul", ["tk", "c"], "sk")] if scaled else []),
                   node("matmul", [q, k], "scores"), node("softmax", ["scores"], "probs", axis=3),
                   node("reshape", ["v"], "rv", shape=["?b", "?l", "?h", "?dv"]),
                   node("transpose", ["rv"], "tv", perm=heads_perm), node("matmul", ["probs", "tv"], "context"),
                   *([node("reshape", ["context"], "same", shape=["?b", "?h", "?s", "?dv"])]
                     if context_reshaped else []),
                   node("transpose", ["same" if context_reshaped else "context"], "merged", perm=heads_perm),
                   node("reshape", ["merged"], "y", shape=["?b", "?s", "?e"])]
            fused = node("mha", ["uq", "uk", "v"] if scaled else ["q", "k", "v"], "f", num_heads="?h", scale=1.0)
            dst = [node("smul", ["q", "a"], "uq"), node("smul", ["k", "c"], "uk"), fused] if scaled else [fused]
            inputs = {"q": "any", "k": "any", "v": "any", **({"a": "any", "c": "any"} if scaled else {})}
            name = f"fuse_attention{'_scaled' if scaled else ''}{'_context_reshaped' if context_reshaped else ''}"
            yield _rule(name, inputs, src, dst, {**found, **({"a": [], "c": []} if scaled else {})}, where)


def _rms_norms() -> Iterator[dict[str, Any]]:
    """RMSNorm as transformers' exports write Llama's (``LlamaRMSNorm``: x * rsqrt(mean(x²) + eps) * weight: Pow,
    ReduceMean, Add, Sqrt, then Reciprocal and Mul, Div(x, ·), or Div(1, ·) and Mul, which is torch's rsqrt in the
    legacy exporter; with or without the Cast back to the input's type before the weight, ``.to(input_dtype)``)
    into one SimplifiedLayerNormalization. The epsilon is a constant the export adds; the fused op takes it as an
    attribute, read from the constant by ``value(e)``. One direction only: the reverse would have to make that
    constant."""
    where = ["ax == (rank(x) - 1,)", "rank(e) == 0"]
    found = {"x": [2, 3, 8], "g": [8], "e": []}
    head = [node("pow", ["x"], "sq", exponent=2.0), node("reducemean", ["sq"], "ms", axes="?ax", keepdims=1),
            node("add", ["ms", "e"], "mse"), node("sqrt", ["mse"], "rms")]
    tails = {"reciprocal": ([node("reciprocal", ["rms"], "inv"), node("mul", ["x", "inv"], "n")], {}, []),
             "div": ([node("div", ["x", "rms"], "n")], {}, []),
             "div_one": ([node("div", ["o", "rms"], "inv"), node("mul", ["x", "inv"], "n")], {"o": "const"},
                         ["value(o) == 1", "rank(o) == 0"])}
    fused = node("rmsnorm", ["x", "g"], "f", axis="=rank(x) - 1", epsilon="=value(e)")
    for form, (tail, extra, conditions) in tails.items():
        for cast in (False, True):
            scaled = [node("cast", ["n"], "c", to="?t"), node("mul", ["g", "c"], "y")] if cast else [
                node("mul", ["g", "n"], "y")]
            inputs = {"x": "any", "g": "const", "e": "const", **extra}
            yield _rule(f"fuse_rmsnorm_{form}{'_cast' if cast else ''}", inputs,
                        [*head, *tail, *scaled], [fused], {**found, **{k: [] for k in extra}},
                        [*where, *conditions, *(["dtype(n) == t"] if cast else [])])


def _rotaries() -> Iterator[dict[str, Any]]:
    """Rotary embedding in the rotate-half form transformers' Llama exports write (x · cos + concat(-x₂, x₁) · sin,
    the slices of x over its last axis, cos and sin the rows of position-indexed tables unsqueezed over the heads)
    into one RotaryEmbedding. Two candidates, which differ in how the tables are given:

    - ``fuse_rotary_halved_tables``: each table written as the concat of its half-width cache with itself (what
      transformers computes, ``cat((freqs, freqs))``, before the cos): proved from ``rotary_def``;
    - ``fuse_rotary_tables``: each table one constant of the head's width, as the legacy export (and the zoo's
      decoder) writes it, the fused op given its first half: true only where the table's two halves are equal, a
      fact about the constant's values that no rule condition states (``value()`` reads one-element constants):
      refuted on random tables, as it must be.

    Neither matches the zoo's decoder yet (see the lab note 2026-12-02-decoder-fusions.md): its position ids are
    (1, S) against a batch of B, and its Slices over the dynamic dims stay outside the algebra."""
    heads = ["?b", "?n", "?s"]
    where = ["rank(x) == 4", "b == dim(x, 0)", "n == dim(x, 1)", "s == dim(x, 2)", "d == dim(x, 3)",
             "h == dim(x, 3) // 2", "2 * h == d"]
    rotate = [node("slice", ["x"], "x1", starts=[0, 0, 0, 0], stops=[*heads, "?h"], steps=[1, 1, 1, 1]),
              node("slice", ["x"], "x2", starts=[0, 0, 0, "?h"], stops=[*heads, "?d"], steps=[1, 1, 1, 1]),
              node("neg", ["x2"], "nx2"), node("concat", ["nx2", "x1"], "rot", axis=3),
              node("mul", ["x", "cos"], "xc"), node("mul", ["rot", "sin"], "rs"), node("add", ["xc", "rs"], "y")]
    rows = [node("gather", ["tc", "p"], "gc", axis=0), node("unsqueeze", ["gc"], "cos", axes=[1]),
            node("gather", ["ts", "p"], "gs", axis=0), node("unsqueeze", ["gs"], "sin", axes=[1])]
    halved = [node("concat", ["c", "c"], "tc", axis=1), node("concat", ["s", "s"], "ts", axis=1)]
    yield _rule("fuse_rotary_halved_tables", {"x": "any", "p": "any", "c": "const", "s": "const"},
                [*halved, *rows, *rotate], [node("rotary", ["x", "p", "c", "s"], "f")],
                {"x": [2, 3, 4, 8], "p": [2, 4], "c": [6, 4], "s": [6, 4]}, where)
    half = {"starts": [0, 0], "stops": "=(dim(tc, 0), h)", "steps": [1, 1]}
    yield _rule("fuse_rotary_tables", {"x": "any", "p": "any", "tc": "const", "ts": "const"}, [*rows, *rotate],
                [node("slice", ["tc"], "c", **half), node("slice", ["ts"], "s", **half),
                 node("rotary", ["x", "p", "c", "s"], "f")],
                {"x": [2, 3, 4, 8], "p": [2, 4], "tc": [6, 8], "ts": [6, 8]}, where)


def all_candidates() -> list[dict[str, Any]]:
    """Every candidate, in a fixed order."""
    fusions = [*_skip_norms(), *_gelus(), *_fused_matmuls(), *_fused_convs()]
    return [c for f in fusions for c in candidates(f)] + list(_unfusable_forms())


def main() -> None:
    """Write the candidate file."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="candidate file to write (for generate-rules --candidates)")
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--only-unfusable", action="store_true",
                      help="only the forms ORT's fusions do not match (Add -> Sum before a layer normalization, "
                           "a matmul's bias with a leading unit axis)")
    only.add_argument("--folded-scales", action="store_true",
                      help="only a per-column scale after a matmul folded into its weight (and bias)")
    only.add_argument("--denormal-lifts", action="store_true",
                      help="only softmax probabilities scaled out of the denormal range before their matmul")
    only.add_argument("--attentions", action="store_true", help="only attention as the exports write it, into "
                      "MultiHeadAttention")
    only.add_argument("--rms-norms", action="store_true", help="only RMSNorm as transformers' Llama exports write "
                      "it, into SimplifiedLayerNormalization")
    only.add_argument("--rotaries", action="store_true", help="only rotary embedding as transformers' Llama exports "
                      "write it, into RotaryEmbedding")
    only.add_argument("--identities", action="store_true", help="only nodes that compute their input (a one-input "
                      "Concat, a Cast to its input's type, an Identity, a product with one)")
    args = parser.parse_args()
    found = (list(_unfusable_forms()) if args.only_unfusable else list(_folded_scales()) if args.folded_scales
             else list(_denormal_lifts()) if args.denormal_lifts else list(_identities()) if args.identities
             else list(_attentions()) if args.attentions else list(_rms_norms()) if args.rms_norms
             else list(_rotaries()) if args.rotaries
             else all_candidates())
    with open(args.out, "w", encoding="utf-8") as f:
        max_ops = max(max(len(c["src"]), len(c["dst"])) for c in found)
        json.dump({"format": CANDIDATES_FORMAT, "max_ops": max_ops, "seed": 0, "candidates": found}, f, indent=1)
    print(f"wrote {args.out}: {len(found)} candidates")


if __name__ == "__main__":
    main()
