"""xflow as an installed package meets it: ONNX Runtime is an extra, so a command that needs it and does not find it
says so in one line (exit 2) while the others keep working."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from xflow.cli.common import NO_ONNXRUNTIME

ROOT = Path(__file__).resolve().parents[1]


def relu_model(path: Path) -> str:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return str(path)


def run_without_onnxruntime(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``xflow ARGS`` in a fresh interpreter where ``import onnxruntime`` fails as it does where the package is
    missing: a sitecustomize on PYTHONPATH puts None in sys.modules (inherited by worker processes too)."""
    blocker = tmp_path / "no-onnxruntime"
    blocker.mkdir(exist_ok=True)
    (blocker / "sitecustomize.py").write_text('import sys\nsys.modules["onnxruntime"] = None\n')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(blocker), str(ROOT)]))
    return subprocess.run([sys.executable, "-m", "xflow.cli", *args], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)


def test_the_blocker_really_hides_onnxruntime(tmp_path):
    proc = run_without_onnxruntime(tmp_path, "--help")
    assert proc.returncode == 0
    blocked = subprocess.run([sys.executable, "-c", "import onnxruntime"], capture_output=True, text=True,
                             env=dict(os.environ, PYTHONPATH=str(tmp_path / "no-onnxruntime")))
    assert blocked.returncode != 0 and "ModuleNotFoundError" in blocked.stderr


@pytest.mark.parametrize("command", [
    ["optimize", "m.onnx", "o.onnx"],
    ["optimize", "m.onnx", "o.onnx", "--cost", "analytic"],
    ["bench", "squeezenet", "--small", "--out", "o.md"],
    ["run", "m.onnx", "--plan", "plan.json"],
    ["place", "m.onnx", "--topology", "cpu", "--out", "o.json"],
    ["place", "m.onnx", "--topology", "cpu", "--cost", "analytic", "--env", "real", "--out", "o.json"],
    ["place-calibrate", "m.onnx", "--topology", "cpu", "--out", "o.json"],
    ["denormals", "m.onnx", "--json", "o.json"],
])
def test_a_command_needing_onnxruntime_refuses_in_one_line(tmp_path, command):
    relu_model(tmp_path / "m.onnx")
    (tmp_path / "plan.json").write_text("{}")
    before = set(os.listdir(tmp_path)) | {"no-onnxruntime"}
    proc = run_without_onnxruntime(tmp_path, *command)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [f"xflow: error: {NO_ONNXRUNTIME}"]
    assert proc.stdout == ""
    assert set(os.listdir(tmp_path)) == before  # nothing written


def test_commands_not_needing_onnxruntime_keep_working(tmp_path):
    model = relu_model(tmp_path / "m.onnx")
    for command in (["--help"], ["optimize", "--help"], ["zoo", "squeezenet", "sq.onnx", "--small"],
                    ["rules", "stats", model, "--rules", str(ROOT / "rules" / "identities.json")],
                    ["verify-rules", str(ROOT / "rules" / "identities.json"), "--jobs", "1"],
                    ["place", model, "--topology", "4xgpu-pcie", "--cost", "analytic", "--steps", "2",
                     "--time-limit", "5", "--out", "plan.json", "-q"]):
        proc = run_without_onnxruntime(tmp_path, *command)
        assert proc.returncode == 0, (command, proc.stderr)
        assert "onnxruntime" not in proc.stderr, command
    assert (tmp_path / "sq.onnx").exists() and (tmp_path / "plan.json").exists()


def installed_layout(tmp_path: Path, rules_json: str | None) -> Path:
    """A site-packages folder as the wheel lays xflow out: the package, and the shipped rule file (when given)
    as its package data ``xflow/rules/data/default.json``; no repository around it."""
    site = tmp_path / "site"
    shutil.copytree(ROOT / "xflow", site / "xflow", ignore=shutil.ignore_patterns("__pycache__"))
    if rules_json is not None:
        (site / "xflow" / "rules" / "data").mkdir()
        (site / "xflow" / "rules" / "data" / "default.json").write_text(rules_json)
    return site


