"""BERT-base encoder in the op pattern produced by a typical PyTorch -> ONNX export (opset 17)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx

from ._builder import GraphBuilder

INIT_STD = 0.02
LN_EPS = 1e-12


@dataclass(frozen=True)
class BertConfig:
    """Sizes of a BERT encoder."""

    layers: int = 12
    hidden: int = 768
    heads: int = 12
    intermediate: int = 3072
    seq_len: int = 128
    vocab: int = 30522
    max_positions: int = 512
    type_vocab: int = 2


SMALL = BertConfig(layers=2, hidden=64, heads=4, intermediate=256, seq_len=16, vocab=1000, max_positions=64)


def _layer_norm(gb: GraphBuilder, x: str, name: str) -> str:
    h = gb.shape(x)[-1]
    with gb.scope(name):
        scale = gb.normal("weight", (h,), std=0.05, mean=1.0)
        bias = gb.normal("bias", (h,), std=0.05)
        return gb.node("LayerNormalization", [x, scale, bias], gb.shape(x), axis=-1, epsilon=LN_EPS)


def _linear(gb: GraphBuilder, x: str, out_features: int, name: str) -> str:
    """MatMul by a [in, out] weight then Add bias (the exported form of nn.Linear on 3-D input)."""
    in_features = gb.shape(x)[-1]
    with gb.scope(name):
        w = gb.normal("weight", (in_features, out_features), std=INIT_STD)
        b = gb.normal("bias", (out_features,), std=INIT_STD)
        return gb.add(gb.matmul(x, w), b)


def _gelu(gb: GraphBuilder, x: str) -> str:
    """Exact GELU as exported: x * 0.5 * (1 + erf(x / sqrt(2)))."""
    e = gb.unary("Erf", gb.binary("Div", x, gb.const(math.sqrt(2.0))))
    return gb.mul(gb.mul(x, gb.add(e, gb.const(1.0))), gb.const(0.5))


def _heads(gb: GraphBuilder, x: str, cfg: BertConfig, perm: list[int]) -> str:
    """[1,S,H] -> Reshape [1,S,heads,dh] -> Transpose(perm)."""
    dh = cfg.hidden // cfg.heads
    split = (1, cfg.seq_len, cfg.heads, dh)
    r = gb.node("Reshape", [x, gb.const(split, np.int64)], split)
    return gb.node("Transpose", [r], tuple(split[p] for p in perm), perm=perm)


def _self_attention(gb: GraphBuilder, x: str, mask: str, cfg: BertConfig) -> str:
    dh = cfg.hidden // cfg.heads
    with gb.scope("attention"):
        q = _heads(gb, _linear(gb, x, cfg.hidden, "query"), cfg, [0, 2, 1, 3])
        k = _heads(gb, _linear(gb, x, cfg.hidden, "key"), cfg, [0, 2, 3, 1])
        v = _heads(gb, _linear(gb, x, cfg.hidden, "value"), cfg, [0, 2, 1, 3])
        scores = gb.binary("Div", gb.matmul(q, k), gb.const(math.sqrt(dh)))
        probs = gb.unary("Softmax", gb.add(scores, mask), axis=-1)
        ctx = gb.matmul(probs, v)
        ctx = gb.node("Transpose", [ctx], (1, cfg.seq_len, cfg.heads, dh), perm=[0, 2, 1, 3])
        merged = (1, cfg.seq_len, cfg.hidden)
        ctx = gb.node("Reshape", [ctx, gb.const(merged, np.int64)], merged)
        out = _linear(gb, ctx, cfg.hidden, "output")
        return _layer_norm(gb, gb.add(out, x), "output_ln")


def _encoder_layer(gb: GraphBuilder, x: str, mask: str, cfg: BertConfig) -> str:
    x = _self_attention(gb, x, mask, cfg)
    h = _gelu(gb, _linear(gb, x, cfg.intermediate, "intermediate"))
    h = _linear(gb, h, cfg.hidden, "output")
    return _layer_norm(gb, gb.add(h, x), "output_ln")


def bert(
    *,
    small: bool = False,
    seed: int = 0,
    config: BertConfig | None = None,
) -> onnx.ModelProto:
    """BERT-base encoder (input_ids/attention_mask [1,128] -> last_hidden_state [1,128,768])."""
    cfg = config or (SMALL if small else BertConfig())
    if cfg.hidden % cfg.heads:
        raise ValueError("hidden must be divisible by heads")
    if cfg.seq_len > cfg.max_positions:
        raise ValueError("seq_len exceeds max_positions")
    s = cfg.seq_len
    gb = GraphBuilder("bert", seed)
    ids = gb.add_input("input_ids", (1, s), np.int64)
    attn = gb.add_input("attention_mask", (1, s), np.int64)

    with gb.scope("embeddings"):
        word = gb.normal("word_embeddings", (cfg.vocab, cfg.hidden), std=INIT_STD)
        pos = gb.normal("position_embeddings", (cfg.max_positions, cfg.hidden), std=INIT_STD)
        typ = gb.normal("token_type_embeddings", (cfg.type_vocab, cfg.hidden), std=INIT_STD)
        pos_ids = gb.initializer("position_ids", np.arange(s, dtype=np.int64)[None, :])
        typ_ids = gb.initializer("token_type_ids", np.zeros((1, s), dtype=np.int64))
        emb_shape = (1, s, cfg.hidden)
        e = gb.node("Gather", [word, ids], emb_shape, axis=0)
        e = gb.add(e, gb.node("Gather", [typ, typ_ids], emb_shape, axis=0))
        e = gb.add(e, gb.node("Gather", [pos, pos_ids], emb_shape, axis=0))
        x = _layer_norm(gb, e, "LayerNorm")

    with gb.scope("extended_attention_mask"):
        m = gb.node("Unsqueeze", [attn, gb.const([1, 2], np.int64)], (1, 1, 1, s))
        m = gb.node("Cast", [m], (1, 1, 1, s), dtype=np.float32, to=onnx.TensorProto.FLOAT)
        m = gb.binary("Sub", gb.const(1.0), m)
        mask = gb.mul(m, gb.const(-10000.0))

    for i in range(cfg.layers):
        with gb.scope(f"encoder.layer.{i}"):
            x = _encoder_layer(gb, x, mask, cfg)
    gb.add_output(x, "last_hidden_state")
    return gb.to_model(doc=f"bert encoder: {cfg}")
