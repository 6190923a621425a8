"""``--report``'s JSON as a pipeline reads it: a schema version, ONNX op types, rules by readable name with their
ids, the decision as an enumerated value with its reason, one time unit (ms, the keys saying so)."""

from __future__ import annotations

import json

import onnx
from click.testing import CliRunner

from tests.test_keep_simpler import _script, transpose_pair_model
from xflow.cli import main
from xflow.optimize.decision import Decision
from xflow.optimize.report import SCHEMA_VERSION


def _keys(value: object) -> list[str]:
    if isinstance(value, dict):
        return [k for k, v in value.items() for k in (k, *_keys(v))]
    if isinstance(value, list):
        return [k for v in value for k in _keys(v)]
    return []


def test_the_report_names_ops_rules_and_the_decision_and_times_in_ms(tmp_path, monkeypatch):
    _script(monkeypatch, " ".join(["+0.1", "-0.1"] * 6))
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(transpose_pair_model(), src)
    result = CliRunner().invoke(main, ["optimize", str(src), str(out), "--cost", "analytic", "--report", "-"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["schema_version"] == SCHEMA_VERSION == 3
    assert report["ops_before"] == {"Add": 1, "Concat": 1, "Mul": 1, "Relu": 1, "Sigmoid": 1, "Transpose": 2}
    assert report["ops_after"] == {"Add": 1, "Mul": 1, "Relu": 1, "Sigmoid": 1}
    assert report["ir_ops_before"]["transpose"] == 2  # the algebra's own names only under ir_
    assert 0 < report["bytes_after"] < report["bytes_before"]
    ids = {name: entry["ids"] for name, entry in report["rewrites"].items()}
    assert set(ids) == {"cancel-transpose", "cancel-concat"}
    assert all(report["rule_names"][i] == name for name, rule_ids in ids.items() for i in rule_ids)
    assert all(step["name"] == report["rule_names"][step["rule"]] for step in report["steps"])
    assert report["outcome"] == Decision.SIMPLER_NOT_SLOWER.value
    assert report["outcome_reason"] == Decision.SIMPLER_NOT_SLOWER.reason and report["simpler"]
    times = [k for k in _keys(report) if "second" in k or k.endswith("_s") or k.startswith("cost_before")
             or k.startswith("cost_after")]
    assert all(k.endswith("_ms") for k in times) and "search_ms" in report and "total_ms" in report, times
    assert report["cost_before_ms"] > report["cost_after_ms"] > 0


def test_each_step_states_the_subgraphs_it_matched_and_made_and_the_ab_its_pairs(tmp_path, monkeypatch):
    """Schema 3: what a page draws is in the report (ONNX op names, the graph's value names)."""
    _script(monkeypatch, " ".join(["+5"] * 12))
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(transpose_pair_model(), src)
    result = CliRunner().invoke(main, ["optimize", str(src), str(out), "--cost", "analytic", "--report", "-"],
                                catch_exceptions=False)
    report = json.loads(result.stdout)
    by_name = {step["name"]: step for step in report["steps"]}
    pair = by_name["cancel-transpose"]
    assert [n["op"] for n in pair["before"]] == ["Transpose", "Transpose"] and pair["after"] == []
    assert pair["before"][0]["inputs"] == ["r"] and pair["before"][0]["attrs"] == {"perm": "[1, 0]"}
    assert pair["aliases"] == {"t2": "r"}  # the pair's output is now its input
    assert [n["op"] for n in by_name["cancel-concat"]["before"]] == ["Concat"]
    assert len(report["pairs_ms"]) == report["session_pairs"] > 0
    assert all(a > b > 0 for a, b in report["pairs_ms"])  # each pair 5% faster, as scripted
