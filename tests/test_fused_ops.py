"""ONNX Runtime's fused kernels in the op table: each op's kernel (its decomposition) against ORT's own kernel
on random shapes, decoding by (domain, op type), and the contrib domain written only when a fused op is."""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from xflow.verifier import verify_rule

from xflow.ir import OPAQUE, Node
from xflow.onnx_io import graph_from_model, to_model_proto
from xflow.onnx_io.save import import_node_domains
from xflow.ops import OPS
from xflow.rewrite import apply_match, find_matches
from xflow.rules import load_rules

FLOAT = TensorProto.FLOAT
MS = "com.microsoft"
#: float32 agreement: ORT's kernel and the decomposition, both in float32, may round differently by a few ulps
#: of the largest value involved (a normalization's output, a convolution's accumulation); beyond that a
#: kernel is another function and its op must stay out of the table
RTOL = 1e-5

Draw = Callable[[np.random.Generator], tuple[list[tuple[int, ...]], dict]]


def _dims(rng: np.random.Generator, rank: int) -> tuple[int, ...]:
    return tuple(int(d) for d in rng.integers(1, 9, size=rank))


def _skip(params: int) -> Draw:
    def draw(rng):
        x = _dims(rng, int(rng.integers(2, 4)))
        return [x, x, *[x[-1:]] * params], {"epsilon": float(rng.choice([1e-12, 1e-5]))}
    return draw


def _rms(rng):
    x = _dims(rng, int(rng.integers(1, 4)))
    axis = int(rng.integers(len(x)))
    return [x, x[axis:]], {"axis": axis, "epsilon": 1e-5}


def _unary(attrs: Callable[[np.random.Generator], dict] = lambda rng: {}) -> Draw:
    return lambda rng: ([_dims(rng, int(rng.integers(1, 5)))], attrs(rng))


def _biased(optional: bool) -> Draw:
    def draw(rng):
        x = _dims(rng, int(rng.integers(1, 5)))
        return ([x] if optional and rng.random() < 0.5 else [x, x[-1:]]), {}
    return draw


