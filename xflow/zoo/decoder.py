"""Small decode-step decoders with a KV cache, in the forms transformers' legacy exporter writes (opset 17).

Unlike the rest of the zoo these are dynamic by construction: ``input_ids [batch, seq]``, ``attention_mask
[batch, total_seq]``, ``past_key_i``/``past_value_i [batch, kv_heads, past_seq, head_dim]`` in, ``logits
[batch, seq, vocab]`` and ``present_key_i``/``present_value_i [batch, kv_heads, total_seq, head_dim]`` out, with
``total_seq = past_seq + seq`` holding only because the graph concatenates the cache with the new tokens and
broadcasts the mask against the result. Sizes, causal mask and position ids are computed from ``Shape`` reads
(Shape/Gather/Range/Unsqueeze/Concat/Expand/Where), recomputed per layer where the exporter does.

Usage::

    from xflow.zoo.decoder import llama_decoder, gpt2_decoder
    model = llama_decoder(DecoderConfig(layers=2), seed=0)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ._builder import IR_VERSION, OPSET, PRODUCER

BATCH, SEQ, PAST, TOTAL = "batch", "seq", "past_seq", "total_seq"
_INT_MAX = np.iinfo(np.int64).max


@dataclass(frozen=True)
class DecoderConfig:
    """Sizes of a small decoder (``kv_heads < heads``: grouped-query attention, Llama only)."""

    layers: int = 2
    hidden: int = 32
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 64
    vocab: int = 96
    max_positions: int = 128  # rows of the rotary tables / position embeddings
    eps: float = 1e-6

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.hidden // self.heads


class _Nodes:
    """Names, nodes and initializers of one graph being written (every value named once)."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0
        self._consts: dict[tuple[str, tuple[int, ...], bytes], str] = {}

    def op(self, op_type: str, *inputs: str, outputs: int = 1, **attrs: object) -> str | list[str]:
        """Append a node; its output name (or names, with ``outputs`` > 1)."""
        self._count += 1
        base = f"/{op_type}_{self._count}"
        names = [f"{base}_output_{k}" for k in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, name=base, **attrs))
        return names[0] if outputs == 1 else names

    def const(self, value: object, dtype: type = np.int64) -> str:
        """A shared small constant (deduplicated by dtype, shape and value)."""
        array = np.asarray(value, dtype=dtype)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self._consts:
            name = f"onnx::Constant_{len(self._consts)}"
            self.initializers.append(numpy_helper.from_array(array, name))
            self._consts[key] = name
        return self._consts[key]

    def weight(self, name: str, shape: tuple[int, ...], std: float = 0.1, mean: float = 0.0) -> str:
        """A seeded float32 weight."""
        array = (self.rng.standard_normal(shape) * std + mean).astype(np.float32)
        self.initializers.append(numpy_helper.from_array(array, name))
        return name

    def dim(self, value: str, axis: int) -> str:
        """``value.shape[axis]`` as a scalar int64 (Shape -> Gather)."""
        return self.op("Gather", self.op("Shape", value), self.const(axis), axis=0)

    def vector(self, *scalars_or_ints: str | int) -> str:
        """A 1-D int64 shape from scalars (Unsqueeze) and fixed ints, concatenated as the exporter does."""
        parts = [self.const([p]) if isinstance(p, int) else self.op("Unsqueeze", p, self.const([0]))
                 for p in scalars_or_ints]
        return self.op("Concat", *parts, axis=0)


def _io(cfg: DecoderConfig, kv_heads: int, float_type: int = TensorProto.FLOAT
        ) -> tuple[list[onnx.ValueInfoProto], list[onnx.ValueInfoProto]]:
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [BATCH, SEQ]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [BATCH, TOTAL])]
    outputs = [helper.make_tensor_value_info("logits", float_type, [BATCH, SEQ, cfg.vocab])]
    for i in range(cfg.layers):
        for kind in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past_{kind}_{i}", float_type,
                                                        [BATCH, kv_heads, PAST, cfg.head_dim]))
            outputs.append(helper.make_tensor_value_info(f"present_{kind}_{i}", float_type,
                                                         [BATCH, kv_heads, TOTAL, cfg.head_dim]))
    return inputs, outputs