def run_installed(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(site))
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=site.parent,
                          timeout=300)


def test_in_a_checkout_the_shipped_rules_are_the_repositorys():
    from xflow.rules import default_rules_path, load_rules

    assert default_rules_path() == ROOT / "rules" / "default.json"
    assert len(load_rules()) > 100


def test_installed_the_shipped_rules_are_package_data(tmp_path):
    site = installed_layout(tmp_path, (ROOT / "rules" / "identities.json").read_text())
    proc = run_installed(site, "-c",
                         "import xflow.rules as r; print(r.default_rules_path()); print(len(r.load_rules()))")
    assert proc.returncode == 0, proc.stderr
    path, count = proc.stdout.split()
    assert Path(path) == site / "xflow" / "rules" / "data" / "default.json"
    assert int(count) == len(json.loads((ROOT / "rules" / "identities.json").read_text())["rules"]) > 0


@pytest.mark.parametrize("shipped", ["missing", "empty"])
def test_no_shipped_rules_is_an_error_not_a_copy(tmp_path, shipped):
    empty = json.dumps({"format": "xflow.rules/1", "rules": []})
    site = installed_layout(tmp_path, None if shipped == "missing" else empty)
    model = relu_model(tmp_path / "m.onnx")
    for command in (["optimize", model, str(tmp_path / "o.onnx"), "-q"], ["rules", "stats", model]):
        proc = run_installed(site, "-m", "xflow.cli", *command)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("xflow: error: ") and "default.json" in lines[0], proc.stderr
        assert ("missing" if shipped == "missing" else "holds no rules") in lines[0]
    assert not (tmp_path / "o.onnx").exists()


@pytest.mark.slow
def test_the_wheel_carries_rules_license_and_types(tmp_path):
    """Built as pip builds it (a copy of the checkout, so no build folder is left in it): the distribution name is
    free on PyPI's side (``xflow`` is another project), the license is PEP 639's, the rule files are package data,
    and only xflow is installed (the repository's generator/ and verifier/ as xflow.generator and xflow.verifier)."""
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__",
                                                                 ".pytest_cache", ".ruff_cache", ".hypothesis"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation",
                           "-w", str(tmp_path / "whl")],  # the dev extra's setuptools: no package index needed
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = (tmp_path / "whl").glob("*.whl")
    assert wheel.name.startswith("xflow_opt-")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    shipped = {f"xflow/rules/data/{p.name}" for p in (ROOT / "rules").glob("*.json")}
    assert "xflow/rules/data/default.json" in shipped and shipped <= names
    assert "xflow/py.typed" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert {n.split("/")[0] for n in names if "/" in n and ".dist-info" not in n} == {"xflow"}
    assert {"xflow/generator/walk.py", "xflow/verifier/prove.py"} <= names
    assert "Name: xflow-opt\n" in metadata and "License-Expression: Apache-2.0\n" in metadata
    assert 'Requires-Dist: onnxruntime>=1.18; extra == "cpu"' in metadata  # never a core dependency
    # installed from the wheel alone (no checkout around it): a zoo model is optimized with the shipped rules, and a
    # user's rule file is proved first, by the verifier the wheel carries as xflow.verifier
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target",
                           str(site), str(wheel)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    model = relu_model(tmp_path / "m.onnx")
    proc = run_installed(site, "-c", "import xflow.rules, xflow.verifier.user_rules as v; "
                                     "print(xflow.rules.default_rules_path()); print(v.__file__)")
    assert proc.returncode == 0, proc.stderr
    assert all(Path(line).is_relative_to(site) for line in proc.stdout.split()), proc.stdout
    user_rules = tmp_path / "user.json"
    shutil.copy(ROOT / "rules" / "identities.json", user_rules)
    proc = run_installed(site, "-m", "xflow.cli", "optimize", model, str(tmp_path / "o.onnx"), "--rules",
                         str(user_rules), "--report", "-", "-q")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["outcome"] != "no-rules"
