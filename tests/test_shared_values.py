"""Values computed twice, read once (``xflow.rewrite.share``): ALBERT's shared layer repeats its attention mask's
``Where`` twelve times over copies of the same constants; the copies become one constant and the repeats one node,
the outputs bit for bit the same, the step certified and re-derived by ``xflow check``, and a false claim refused."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from xflow.check.certificate import carried
from xflow.check.replay import StepRefused, replay
from xflow.cli import main
from xflow.onnx_io import graph_from_model, to_model_proto
from xflow.ort import open_session
from xflow.rewrite.share import KIND, share_values

LAYERS = 3


def _layers(last_fill: float = -1e4, seeded: bool = False) -> onnx.ModelProto:
    """Each layer: ``Where(mask, 0, fill) + Relu(h)``, with its own copies of 0 and the fill (the last layer's
    fill ``last_fill``); ``seeded``: the mask a RandomUniformLike of it (not a function of its input)."""
    nodes, inits = [], []
    h = "x"
    mask = "m"
    if seeded:
        nodes.append(helper.make_node("RandomUniformLike", ["x"], ["r"], seed=1.0))
        nodes.append(helper.make_node("Greater", ["r", "half"], ["m"]))
        inits.append(numpy_helper.from_array(np.array(0.5, np.float32), "half"))
    for k in range(LAYERS):
        fill = last_fill if k == LAYERS - 1 else -1e4
        inits += [numpy_helper.from_array(np.array(0.0, np.float32), f"zero{k}"),
                  numpy_helper.from_array(np.array(fill, np.float32), f"fill{k}")]
        nodes += [helper.make_node("Where", [mask, f"zero{k}", f"fill{k}"], [f"bias{k}"], name=f"where{k}"),
                  helper.make_node("Relu", [h], [f"r{k}"]), helper.make_node("Add", [f"r{k}", f"bias{k}"], [f"h{k}"])]
        h = f"h{k}"
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])]
    if not seeded:
        inputs.append(helper.make_tensor_value_info("m", TensorProto.BOOL, [2, 8]))
    graph = helper.make_graph(nodes, "layers", inputs, [helper.make_tensor_value_info(h, TensorProto.FLOAT, [2, 8])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _feeds() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"x": rng.standard_normal((2, 8)).astype(np.float32), "m": rng.random((2, 8)) > 0.5}


def _same_outputs(a: onnx.ModelProto, b: onnx.ModelProto) -> None:
    for x, y in zip(open_session(a.SerializeToString()).run(None, _feeds()),
                    open_session(b.SerializeToString()).run(None, _feeds()), strict=True):
        assert np.array_equal(x, y)


def test_copies_of_a_constant_become_one_and_repeated_nodes_one():
    model = _layers()
    step = share_values(graph_from_model(model))
    assert step is not None and step.removed == ("where1", "where2")
    written = to_model_proto(step.graph, constant_nodes=False)
    ops = [n.op_type for n in written.graph.node]
    assert ops.count("Where") == 1 and len(written.graph.initializer) == 2
    _same_outputs(model, written)


def test_a_node_on_other_values_stays():
    step = share_values(graph_from_model(_layers(last_fill=-1e5)))  # the last layer's fill differs
    assert step is not None and step.removed == ("where1",)


def test_an_op_that_is_not_a_function_of_its_inputs_is_not_shared():
    model = _layers(seeded=True)
    model.graph.node.insert(1, helper.make_node("RandomUniformLike", ["x"], ["r2"], seed=1.0))
    model.graph.output.append(helper.make_tensor_value_info("r2", TensorProto.FLOAT, [2, 8]))
    step = share_values(graph_from_model(model))
    assert step is not None
    assert "r2" not in step.shared and "r" not in step.shared


def test_the_step_replays_and_false_claims_are_refused():
    graph = graph_from_model(_layers(last_fill=-1e5))
    step = share_values(graph)
    certificate = {"input": {"graph": graph.structural_hash}, "steps": [step.record()],
                   "output": {"graph": step.graph.structural_hash}}
    assert replay(graph, certificate, {}).graph.structural_hash == step.graph.structural_hash
    for claim, why in ((("fill2", "fill0"), "not equal constants"), (("bias2", "bias0"), "not the same op")):
        record = step.record()
        record["shared"][claim[0]] = claim[1]
        with pytest.raises(StepRefused, match=f"shared values: .*{why}"):
            replay(graph, {**certificate, "steps": [record]}, {})


def test_optimize_writes_one_mask_and_check_re_derives_it(tmp_path):
    src, out, report = tmp_path / "in.onnx", tmp_path / "out.onnx", tmp_path / "report.json"
    model = _layers()
    onnx.save(model, str(src))
    result = CliRunner().invoke(main, ["optimize", str(src), str(out), "--cost", "analytic", "--keep-if-slower",
                                       "--report", str(report)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "repeated values:" in result.output and "2 nodes deleted" in result.output
    assert json.loads(report.read_text())["shared_nodes_deleted"] == 2
    written = onnx.load(str(out))
    assert [n.op_type for n in written.graph.node].count("Where") == 1
    assert written.graph.input == model.graph.input and written.graph.output == model.graph.output
    _same_outputs(model, written)
    assert json.loads(carried(written))["steps"][-1]["kind"] == KIND
    checked = CliRunner().invoke(main, ["check", str(src), str(out)], catch_exceptions=False)
    assert checked.exit_code == 0, checked.output


def test_a_scalar_and_a_one_element_vector_are_not_one_constant():
    model = _layers()
    for init in model.graph.initializer:
        if init.name == "zero1":
            init.CopyFrom(numpy_helper.from_array(np.array([0.0], np.float32), "zero1"))
    step = share_values(graph_from_model(model))
    assert "zero1" not in step.shared and "bias1" not in step.shared
