"""``xflow denormals``: each side timed in processes of its own, the outputs of both compared, bad input refused in
one line. Speed itself is measured in benchmarks, not asserted here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from xflow.denormals import NodeTime, _Child, _largest_savings, check_denormals, rank_test_p

# float32's smallest normal is about 1.18e-38: this scale is a denormal, which a flushed session reads as zero
DENORMAL = np.float32(1e-39)


def _model(path: Path, scale: np.float32 | None) -> Path:
    """y = x * scale (a denormal constant gives denormal outputs), or y = relu(x) with no scale."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])
    if scale is None:
        nodes, inits = [helper.make_node("Relu", ["x"], ["y"])], []
    else:
        nodes = [helper.make_node("Mul", ["x", "s"], ["y"])]
        inits = [helper.make_tensor("s", TensorProto.FLOAT, [], [float(scale)])]
    graph = helper.make_graph(nodes, "g", [x], [y], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def _ours(scratch: Path) -> list[Path]:
    """What the command left in a temporary folder: its scratch folders (the libraries it imports write files of
    their own there: ONNX Runtime a ``.ses``, some builds a ``mat-debug-*.log``)."""
    return [p for p in scratch.iterdir() if p.name.startswith("xflow-denormals-")]


def _cli(*args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TMPDIR": str(tmp)}
    return subprocess.run([sys.executable, "-m", "xflow.cli", "denormals", *args], capture_output=True, text=True,
                          env=env, timeout=300, check=False)


def test_flushed_outputs_are_compared_with_the_default_ones(tmp_path: Path) -> None:
    check = check_denormals(str(_model(tmp_path / "m.onnx", DENORMAL)), threads=1, processes=2, seconds=0)
    assert len(check.default_ms) == len(check.flushed_ms) == 2 and min(check.default_ms + check.flushed_ms) > 0
    assert not check.identical  # the flushed session computes zeros where the default one gives denormals
    assert 0 < check.max_abs_diff["y"] < 1.2e-38
    plain = check_denormals(str(_model(tmp_path / "r.onnx", None)), threads=1, processes=2, seconds=0)
    assert plain.identical and plain.max_abs_diff == {"y": 0.0}


def test_a_profiled_process_gives_each_nodes_kernel_time(tmp_path: Path) -> None:
    child = _Child(str(_model(tmp_path / "m.onnx", DENORMAL)), threads=1, seconds=0, seed=0, shapes={},
                   inputs_npz=None)
    nodes = child.run(True, profile=str(tmp_path))["nodes"]
    assert list(nodes) == ["Mul"] or [op for op, _ in nodes.values()] == ["Mul"]
    assert all(ms >= 0 for _, ms in nodes.values())
    assert not list(tmp_path.glob("profile*"))  # the profile file is read and removed


def test_the_nodes_named_are_those_flushing_saved_most_in() -> None:
    default = {"a": ["MatMul", 3.7], "b": ["Softmax", 1.2], "c": ["Add", 0.1], "gone": ["Mul", 5.0]}
    flushed = {"a": ["MatMul", 0.4], "b": ["Softmax", 0.4], "c": ["Add", 0.2]}
    assert _largest_savings(default, flushed, 5) == [NodeTime("a", "MatMul", 3.7, 0.4),
                                                    NodeTime("b", "Softmax", 1.2, 0.4)]
    assert _largest_savings(default, flushed, 1) == [NodeTime("a", "MatMul", 3.7, 0.4)]


def test_the_rank_test_over_processes() -> None:
    assert rank_test_p([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == pytest.approx(1 / 252)
    assert rank_test_p([6, 7, 8, 9, 10], [1, 2, 3, 4, 5]) == 1.0
    assert rank_test_p([1, 2, 3, 4, 6], [5, 7, 8, 9, 10]) == pytest.approx(2 / 252)
    assert rank_test_p([1.0, 1.0], [1.0, 1.0]) == 1.0  # ties: no evidence either way


def test_the_command_reports_each_model_and_writes_json(tmp_path: Path) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    model = _model(tmp_path / "m.onnx", DENORMAL)
    run = _cli(str(model), "--threads", "1", "--processes", "2", "--seconds", "0", "--json",
               str(tmp_path / "d.json"), tmp=scratch)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith(f"{model}: ") and "set_denormal_as_zero=1" in run.stdout
    assert "outputs on seed 0: max abs diff" in run.stdout
    figures = json.loads((tmp_path / "d.json").read_text())
    assert [f["model"] for f in figures] == [str(model)] and figures[0]["identical"] is False
    assert _ours(scratch) == []  # the children's outputs are gone


@pytest.mark.parametrize("problem", ["missing", "not onnx", "refused by ORT"])
def test_bad_input_is_one_line_and_nothing_is_left(tmp_path: Path, problem: str) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    path = tmp_path / "bad.onnx"
    if problem == "not onnx":
        path.write_bytes(b"\x00garbage")
    elif problem == "refused by ORT":  # a valid model of an op in a domain ONNX Runtime has no kernel for
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
        graph = helper.make_graph([helper.make_node("Frob", ["x"], ["y"], domain="acme")], "g", [x],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("acme", 1)])
        model.ir_version = 8
        onnx.save(model, path)
    run = _cli(str(path), "--threads", "1", "--processes", "2", "--seconds", "0", "--json", str(tmp_path / "d.json"),
               tmp=scratch)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"xflow: error: {path}: ")
    assert not (tmp_path / "d.json").exists() and _ours(scratch) == []
