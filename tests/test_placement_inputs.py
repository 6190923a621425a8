"""Bad topology, plan and calibration files, as a user or a pipeline would feed them to ``xflow place``,
``xflow run --plan`` and ``xflow optimize --place``.

Each case is refused with one line on stderr naming the file and the problem, exit code 2; the inputs
are byte-identical afterwards and nothing is written (no plan, no model, no temp file).
"""

from __future__ import annotations

import hashlib
import json
import os

import onnx
import pytest
from click.testing import CliRunner

from tests.test_placement import branches_model
from xflow.cli import main
from xflow.placement.topology import BUILTINS, MAX_THREADS

GPU = {"name": "gpu0", "kind": "cuda", "speed": 8.0, "overhead": 8e-6}
LINK = {"latency": 1e-5, "bandwidth": 1.2e10}


def topology(**device: object) -> dict:
    """Two GPUs; the first one's fields replaced by ``device``."""
    return {"name": "t", "devices": [{**GPU, **device}, {**GPU, "name": "gpu1"}], "default_link": LINK}


def with_link(**link: object) -> dict:
    return {**topology(), "links": [{"from": "gpu0", "to": "gpu1", **LINK, **link}]}


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("model") / "branches.onnx")
    onnx.save(branches_model(), path)
    return path


def digest(folder) -> dict[str, str]:  # noqa: ANN001
    return {p: hashlib.sha256(open(os.path.join(folder, p), "rb").read()).hexdigest() for p in os.listdir(folder)}


def refused(tmp_path, *args: str) -> str:  # noqa: ANN001
    """Run the CLI; assert exit 2, one line naming a problem, inputs untouched and nothing new written."""
    before = digest(tmp_path)
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("xflow: error: "), result.output
    assert digest(tmp_path) == before
    return lines[0]


BAD_TOPOLOGIES = [
    (topology(overhead=-1e-3), "overhead must be a finite number >= 0"),
    (topology(overhead=5.0), "overhead must be a finite number >= 0 and <= 1"),
    (topology(speed=float("nan")), "speed must be a finite number > 0 (got nan)"),
    (topology(speed=0), "speed must be a finite number > 0"),
    (topology(speed="fast"), "speed must be a finite number > 0 (got 'fast')"),
    (topology(op_speed={"Conv": -2.0}), "op_speed: Conv must be a finite number > 0"),
    (topology(threads=1_000_000), f"threads must be an integer >= 1 and <= {MAX_THREADS}"),
    (topology(threads=2.5), "threads must be an integer"),
    (topology(memory=1), "memory is in bytes (0 = unlimited) and at least"),
    (topology(memory=float("inf")), "memory must be a finite number"),
    (topology(memory=-5), "memory must be a finite number >= 0"),
    (topology(memory_fraction=1e-9), "memory_fraction is a share of the model's peak"),
    (topology(memory=1e9, memory_fraction=0.5), "not both"),
    (topology(sped=2.0), "unknown field 'sped'"),
    (topology(unsupported="Conv"), "unsupported must be a list of op names"),
    ({**topology(), "default_link": {"latency": float("nan"), "bandwidth": 1e9}}, "latency must be a finite"),
    ({**topology(), "default_link": {"latency": 0, "bandwidth": float("inf")}}, "bandwidth must be a finite"),
    ({**topology(), "default_link": {"latency": -1, "bandwidth": 1e9}}, "latency must be a finite number >= 0"),
    (with_link(bandwidth=0), "link gpu0->gpu1: bandwidth must be a finite number > 0"),
    (with_link(to="gpu0"), "a link joins two different devices"),
    (with_link(to="gpu7"), "must name two known devices"),
    (with_link(bidirectional="yes"), "bidirectional must be true or false"),
    ({**topology(), "name": ""}, "name must be a non-empty string"),
]


@pytest.mark.parametrize("data, problem", BAD_TOPOLOGIES, ids=[p for _, p in BAD_TOPOLOGIES])
def test_place_refuses_a_nonsense_topology(tmp_path, model, data, problem):
    path = tmp_path / "topo.json"
    path.write_text(json.dumps(data))  # json writes NaN and Infinity, and reads them back
    line = refused(tmp_path, "place", model, "--topology", str(path), "--cost", "analytic",
                   "--out", str(tmp_path / "plan.json"))
    assert f"{path}: malformed topology: " in line and problem in line


def test_every_problem_of_a_topology_is_on_its_one_line(tmp_path, model):
    path = tmp_path / "topo.json"
    path.write_text(json.dumps(topology(speed=-1, overhead=-1, threads=0)))
    line = refused(tmp_path, "place", model, "--topology", str(path), "--cost", "analytic")
    assert "speed must" in line and "overhead must" in line and "threads must" in line


def test_optimize_place_refuses_a_nonsense_topology_before_running(tmp_path, model):
    path = tmp_path / "topo.json"
    path.write_text(json.dumps(topology(overhead=-1e-3)))
    line = refused(tmp_path, "optimize", model, str(tmp_path / "out.onnx"), "--cost", "analytic",
                   "--place", str(path))
    assert "overhead must be" in line


