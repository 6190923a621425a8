"""``xflow.optimize`` for pipelines, and the measured-cost figures of the report."""

from __future__ import annotations

import json

import onnx
import pytest

import xflow
from tests.rulebook import MATMUL_MERGE, SPLIT_SPLIT_MERGE
from tests.test_search import assert_same_outputs, shared_input_model
from xflow.optimize import OptimizeOptions, optimize_model


def rules_file(tmp_path) -> str:
    path = tmp_path / "rules.json"
    path.write_text(json.dumps({"format": "xflow.rules/1", "rules": [MATMUL_MERGE, SPLIT_SPLIT_MERGE]}))
    return str(path)


def test_python_api_returns_an_equivalent_model_proto(tmp_path):
    model = shared_input_model(3)
    out = xflow.optimize(model, rules_path=rules_file(tmp_path), cost="analytic", keep_if_slower=True)
    assert isinstance(out, onnx.ModelProto)
    onnx.checker.check_model(out)
    assert_same_outputs(model, out)


def test_python_api_rejects_unknown_options():
    with pytest.raises(TypeError, match="unknown option"):
        xflow.optimize(shared_input_model(2), budgett=3)


def test_report_has_measured_cost_cache_figures(tmp_path):
    options = OptimizeOptions.of(rules_path=rules_file(tmp_path), cost_db=str(tmp_path / "c.sqlite"), budget=20,
                              measure=False)
    _, cold = optimize_model(shared_input_model(3), options)
    assert cold.cost_model == "measured" and cold.nodes_measured > 0 and cold.cost_db_hits == 0
    assert cold.measure_sessions < cold.nodes_measured  # batched: several node configurations per session
    _, warm = optimize_model(shared_input_model(3), options)
    assert warm.nodes_measured == 0 and warm.measure_sessions == 0 and warm.cost_db_hits > 0
    assert warm.cost_db == str(tmp_path / "c.sqlite")


def test_bert_qkv_merge_keeps_constants_read_by_original_protos(tmp_path):
    """Reshape keeps its shape as an attribute in the IR but is saved as its original proto, which reads
    the shape initializer: pruning must not drop that initializer after the QKV MatMuls are merged."""
    from tests.test_search import LAUNCH_BOUND
    from xflow import zoo
    from xflow.optimize import optimize_file

    onnx.save(zoo.build("bert", small=True), tmp_path / "bert.onnx")
    options = OptimizeOptions.of(rules_path=rules_file(tmp_path), budget=300, keep_if_slower=True, measure=False)
    report = optimize_file(str(tmp_path / "bert.onnx"), str(tmp_path / "out.onnx"), options, cost_model=LAUNCH_BOUND,
                           say=lambda _m: None)
    assert report.rules_applied.get("matmul_merge_shared_lhs") and report.verified and report.decision == "optimized"
    onnx.checker.check_model(str(tmp_path / "out.onnx"))


def test_python_api_works_in_memory(tmp_path, monkeypatch):
    """A ModelProto is optimized, verified and timed without a file: nothing is saved, and the run folder
    it would use for large weights (under the temp directory) is gone afterwards."""
    import importlib
    import tempfile

    save_module = importlib.import_module("xflow.onnx_io.save")  # (the package attribute is the function)

    def no_file(*_args, **_kwargs):  # noqa: ANN202
        raise AssertionError("a model was written to disk")

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    rules = rules_file(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    monkeypatch.setattr(save_module, "write_model_atomically", no_file)
    monkeypatch.setattr(onnx, "save", no_file)
    from tests.test_search import LAUNCH_BOUND

    model = shared_input_model(3)
    out, report = optimize_model(model, OptimizeOptions.of(rules_path=rules, keep_if_slower=True), LAUNCH_BOUND)
    assert report.decision == "optimized" and report.verified and report.latency_after_ms is not None
    assert report.nodes_after == len(out.graph.node) < len(model.graph.node)
    assert list(scratch.iterdir()) == []
    assert_same_outputs(model, out)


def test_flat_option_names_fill_their_groups_and_the_rest_keep_the_defaults():
    from xflow.optimize import DEFAULTS

    options = OptimizeOptions.of(budget=4, branches=0, memory_limit=512.0, cost_db="c.sqlite", seed=3, measure=False)
    assert (options.search.budget, options.search.branches, options.search.memory_limit_mb) == (4, 0, 512.0)
    assert options.search.alpha == DEFAULTS.search.alpha and options.search.patience == DEFAULTS.search.patience
    assert options.cost.db == "c.sqlite" and options.cost.kind == DEFAULTS.cost.kind
    assert options.inputs.seed == 3 and not options.checks.measure and options.checks.verify
    assert OptimizeOptions.of() == DEFAULTS
    with pytest.raises(TypeError, match="alternatives"):  # one word: branches
        OptimizeOptions.of(alternatives=0)


def test_the_decision_is_data_and_the_report_writes_it_with_its_reason():
    from xflow.optimize import Decision

    assert Decision.OPTIMIZED.describe(copied=False) == "optimized"
    assert Decision.NOT_FASTER.describe(copied=True) == "copied (optimized model was not faster)"
    assert Decision.NO_RULES.describe(copied=False) == "original re-encoded (no rules)"
    assert Decision("kept-original-not-faster") is Decision.NOT_FASTER
    assert len({d.reason for d in Decision}) == len(Decision)  # every decision says its own reason
