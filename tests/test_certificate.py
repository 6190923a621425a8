"""Proof-carrying models: the certificate a rewritten model carries, ``xflow check`` refusing every tampering,
and ``xflow optimize --replay`` writing the run's bytes again."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import numpy_helper

import xflow
from tests.test_cli import CONV_BIAS_RELU_FOLD, conv_relu_model, write_rules
from xflow.check.certificate import KEY, carried, rule_hash
from xflow.check.check import check
from xflow.cli import main
from xflow.rules import load_rules, rules_from_json
from xflow.zoo import build

ANALYTIC = ("--cost", "analytic", "--keep-if-slower", "--budget", "30", "-q")


def invoke(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


ROOT = Path(__file__).resolve().parents[1]
#: The benchmark's conv merges: on the small Inception, rule steps, a fold (the merged kernels) and the split
#: simplifications (nested splits, elementwise ops hoisted) under the analytic cost.
CONV_MERGES = ("conv_merge_shared_input", "conv_bias_merge_shared_input", "conv_bn_merge_shared_input")


@pytest.fixture(scope="module")
def inception_run(tmp_path_factory):
    """The small Inception optimized with the conv merges, its certificate also written alone."""
    folder = tmp_path_factory.mktemp("inception")
    src = str(folder / "m.onnx")
    onnx.save(build("inception_v3", small=True), src)
    bench = json.loads((ROOT / "benchmarks" / "bench_rules.json").read_text())["rules"]
    rules = write_rules(folder / "rules.json", [r for r in bench if r["name"] in CONV_MERGES])
    out, cert = folder / "out.onnx", folder / "cert.json"
    result = invoke("optimize", src, str(out), "--rules", rules, "--certificate", str(cert), *ANALYTIC)
    assert result.exit_code == 0, result.output
    return folder, src, rules, out, cert


def _check(src: str, out, *extra: str):
    return invoke("check", src, str(out), *extra)


def test_written_model_carries_its_certificate_and_checks(inception_run):
    _folder, src, rules, out, cert = inception_run
    model = onnx.load(str(out))
    text = carried(model)
    assert text is not None and json.loads(text) == json.loads(cert.read_text())
    certificate = json.loads(text)
    kinds = [step["kind"] for step in certificate["steps"]]
    assert kinds.count("rule") >= 2 and "simplification" in kinds  # the split simplifications, each a step
    assert set(kinds[kinds.index("fold"):]) == {"fold", "simplification"} and kinds.index("fold") == kinds.count("rule")
    assert certificate["steps"][kinds.index("fold")]["constants"], "the merged weights are folded constants"
    stated = {step["rule_sha256"] for step in certificate["steps"] if step["kind"] == "rule"}
    assert stated <= {rule_hash(r) for r in load_rules(rules)}
    assert [i.name for i in model.graph.input] == [i.name for i in onnx.load(src).graph.input]
    result = _check(src, out)
    assert result.exit_code == 0, result.output
    assert result.output.startswith("OUT computes what IN computes for every input at every size its interface "
                                    "allows: ")
    applied = {step["rule"] for step in certificate["steps"] if step["kind"] == "rule"}
    assert f"{len(kinds)} steps, {len(applied)} proved rules" in result.output


def test_no_certificate_leaves_it_out(tmp_path):
    src = conv_relu_model(tmp_path / "m.onnx")
    rules = write_rules(tmp_path / "rules.json", [CONV_BIAS_RELU_FOLD])
    out = tmp_path / "out.onnx"
    assert invoke("optimize", src, str(out), "--rules", rules, "--no-certificate", *ANALYTIC).exit_code == 0
    assert carried(onnx.load(str(out))) is None
    result = _check(src, out)
    assert result.exit_code == 2 and "carries no certificate" in result.output


def test_the_original_written_back_checks_without_a_certificate(tmp_path):
    src = conv_relu_model(tmp_path / "m.onnx")
    out = tmp_path / "out.onnx"
    assert invoke("optimize", src, str(out), "--rules", write_rules(tmp_path / "rules.json", []), "-q").exit_code == 0
    result = _check(src, out)
    assert result.exit_code == 0 and result.output.endswith(": 0 steps, 0 proved rules\n"), result.output


def _tampered(out, tmp_path, change) -> str:
    model = onnx.load(str(out))
    change(model)
    path = tmp_path / "tampered.onnx"
    onnx.save(model, str(path))
    return str(path)


def _change_weight(model: onnx.ModelProto) -> None:
    tensor = max(model.graph.initializer, key=lambda t: int(np.prod(t.dims)))
    array = numpy_helper.to_array(tensor).copy()
    array.flat[0] += 1e-3
    tensor.CopyFrom(numpy_helper.from_array(array, tensor.name))


def _delete_node(model: onnx.ModelProto) -> None:
    node = model.graph.node[-1]
    out_name = node.output[0]
    del model.graph.node[-1]
    for output in model.graph.output:  # keep the model valid: the output now read from the node's input
        if output.name == out_name:
            model.graph.node.append(onnx.helper.make_node("Identity", [node.input[0]], [out_name]))


def _swap_inputs(model: onnx.ModelProto) -> None:
    node = next(n for n in model.graph.node if len(n.input) >= 2 and n.input[0] != n.input[1])
    node.input[0], node.input[1] = node.input[1], node.input[0]


@pytest.mark.parametrize("change, said", [(_change_weight, "weight"), (_delete_node, "node"),
                                          (_swap_inputs, "node")])
def test_tampered_output_is_refused(inception_run, tmp_path, change, said):
    _folder, src, _rules, out, _cert = inception_run
    result = _check(src, _tampered(out, tmp_path, change))
    assert result.exit_code == 1, result.output
    assert result.output.startswith("OUT does not check") and said in result.output


def test_certificate_of_another_model_is_refused(inception_run, tmp_path):
    _folder, _src, _rules, out, cert = inception_run
    other = conv_relu_model(tmp_path / "other.onnx")
    other_out = tmp_path / "other_out.onnx"
    rules = write_rules(tmp_path / "rules.json", [CONV_BIAS_RELU_FOLD])
    assert invoke("optimize", other, str(other_out), "--rules", rules, *ANALYTIC).exit_code == 0
    assert _check(other, other_out).exit_code == 0
    result = _check(other, other_out, "--certificate", str(cert))
    assert result.exit_code == 1 and "another input model" in result.output
    result = _check(other, out)  # OUT of the q/k/v model, checked against another IN
    assert result.exit_code == 1 and "another input model" in result.output


def test_rule_edited_after_proving_is_refused(inception_run, tmp_path):
    _folder, src, rules, out, cert = inception_run
    data = json.loads(open(rules).read())
    applied = next(s["rule"] for s in json.loads(cert.read_text())["steps"] if s["kind"] == "rule")
    edited_rule = next(r for r in data["rules"] if r["name"] == applied)
    first, second = list(edited_rule["outputs"])[:2]  # the merged conv's pieces handed out swapped
    edited_rule["outputs"][first], edited_rule["outputs"][second] = \
        edited_rule["outputs"][second], edited_rule["outputs"][first]
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(data))
    result = _check(src, out, "--rules", str(edited))
    assert result.exit_code == 1 and "content hash differs" in result.output
    # a certificate rewritten to the edited rule's hash: the rule must still re-prove, and it does not
    wrong = next(r for r in rules_from_json(data["rules"]) if r.name == applied)
    certificate = json.loads(cert.read_text())
    for step in certificate["steps"]:
        if step["kind"] == "rule" and step["rule"] == wrong.name:
            step["rule_sha256"] = rule_hash(wrong)
    doctored = tmp_path / "doctored.json"
    doctored.write_text(json.dumps(certificate))
    result = _check(src, out, "--rules", str(edited), "--certificate", str(doctored))
    assert result.exit_code == 1 and "does not re-prove" in result.output, result.output


def test_a_doctored_split_simplification_is_refused_naming_its_step(inception_run, tmp_path):
    """A split simplification is re-established, not rerun and trusted: a hoist that applies another op to the
    whole than the pieces had is refused at that step."""
    _folder, src, _rules, out, cert = inception_run
    certificate = json.loads(cert.read_text())
    index, step = next((k, s) for k, s in enumerate(certificate["steps"], 1) if s["kind"] == "simplification"
                       and s["form"] == "elementwise_hoisted")
    node = next(n for n in step["added"] if n["op"] not in ("split", "concat"))
    node["op"] = "sigmoid" if node["op"] != "sigmoid" else "relu"
    doctored = tmp_path / "doctored.json"
    doctored.write_text(json.dumps(certificate))
    result = _check(src, out, "--certificate", str(doctored))
    assert result.exit_code == 1, result.output
    assert result.output.startswith(f"OUT does not check: step {index}: split simplification"), result.output


def test_bad_certificate_is_bad_input(inception_run, tmp_path):
    _folder, src, _rules, out, _cert = inception_run
    (tmp_path / "bad.json").write_text("{\"format\": \"something else\"}")
    result = _check(src, out, "--certificate", str(tmp_path / "bad.json"))
    assert result.exit_code == 2 and "not an xflow certificate" in result.output


@pytest.mark.parametrize("from_model", [False, True])
def test_replay_writes_the_runs_bytes(inception_run, tmp_path, from_model):
    _folder, src, rules, out, cert = inception_run
    digests = set()
    for k in range(2):
        again = tmp_path / f"again{k}.onnx"
        result = invoke("optimize", src, str(again), "--replay", str(out if from_model else cert), "-q")
        assert result.exit_code == 0, result.output
        digests.add(hashlib.sha256(again.read_bytes()).hexdigest())
    assert digests == {hashlib.sha256(out.read_bytes()).hexdigest()}


def test_replay_refuses_another_input(inception_run, tmp_path):
    _folder, _src, _rules, _out, cert = inception_run
    other = conv_relu_model(tmp_path / "other.onnx")
    result = invoke("optimize", other, str(tmp_path / "o.onnx"), "--replay", str(cert))
    assert result.exit_code == 2 and "another input model" in result.output
    assert not (tmp_path / "o.onnx").exists()
    assert KEY == "xflow.certificate"


def test_the_api_result_carries_a_certificate_that_checks(inception_run, tmp_path):
    _folder, src, rules, _out, _cert = inception_run
    result = xflow.optimize(src, rules_path=rules, cost="analytic", keep_if_slower=True, budget=30)
    assert carried(result) is not None
    path = tmp_path / "api.onnx"
    onnx.save(result, str(path))
    assert _check(src, path).exit_code == 0
    trusted = check(src, str(path))  # the library's check without a prover: the rules trusted by content hash
    assert trusted.ok and trusted.line.endswith("rules trusted by their content hash")


def test_shipped_rules_are_found_where_the_checking_machine_has_them(tmp_path):
    src = str(tmp_path / "bert.onnx")
    onnx.save(build("bert", small=True), src)
    out, cert = tmp_path / "out.onnx", tmp_path / "cert.json"
    assert invoke("optimize", src, str(out), "--certificate", str(cert), *ANALYTIC).exit_code == 0
    certificate = json.loads(cert.read_text())
    assert certificate["rules"]["shipped"] and any(s["kind"] == "rule" for s in certificate["steps"])
    certificate["rules"]["path"] = "/elsewhere/rules/default.json"  # the path on the machine that wrote it
    cert.write_text(json.dumps(certificate))
    result = _check(src, out, "--certificate", str(cert))
    assert result.exit_code == 0, result.output


def test_structural_hash_is_the_same_in_every_process(inception_run):
    """A certificate states graphs by their structural hash: no salted str hash may leak into it."""
    _folder, src, _rules, _out, cert = inception_run
    code = ("import sys; from xflow.optimize.load import load_source; from xflow.optimize.options import "
            "InputSettings; print(load_source(sys.argv[1], InputSettings()).graph.structural_hash)")
    hashes = {subprocess.run([sys.executable, "-c", code, src], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONHASHSEED": seed}, cwd=ROOT).stdout for seed in ("1", "2")}
    assert len(hashes) == 1 and json.loads(cert.read_text())["input"]["graph"] == hashes.pop().strip()


def test_a_dynamic_model_checks_with_its_dims_as_symbols(tmp_path):
    """The matches of a model with a dynamic batch are stated, and re-established, over the symbol."""
    src = str(tmp_path / "bert.onnx")
    onnx.save(build("bert", small=True, dynamic=True), src)
    out, cert = tmp_path / "out.onnx", tmp_path / "cert.json"
    assert invoke("optimize", src, str(out), "--certificate", str(cert), *ANALYTIC).exit_code == 0
    shapes = [dim for step in json.loads(cert.read_text())["steps"] if step["kind"] == "rule"
              for shape in step["shapes"].values() for dim in shape]
    assert "batch" in shapes
    result = _check(src, out)
    assert result.exit_code == 0, result.output