def test_builtin_topologies_pass_the_checks(tmp_path, model):
    for name in BUILTINS:
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(BUILTINS[name]))
        result = CliRunner().invoke(main, ["place", model, "--topology", str(path), "--cost", "analytic",
                                           "--steps", "2", "--no-improve", "-q"])
        assert result.exit_code == 0, (name, result.output)


@pytest.fixture(scope="module")
def plan(tmp_path_factory, model) -> dict:
    path = str(tmp_path_factory.mktemp("plan") / "plan.json")
    result = CliRunner().invoke(main, ["place", model, "--topology", "cpu", "--cost", "analytic", "--steps", "2",
                                       "--no-improve", "--out", path, "-q"])
    assert result.exit_code == 0, result.output
    return json.loads(open(path).read())


def edited(plan: dict, **changes: object) -> dict:
    return {**json.loads(json.dumps(plan)), **changes}


def test_run_refuses_plan_entries_for_nodes_the_model_lacks(tmp_path, model, plan):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(edited(plan, placement={**plan["placement"], "ghost": "cpu0"})))
    line = refused(tmp_path, "run", model, "--plan", str(path), "--runs", "1")
    assert f"{path}: plan does not match the model: it places 1 node(s) the model does not have, e.g. 'ghost'" in line


@pytest.mark.parametrize("change, problem", [
    ({"placement": "all on cpu0"}, "expected format 'xflow-plan/1' with a 'placement' object"),
    ({"format": "xflow-plan/0"}, "expected format"),
    ({"step_seconds": float("nan")}, "step_seconds must be a finite number of seconds >= 0 (got nan)"),
    ({"step_seconds": -1}, "step_seconds must be a finite number"),
    ({"baselines": {"m-etf": "fast"}}, "baselines['m-etf'] must be a finite number"),
    ({"baselines": [1, 2]}, "'baselines' must map names to seconds"),
    ({"rl": 3}, "'rl' must be an object"),
], ids=["placement", "format", "nan-step", "negative-step", "baseline", "baselines", "rl"])
def test_run_refuses_a_malformed_plan(tmp_path, model, plan, change, problem):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(edited(plan, **change)))
    line = refused(tmp_path, "run", model, "--plan", str(path), "--runs", "1")
    assert f"{path}: malformed plan: {problem}" in line


def test_run_refuses_a_plan_on_devices_its_topology_lacks(tmp_path, model, plan):
    path = tmp_path / "plan.json"
    first = next(iter(plan["placement"]))
    path.write_text(json.dumps(edited(plan, placement={**plan["placement"], first: "tpu9"})))
    line = refused(tmp_path, "run", model, "--plan", str(path), "--runs", "1")
    assert "'tpu9' that its topology (cpu0, cpu1) lacks" in line


def test_run_refuses_a_plan_with_a_nonsense_topology(tmp_path, model, plan):
    path = tmp_path / "plan.json"
    bad = edited(plan)
    bad["topology"]["devices"][0]["threads"] = -3
    path.write_text(json.dumps(bad))
    line = refused(tmp_path, "run", model, "--plan", str(path), "--runs", "1")
    assert f"{path}: malformed topology: device 'cpu0': threads must be an integer >= 1" in line


@pytest.mark.parametrize("params, problem", [
    ({"compute_scale": float("nan")}, "compute_scale must be a finite number > 0 (got nan)"),
    ({"node_overhead": -1e-6}, "node_overhead must be a finite number >= 0"),
    ({"bandwidth_scale": 0}, "bandwidth_scale must be a finite number > 0"),
    ({"compute_scal": 2.0}, "unknown field 'compute_scal'"),
    ([1, 2], "expected an object of simulator parameters"),
], ids=["nan", "negative", "zero", "typo", "list"])
def test_place_refuses_a_nonsense_calibration(tmp_path, model, params, problem):
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"params": params} if isinstance(params, dict) else params))
    line = refused(tmp_path, "place", model, "--topology", "cpu", "--cost", "analytic", "--calibration", str(path))
    assert f"{path}: malformed calibration: " in line and problem in line


@pytest.mark.parametrize("flags, problem", [
    (("--samples", "0"), "--samples must be at least 1 (got 0)"),
    (("--steps", "-5"), "--steps must be at least 1"),
    (("--time-limit", "nan"), "--time-limit must be a finite number of seconds >= 0"),
    (("--time-limit", "-1"), "--time-limit must be a finite number of seconds >= 0"),
    (("--policy", "missing.npz"), "missing.npz: no such policy file"),
], ids=["samples", "steps", "nan-limit", "negative-limit", "policy"])
def test_place_refuses_nonsense_settings(tmp_path, model, flags, problem):
    line = refused(tmp_path, "place", model, "--topology", "cpu", "--cost", "analytic", *flags,
                   "--out", str(tmp_path / "plan.json"))
    assert problem in line


def test_a_file_that_is_not_a_policy_is_named(tmp_path, model):
    path = tmp_path / "policy.npz"
    path.write_text("not numpy")
    line = refused(tmp_path, "place", model, "--topology", "cpu", "--cost", "analytic", "--policy", str(path))
    assert f"{path}: malformed policy file" in line
