"""`xflow place`, `xflow run --plan`, `xflow place-calibrate` as a user meets them, bad input included."""

from __future__ import annotations

import json
import os

import onnx
import pytest
from click.testing import CliRunner

from tests.test_placement import branches_model
from xflow import zoo
from xflow.cli import main
from xflow.placement.calibrate import kendall_tau
from xflow.placement.plan import DEVICE_KEY


def invoke(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    paths = {}
    for name in ("squeezenet", "inception_v3", "nasrnn"):
        paths[name] = str(folder / f"{name}.onnx")
        onnx.save(zoo.build(name, small=True), paths[name])
    paths["branches"] = str(folder / "branches.onnx")
    onnx.save(branches_model(), paths["branches"])
    return paths


def test_place_writes_plan_curve_and_annotated_model_then_run_executes_it(tmp_path, models):
    plan_path, onnx_out, curve = (str(tmp_path / n) for n in ("plan.json", "placed.onnx", "curve.png"))
    result = invoke("place", models["inception_v3"], "--topology", "cpu", "--cost", "analytic", "--steps", "20",
                    "--time-limit", "6", "--out", plan_path, "--onnx-out", onnx_out, "--curve", curve)
    assert result.exit_code == 0, result.output
    for name in ("single:cpu0", "single:cpu1", "round-robin", "min-cut", "m-etf", "rl"):
        assert name in result.output
    plan = json.loads(open(plan_path).read())
    assert plan["format"] == "xflow-plan/1" and plan["topology"]["name"] == "cpu"
    assert set(plan["placement"].values()) <= {"cpu0", "cpu1"} and plan["nodes"] == len(plan["placement"])
    assert plan["step_seconds"] == min([*plan["baselines"].values(), plan["rl"]["seconds"],
                                        *plan["rl"]["improved_from"].values()])
    assert f"* {plan['chosen']}" in result.output  # the chosen placement is printed and marked
    assert open(curve, "rb").read(4) == b"\x89PNG"
    tagged = [n for n in onnx.load(onnx_out).graph.node if any(e.key == DEVICE_KEY for e in n.metadata_props)]
    assert len(tagged) == len(onnx.load(models["inception_v3"]).graph.node)
    ran = invoke("run", models["inception_v3"], "--plan", plan_path, "--runs", "3")
    assert ran.exit_code == 0, ran.output
    assert "ms median of 3 runs" in ran.output and "outputs match" in ran.output


def test_train_on_several_models_then_place_an_unseen_one_zero_shot(tmp_path, models):
    policy = str(tmp_path / "policy.npz")
    result = invoke("place", "--train-on", models["squeezenet"], "--train-on", models["nasrnn"], "--topology",
                    "4xgpu-pcie", "--cost", "analytic", "--steps", "15", "--save-policy", policy)
    assert result.exit_code == 0, result.output
    assert os.path.exists(policy) and "trained on squeezenet.onnx" in result.output
    plan_path = str(tmp_path / "plan.json")
    placed = invoke("place", models["branches"], "--topology", "4xgpu-pcie", "--cost", "analytic",
                    "--policy", policy, "--no-improve", "--out", plan_path)
    assert placed.exit_code == 0, placed.output
    plan = json.loads(open(plan_path).read())
    assert plan["rl"]["mode"] == "zero-shot" and plan["feasible"]
    # the plan written is the best of the zero-shot policy's and the baselines'
    assert plan["step_seconds"] == min([plan["rl"]["seconds"], *plan["baselines"].values()])
    tuned = invoke("place", models["branches"], "--topology", "4xgpu-pcie", "--cost", "analytic", "--policy", policy,
                   "--fine-tune", "--steps", "5", "--time-limit", "0", "--no-improve", "--out", plan_path)
    assert tuned.exit_code == 0, tuned.output
    plan = json.loads(open(plan_path).read())
    assert plan["rl"]["mode"] == "fine-tuned" and plan["rl"]["steps"] == 5
    assert plan["rl"]["seconds"] <= plan["rl"]["zero_shot_seconds"]
    wrong = invoke("place", models["branches"], "--topology", "cpu", "--cost", "analytic", "--policy", policy)
    assert wrong.exit_code == 2 and "trained for 5 devices" in wrong.output


def test_place_with_the_real_executor(tmp_path, models):
    plan_path = str(tmp_path / "plan.json")
    result = invoke("place", models["branches"], "--topology", "cpu", "--env", "real", "--cost", "analytic",
                    "--steps", "3", "--samples", "4", "--no-improve", "--out", plan_path)
    assert result.exit_code == 0, result.output
    assert json.loads(open(plan_path).read())["env"] == "real"


def test_place_calibrate_reports_tau(tmp_path, models):
    out = str(tmp_path / "cal.json")
    result = invoke("place-calibrate", models["branches"], "--cost", "analytic", "--placements", "6",
                    "--fit-placements", "4", "--runs", "2", "--rounds", "4", "--out", out)
    assert result.exit_code == 0, result.output
    report = json.loads(open(out).read())
    # a small model has few distinct placements beside the fit set: as many as there are, at most 6
    assert 2 <= report["placements"] <= 6 and report["rounds"] == 4
    assert report["placements"] == len(report["measured"]) == len(report["simulated"])
    assert report["tau"] == kendall_tau(report["simulated"], report["measured"]) and "compute_scale" in report["params"]
    assert -1 <= report["tau_measurement_split_half"] <= 1 and "agree with themselves" in result.output
    plan_path = str(tmp_path / "plan.json")
    calibrated = invoke("place", models["branches"], "--topology", "cpu", "--cost", "analytic", "--steps", "5",
                        "--calibration", out, "--out", plan_path)
    assert calibrated.exit_code == 0, calibrated.output
    assert json.loads(open(plan_path).read())["simulator"] == report["params"]


def bad(tmp_path, *args: str) -> str:
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("xflow: error: "), result.output
    assert not [p for p in os.listdir(tmp_path) if p.endswith((".json", ".png", ".npz", "out.onnx"))]
    return lines[0]


def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, models):
    out = str(tmp_path / "plan.json")
    missing = str(tmp_path / "missing.onnx")
    assert "missing.onnx: no such file" in bad(tmp_path, "place", missing, "--topology", "cpu", "--out", out)
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(b"not a model")
    assert "corrupt.onnx" in bad(tmp_path, "place", str(corrupt), "--topology", "cpu", "--cost", "analytic",
                                 "--out", out)
    assert "9xtpu: no such topology" in bad(tmp_path, "place", models["branches"], "--topology", "9xtpu",
                                           "--out", out)
    topo = tmp_path / "topo.txt"
    topo.write_text('{"devices": [{"name": "a", "kind": "tpu"}]}')
    assert "topo.txt: malformed topology" in bad(tmp_path, "place", models["branches"], "--topology", str(topo),
                                                 "--out", out)
    unwritable = str(tmp_path / "no-such-dir" / "plan.json")
    assert "cannot write" in bad(tmp_path, "place", models["branches"], "--topology", "cpu", "--out", unwritable)
    assert "no such plan file" in bad(tmp_path, "run", models["branches"], "--plan", str(tmp_path / "nope.txt"))
    plan_text = tmp_path / "plan.txt"
    plan_text.write_text("{")
    assert "plan.txt: malformed plan" in bad(tmp_path, "run", models["branches"], "--plan", str(plan_text))
    good = str(tmp_path / "good.txt")
    assert invoke("place", models["branches"], "--topology", "cpu", "--cost", "analytic", "--steps", "2",
                  "--no-improve", "--out", good, "-q").exit_code == 0
    assert "does not match the model" in bad(tmp_path, "run", models["squeezenet"], "--plan", good)


