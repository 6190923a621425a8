"""Every rule file the suite optimizes with is re-verified here (z3 proof from the operator axioms plus
the numeric check), the shipped one included (slow), and ``xflow rules merge``, which built the shipped
file, is tested."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from xflow.verifier.batch import verify_candidate

from tests.rulebook import CONCAT_SPLIT_CANCEL, CONV_RELU_FOLD, MATMUL_MERGE, SPLIT_SPLIT_MERGE
from tests.test_cli import CONV_BIAS_RELU_FOLD
from tests.test_decision import RELU_ON_A_DOUBLED_COPY
from xflow.cli import main
from xflow.rules import default_rules_path, load_rules

ROOT = Path(__file__).resolve().parents[1]
BENCH_RULES = ROOT / "benchmarks" / "bench_rules.json"
ENGINE_RULES = [MATMUL_MERGE, CONV_RELU_FOLD, CONV_BIAS_RELU_FOLD, CONCAT_SPLIT_CANCEL, SPLIT_SPLIT_MERGE,
                RELU_ON_A_DOUBLED_COPY]
# Rules the numeric check passes but z3 cannot settle within the budget: allowed to stay unproved, never
# to be refuted. split_split_merge: nested 2-way splits against one 3-way split (the axioms state splits
# of two pieces; the 3-way form needs an unbounded quantifier instantiation z3 does not find within the default budget).
KNOWN_UNPROVED = {"split_split_merge"}


def _rules_in(path: Path) -> list[dict]:
    return json.loads(path.read_text())["rules"]


@pytest.mark.parametrize("source", ["engine", "bench"])
def test_every_rule_the_tests_optimize_with_is_proved_or_known_unproved(source):
    rules = ENGINE_RULES if source == "engine" else _rules_in(BENCH_RULES)
    outcomes = {rule["name"]: verify_candidate(rule, trials=3, seed=0) for rule in rules}
    for name, outcome in outcomes.items():
        if name in KNOWN_UNPROVED:
            assert outcome.status == "unknown" and not any(s.startswith("refuted") for s in outcome.statuses), \
                (name, outcome.statuses)
        else:
            assert outcome.status == "proved", (name, outcome.statuses)


@pytest.mark.slow
def test_verify_rules_proves_every_shipped_rule(tmp_path):
    """`xflow verify-rules` over rules/default.json: every rule is proved again and checked, except the ones
    named in OVER_BUDGET, which must still be unsettled (never refuted). The budget is z3 resource units (the
    default), so the answer does not depend on the machine's load and the list is exact."""
    rules = load_rules(str(default_rules_path()))
    result = CliRunner().invoke(main, ["verify-rules", str(default_rules_path())])
    failures = dict(line.removeprefix("FAIL ").split(": ", 1) for line in result.output.splitlines()
                    if line.startswith("FAIL "))
    assert set(failures) == OVER_BUDGET, result.output[-2000:]
    assert all(reason.startswith("unknown") for reason in failures.values()), failures
    assert f"{len(rules) - len(OVER_BUDGET)} of {len(rules)} rules proved and checked" in result.output


# Shipped rules the default budget does not prove: none. The last five (matmul(concat(a, a), concat(b, c)) ->
# matmul(a, add(b, c)) and mirrors, which hold only where b and c have one shape and no axiom gives a broadcast's
# dims) were removed from the file, like six more of the kind that were compositions of smaller rules.
OVER_BUDGET: set[str] = set()


def test_rules_merge_keeps_each_rule_once_most_general_with_provenance(tmp_path):
    """Two files sharing a rule under other names (one over a constant, one over any input) merge into one
    file holding it once, in its general form, with every other rule and its provenance."""
    shipped = _rules_in(Path(default_rules_path()))[:6]
    general = {"name": "zz_relu_twice", "doc": "relu(relu(x)) -> relu(x)", "inputs": {"x1": "any"},
               "src": [{"op": "relu", "in": ["x1"], "out": ["s0"]}, {"op": "relu", "in": ["s0"], "out": ["s1"]}],
               "dst": [{"op": "relu", "in": ["x1"], "out": ["d0"]}], "outputs": {"s1": "d0"},
               "provenance": {"source": "second"}}
    pinned = {**general, "name": "aa_relu_twice_const", "inputs": {"w1": "const"},
              "src": [{"op": "relu", "in": ["w1"], "out": ["s0"]}, {"op": "relu", "in": ["s0"], "out": ["s1"]}],
              "dst": [{"op": "relu", "in": ["w1"], "out": ["d0"]}], "provenance": {"source": "first"}}
    first, second, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "merged.json"
    first.write_text(json.dumps({"format": "xflow.rules/1", "rules": [*shipped[:4], pinned]}))
    second.write_text(json.dumps({"format": "xflow.rules/1", "rules": [*shipped[2:], general]}))
    result = CliRunner().invoke(main, ["rules", "merge", str(first), str(second), "--out", str(out)])
    assert result.exit_code == 0, result.output
    merged = {r["name"]: r for r in json.loads(out.read_text())["rules"]}
    assert set(merged) == {r["name"] for r in shipped} | {"zz_relu_twice"}
    assert merged["zz_relu_twice"]["provenance"] == {"source": "second"}
    assert all(merged[r["name"]]["provenance"] == r["provenance"] for r in shipped)
    assert f"wrote {out}: 7 rules from 10 in 2 files" in result.output
    assert [s["file"] for s in json.loads(out.read_text())["merged_from"]] == ["a.json", "b.json"]
    assert len(load_rules(str(out))) == 7