def _fused_matmul(rng):
    m, k, n = _dims(rng, 3)
    batch = _dims(rng, int(rng.integers(0, 3)))
    ta, tb = int(rng.integers(2)), int(rng.integers(2))
    a = (*batch, k, m) if ta else (*batch, m, k)
    b = (*batch[len(batch) // 2:], n, k) if tb else (*batch[len(batch) // 2:], k, n)
    return [a, b], {"transA": ta, "transB": tb, "alpha": float(rng.choice([1.0, 0.125]))}


def _fused_conv(rng):
    group = int(rng.choice([1, 2]))
    cin, m = group * int(rng.integers(1, 4)), group * int(rng.integers(1, 4))
    kh, kw = int(rng.choice([1, 3])), int(rng.choice([1, 3]))
    x = (int(rng.integers(1, 3)), cin, int(rng.integers(kh, 9)), int(rng.integers(kw, 9)))
    shapes = [x, (m, cin // group, kh, kw)] + ([(m,)] if rng.random() < 0.5 else [])
    attrs = {"group": group, "strides": (int(rng.choice([1, 2])),) * 2,
             "pads": tuple(int(p) for p in rng.integers(0, 2, size=4)),
             "activation": str(rng.choice(["Relu", "Sigmoid", "Tanh"]))}
    return shapes, attrs


def _mha(rng):
    batch, seq, length = int(rng.integers(1, 3)), int(rng.integers(1, 10)), int(rng.integers(1, 10))
    heads, size, v_size = int(rng.integers(1, 5)), int(rng.integers(1, 9)), int(rng.integers(1, 9))
    scale = float(np.float32(rng.uniform(0.05, 2.0))) if rng.random() < 0.5 else 0.0  # 0: 1/sqrt(size)
    return ([(batch, seq, heads * size), (batch, length, heads * size), (batch, length, heads * v_size)],
            {"num_heads": heads, "scale": scale})


def _attention(rng):
    batch, seq, e_in = int(rng.integers(1, 3)), int(rng.integers(1, 10)), int(rng.integers(1, 9))
    heads, size = int(rng.integers(1, 5)), int(rng.integers(1, 9))
    sizes = (heads * size,) * 2 + (heads * int(rng.integers(1, 9)),) if rng.random() < 0.5 else ()  # (): thirds
    columns = sum(sizes) or 3 * heads * size
    scale = float(np.float32(rng.uniform(0.05, 2.0))) if rng.random() < 0.5 else 0.0  # 0: 1/sqrt(size)
    return [(batch, seq, e_in), (e_in, columns), (columns,)], {"num_heads": heads, "scale": scale,
                                                               "qkv_hidden_sizes": sizes}


def _rotary(rng):
    batch, heads, seq, half = (int(d) for d in rng.integers(1, 6, size=4))
    positions = int(rng.integers(seq, 3 * seq + 2))
    return [(batch, heads, seq, 2 * half), (batch, seq), (positions, half), (positions, half)], {}


DRAWS: dict[str, Draw] = {
    "skip_layernorm": lambda rng: _skip(int(rng.integers(1, 3)))(rng), "skip_rmsnorm": _skip(1), "rmsnorm": _rms,
    "ms_gelu": _unary(), "bias_gelu": _biased(False), "fast_gelu": _biased(True),
    "quick_gelu": _unary(lambda rng: {"alpha": float(rng.choice([1.0, 1.702, 0.5]))}),
    "fused_matmul": _fused_matmul, "fused_conv": _fused_conv, "mha": _mha,
    "attention": _attention, "rotary": _rotary,
}


def _is_index(op: str, k: int) -> bool:
    """Input ``k`` of ``op`` holds indices (int64: rotary's position ids), drawn below the cache's rows."""
    return OPS[op].role(k) == "indices"


def _one_node_model(op: str, shapes: list[tuple[int, ...]], attrs: dict) -> tuple[onnx.ModelProto, Node]:
    entry = OPS[op]
    node = Node(op, tuple(f"i{k}" for k in range(len(shapes))), ("y",), entry.normalize_attrs(attrs), "n")

    class Ctx:
        opset = 17

        def fresh_name(self, hint: str) -> str:
            return hint

    graph = helper.make_graph(entry.encode(node, Ctx()), "fused",
                              [helper.make_tensor_value_info(f"i{k}", TensorProto.INT64 if _is_index(op, k) else FLOAT,
                                                             s) for k, s in enumerate(shapes)],
                              [helper.make_tensor_value_info("y", FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    import_node_domains(model)
    return model, node


def test_every_fused_op_is_drawn() -> None:
    fused = {name for name, entry in OPS.items() if entry.domain or name == "rmsnorm"}
    assert fused == set(DRAWS)


@pytest.mark.parametrize("op", sorted(DRAWS))
def test_kernel_matches_onnxruntimes_own_kernel(op: str) -> None:
    """The op's kernel is its decomposition; ORT's fused kernel (CPU provider, graph optimizations off, so
    it runs as written) must agree with it on random shapes, or the op does not belong in the table."""
    rng = np.random.default_rng(sum(map(ord, op)))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    for _ in range(6):
        shapes, attrs = DRAWS[op](rng)
        model, node = _one_node_model(op, shapes, attrs)
        assert OPS[op].domain in {imp.domain for imp in model.opset_import} | {""}
        arrays = [rng.integers(0, shapes[2][0], size=s).astype(np.int64) if _is_index(op, k)
                  else rng.standard_normal(s).astype(np.float32) for k, s in enumerate(shapes)]
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        (got,) = session.run(None, {f"i{k}": a for k, a in enumerate(arrays)})
        (want,) = OPS[op].evaluate(np, arrays, node.attrs)  # in float32, as ORT computes
        assert got.shape == want.shape == OPS[op].infer(shapes, node.attrs)[0]
        scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
        # a convolution's or a product's terms bound its rounding, not its (possibly cancelling) result
        if op in ("fused_conv", "fused_matmul"):
            scale *= max(8.0, float(np.prod(shapes[1][1:]) if op == "fused_conv" else shapes[0][-1]))
        err = float(np.max(np.abs(got - want))) if want.size else 0.0
        assert err <= RTOL * scale, f"{op} {shapes} {attrs}: ORT's kernel differs by {err}: keep it out"


def _contrib_model(opset: int = 17) -> onnx.ModelProto:
    nodes = [helper.make_node("Gelu", ["x"], ["a"], domain=MS),
             helper.make_node("SkipLayerNormalization", ["a", "r", "g", "b"], ["n"], domain=MS, epsilon=1e-5),
             helper.make_node("FusedMatMul", ["n", "w"], ["y"], domain=MS, transB=1, alpha=0.5)]
    rng = np.random.default_rng(0)
    inits = [helper.make_tensor(n, FLOAT, s, rng.standard_normal(s).astype(np.float32).ravel())
             for n, s in (("g", (8,)), ("b", (8,)), ("w", (5, 8)))]
    graph = helper.make_graph(nodes, "contrib", [helper.make_tensor_value_info(n, FLOAT, (2, 3, 8)) for n in "xr"],
                              [helper.make_tensor_value_info("y", FLOAT, (2, 3, 5))], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)],
                             ir_version=8)


def test_each_fused_ops_element_types_are_ones_ort_runs() -> None:
    """``kernel_dtypes`` of every contrib op: float among them, and each one a type of ONNX Runtime's CPU kernel
    (float16 besides, which ORT runs by casting around a float kernel), read from ORT's own kernel registry."""
    from onnxruntime.capi.onnxruntime_pybind11_state import get_all_opkernel_def

    registered: dict[tuple[str, str], set[int]] = {}
    for kernel in get_all_opkernel_def():
        if kernel.provider == "CPUExecutionProvider":
            types = {t for allowed in kernel.type_constraints.values() for t in allowed}
            registered.setdefault((kernel.domain, kernel.op_name), set()).update(
                getattr(TensorProto, t[len("tensor("):-1].upper()) for t in types
                if t.startswith("tensor(") and hasattr(TensorProto, t[len("tensor("):-1].upper()))
    fused = [entry for entry in OPS.values() if entry.domain]
    assert fused
    for entry in fused:
        assert TensorProto.FLOAT in entry.kernel_dtypes, entry.name
        ort_types = registered[(entry.domain, entry.onnx_types[0])] | {TensorProto.FLOAT16}
        assert set(entry.kernel_dtypes) <= ort_types, entry.name


def test_contrib_nodes_decode_by_domain_and_round_trip() -> None:
    model = _contrib_model()
    graph = graph_from_model(model)
    assert [n.op for n in graph.nodes] == ["ms_gelu", "skip_layernorm", "fused_matmul"]
    assert graph.nodes[2].attrs["alpha"] == 0.5 and graph.nodes[2].attrs["transB"] == 1
    written = to_model_proto(graph, reuse_protos=False)
    assert list(written.opset_import) == list(model.opset_import)
    feeds = {n: np.random.default_rng(1).standard_normal((2, 3, 8)).astype(np.float32) for n in "xr"}
    run = [ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
           for m in (model, written)]
    np.testing.assert_allclose(run[0], run[1], rtol=1e-6, atol=1e-6)


def _attention_model(**attrs: float) -> onnx.ModelProto:
    node = helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["y"], domain=MS, **attrs)
    shapes = {"q": (2, 3, 8), "k": (2, 5, 8), "v": (2, 5, 4)}
    graph = helper.make_graph([node], "attention",
                              [helper.make_tensor_value_info(n, FLOAT, s) for n, s in shapes.items()],
                              [helper.make_tensor_value_info("y", FLOAT, (2, 3, 4))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)],
                             ir_version=8)


@pytest.mark.parametrize("attrs", [{"num_heads": 2}, {"num_heads": 2, "scale": 0.3}, {"num_heads": 4, "scale": 1.0},
                                   {"num_heads": 1, "unidirectional": 0}], ids=str)
def test_multi_head_attention_decodes_and_round_trips(attrs: dict) -> None:
    """The three-input form decodes into mha, its scale as given (0, the default: 1/sqrt(head size) when run),
    and is written back with the attributes it was read with (``unidirectional`` 0, the default, left out)."""
    model = _attention_model(**attrs)
    graph = graph_from_model(model)
    (node,) = graph.nodes
    assert node.op == "mha" and node.attrs["num_heads"] == attrs["num_heads"]
    assert node.attrs["scale"] == attrs.get("scale", 0.0)  # as given (the shortest decimal of its float32)
    written = to_model_proto(graph, reuse_protos=False)
    (proto,) = written.graph.node
    assert (proto.op_type, proto.domain) == ("MultiHeadAttention", MS)
    read = {a.name: helper.get_attribute_value(a) for a in model.graph.node[0].attribute}
    assert {a.name: helper.get_attribute_value(a) for a in proto.attribute} == {
        k: v for k, v in read.items() if (k, v) != ("unidirectional", 0)}
    rng = np.random.default_rng(5)
    feeds = {vi.name: rng.standard_normal([d.dim_value for d in vi.type.tensor_type.shape.dim]).astype(np.float32)
             for vi in model.graph.input}
    run = [ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
           for m in (model, written)]
    np.testing.assert_array_equal(run[0], run[1])
    (want,) = OPS["mha"].evaluate(np, [feeds[n] for n in "qkv"], node.attrs)
    np.testing.assert_allclose(want, run[0], rtol=RTOL, atol=RTOL)


def _packed_attention_model(**attrs: object) -> onnx.ModelProto:
    """Attention as ORT's transformer optimizer writes it: the weights and bias initializers."""
    sizes = attrs.get("qkv_hidden_sizes") or (8, 8, 8)
    rng = np.random.default_rng(6)
    inits = [helper.make_tensor(n, FLOAT, s, rng.standard_normal(s).astype(np.float32).ravel())
             for n, s in (("w", (4, sum(sizes))), ("b", (sum(sizes),)))]
    node = helper.make_node("Attention", ["x", "w", "b"], ["y"], domain=MS, **attrs)
    graph = helper.make_graph([node], "attention", [helper.make_tensor_value_info("x", FLOAT, (2, 3, 4))],
                              [helper.make_tensor_value_info("y", FLOAT, (2, 3, sizes[2]))], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)],
                             ir_version=8)


@pytest.mark.parametrize("attrs", [{"num_heads": 2}, {"num_heads": 2, "scale": 0.3},
                                   {"num_heads": 2, "qkv_hidden_sizes": [8, 8, 4]},
                                   {"num_heads": 4, "scale": 1.0, "qkv_hidden_sizes": [8, 8, 8]},
                                   {"num_heads": 1, "unidirectional": 0}], ids=str)
def test_attention_decodes_and_round_trips(attrs: dict) -> None:
    """The three-input form decodes into attention, its scale and qkv_hidden_sizes as given (0 and (): the
    defaults), and is written back with the attributes it was read with (``unidirectional`` 0 left out): ORT's
    outputs of the two models are identical, and the op's kernel agrees with them."""
    model = _packed_attention_model(**attrs)
    graph = graph_from_model(model)
    (node,) = graph.nodes
    assert node.op == "attention" and node.attrs["num_heads"] == attrs["num_heads"]
    assert node.attrs["scale"] == attrs.get("scale", 0.0)
    assert node.attrs["qkv_hidden_sizes"] == tuple(attrs.get("qkv_hidden_sizes", ()))
    written = to_model_proto(graph, reuse_protos=False)
    (proto,) = written.graph.node
    assert (proto.op_type, proto.domain, list(proto.input)) == ("Attention", MS, ["x", "w", "b"])
    read = {a.name: helper.get_attribute_value(a) for a in model.graph.node[0].attribute}
    assert {a.name: helper.get_attribute_value(a) for a in proto.attribute} == {
        k: v for k, v in read.items() if (k, v) != ("unidirectional", 0)}
    feeds = {"x": np.random.default_rng(5).standard_normal((2, 3, 4)).astype(np.float32)}
    run = [ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
           for m in (model, written)]
    np.testing.assert_array_equal(run[0], run[1])
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    (want,) = OPS["attention"].evaluate(np, [feeds["x"], weights["w"], weights["b"]], node.attrs)
    np.testing.assert_allclose(want, run[0], rtol=RTOL, atol=RTOL)


#: Attention's forms beside the plain one (which the first entry is, the control): a mask_index, a causal mask,
#: the present output used, rotary embedding, the heads missing
ATTENTION_FORMS = [
    (["a", "aw", "ab"], ["y"], {"num_heads": 2}),
    (["a", "aw", "ab", "am"], ["y"], {"num_heads": 2}),
    (["a", "aw", "ab"], ["y"], {"num_heads": 2, "unidirectional": 1}),
    (["a", "aw", "ab"], ["y", "present"], {"num_heads": 2}),
    (["a", "aw", "ab"], ["y"], {"num_heads": 2, "do_rotary": 1}),
    (["a", "aw", "ab"], ["y"], {})]


def test_the_plain_attention_form_decodes_where_its_other_forms_stay_opaque() -> None:
    """The control for the opaque forms below: in the same model the plain form is decoded."""
    model = _opaque_case_model(helper.make_node("Attention", *ATTENTION_FORMS[0][:2], domain=MS,
                                                **ATTENTION_FORMS[0][2]))
    assert [n.op for n in graph_from_model(model).nodes] == ["attention"]


def test_same_type_in_two_domains_decodes_to_two_ops() -> None:
    gelu20 = helper.make_node("Gelu", ["x"], ["y"])
    model = helper.make_model(helper.make_graph([gelu20, helper.make_node("Gelu", ["y"], ["z"], domain=MS)], "g",
                                                [helper.make_tensor_value_info("x", FLOAT, (2, 4))],
                                                [helper.make_tensor_value_info("z", FLOAT, (2, 4))]),
                              opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid(MS, 1)], ir_version=10)
    assert [n.op for n in graph_from_model(model).nodes] == ["gelu", "ms_gelu"]