def test_optimize_then_place(tmp_path, models):
    out = str(tmp_path / "opt.onnx")
    result = invoke("optimize", models["branches"], out, "--cost", "analytic", "--budget", "5",
                    "--keep-if-slower", "--place", "4xgpu-pcie", "--place-time-limit", "2")
    assert result.exit_code == 0, result.output
    plan = json.loads(open(str(tmp_path / "opt.plan.json")).read())
    assert plan["topology"]["name"] == "4xgpu-pcie" and "m-etf" in plan["baselines"]
    bad_topology = invoke("optimize", models["branches"], str(tmp_path / "other.onnx"), "--cost", "analytic",
                          "--place", "9xtpu")
    assert bad_topology.exit_code == 2 and "9xtpu" in bad_topology.output
    assert not os.path.exists(str(tmp_path / "other.onnx"))


def test_progress_shows_on_a_tty_only(models, capsys, monkeypatch):
    from xflow.cli import progress

    piped = invoke("place", models["branches"], "--topology", "cpu", "--cost", "analytic", "--steps", "3",
                   "--time-limit", "2")
    assert piped.exit_code == 0 and "training:" not in piped.output and "improving" not in piped.output
    monkeypatch.setattr(progress.sys.stderr, "isatty", lambda: True)
    status = progress.status_line(quiet=False)
    assert status is not None and progress.status_line(quiet=True) is None
    status("training: step 1, best 2.000 ms")
    status.last = 0.0  # the next message is not throttled
    status("improving")
    status.clear()
    err = capsys.readouterr().err
    assert err.startswith("\rtraining: step 1, best 2.000 ms\rimproving") and err.endswith("\r")


