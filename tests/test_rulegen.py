"""Generated rules are shape-generic, proved, and useful: generator -> verifier -> rule file -> real graphs."""

from __future__ import annotations

import json
import re

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper
from xflow.generator.generalize import canonical_key, dedupe
from xflow.generator.run import generate
from xflow.verifier.batch import verify_candidate
from xflow.verifier.status import OutcomeStatus

from xflow.cli import main
from xflow.onnx_io import graph_from_model
from xflow.rewrite.match import find_matches
from xflow.rules import default_rules_path, load_rules, parse_rule


@pytest.fixture(scope="module")
def candidates_2ops() -> list[dict]:
    return generate(max_ops=2, seed=0).rules


def _by_doc(candidates: list[dict], doc: str) -> dict:
    """The candidate with this doc; kernel names, pads and strides may differ (the generator keeps one
    rule per shape-generic form, found on whichever kernel sorts first)."""
    pattern = (re.escape(doc).replace(re.escape("pads=(0, 0, 0, 0)"), r"pads=\([0-9, ]+\)")
               .replace(re.escape("strides=(1, 1)"), r"strides=\([0-9, ]+\)").replace("k11", r"k\w+"))
    found = [c for c in candidates if c["doc"] == doc] or [c for c in candidates if re.fullmatch(pattern, c["doc"])]
    assert found, f"generator did not find {doc!r}"
    return found[0]


CONV_RELU = ("relu[](conv[act=none,group=1,pads=(0, 0, 0, 0),strides=(1, 1)](i1,k11)) -> "
             "conv[act=relu,group=1,pads=(0, 0, 0, 0),strides=(1, 1)](i1,k11)")
SPLIT_CONCAT = ("split[axis=1,split=(4, 4)](concat[axis=1](i1,i2))#0 ; "
                "split[axis=1,split=(4, 4)](concat[axis=1](i1,i2))#1 -> i1 ; i2")


def _conv_relu_model(channels: int, hw: int, kernel: int, stride: int) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, hw, hw])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    w = helper.make_tensor("w", TensorProto.FLOAT, [2 * channels, channels, kernel, kernel],
                           np.zeros(2 * channels * channels * kernel * kernel, np.float32))
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[kernel // 2] * 4, strides=[stride, stride]),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "g", [x], [y], initializer=[w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _proved(candidate: dict) -> dict:
    outcome = verify_candidate(candidate)
    assert outcome.status == OutcomeStatus.PROVED, outcome.statuses
    rule = outcome.rule
    assert not any("shape(" in w for w in rule.get("where", [])), rule["where"]
    assert rule["provenance"]["z3"]["status"] == "proved"
    assert rule["provenance"]["numeric"]["trials"] >= 3
    return rule


def test_generated_rule_is_proved_without_shape_pins_and_matches_real_shapes(candidates_2ops):
    rule = _proved(_by_doc(candidates_2ops, CONV_RELU))
    # found with a 1x1 kernel on 1x4x7x7 images, it fuses a real 3x3 stride-2 conv on 1x64x56x56
    graph = graph_from_model(_conv_relu_model(64, 56, 3, 2))
    assert len(list(find_matches(graph, parse_rule(rule)))) == 1


def test_split_sizes_generalize_to_the_concatenated_pieces(candidates_2ops):
    rule = parse_rule(_proved(_by_doc(candidates_2ops, SPLIT_CONCAT)))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 48, 7, 7])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 80, 7, 7])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("p", "q")]
    split = helper.make_tensor("sizes", TensorProto.INT64, [2], [48, 80])
    nodes = [helper.make_node("Concat", ["x", "z"], ["c"], axis=1),
             helper.make_node("Split", ["c", "sizes"], ["p", "q"], axis=1)]
    model = helper.make_model(helper.make_graph(nodes, "g", [x, z], outs, initializer=[split]),
                              opset_imports=[helper.make_opsetid("", 17)])
    assert len(list(find_matches(graph_from_model(model), rule))) == 1
    nodes[1] = helper.make_node("Split", ["c", "sizes"], ["p", "q"], axis=1)
    wrong = helper.make_tensor("sizes", TensorProto.INT64, [2], [64, 64])
    model = helper.make_model(helper.make_graph(nodes, "g", [x, z], outs, initializer=[wrong]),
                              opset_imports=[helper.make_opsetid("", 17)])
    assert not list(find_matches(graph_from_model(model), rule))


def test_shape_specific_coincidence_is_not_shipped(candidates_2ops):
    # on the enumeration's 1x1 kernels a matmul over the last two axes is an elementwise product
    candidate = _by_doc(candidates_2ops, "matmul[](add[](k11,k11),k11) -> add[](mul[](k11,k11),mul[](k11,k11))")
    assert verify_candidate(candidate).status != OutcomeStatus.PROVED