@pytest.mark.parametrize("proto", [
    helper.make_node("Relu", ["x"], ["y"], domain="custom.domain"),  # a known type in an unknown domain
    helper.make_node("Gelu", ["x"], ["y"], domain="custom.domain"),
    helper.make_node("FastGelu", ["x"], ["y"]),  # a contrib type in the standard domain
    helper.make_node("QuickGelu", ["x"], ["y"], domain=MS, unknown_attr=1),
    helper.make_node("FusedConv", ["x4", "w"], ["y"], domain=MS, activation="LeakyRelu", activation_params=[0.1]),
    helper.make_node("FusedMatMul", ["x", "x"], ["y"], domain=MS, transBatchA=1),
    helper.make_node("SkipLayerNormalization", ["x", "x", "g"], ["y", "mean"], domain=MS),
    # MultiHeadAttention's other forms: a bias, a causal mask, the present key used, a mask's fill value, a
    # packed (BNSH, rank-4) key and value, the heads missing
    *(helper.make_node("MultiHeadAttention", inputs, outputs, domain=MS, **attrs) for inputs, outputs, attrs in (
        (["q", "q", "q", "qb"], ["y"], {"num_heads": 2}),
        (["q", "q", "q"], ["y"], {"num_heads": 2, "unidirectional": 1}),
        (["q", "q", "q"], ["y", "present_k"], {"num_heads": 2}),
        (["q", "q", "q"], ["y"], {"num_heads": 2, "mask_filter_value": -1e4}),
        (["q", "k4", "k4"], ["y"], {"num_heads": 2}), (["q", "q", "q"], ["y"], {}))),
    *(helper.make_node("Attention", inputs, outputs, domain=MS, **attrs)
      for inputs, outputs, attrs in ATTENTION_FORMS[1:]),
], ids=lambda p: f"{p.domain or 'onnx'}:{p.op_type}")
def test_uncovered_forms_stay_opaque(proto: onnx.NodeProto) -> None:
    assert [n.op for n in graph_from_model(_opaque_case_model(proto)).nodes] == [OPAQUE]