def _digest(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


@pytest.mark.parametrize("flag", ["--out", "--onnx-out", "--curve", "--save-policy"])
def test_place_refuses_to_write_over_its_input(tmp_path, flag):
    """#59 defect 3: ``--out in.onnx`` replaced the model with the plan, ``--onnx-out in.onnx`` with the
    annotated model, both exiting 0. Every output that names a file the command reads is refused."""
    src = str(tmp_path / "in.onnx")
    onnx.save(branches_model(), src)
    before = _digest(src)
    result = invoke("place", src, "--topology", "cpu", "--cost", "analytic", "--steps", "2", flag, src)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "in.onnx" in lines[0] and flag in lines[0], result.output
    assert _digest(src) == before and os.listdir(tmp_path) == ["in.onnx"]


@pytest.mark.parametrize("case", ["out-is-onnx-out", "out-is-topology", "out-is-cost-db", "calibrate-out-is-input"])
def test_place_outputs_named_twice_are_refused(tmp_path, case):
    """The next files a user might name twice: two outputs of one run, the topology file read, the cost
    cache, and place-calibrate's report over its model."""
    src = str(tmp_path / "in.onnx")
    onnx.save(branches_model(), src)
    topology = tmp_path / "topo.json"
    topology.write_text(json.dumps({"name": "two", "devices": [{"name": "cpu0", "kind": "cpu"},
                                                               {"name": "cpu1", "kind": "cpu"}]}))
    plan = str(tmp_path / "plan.json")
    args = {"out-is-onnx-out": ["place", src, "--topology", "cpu", "--out", plan, "--onnx-out", plan],
            "out-is-topology": ["place", src, "--topology", str(topology), "--out", str(topology)],
            "out-is-cost-db": ["place", src, "--topology", "cpu", "--out", plan, "--cost-db", plan],
            "calibrate-out-is-input": ["place-calibrate", src, "--out", src]}[case]
    before = {name: _digest(str(tmp_path / name)) for name in os.listdir(tmp_path)}
    result = invoke(*args, *(["--cost", "analytic"] if args[0] == "place" else []))
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "named as both" in lines[0], result.output
    assert {name: _digest(str(tmp_path / name)) for name in os.listdir(tmp_path)} == before


def test_plan_naming_a_cuda_device_blames_the_plan_file(tmp_path, models):
    """#59 defect 8: ``xflow run --plan`` with a plan placing nodes on a CUDA device here blamed the topology."""
    from xflow.placement.executor import cuda_available

    if cuda_available():
        pytest.skip("CUDA runs here: the plan is runnable")
    plan_path = str(tmp_path / "plan.json")
    made = invoke("place", models["branches"], "--topology", "cpu+cuda", "--cost", "analytic", "--steps", "3",
                  "--no-improve", "--out", plan_path)
    assert made.exit_code == 0, made.output
    plan = json.loads(open(plan_path).read())
    if "cuda0" not in plan["placement"].values():  # the planner kept every node on the CPU: put one on the GPU
        plan["placement"][next(iter(plan["placement"]))] = "cuda0"
        with open(plan_path, "w") as f:
            json.dump(plan, f)
    ran = invoke("run", models["branches"], "--plan", plan_path, "--runs", "1")
    assert ran.exit_code == 2, ran.output
    lines = [line for line in ran.output.splitlines() if line.strip()]
    assert len(lines) == 1 and plan_path in lines[0] and "cuda0" in lines[0], ran.output
