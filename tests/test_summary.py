"""``xflow optimize``'s output as a user reads it: a table of ONNX operators before -> after, nodes, model size,
latency with its ratio, the rewrites by name and the verdict last; developer detail only with -v; the library's
messages through ``logging``; ``--report -`` puts the report on stdout and the summary on stderr."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import onnx
import pytest
from click.testing import CliRunner

from tests.test_cli import write_rules
from tests.test_keep_simpler import _script, transpose_pair_model
from xflow.cli import main
from xflow.cli.summary import _point_verdict, ratio_words, readable_bytes, verdict
from xflow.optimize import Decision, OptimizeOptions, optimize_file

DEVELOPER_DETAIL = ("search:", "in the algebra", "estimate", "cost cache", "signed-rank p", "session pairs, ")


@pytest.fixture
def model_path(tmp_path):  # noqa: ANN001, ANN201
    path = tmp_path / "in.onnx"
    onnx.save(transpose_pair_model(), path)
    return path


def _optimize(model_path, *extra: str):  # noqa: ANN001, ANN202
    out = model_path.parent / "out.onnx"
    return CliRunner().invoke(main, ["optimize", str(model_path), str(out), "--cost", "analytic", *extra],
                              catch_exceptions=False)


def test_the_summary_is_a_table_of_onnx_ops_and_the_verdict_is_last(model_path, monkeypatch):
    _script(monkeypatch, " ".join(["+0.1", "-0.1"] * 6))  # a wash: the simpler model is not slower
    result = _optimize(model_path)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == f"{model_path} -> {model_path.parent / 'out.onnx'}"
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:10]}
    assert rows["Transpose"] == ["2", "-", "*"] and rows["Concat"] == ["1", "-", "*"] and rows["Relu"] == ["1", "1"]
    assert rows["nodes"] == ["7", "4"]
    assert any(line.strip().startswith("model size") and line.count(" B") == 2 for line in lines)
    assert any(line.strip().startswith("measured latency:") and " ms -> " in line for line in lines)
    assert "  rewrites: cancel-concat x1, cancel-transpose x1" in lines
    assert lines[-1].startswith(f"wrote {model_path.parent / 'out.onnx'}: the optimized model, simpler, not slower: "
                                "7 nodes -> 4 nodes")
    assert not [line for line in lines if any(word in line for word in DEVELOPER_DETAIL)], lines


def test_verbose_adds_the_developers_detail_before_the_verdict(model_path):
    result = _optimize(model_path, "-v")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    for word in ("search:", "in the algebra", "the search's estimate", "signed-rank p"):
        assert any(word in line for line in lines), (word, lines)
    assert lines[-1].startswith("wrote ")


def test_the_original_kept_is_said_last_in_plain_words(model_path, monkeypatch):
    _script(monkeypatch, " ".join(["+0.1", "-0.1"] * 6))
    result = _optimize(model_path, "--require-faster")
    last = result.stdout.splitlines()[-1]
    assert last.startswith("wrote ") and "the original, copied (optimized model was not faster)" in last
    assert "as fast (1.00x)" in last and "session pairs" in last and "within 1%" not in last  # not asked


def test_report_to_stdout_and_the_summary_to_stderr(model_path):
    result = _optimize(model_path, "--report", "-")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["nodes_before"] == 7 and report["nodes_after"] == 4
    assert "wrote " in result.stderr.splitlines()[-1] and "measured latency" in result.stderr


def test_quiet_prints_nothing(model_path):
    result = _optimize(model_path, "-q")
    assert result.exit_code == 0 and result.output == ""


def test_the_library_says_what_it_noticed_through_logging(tmp_path, model_path, caplog):
    rules = write_rules(tmp_path / "rules.json", [])
    with caplog.at_level(logging.INFO, logger="xflow"):
        report = optimize_file(str(model_path), str(tmp_path / "out.onnx"), OptimizeOptions.of(rules_path=rules))
    assert report.outcome == "no-rules"
    assert [r.name for r in caplog.records if "no rules in" in r.getMessage()] == ["xflow.optimize.run"]


def test_sizes_and_ratios_read_as_the_peers_print_them():
    assert readable_bytes(224) == "224 B" and readable_bytes(1_234_567) == "1.23 MB"
    assert readable_bytes(12_000) == "12.00 KB" and readable_bytes(3_500_000_000) == "3.50 GB"
    assert ratio_words(1.5) == "1.50x faster" and ratio_words(0.8) == "1.25x slower"
    assert ratio_words(1.001) == "as fast (1.00x)"


def _two_point_report(outcome: str, second: str) -> SimpleNamespace:
    """A decoder's report as the verify pass fills it: faster at the decode step, ``second`` at the prefill."""
    points = [{"point": {"past_seq": 127}, "verdict": "faster"},
              {"point": {"seq": 128, "past_seq": 0}, "verdict": second}]
    return SimpleNamespace(outcome=outcome, decision=Decision(outcome).describe(True), verified=True,
                           latency_before_ms=24.1, latency_after_ms=22.1, steps=[{}], shapes_folded=0,
                           shapes_shared=0, shapes_deleted=0, nodes_before=2647, nodes_after=1641, speedup=1.08,
                           session_pairs=8, rank_test_p=0.004, not_slower_p=0.2, profile_points=points)


def test_a_verdict_over_two_profile_points_names_the_point_each_part_is_about():
    written = verdict(_two_point_report("simpler-not-slower", "not-slower"))
    assert "1.08x faster at the first profile point and within 2% of the original's time at seq=128 past_seq=0" \
        in written
    kept = verdict(_two_point_report("kept-original-not-faster-at-every-point", "slower"))
    assert kept.startswith("the original, ") and "1.08x faster at the first profile point" in kept
    assert kept.endswith("but neither faster nor within 2% of its time at seq=128 past_seq=0")
    # each other point's line says what the A/B found there, in the same words
    assert [_point_verdict(e, True) for e in _two_point_report("simpler-not-slower", "not-slower").profile_points] \
        == ["faster", "within 2%"]
    assert _point_verdict({"verdict": "slower"}, True) == "neither faster nor within 2%"
    assert _point_verdict({"verdict": "slower"}, False) == "not faster"
