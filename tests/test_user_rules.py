"""A user's rule file (``xflow optimize --rules F``) and the checks that keep a wrong rule from writing a wrong
model (issue #59, defect 2): every rule that carries no proof is proved before it is used, or refused by name,
and the equivalence check draws inputs at several scales, so a rule true only on small inputs cannot pass."""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

import xflow
from tests.rulebook import CONCAT_SPLIT_CANCEL
from xflow.cli import main
from xflow.equivalence import EquivalenceError
from xflow.errors import XflowError
from xflow.rules import rules_from_json
from xflow.rules.proof import content_digest, has_proof, unproved, with_proof_digest

#: ``clip[min=-1, max=1](x) -> x``: true on inputs in [-1, 1], false beyond them.
CLIP_IDENTITY = {"name": "clip_identity", "inputs": {"x": "any"},
                 "src": [{"op": "clip", "in": ["x"], "out": ["y"], "attrs": {"min": -1.0, "max": 1.0}}],
                 "dst": [], "outputs": {"y": "x"}}
#: The next rules a user might get wrong: one true for non-negative inputs only, one true for none.
RELU_IDENTITY = {"name": "relu_identity", "inputs": {"x": "any"},
                 "src": [{"op": "relu", "in": ["x"], "out": ["y"]}], "dst": [], "outputs": {"y": "x"}}
TANH_IDENTITY = {"name": "tanh_identity", "inputs": {"x": "any"},
                 "src": [{"op": "tanh", "in": ["x"], "out": ["y"]}], "dst": [], "outputs": {"y": "x"}}
#: A proof record as the verifier writes it; forged here, to show the equivalence check does not trust it.
FORGED_PROOF = {"z3": {"status": "proved", "rlimit": 1, "rlimit_used": 1, "variant": 0},
                "numeric": {"max_abs_err": 0.0, "trials": 3, "backend": "numpy", "dtype": "float64", "shapes": []}}


