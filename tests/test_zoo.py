"""Tests for the benchmark model zoo (xflow.zoo)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from xflow import zoo
from xflow.zoo.transformer import SMALL as BERT_SMALL

# Output shapes of the small variants.
SMALL_OUTPUTS: dict[str, dict[str, tuple[int, ...]]] = {
    "resnet50": {"logits": (1, 1000)},
    "resnext50": {"logits": (1, 1000)},
    "inception_v3": {"logits": (1, 1000)},
    "squeezenet": {"logits": (1, 1000)},
    "bert": {"last_hidden_state": (1, 16, 64)},
    "nasnet_a": {"logits": (1, 1000)},
    "nasrnn": {"h_final": (1, 64)},
}

MAX_SMALL_NODES = 160


def _dims(vi: onnx.ValueInfoProto) -> tuple[int, ...]:
    dims = vi.type.tensor_type.shape.dim
    assert all(d.HasField("dim_value") for d in dims), f"{vi.name} has a symbolic dim"
    return tuple(d.dim_value for d in dims)


def _run(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    outs = sess.run(None, zoo.random_inputs(model, seed))
    return {o.name: v for o, v in zip(sess.get_outputs(), outs, strict=True)}


@pytest.fixture(scope="module")
def small_models() -> dict[str, onnx.ModelProto]:
    return {name: zoo.build(name, small=True, seed=0) for name in zoo.MODELS}


def test_registry_covers_expected_models() -> None:
    assert set(zoo.MODELS) == set(SMALL_OUTPUTS)


@pytest.mark.parametrize("name", sorted(SMALL_OUTPUTS))
def test_small_model_checks_and_runs(name: str, small_models: dict[str, onnx.ModelProto]) -> None:
    model = small_models[name]
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == 8
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    assert len(model.graph.node) <= MAX_SMALL_NODES
    # static shapes everywhere: inputs, outputs and every intermediate value
    for vi in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        _dims(vi)
    assert {n.output[0] for n in model.graph.node} <= {vi.name for vi in [*model.graph.value_info, *model.graph.output]}
    declared = {o.name: _dims(o) for o in model.graph.output}
    assert declared == SMALL_OUTPUTS[name]

    outs = _run(model)
    assert set(outs) == set(declared)
    for out_name, value in outs.items():
        assert value.shape == declared[out_name]
        assert value.dtype == np.float32
        assert np.isfinite(value).all()
        assert np.abs(value).max() > 0.0


def test_weights_are_seeded() -> None:
    a = zoo.build("nasrnn", small=True, seed=1)
    b = zoo.build("nasrnn", small=True, seed=1)
    c = zoo.build("nasrnn", small=True, seed=2)
    assert a.SerializeToString() == b.SerializeToString()
    assert a.graph.initializer[0].raw_data != c.graph.initializer[0].raw_data


def test_unique_names(small_models: dict[str, onnx.ModelProto]) -> None:
    for model in small_models.values():
        g = model.graph
        values = [o for n in g.node for o in n.output] + [t.name for t in g.initializer] + [i.name for i in g.input]
        assert len(values) == len(set(values))
        node_names = [n.name for n in g.node]
        assert all(node_names) and len(node_names) == len(set(node_names))


def test_bert_inputs_and_pattern(small_models: dict[str, onnx.ModelProto]) -> None:
    model = small_models["bert"]
    feeds = zoo.random_inputs(model, seed=3)
    assert set(feeds) == {"input_ids", "attention_mask"}
    assert feeds["input_ids"].dtype == np.int64 and feeds["input_ids"].shape == (1, 16)
    vocab = BERT_SMALL.vocab
    assert feeds["input_ids"].min() >= 0 and feeds["input_ids"].max() < vocab
    assert (feeds["attention_mask"] == 1).all()
    ops = [n.op_type for n in model.graph.node]
    for op in ("Gather", "LayerNormalization", "Erf", "Softmax", "Reshape", "Transpose", "Cast", "Unsqueeze"):
        assert op in ops
    assert ops.count("MatMul") == 2 * 8  # per layer: Q, K, V, QK^T, PV, out, FFN1, FFN2


def test_random_inputs_floats_in_range(small_models: dict[str, onnx.ModelProto]) -> None:
    feeds = zoo.random_inputs(small_models["nasrnn"], seed=0)
    assert set(feeds) == {"x_0", "x_1", "x_2", "h_0"}
    for v in feeds.values():
        assert v.dtype == np.float32 and v.shape == (1, 64)
        assert v.min() >= -1.0 and v.max() <= 1.0


def test_structural_features(small_models: dict[str, onnx.ModelProto]) -> None:
    def groups(model: onnx.ModelProto) -> set[int]:
        return {a.i for n in model.graph.node if n.op_type == "Conv" for a in n.attribute if a.name == "group"}

    assert groups(small_models["resnet50"]) == {1}
    assert 32 in groups(small_models["resnext50"])
    assert len(groups(small_models["nasnet_a"])) > 1  # depthwise convs
    # nasrnn: 8 MatMuls per step share the input x_t
    nasrnn = small_models["nasrnn"]
    assert sum(1 for n in nasrnn.graph.node if n.op_type == "MatMul" and n.input[0] == "x_0") == 8


def test_unknown_name_lists_valid_names() -> None:
    with pytest.raises(KeyError) as info:
        zoo.build("alexnet")
    msg = str(info.value)
    assert "alexnet" in msg
    for name in zoo.MODELS:
        assert name in msg


def test_full_squeezenet_builds_and_runs() -> None:
    model = zoo.build("squeezenet")
    onnx.checker.check_model(model, full_check=True)
    assert _dims(model.graph.input[0]) == (1, 3, 224, 224)
    out = _run(model)["logits"]
    assert out.shape == (1, 1000)
    assert np.isfinite(out).all()
