"""The select stage's finalist files: every graph as its own model, the weights they share written once to one
data file that ONNX Runtime maps, so that a session of each finalist at once holds the model's weights once."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from xflow.onnx_io import graph_from_model
from xflow.onnx_io.load import load
from xflow.onnx_io.shared_weights import write_sharing_weights
from xflow.ort import open_session
from xflow.runtime import random_feeds

WEIGHT_BYTES = 256 * 256 * 4


def _two_matmuls(seed: int) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    weights = [numpy_helper.from_array((rng.standard_normal((256, 256)) / 16).astype(np.float32), name)
               for name in ("W", "V")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("MatMul", ["h", "V"], ["y"])]
    model = helper.make_model(helper.make_graph(
        nodes, "two", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 256])], weights),
        opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_graphs_share_one_copy_of_each_weight_and_run_as_their_models(tmp_path):
    graph = graph_from_model(_two_matmuls(0))
    twin = graph.with_nodes(graph.nodes)  # the same weight objects, as a rewrite of the graph keeps them
    other = graph_from_model(_two_matmuls(1))  # weights of its own
    files = write_sharing_weights([graph, twin, other], str(tmp_path), "finalist")
    assert [os.path.basename(p) for p in files.model_paths] == ["finalist0.onnx", "finalist1.onnx", "finalist2.onnx"]
    size = os.path.getsize(files.data_path)
    assert 4 * WEIGHT_BYTES <= size < 4 * WEIGHT_BYTES + 4 * 4096  # four weights, not six: the twin's are shared
    feeds = random_feeds(open_session(_two_matmuls(0)), 0)
    for path, seed in zip(files.model_paths, (0, 0, 1), strict=True):
        expected = open_session(_two_matmuls(seed)).run(None, feeds)[0]
        np.testing.assert_array_equal(open_session(path).run(None, feeds)[0], expected)
    files.remove()
    assert not list(tmp_path.iterdir())


def test_a_graph_reading_external_weights_is_refused_and_nothing_is_left(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    onnx.save(_two_matmuls(0), source / "m.onnx", save_as_external_data=True, location="m.onnx.data",
              size_threshold=1024)
    external = load(str(source / "m.onnx"))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ValueError, match="external"):
        write_sharing_weights([graph_from_model(_two_matmuls(0)), external], str(out), "finalist")
    assert not list(out.iterdir())