def test_variants_go_from_general_to_pinned(candidates_2ops):
    candidate = _by_doc(candidates_2ops, CONV_RELU)
    wheres = [v["where"] for v in candidate["variants"]]
    assert not any(w.startswith("rank(") for w in wheres[0])
    assert any(w.startswith("rank(") for w in wheres[-1])


def _relu_twice(name: str, var: str, kind: str) -> dict:
    return {"name": name, "inputs": {var: kind},
            "src": [{"op": "relu", "in": [var], "out": ["s0"]}, {"op": "relu", "in": ["s0"], "out": ["s1"]}],
            "dst": [{"op": "relu", "in": [var], "out": ["d0"]}], "outputs": {"s1": "d0"}}


def test_dedupe_keeps_the_most_general_input_kinds():
    """relu(relu(x)) -> relu(x) over any input and over a constant: one form, and only the general one stays.
    (The generator itself never emits this pair: relu's integer stand-in is not idempotent.)"""
    general, pinned = _relu_twice("b", "x1", "any"), _relu_twice("a", "w1", "const")
    assert canonical_key(general) == canonical_key(pinned)
    assert dedupe([pinned, general]) == [general] and dedupe([general, pinned]) == [general]


def test_generate_rules_cli_writes_only_proved_rules(tmp_path):
    out = tmp_path / "rules.json"
    result = CliRunner().invoke(main, ["generate-rules", "--max-ops", "1", "--jobs", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "rules shipped" in result.output and "verifier: proved" in result.output
    data = json.loads(out.read_text())
    rules = load_rules(str(out))
    assert len(rules) == len(data["rules"])
    for rule in rules:
        assert rule.provenance["z3"]["status"] == "proved"
        assert np.isfinite(rule.provenance["numeric"]["max_abs_err"])
    again = CliRunner().invoke(main, ["verify-rules", str(out)])
    assert again.exit_code == 0, again.output


def test_generate_rules_cli_verifies_saved_candidates(tmp_path):
    """A long run's candidates are saved once and verified again (or further) without generating."""
    saved, first, second = tmp_path / "cands.json", tmp_path / "a.json", tmp_path / "b.json"
    run = CliRunner().invoke(main, ["generate-rules", "--max-ops", "1", "--jobs", "1", "--save-candidates",
                                    str(saved), "--out", str(first)])
    assert run.exit_code == 0, run.output
    again = CliRunner().invoke(main, ["generate-rules", "--max-ops", "1", "--jobs", "1", "--candidates", str(saved),
                                      "--out", str(second)])
    assert again.exit_code == 0, again.output
    assert "candidates read from cands.json" in again.output
    assert [r["name"] for r in json.loads(second.read_text())["rules"]] == \
        [r["name"] for r in json.loads(first.read_text())["rules"]]
    wrong = CliRunner().invoke(main, ["generate-rules", "--max-ops", "2", "--candidates", str(saved),
                                      "--out", str(tmp_path / "c.json")])
    assert wrong.exit_code != 0 and "pass --max-ops 1" in wrong.output and not (tmp_path / "c.json").exists()
    (tmp_path / "bad.json").write_text("{not json")
    bad = CliRunner().invoke(main, ["generate-rules", "--max-ops", "1", "--candidates", str(tmp_path / "bad.json"),
                                    "--out", str(tmp_path / "d.json")])
    assert bad.exit_code != 0 and "bad.json" in bad.output and not (tmp_path / "d.json").exists()


def test_generate_rules_cli_enumerates_up_to_four_ops_only(tmp_path):
    """Larger sizes are for hand-written candidate files (the attention rule's 14 ops), never enumerated."""
    result = CliRunner().invoke(main, ["generate-rules", "--max-ops", "5", "--out", str(tmp_path / "r.json")])
    assert result.exit_code == 2 and "--max-ops" in result.output and "--candidates" in result.output
    assert not (tmp_path / "r.json").exists()


def test_generate_rules_cli_refuses_unwritable_output(tmp_path):
    result = CliRunner().invoke(main, ["generate-rules", "--max-ops", "1", "--out", str(tmp_path / "no" / "r.json")])
    assert result.exit_code == 2
    assert "r.json" in result.output


def test_shipped_rules_are_proved_and_fire_on_the_zoo():
    path = default_rules_path()
    if not path.exists():
        pytest.skip("no shipped rule file")
    rules = load_rules(str(path))
    assert rules
    for rule in rules:
        assert rule.provenance["z3"]["status"] == "proved", rule.name
        assert rule.provenance["numeric"]["trials"] >= 3, rule.name
        # a generated rule names the fingerprint it was paired on; one proved from a candidate script
        # (benchmarks/fusion_candidates.py) names that script instead
        assert "fingerprint" in rule.provenance or rule.provenance.get("generator", {}).get("script"), rule.name
    result = CliRunner().invoke(main, ["rules", "stats", "bert", "--small"])
    assert result.exit_code == 0, result.output
    assert " 0 matches" not in result.output


def test_shipped_rules_merge_the_conv_batchnorm_branches_of_inception():
    """Inception's branches read one input through conv + BatchNormalization pairs: the shipped rules must
    offer to merge them (the batchnorm lifts of the generated conv merges)."""
    path = default_rules_path()
    if not path.exists():
        pytest.skip("no shipped rule file")
    from xflow.zoo import build

    rules = [r for r in load_rules(str(path)) if r.provenance.get("lifted", {}).get("by") == "batchnorm"]
    graph = graph_from_model(build("inception_v3", small=True))
    merges = [r for r in rules if [n.op for n in r.src].count("conv") == 2
              and [n.op for n in r.dst].count("conv") == 1 and any(True for _ in find_matches(graph, r))]
    assert merges, "no batchnorm-lifted conv merge matches Inception-v3"


def _entry(graph, seed: int = 0):
    from xflow.generator.enumerate import INPUTS
    from xflow.generator.fingerprint import Entry, fps_of, int_values

    n_in = len(INPUTS)
    values = int_values(graph, seed)
    consumed = {t for _, _, operands in graph for t in operands}
    outputs = tuple(t for t in range(n_in, len(values)) if t not in consumed)
    fps = fps_of(values)
    return Entry(graph, outputs, tuple(fps[t] for t in outputs), frozenset(t for t in consumed if t < n_in))


def test_matmul_merge_of_a_shared_input_is_proved_for_activations_of_any_rank():
    """x @ w1, x @ w2 -> split(x @ concat(w1, w2)): the general variant needs the concatenated kernels' ranks
    equal (a condition the target states), and must not use up the z3 budget of the pinned variants."""
    from xflow.generator.enumerate import INPUTS
    from xflow.generator.fingerprint import Pair
    from xflow.generator.to_rules import pair_to_rule

    from xflow.ir import Attrs

    idx = {name: i for i, (name, _, _, _) in enumerate(INPUTS)}
    n = len(INPUTS)
    x, w1, w2 = idx["x1"], idx["w1"], idx["w2"]
    src = (("matmul", Attrs({}), (x, w1)), ("matmul", Attrs({}), (x, w2)))
    dst = (("concat", Attrs({"axis": 1}), (w1, w2)), ("matmul", Attrs({}), (x, n)),
           ("split", Attrs({"axis": 1, "split": (4, 4)}), (n + 1,)))
    a, b = _entry(src), _entry(dst)
    assert sorted(a.output_fps) == sorted(b.output_fps)
    candidate = pair_to_rule(Pair(a, b, 0), seed=0, max_ops=3)
    assert "rank(w1) == rank(w2)" in candidate["variants"][0]["where"]
    outcome = verify_candidate(candidate, rlimit=4_000_000)
    assert outcome.status == OutcomeStatus.PROVED, outcome.statuses
    rule = outcome.rule
    assert not any(w.startswith("rank(x1) ==") for w in rule["where"]), rule["where"]
    bert_like = parse_rule(rule)
    assert bert_like.inputs["x1"] == "any"


def test_generate_rules_without_a_terminal_writes_a_line_per_step_to_stderr(tmp_path):
    """Written to a log (no terminal), the progress is whole lines, one per step, not a line rewritten in place."""
    result = CliRunner().invoke(main, ["generate-rules", "--max-ops", "1", "--jobs", "1", "--out",
                                       str(tmp_path / "r.json")])
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    assert "\r" not in result.stderr
    for step in ("graphs enumerated: ", "verifying 1/", "lifting the proved rules",
                 "leaving out compositions of smaller rules among "):
        assert sum(line.startswith(step) for line in lines) == 1, (step, lines)
    assert "rules shipped" in result.stdout and "rules shipped" not in result.stderr
    quiet = CliRunner().invoke(main, ["generate-rules", "--max-ops", "1", "--jobs", "1", "-q", "--out",
                                      str(tmp_path / "q.json")])
    assert quiet.exit_code == 0 and quiet.stderr == "" and quiet.stdout == ""


def test_progress_lines_within_a_step_are_throttled(capsys):
    from xflow.cli.progress import ProgressLine

    show = ProgressLine(tty=False, every_s=3600.0)
    for text in ("verifying 1/3: 0 proved", "verifying 2/3: 1 proved", "verifying lifts: 1/2: 1 proved",
                 "verifying lifts: 2/2: 2 proved"):
        show(text)
    assert capsys.readouterr().err.splitlines() == ["verifying 1/3: 0 proved", "verifying lifts: 1/2: 1 proved"]
    every = ProgressLine(tty=False, every_s=0.0)
    every("verifying 1/3: 0 proved")
    every("verifying 2/3: 1 proved")
    assert len(capsys.readouterr().err.splitlines()) == 2
