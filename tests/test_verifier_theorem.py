"""A rule and its reverse are one theorem: generate-rules verifies them in one task and does not spend z3's budget
twice on what it could not prove, nor check numerically again what it refuted; a proved direction does not make
the other one proved (each written rule is proved in its own right)."""

from __future__ import annotations

from xflow.verifier.batch import GENERATION_ROUNDS, WIDE_TRIALS, verify_candidates, verify_group
from xflow.verifier.prove import GENERATION_RLIMIT
from xflow.verifier.status import OutcomeStatus
from xflow.verifier.theorem import same_theorem_groups, theorem_key


def _rule(name: str, src: list, dst: list, inputs: dict, outputs: dict, where: tuple = ()) -> dict:
    return {"name": name, "inputs": inputs, "src": src, "dst": dst, "outputs": outputs, "where": list(where)}


def _reverse(raw: dict, name: str) -> dict:
    """``raw`` read right to left, its tensors renamed as the generator names them (``s`` left, ``d`` right)."""
    swap = {}
    for prefix, new in (("s", "d"), ("d", "s")):
        for node in raw["src" if prefix == "s" else "dst"]:
            swap.update({o: new + o[1:] for o in node["out"]})

    def nodes(side: list) -> list:
        return [{**n, "in": [swap.get(i, i) for i in n["in"]], "out": [swap[o] for o in n["out"]]} for n in side]

    return {**raw, "name": name, "src": nodes(raw["dst"]), "dst": nodes(raw["src"]),
            "outputs": {swap.get(d, d): swap.get(s, s) for s, d in raw["outputs"].items()}}


def _conv(src: str, out: str, pads: list[int]) -> dict:
    return {"op": "conv", "in": [src, "kd"], "out": [out],
            "attrs": {"act": "none", "group": "?cg", "pads": pads, "strides": [2, 2]}}


#: x * (x - x) -> ((x - x) @ (x - x)) @ ((x - x) @ (x - x)): true, but z3 needs about a million units.
ZERO_PRODUCT_SQUARED = _rule("zps", [{"op": "sub", "in": ["i1", "i1"], "out": ["s0"]},
                                     {"op": "mul", "in": ["i1", "s0"], "out": ["s1"]}],
                             [{"op": "sub", "in": ["i1", "i1"], "out": ["d0"]},
                              {"op": "matmul", "in": ["d0", "d0"], "out": ["d1"]},
                              {"op": "matmul", "in": ["d1", "d1"], "out": ["d2"]}], {"i1": "any"}, {"s1": "d2"})
#: x * (x - x) -> (x - x) @ (x - x): proved within the generation budget.
ZERO_PRODUCT = _rule("zp", ZERO_PRODUCT_SQUARED["src"], ZERO_PRODUCT_SQUARED["dst"][:2], {"i1": "any"},
                     {"s1": "d1"})
#: A stride-2 conv's pad moved from its start to its end: every window moves, the numeric check refutes it.
MOVED_PADS = _rule("moved", [_conv("i1", "s0", [1, 1, 1, 1])], [_conv("i1", "d0", [0, 0, 2, 2])],
                   {"i1": "any", "kd": "const"}, {"s0": "d0"})

SETTINGS = {"rlimit": GENERATION_RLIMIT, "rounds": GENERATION_ROUNDS, "replay": True, "wide_trials": WIDE_TRIALS}


def test_a_rule_and_its_reverse_have_one_key_and_other_rules_another():
    for raw in (ZERO_PRODUCT, ZERO_PRODUCT_SQUARED, MOVED_PADS):
        assert theorem_key(_reverse(raw, "r")) == theorem_key(raw)
    assert theorem_key(ZERO_PRODUCT) != theorem_key(ZERO_PRODUCT_SQUARED)
    # a condition, an attribute or an input's role makes another theorem
    assert theorem_key({**MOVED_PADS, "where": ["rank(i1) == 4"]}) != theorem_key(MOVED_PADS)
    assert theorem_key(_rule("x", MOVED_PADS["src"], [_conv("i1", "d0", [0, 0, 1, 1])], MOVED_PADS["inputs"],
                             MOVED_PADS["outputs"])) != theorem_key(MOVED_PADS)
    assert theorem_key({**MOVED_PADS, "inputs": {"i1": "any", "kd": "any"}}) != theorem_key(MOVED_PADS)


def test_reverses_are_grouped_in_the_candidates_order():
    candidates = [ZERO_PRODUCT, MOVED_PADS, _reverse(ZERO_PRODUCT, "zp_rev"), ZERO_PRODUCT_SQUARED]
    assert same_theorem_groups(candidates) == [(0, 2), (1,), (3,)]


