"""The same input, rules and seed give a byte-identical output, run after run and process after process
(different hash seeds, so no set or dict order of strings may leak into the written model)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.rulebook import CONCAT_SPLIT_CANCEL, CONV_RELU_FOLD, MATMUL_MERGE, SPLIT_SPLIT_MERGE
from tests.test_cli import CONV_BIAS_RELU_FOLD

ROOT = Path(__file__).resolve().parents[1]
BENCH_RULES = ROOT / "benchmarks" / "bench_rules.json"


def rule_file(path: Path) -> str:
    """Engine rules plus the benchmark rules (conv merges, relu before split) when present."""
    rules = [MATMUL_MERGE, CONV_RELU_FOLD, CONV_BIAS_RELU_FOLD, CONCAT_SPLIT_CANCEL, SPLIT_SPLIT_MERGE]
    if BENCH_RULES.exists():
        names = {r["name"] for r in rules}
        rules += [r for r in json.loads(BENCH_RULES.read_text())["rules"] if r["name"] not in names]
    path.write_text(json.dumps({"format": "xflow.rules/1", "rules": rules}))
    return str(path)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def xflow(*args: str, hash_seed: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    return subprocess.run([sys.executable, "-m", "xflow.cli", *args], capture_output=True, text=True, env=env,
                          timeout=300, cwd=ROOT)


@pytest.mark.parametrize("model", ["inception_v3", "bert"])
def test_same_input_rules_seed_give_identical_bytes(tmp_path, model):
    src = tmp_path / "m.onnx"
    made = xflow("zoo", model, str(src), "--small", hash_seed="0")
    assert made.returncode == 0, made.stderr
    rules = rule_file(tmp_path / "rules.json")
    outputs = []
    for k, hash_seed in enumerate(("1", "2", "3")):
        out = tmp_path / f"out{k}.onnx"
        report = tmp_path / f"r{k}.json"
        run = xflow("optimize", str(src), str(out), "--rules", rules, "--trust-rules", "--cost", "analytic",
                    "--seed", "7",
                    "--budget", "60", "--time-limit", "600", "--keep-if-slower", "--report", str(report),
                    hash_seed=hash_seed)
        assert run.returncode == 0, run.stderr
        data = json.loads(report.read_text())
        assert data["decision"] == "optimized" and data["search_stop"] in ("budget", "exhausted", "patience"), data
        # the finalists are timed end to end and the fastest written: which one wins is the machine's to say,
        # but the finalists themselves, and the bytes written for each, are the search's and must not vary
        finalists = [(f["estimated_ms"], f["rewrites"], f["completed"]) for f in data["finalists"]]
        chosen = next((i for i, f in enumerate(data["finalists"]) if f["chosen"]), 0)
        outputs.append((finalists, chosen, digest(out)))
        assert not (tmp_path / f"out{k}.onnx.data").exists()
    assert outputs[0][0] == outputs[1][0] == outputs[2][0]
    for (_, chosen_a, bytes_a), (_, chosen_b, bytes_b) in zip(outputs, outputs[1:], strict=False):
        assert chosen_a != chosen_b or bytes_a == bytes_b