def _model(g: _Nodes, name: str, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
           results: dict[str, str]) -> onnx.ModelProto:
    """The model, each graph output the node output ``results`` names renamed to it."""
    renames = {value: out for out, value in results.items()}
    for node in g.nodes:
        for k, out in enumerate(node.output):
            node.output[k] = renames.get(out, out)
        for k, inp in enumerate(node.input):
            node.input[k] = renames.get(inp, inp)
    graph = helper.make_graph(g.nodes, name, inputs, outputs, g.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name=PRODUCER)
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model


def _heads(g: _Nodes, x: str, batch: str, seq: str, heads: int, head_dim: int) -> str:
    """[b, s, heads*hd] -> [b, heads, s, hd], the Reshape target built from Shape reads."""
    shaped = g.op("Reshape", x, g.vector(batch, seq, heads, head_dim))
    return g.op("Transpose", shaped, perm=[0, 2, 1, 3])


def _merge_heads(g: _Nodes, x: str, batch: str, seq: str, hidden: int) -> str:
    """[b, heads, s, hd] -> [b, s, heads*hd]."""
    return g.op("Reshape", g.op("Transpose", x, perm=[0, 2, 1, 3]), g.vector(batch, seq, hidden))


def _attend(g: _Nodes, q: str, k: str, v: str, bias: str, head_dim: int) -> str:
    """softmax(q k^T / sqrt(hd) + bias) v."""
    scores = g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 3, 2]))
    scores = g.op("Div", scores, g.const(np.sqrt(head_dim), np.float32))
    return g.op("MatMul", g.op("Softmax", g.op("Add", scores, bias), axis=-1), v)


def _padding_bias(g: _Nodes, mask: str) -> str:
    """The padding mask [b, total] -> an additive bias [b, 1, 1, total] (0 kept, float32 min masked)."""
    keep = g.op("Cast", g.op("Unsqueeze", mask, g.const([1, 2])), to=TensorProto.FLOAT)
    return g.op("Mul", g.op("Sub", g.const(1.0, np.float32), keep), g.const(np.finfo(np.float32).min, np.float32))


# ---- Llama ------------------------------------------------------------------------------------------------


def _rms_norm(g: _Nodes, x: str, name: str, cfg: DecoderConfig) -> str:
    """x * rsqrt(mean(x^2) + eps) * w, as exported: Pow, ReduceMean, Add, Sqrt, Reciprocal, Mul, Mul."""
    variance = g.op("ReduceMean", g.op("Pow", x, g.const(2.0, np.float32)), axes=[-1], keepdims=1)
    scale = g.op("Reciprocal", g.op("Sqrt", g.op("Add", variance, g.const(cfg.eps, np.float32))))
    return g.op("Mul", g.weight(name, (cfg.hidden,), std=0.05, mean=1.0), g.op("Mul", x, scale))


def _rotate(g: _Nodes, x: str, cos: str, sin: str, half: int) -> str:
    """x * cos + rotate_half(x) * sin, rotate_half = cat(-x2, x1) over the last axis (Slice/Neg/Concat)."""
    x1 = g.op("Slice", x, g.const([0]), g.const([half]), g.const([-1]), g.const([1]))
    x2 = g.op("Slice", x, g.const([half]), g.const([_INT_MAX]), g.const([-1]), g.const([1]))
    rotated = g.op("Concat", g.op("Neg", x2), x1, axis=-1)
    return g.op("Add", g.op("Mul", x, cos), g.op("Mul", rotated, sin))


