"""1-D convolutions (SqueezeBERT's linear layers, wav2vec2's and Whisper's feature convs) in the algebra: decoded
as the 2-D conv of a unit-height image between an unsqueeze and a squeeze, written back as the original node while
untouched, and computing the original's function when re-encoded (as a rewrite writes it)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from xflow.onnx_io import graph_from_model, to_model_proto
from xflow.ort import open_session


def _conv1d_model(length: int | str = 17, dilations: list[int] | None = None, kernel_input: bool = False
                  ) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((8, 3, 3)).astype(np.float32), "w1")
    b1 = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b1")
    w2 = numpy_helper.from_array(rng.standard_normal((4, 8, 4)).astype(np.float32), "w2")
    extra = {"dilations": dilations} if dilations else {}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="grouped", group=2, strides=[2], pads=[1, 2],
                              **extra),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu"),
             helper.make_node("Conv", ["r1", "w2"], ["y"], name="same", auto_pad="SAME_UPPER")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6, length])]
    initializers = [w1, b1, w2]
    if kernel_input:
        initializers = [b1, w2]
        inputs.append(helper.make_tensor_value_info("w1", TensorProto.FLOAT, [8, 3, 3]))
    model = helper.make_model(helper.make_graph(
        nodes, "conv1d", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, None])], initializers),
        opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return open_session(model, threads=1).run(None, {"x": x})[0]


def test_a_1d_conv_is_a_2d_conv_between_unsqueeze_and_squeeze():
    graph = graph_from_model(_conv1d_model())
    ops = [n.op for n in graph.nodes]
    assert ops == ["unsqueeze", "conv", "squeeze", "relu", "unsqueeze", "conv", "squeeze"]
    first, second = (n for n in graph.nodes if n.op == "conv")
    assert first.attrs["strides"] == (1, 2) and first.attrs["pads"] == (0, 1, 0, 2) and first.attrs["group"] == 2
    assert second.attrs["pads"] == (0, 1, 0, 2)  # SAME_UPPER of a width-4 kernel: 1 before, 2 after
    assert graph.constants[first.inputs[1]].value().shape == (8, 3, 1, 3)


def test_untouched_it_is_written_back_as_the_original_node():
    model = _conv1d_model()
    written = to_model_proto(graph_from_model(model))
    assert list(written.graph.node) == list(model.graph.node)
    assert {t.name for t in written.graph.initializer} == {"w1", "b1", "w2"}  # no laid-out kernel written


@pytest.mark.parametrize("length", [17, 4, 1])
def test_re_encoded_it_computes_the_original(length):
    model = _conv1d_model(length)
    x = np.random.default_rng(1).standard_normal((2, 6, length)).astype(np.float32)
    re_encoded = to_model_proto(graph_from_model(model), reuse_protos=False)
    assert "Unsqueeze" in {n.op_type for n in re_encoded.graph.node}
    np.testing.assert_allclose(_run(re_encoded, x), _run(model, x), rtol=1e-5, atol=1e-5)


def test_a_dynamic_length_is_decoded_and_computes_the_original_at_every_length():
    model = _conv1d_model("length")
    graph = graph_from_model(model)
    assert sum(n.op == "conv" for n in graph.nodes) == 2
    re_encoded = to_model_proto(graph, reuse_protos=False)
    for length in (5, 30):
        x = np.random.default_rng(length).standard_normal((2, 6, length)).astype(np.float32)
        np.testing.assert_allclose(_run(re_encoded, x), _run(model, x), rtol=1e-5, atol=1e-5)


def test_variants_outside_the_algebra_stay_opaque():
    dilated = graph_from_model(_conv1d_model(dilations=[2]))
    assert [n.op for n in dilated.nodes][:2] == ["opaque", "relu"]
    computed_kernel = graph_from_model(_conv1d_model(kernel_input=True))
    assert [n.op for n in computed_kernel.nodes][:2] == ["opaque", "relu"]