def clip_relu_model(path) -> None:  # noqa: ANN001
    """y = relu(clip(x, -1, 1)) on a 64 x 64 input (the issue's model)."""
    nodes = [helper.make_node("Clip", ["x", "lo", "hi"], ["c"]), helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])],
                              [numpy_helper.from_array(np.array(-1, np.float32), "lo"),
                               numpy_helper.from_array(np.array(1, np.float32), "hi")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


def write_rules(path, *rules) -> str:  # noqa: ANN001
    path.write_text(json.dumps({"format": "xflow.rules/1", "rules": list(rules)}))
    return str(path)


def invoke(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.mark.parametrize("rule", [CLIP_IDENTITY, RELU_IDENTITY, TANH_IDENTITY], ids=lambda r: r["name"])
def test_unproved_false_rule_is_refused_by_name_and_nothing_written(tmp_path, rule):
    """#59 defect 2: with ``--rules F`` holding ``clip[min=-1,max=1](x) -> x`` the run wrote a model whose
    outputs differ by up to 3.27 on inputs in [-5, 5]. The rule carries no proof: it is proved before use, and
    a false one is refused by name in one line (exit 2), nothing written."""
    src, out = tmp_path / "m.onnx", tmp_path / "out.onnx"
    clip_relu_model(src)
    rules = write_rules(tmp_path / "rules.json", rule)
    before = sorted(os.listdir(tmp_path))
    result = invoke("optimize", str(src), str(out), "--rules", rules, "--cost", "analytic", "--keep-if-slower")
    assert result.exit_code == 2, (result.output, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and rules in lines[0] and repr(rule["name"]) in lines[0] and "refuted" in lines[0], lines
    assert sorted(os.listdir(tmp_path)) == before


def test_unproved_true_rule_is_proved_then_used(tmp_path):
    """A true rule without a proof is proved (numerically, then z3) and used; the run says so."""
    from tests.test_bad_input import cancel_model

    src, out = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(cancel_model(), src)
    rules = write_rules(tmp_path / "rules.json", CONCAT_SPLIT_CANCEL)
    result = invoke("optimize", str(src), str(out), "--rules", rules, "--cost", "analytic", "--keep-if-slower")
    assert result.exit_code == 0, (result.output, result.stderr)
    assert "proved 1 rule that carried no proof" in result.output and "cancel-concat-split" in result.output


def test_a_proof_is_for_the_content_it_was_made_for():
    """A proof made here records the rule's content digest; the rule edited afterwards carries no proof."""
    rule, = rules_from_json([{**CLIP_IDENTITY, "provenance": FORGED_PROOF}])
    assert has_proof(rule) and not unproved([rule])  # a record without a digest: the shipped files' form
    stamped, = rules_from_json([{**CLIP_IDENTITY, "provenance": with_proof_digest(FORGED_PROOF, CLIP_IDENTITY)}])
    assert has_proof(stamped)
    edited = {**CLIP_IDENTITY, "src": [{**CLIP_IDENTITY["src"][0], "attrs": {"min": -2.0, "max": 2.0}}]}
    assert content_digest(edited) != content_digest(CLIP_IDENTITY)
    moved, = rules_from_json([{**edited, "provenance": with_proof_digest(FORGED_PROOF, CLIP_IDENTITY)}])
    assert not has_proof(moved) and unproved([moved]) == [moved]
    bare, = rules_from_json([CLIP_IDENTITY])
    assert not has_proof(bare)


def test_equivalence_check_draws_beyond_unit_inputs(tmp_path):
    """#59 defect 2: the check drew float inputs in [-1, 1] only. A rule whose proof is claimed (forged here)
    but false beyond [-1, 1] is caught by the wide draw: nothing is returned."""
    src = tmp_path / "m.onnx"
    clip_relu_model(src)
    rules = write_rules(tmp_path / "rules.json", {**CLIP_IDENTITY, "provenance": FORGED_PROOF})
    with pytest.raises(EquivalenceError, match="wide random inputs"):
        xflow.optimize(str(src), rules_path=rules, cost="analytic", keep_if_slower=True)


def test_verify_rules_refutes_a_false_one_op_rule_before_z3(tmp_path):
    """#59 defect 8: verify-rules on the clip rule ran past 300 s at the default budget; a numeric
    counterexample refutes it first, spending no z3 resource units."""
    rules = write_rules(tmp_path / "rules.json", CLIP_IDENTITY)
    result = invoke("verify-rules", rules, "--jobs", "1")
    assert result.exit_code == 1, result.output
    assert "FAIL clip_identity: refuted" in result.output and "0 z3 resource units" in result.output


def test_rule_z3_cannot_settle_is_refused_unless_trusted(tmp_path):
    """A true rule the verifier cannot prove (``split_split_merge``: z3 answers unknown within the budget) carries
    no proof and is refused by name; ``--trust-rules`` uses the file as it is, as ``xflow.optimize`` does."""
    from tests.rulebook import SPLIT_SPLIT_MERGE
    from tests.test_bad_input import cancel_model

    src = tmp_path / "m.onnx"
    onnx.save(cancel_model(), src)
    rules = write_rules(tmp_path / "rules.json", SPLIT_SPLIT_MERGE)
    refused = invoke("optimize", str(src), str(tmp_path / "a.onnx"), "--rules", rules, "--cost", "analytic")
    assert refused.exit_code == 2 and "'split_split_merge'" in refused.stderr and "unknown" in refused.stderr
    assert not (tmp_path / "a.onnx").exists()
    trusted = invoke("optimize", str(src), str(tmp_path / "b.onnx"), "--rules", rules, "--cost", "analytic",
                     "--trust-rules")
    assert trusted.exit_code == 0 and "proved" not in trusted.output, trusted.output


def test_rule_edited_after_its_proof_is_proved_again_or_refused(tmp_path):
    """A proof is for the content it was made for: the CLI proves an edited rule again (here: refuted, the rule
    was made false), and the library, which takes a file's rules as they are, refuses it by name."""
    edited = {**CLIP_IDENTITY, "provenance": with_proof_digest(FORGED_PROOF, TANH_IDENTITY)}
    src = tmp_path / "m.onnx"
    clip_relu_model(src)
    rules = write_rules(tmp_path / "rules.json", edited)
    result = invoke("optimize", str(src), str(tmp_path / "out.onnx"), "--rules", rules, "--cost", "analytic")
    assert result.exit_code == 2 and "'clip_identity'" in result.stderr and "refuted" in result.stderr
    with pytest.raises(XflowError, match="clip_identity.*edited after it was proved"):
        xflow.optimize(str(src), rules_path=rules, cost="analytic")
    assert not (tmp_path / "out.onnx").exists()