def _opaque_case_model(proto: onnx.NodeProto) -> onnx.ModelProto:
    shapes = {"x": (2, 4), "x4": (1, 2, 5, 5), "w": (3, 2, 3, 3), "g": (4,), "q": (2, 3, 8), "qb": (24,),
              "k4": (2, 2, 5, 4), "a": (2, 3, 4), "aw": (4, 24), "ab": (24,), "am": (2,)}
    inputs = [helper.make_tensor_value_info(n, FLOAT, shapes[n]) for n in dict.fromkeys(proto.input)]
    outputs = [helper.make_tensor_value_info(o, FLOAT, None) for o in proto.output]
    imports = [helper.make_opsetid("", 17)] + [helper.make_opsetid(d, 1) for d in (MS, "custom.domain")]
    return helper.make_model(helper.make_graph([proto], "g", inputs, outputs), opset_imports=imports, ir_version=8)


def test_saving_imports_the_contrib_domain_only_when_a_fused_op_is_written() -> None:
    add = helper.make_node("Add", ["x", "r"], ["s"])
    norm = helper.make_node("LayerNormalization", ["s", "g", "b"], ["y"], axis=-1, epsilon=1e-5)
    inits = [helper.make_tensor(n, FLOAT, (8,), np.ones(8, np.float32)) for n in "gb"]
    model = helper.make_model(helper.make_graph([add, norm], "g",
                                                [helper.make_tensor_value_info(n, FLOAT, (2, 8)) for n in "xr"],
                                                [helper.make_tensor_value_info("y", FLOAT, (2, 8))], inits),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    graph = graph_from_model(model)
    assert [imp.domain for imp in to_model_proto(graph).opset_import] == [""]
    attrs = OPS["skip_layernorm"].normalize_attrs({"epsilon": 1e-5})
    fused = Node("skip_layernorm", ("x", "r", "g", "b"), ("y",), attrs, "fused")
    swapped = type(graph)((fused,), graph.inputs, graph.outputs, graph.types, graph.constants, graph.context)
    written = to_model_proto(swapped)
    assert [(imp.domain, imp.version) for imp in written.opset_import] == [("", 17), (MS, 1)]
    assert [(imp.domain, imp.version) for imp in model.opset_import] == [("", 17)]  # the input is untouched
    feeds = {n: np.random.default_rng(2).standard_normal((2, 8)).astype(np.float32) for n in "xr"}
    run = [ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
           for m in (model, written)]
    np.testing.assert_allclose(run[0], run[1], rtol=1e-5, atol=1e-5)


# ---- the shipped decomposition <-> fused rules ---------------------------------------------------

FUSION_RULES = os.path.join(os.path.dirname(__file__), "..", "rules", "new-fusion.json")


def _exported_block() -> onnx.ModelProto:
    """What exporters write: a residual Add into LayerNormalization, attention's Q @ K^T with K transposed by
    a Transpose, a Conv followed by a Sigmoid, a Gelu (opset 20) of a biased activation."""
    rng = np.random.default_rng(3)
    inits = [helper.make_tensor(n, FLOAT, s, rng.standard_normal(s).astype(np.float32).ravel())
             for n, s in (("g", (8,)), ("b", (8,)), ("w", (4, 2, 3, 3)), ("cb", (4,)), ("bias", (8,)))]
    nodes = [helper.make_node("Add", ["x", "r"], ["s"]),
             helper.make_node("LayerNormalization", ["s", "g", "b"], ["n"], axis=-1, epsilon=1e-5),
             helper.make_node("Add", ["n", "bias"], ["nb"]),
             helper.make_node("Gelu", ["nb"], ["y"]),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["att"]),
             helper.make_node("Conv", ["img", "w", "cb"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c"], ["cs"])]
    shapes = {"x": (2, 3, 8), "r": (2, 3, 8), "q": (1, 2, 5, 4), "k": (1, 2, 6, 4), "img": (1, 2, 6, 6)}
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info(n, FLOAT, s) for n, s in shapes.items()],
                              [helper.make_tensor_value_info(n, FLOAT, None) for n in ("y", "att", "cs")], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)


def _rewrite_all(graph, rules):  # noqa: ANN001, ANN202 - a Graph and parsed rules
    """Apply each rule at its first match until none matches (each rule here removes its own pattern)."""
    applied = []
    changed = True
    while changed:
        changed = False
        for rule in rules:
            match = next(find_matches(graph, rule), None)
            new = apply_match(graph, match) if match is not None else None
            if new is not None:
                graph, changed = new, True
                applied.append(rule.name)
    return graph, applied


def _outputs(model: onnx.ModelProto) -> list[np.ndarray]:
    rng = np.random.default_rng(4)
    feeds = {vi.name: rng.standard_normal([d.dim_value for d in vi.type.tensor_type.shape.dim]).astype(np.float32)
             for vi in model.graph.input}
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # run the nodes as written
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None,
                                                                                                           feeds)


def test_fusion_rules_fuse_an_exported_block_and_unfuse_it_back() -> None:
    rules = load_rules(FUSION_RULES)
    fuse = [r for r in rules if any(OPS[n.op].domain for n in r.dst)]
    unfuse = [r for r in rules if any(OPS[n.op].domain for n in r.src)]
    assert fuse and unfuse and len(fuse) + len(unfuse) == len(rules)
    model = _exported_block()
    graph = graph_from_model(model)
    fused, applied = _rewrite_all(graph, fuse)
    assert sorted(n.op for n in fused.nodes) == ["bias_gelu", "fused_conv", "fused_matmul", "skip_layernorm"]
    written = to_model_proto(fused)
    assert MS in {imp.domain for imp in written.opset_import}
    for got, want in zip(_outputs(written), _outputs(model), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    unfused, _ = _rewrite_all(fused, unfuse)
    assert sorted(n.op for n in unfused.nodes) == sorted(n.op for n in graph.nodes)
    for got, want in zip(_outputs(to_model_proto(unfused)), _outputs(model), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_every_fusion_rule_is_proved_and_checked() -> None:
    for rule in load_rules(FUSION_RULES):
        assert verify_rule(rule).status == "proved", rule.name