def _repeat_kv(g: _Nodes, x: str, batch: str, total: str, cfg: DecoderConfig) -> str:
    """Grouped-query repeat: [b, kvh, T, hd] -> [b, kvh, rep, T, hd] (Unsqueeze, Expand) -> [b, heads, T, hd]."""
    rep = cfg.heads // cfg.kv_heads
    if rep == 1:
        return x
    widened = g.op("Unsqueeze", x, g.const([2]))
    expanded = g.op("Expand", widened, g.vector(batch, cfg.kv_heads, rep, total, cfg.head_dim))
    return g.op("Reshape", expanded, g.vector(batch, cfg.heads, total, cfg.head_dim))


def _rotary_tables(cfg: DecoderConfig) -> tuple[np.ndarray, np.ndarray]:
    inv_freq = 1.0 / (10000.0 ** (np.arange(0, cfg.head_dim, 2) / cfg.head_dim))
    angles = np.outer(np.arange(cfg.max_positions), inv_freq)
    angles = np.concatenate([angles, angles], axis=-1)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def llama_decoder(cfg: DecoderConfig = DecoderConfig(), seed: int = 0) -> onnx.ModelProto:  # noqa: B008 - frozen
    """A Llama-style decoder step: RMSNorm, rotary (cos/sin tables gathered by position ids that start at
    ``past_seq``), grouped-query attention over the cache, SwiGLU MLP, a causal mask built from shapes."""
    g = _Nodes(seed)
    hd, half = cfg.head_dim, cfg.head_dim // 2
    batch, seq = g.dim("input_ids", 0), g.dim("input_ids", 1)
    past = g.dim("past_key_0", 2)
    total = g.op("Add", past, seq)
    positions = g.op("Unsqueeze", g.op("Range", past, total, g.const(1)), g.const([0]))  # [1, seq]
    cos_table, sin_table = _rotary_tables(cfg)
    cos = g.op("Unsqueeze", g.op("Gather", g.const(cos_table, np.float32), positions, axis=0), g.const([1]))
    sin = g.op("Unsqueeze", g.op("Gather", g.const(sin_table, np.float32), positions, axis=0), g.const([1]))
    # causal: key position j > query position past + i is masked; padding from the attention mask
    rows = g.op("Unsqueeze", g.op("Range", past, total, g.const(1)), g.const([1]))  # [seq, 1]
    cols = g.op("Unsqueeze", g.op("Range", g.const(0), total, g.const(1)), g.const([0]))  # [1, past+seq]
    causal = g.op("Greater", cols, rows)  # [seq, past+seq]
    causal = g.op("Expand", causal, g.vector(batch, 1, seq, total))
    padded = g.op("Equal", g.op("Unsqueeze", "attention_mask", g.const([1, 2])), g.const(0))  # [b, 1, 1, total]
    bias = g.op("Where", g.op("Or", causal, padded), g.const(np.finfo(np.float32).min, np.float32),
                g.const(0.0, np.float32))
    h = g.op("Gather", g.weight("embed_tokens", (cfg.vocab, cfg.hidden), std=0.5), "input_ids", axis=0)
    results: dict[str, str] = {}
    for i in range(cfg.layers):
        x = _rms_norm(g, h, f"layers.{i}.input_layernorm", cfg)
        q = g.op("MatMul", x, g.weight(f"layers.{i}.q_proj", (cfg.hidden, cfg.heads * hd)))
        k = g.op("MatMul", x, g.weight(f"layers.{i}.k_proj", (cfg.hidden, cfg.kv_heads * hd)))
        v = g.op("MatMul", x, g.weight(f"layers.{i}.v_proj", (cfg.hidden, cfg.kv_heads * hd)))
        lb, ls = g.dim(x, 0), g.dim(x, 1)  # the exporter reads the sizes again in every layer
        q = _rotate(g, _heads(g, q, lb, ls, cfg.heads, hd), cos, sin, half)
        k = _rotate(g, _heads(g, k, lb, ls, cfg.kv_heads, hd), cos, sin, half)
        v = _heads(g, v, lb, ls, cfg.kv_heads, hd)
        present_k = g.op("Concat", f"past_key_{i}", k, axis=2)
        present_v = g.op("Concat", f"past_value_{i}", v, axis=2)
        results[f"present_key_{i}"], results[f"present_value_{i}"] = present_k, present_v
        lt = g.dim(present_k, 2)
        attended = _attend(g, q, _repeat_kv(g, present_k, lb, lt, cfg), _repeat_kv(g, present_v, lb, lt, cfg),
                           bias, hd)
        out = g.op("MatMul", _merge_heads(g, attended, lb, ls, cfg.hidden),
                   g.weight(f"layers.{i}.o_proj", (cfg.hidden, cfg.hidden)))
        h = g.op("Add", h, out)
        x = _rms_norm(g, h, f"layers.{i}.post_attention_layernorm", cfg)
        gate = g.op("MatMul", x, g.weight(f"layers.{i}.gate_proj", (cfg.hidden, cfg.intermediate)))
        up = g.op("MatMul", x, g.weight(f"layers.{i}.up_proj", (cfg.hidden, cfg.intermediate)))
        act = g.op("Mul", g.op("Mul", gate, g.op("Sigmoid", gate)), up)  # SiLU(gate) * up
        h = g.op("Add", h, g.op("MatMul", act, g.weight(f"layers.{i}.down_proj", (cfg.intermediate, cfg.hidden))))
    x = _rms_norm(g, h, "norm", cfg)
    results["logits"] = g.op("MatMul", x, g.weight("lm_head", (cfg.hidden, cfg.vocab)))
    inputs, outputs = _io(cfg, cfg.kv_heads)
    return _model(g, "llama_decoder", inputs, outputs, results)