#: 2 x (i1 * i1) -> (i1 + i1) * i1: shipped once, now made by smaller shipped rules in two steps
SQUARE_TWICE = {"name": "g2_e827434e8c", "doc": "add[](mul[](i1,i1),mul[](i1,i1)) -> mul[](add[](i1,i1),i1)",
                "inputs": {"i1": "any"},
                "src": [{"op": "mul", "in": ["i1", "i1"], "out": ["s0"]},
                        {"op": "add", "in": ["s0", "s0"], "out": ["s1"]}],
                "dst": [{"op": "add", "in": ["i1", "i1"], "out": ["d0"]},
                        {"op": "mul", "in": ["i1", "d0"], "out": ["d1"]}],
                "outputs": {"s1": "d1"}}


def test_rules_merge_leaves_out_a_composition_of_smaller_rules(tmp_path):
    """Merging the shipped file with a rule its smaller rules already make in two steps writes the shipped rules
    only and lists the composition with its path; --keep-compositions keeps it."""
    shipped = Path(default_rules_path())
    extra = tmp_path / "extra.json"
    extra.write_text(json.dumps({"format": "xflow.rules/1", "rules": [SQUARE_TWICE]}))
    out = tmp_path / "merged.json"
    result = CliRunner().invoke(main, ["rules", "merge", str(shipped), str(extra), "--out", str(out)])
    assert result.exit_code == 0, result.output
    written = json.loads(out.read_text())
    assert len(written["rules"]) == len(_rules_in(shipped))
    assert [r["name"] for r in written["left_out_compositions"]] == ["g2_e827434e8c"]
    assert written["left_out_compositions"][0]["composed_by"]
    assert "1 compositions of smaller rules left out" in result.output
    result = CliRunner().invoke(main, ["rules", "merge", str(shipped), str(extra), "--out", str(out),
                                       "--keep-compositions"])
    assert result.exit_code == 0, result.output
    assert len(json.loads(out.read_text())["rules"]) == len(_rules_in(shipped)) + 1


@pytest.mark.slow
def test_shipped_rules_are_not_proved_vacuously():
    """A proof says something only where the rule's hypotheses are consistent with its axioms: every tenth
    shipped rule (the whole file: ~150 s, run for each soundness change) is not vacuous within 200k units, and a
    rule whose where conditions contradict each other is."""
    from xflow.verifier.prove import vacuous

    from xflow.rules import parse_rule

    rules = load_rules(default_rules_path())
    assert not [rule.name for rule in rules[::10] if vacuous(rule)]
    contradictory = parse_rule({**MATMUL_MERGE, "name": "matmul_merge_contradictory",
                                "where": ["rank(a) == 2", "rank(a) == 3"]})
    assert vacuous(contradictory)


def test_only_the_rules_named_are_parsed_and_every_name_is_still_unique(tmp_path):
    """``xflow check`` parses the rules its certificate applies alone; a broken rule it does not name is not its
    business, a name used twice in the file still is."""
    import json

    from tests.rulebook import CONV_RELU_FOLD, MATMUL_MERGE
    from xflow.errors import XflowError
    from xflow.rules import load_rules

    path = tmp_path / "rules.json"
    broken = {"name": "broken", "inputs": {}, "src": [], "dst": [], "outputs": {"nothing": "here"}}
    path.write_text(json.dumps({"format": "xflow.rules/1", "rules": [MATMUL_MERGE, CONV_RELU_FOLD, broken]}))
    assert [r.name for r in load_rules(path, only={MATMUL_MERGE["name"]})] == [MATMUL_MERGE["name"]]
    with pytest.raises(XflowError):
        load_rules(path)
    path.write_text(json.dumps({"format": "xflow.rules/1", "rules": [MATMUL_MERGE, CONV_RELU_FOLD, CONV_RELU_FOLD]}))
    with pytest.raises(XflowError, match="appears twice"):
        load_rules(path, only={MATMUL_MERGE["name"]})