def test_a_reverse_takes_over_what_z3_could_not_prove_without_spending_its_budget_again():
    first, second = verify_group([ZERO_PRODUCT_SQUARED, _reverse(ZERO_PRODUCT_SQUARED, "zps_rev")], **SETTINGS)
    assert first.status == OutcomeStatus.UNKNOWN and first.rlimit_used >= GENERATION_RLIMIT, first
    assert second.status == OutcomeStatus.UNKNOWN and second.rlimit_used == 0 and second.variants_tried == 0, second
    assert "the same theorem as zps's variant 0" in second.reason
    # alone, the reverse spends the whole budget for the same answer
    alone = verify_group([_reverse(ZERO_PRODUCT_SQUARED, "zps_rev")], **SETTINGS)[0]
    assert alone.status == OutcomeStatus.UNKNOWN and alone.rlimit_used >= GENERATION_RLIMIT, alone


def test_a_reverse_takes_over_a_refutation_without_a_numeric_check():
    first, second = verify_group([MOVED_PADS, _reverse(MOVED_PADS, "moved_rev")], **SETTINGS)
    assert first.status == OutcomeStatus.REFUTED and first.variants_tried == 1, first
    assert second.status == OutcomeStatus.REFUTED and second.variants_tried == 0 and "same theorem" in second.reason, \
        second


def test_a_proved_direction_leaves_the_other_to_its_own_proof():
    """z3's search follows the order terms reach it, so one direction can be proved where the other is not (this
    one's reverse needs more than the generation budget): the other direction is verified as if alone."""
    first, second = verify_group([ZERO_PRODUCT, _reverse(ZERO_PRODUCT, "zp_rev")], **SETTINGS)
    alone = verify_group([_reverse(ZERO_PRODUCT, "zp_rev")], **SETTINGS)[0]
    assert first.status == OutcomeStatus.PROVED and first.rule is not None, first
    assert second.rlimit_used > 0 and second.variants_tried == 1, second
    assert (second.status, second.rlimit_used, second.reason) == (alone.status, alone.rlimit_used, alone.reason)


def test_a_variant_the_earlier_direction_did_not_state_is_verified():
    """Only the variants stating a theorem the earlier candidate left unproved are taken over: a reverse with a
    more general variant first (a condition the other direction lacks) still has it tried."""
    general = {**_reverse(MOVED_PADS, "general"), "where": ["rank(i1) == 4"]}
    reverse = {**_reverse(MOVED_PADS, "moved_rev"), "variants": [general, _reverse(MOVED_PADS, "moved_rev")]}
    first, second = verify_group([MOVED_PADS, reverse], **SETTINGS)
    assert first.status == OutcomeStatus.REFUTED and second.status == OutcomeStatus.REFUTED, (first, second)
    assert second.variants_tried == 1 and second.variant_statuses == {0: "refuted", 1: "refuted"}


def test_pairing_gives_the_same_outcomes_in_one_process_or_two():
    candidates = [ZERO_PRODUCT, MOVED_PADS, _reverse(MOVED_PADS, "moved_rev"), _reverse(ZERO_PRODUCT, "zp_rev")]
    one = verify_candidates(candidates, jobs=1, same_theorems=True, **SETTINGS)
    two = verify_candidates(candidates, jobs=2, same_theorems=True, **SETTINGS)
    assert [o.name for o in one] == ["zp", "moved", "moved_rev", "zp_rev"]
    assert [(o.status, o.rlimit_used, o.reason) for o in one] == [(o.status, o.rlimit_used, o.reason) for o in two]
    assert [o.status for o in one][:3] == ["proved", "refuted", "refuted"]


def test_outcome_statuses_are_enum_members_written_as_their_words():
    """Statuses are ``OutcomeStatus`` members, not free text, down to each variant's; in JSON, in "status: reason"
    lines and in comparisons they are the words the rule files and reports have always held."""
    import json

    import pytest
    from xflow.verifier.batch import _worst

    first, second = verify_group([MOVED_PADS, _reverse(MOVED_PADS, "moved_rev")], **SETTINGS)
    assert type(first.status) is OutcomeStatus and type(second.status) is OutcomeStatus
    assert all(type(s) is OutcomeStatus for o in (first, second) for s in o.variant_statuses.values())
    assert {OutcomeStatus.of_line(line) for line in second.statuses} == {OutcomeStatus.REFUTED}
    assert json.dumps({"status": OutcomeStatus.PROVED}) == '{"status": "proved"}'
    assert f"{OutcomeStatus.TIMEOUT}: guard" == "timeout: guard" and OutcomeStatus.UNKNOWN == "unknown"
    assert _worst(["refuted: a", "timeout: b", "malformed: c"]) is OutcomeStatus.TIMEOUT
    assert _worst(["malformed: c"]) is OutcomeStatus.MALFORMED and _worst([]) is OutcomeStatus.UNCHECKED
    with pytest.raises(ValueError):
        OutcomeStatus.of_line("maybe: a word no outcome has")