# ---- GPT-2 ------------------------------------------------------------------------------------------------


def _layer_norm(g: _Nodes, x: str, name: str, cfg: DecoderConfig) -> str:
    scale = g.weight(f"{name}.weight", (cfg.hidden,), std=0.05, mean=1.0)
    return g.op("LayerNormalization", x, scale, g.weight(f"{name}.bias", (cfg.hidden,), std=0.05),
                axis=-1, epsilon=1e-5)


def _linear(g: _Nodes, x: str, name: str, n_in: int, n_out: int) -> str:
    return g.op("Add", g.op("MatMul", x, g.weight(f"{name}.weight", (n_in, n_out))),
                g.weight(f"{name}.bias", (n_out,), std=0.02))


def _gelu_tanh(g: _Nodes, x: str) -> str:
    """GPT-2's gelu_new: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    cube = g.op("Mul", g.op("Pow", x, g.const(3.0, np.float32)), g.const(0.044715, np.float32))
    inner = g.op("Mul", g.op("Add", x, cube), g.const(np.sqrt(2.0 / np.pi), np.float32))
    return g.op("Mul", g.op("Mul", x, g.const(0.5, np.float32)),
                g.op("Add", g.op("Tanh", inner), g.const(1.0, np.float32)))


def gpt2_decoder(cfg: DecoderConfig = DecoderConfig(kv_heads=4, max_positions=256),  # noqa: B008 - frozen
                 seed: int = 0) -> onnx.ModelProto:
    """A GPT-2-style decoder step: learned position embeddings gathered by position ids computed from the
    attention mask (cumsum - 1), fused QKV projection split three ways, the causal mask sliced from a
    [max, max] lower-triangular buffer at rows ``total - seq .. total``, LayerNormalization, gelu_new."""
    if cfg.kv_heads != cfg.heads:
        raise ValueError("GPT-2 has as many key/value heads as query heads")
    g = _Nodes(seed)
    hd, n = cfg.head_dim, cfg.hidden
    seq = g.dim("input_ids", 1)
    # position ids from the mask: cumsum(mask) - 1, 1 where padded, the last seq of them
    cumsum = g.op("Sub", g.op("CumSum", "attention_mask", g.const(1)), g.const(1))
    positions = g.op("Where", g.op("Equal", "attention_mask", g.const(0)), g.const(1), cumsum)
    positions = g.op("Slice", positions, g.op("Neg", g.op("Unsqueeze", seq, g.const([0]))), g.const([_INT_MAX]),
                     g.const([1]), g.const([1]))
    h = g.op("Add", g.op("Gather", g.weight("wte", (cfg.vocab, n), std=0.5), "input_ids", axis=0),
             g.op("Gather", g.weight("wpe", (cfg.max_positions, n), std=0.1), positions, axis=0))
    padding = _padding_bias(g, "attention_mask")
    tril = np.tril(np.ones((cfg.max_positions, cfg.max_positions), dtype=bool))[None, None]
    buffer = g.const(tril, np.bool_)
    results: dict[str, str] = {}
    for i in range(cfg.layers):
        x = _layer_norm(g, h, f"h.{i}.ln_1", cfg)
        qkv = _linear(g, x, f"h.{i}.attn.c_attn", n, 3 * n)
        q, k, v = g.op("Split", qkv, g.const([n, n, n]), outputs=3, axis=2)
        lb, ls = g.dim(x, 0), g.dim(x, 1)
        q, k, v = (_heads(g, t, lb, ls, cfg.heads, hd) for t in (q, k, v))
        present_k = g.op("Concat", f"past_key_{i}", k, axis=-2)
        present_v = g.op("Concat", f"past_value_{i}", v, axis=-2)
        results[f"present_key_{i}"], results[f"present_value_{i}"] = present_k, present_v
        # causal = bias[:, :, key_length - query_length : key_length, :key_length], sizes read from shapes
        key_len, query_len = g.dim(present_k, 2), g.dim(q, 2)
        start = g.op("Unsqueeze", g.op("Sub", key_len, query_len), g.const([0]))
        end = g.op("Unsqueeze", key_len, g.const([0]))
        causal = g.op("Slice", buffer, start, end, g.const([2]), g.const([1]))
        causal = g.op("Slice", causal, g.const([0]), end, g.const([3]), g.const([1]))
        scores = g.op("MatMul", q, g.op("Transpose", present_k, perm=[0, 1, 3, 2]))
        scores = g.op("Div", scores, g.const(np.sqrt(hd), np.float32))
        scores = g.op("Where", causal, scores, g.const(np.finfo(np.float32).min, np.float32))
        probs = g.op("Softmax", g.op("Add", scores, padding), axis=-1)
        attended = _merge_heads(g, g.op("MatMul", probs, present_v), lb, ls, n)
        h = g.op("Add", h, _linear(g, attended, f"h.{i}.attn.c_proj", n, n))
        x = _layer_norm(g, h, f"h.{i}.ln_2", cfg)
        x = _gelu_tanh(g, _linear(g, x, f"h.{i}.mlp.c_fc", n, cfg.intermediate))
        h = g.op("Add", h, _linear(g, x, f"h.{i}.mlp.c_proj", cfg.intermediate, n))
    x = _layer_norm(g, h, "ln_f", cfg)
    results["logits"] = g.op("MatMul", x, g.weight("lm_head", (n, cfg.vocab)))
    inputs, outputs = _io(cfg, cfg.heads)
    return _model(g, "gpt2_decoder", inputs, outputs, results)


def decoder_feeds(model: onnx.ModelProto, batch: int, seq: int, past: int, seed: int = 0,
                  padded: int = 0) -> dict[str, np.ndarray]:
    """Inputs of a decoder step: token ids in range, the mask all ones but for ``padded`` leading zeros in
    each row (left padding), a random cache of ``past`` positions."""
    rng = np.random.default_rng(seed)
    vocab = next(vi for vi in model.graph.output if vi.name == "logits").type.tensor_type.shape.dim[2].dim_value
    mask = np.ones((batch, past + seq), dtype=np.int64)
    mask[:, :padded] = 0
    feeds = {"input_ids": rng.integers(0, vocab, size=(batch, seq)).astype(np.int64), "attention_mask": mask}
    for vi in model.graph.input:
        if vi.name.startswith("past_"):
            dims = vi.type.tensor_type.shape.dim
            shape = (batch, dims[1].dim_value, past, dims[3].dim_value)
            feeds[vi.name] = rng.uniform(-1, 1, size=shape).astype(np.float32)
    return feeds
