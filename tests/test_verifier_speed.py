"""What settles the <= 2-op candidates cheaply: the zero tensor, linear padding and unread end pads as axioms,
and a generation budget smaller than the shipped file's, with the same answers every run."""

from __future__ import annotations

import click
import pytest
from xflow.verifier import prove_rule
from xflow.verifier.batch import verify_candidate
from xflow.verifier.prove import DEFAULT_RLIMIT, GENERATION_RLIMIT
from xflow.verifier.status import OutcomeStatus

from xflow.rules import parse_rule


def _rule(src: list, dst: list, inputs: dict, outputs: dict, where: tuple = ()) -> dict:
    return {"name": "t", "inputs": inputs, "src": src, "dst": dst, "outputs": outputs, "where": list(where)}


#: Two zero tensors of one shape: (x^2 - x^2) and (relu(x) - relu(x)).
ZEROS = _rule([{"op": "pow", "in": ["i1"], "out": ["s0"], "attrs": {"exponent": 2.0}},
               {"op": "sub", "in": ["s0", "s0"], "out": ["s1"]}],
              [{"op": "relu", "in": ["i1"], "out": ["d0"]}, {"op": "sub", "in": ["d0", "d0"], "out": ["d1"]}],
              {"i1": "any"}, {"s1": "d1"})
#: A zero times anything is zero (distributivity then the zero axiom): x * (x - x) -> (x - x) @ (x - x).
ZERO_PRODUCT = _rule([{"op": "sub", "in": ["i1", "i1"], "out": ["s0"]},
                      {"op": "mul", "in": ["i1", "s0"], "out": ["s1"]}],
                     [{"op": "sub", "in": ["i1", "i1"], "out": ["d0"]},
                      {"op": "matmul", "in": ["d0", "d0"], "out": ["d1"]}],
                     {"i1": "any"}, {"s1": "d1"})
#: The same zero squared by a second product, x * (x - x) -> ((x - x) @ (x - x)) @ ((x - x) @ (x - x)): its proof
#: needs about a million units.
ZERO_PRODUCT_SQUARED = {**ZERO_PRODUCT,
                        "dst": [*ZERO_PRODUCT["dst"], {"op": "matmul", "in": ["d1", "d1"], "out": ["d2"]}],
                        "outputs": {"s1": "d2"}}
#: A stride-2 conv whose extra bottom/right pad row is never read where the output keeps its size.
END_PADS = _rule([{"op": "conv", "in": ["i1", "kd"], "out": ["s0"],
                   "attrs": {"act": "none", "group": "?cg", "pads": [1, 1, 1, 1], "strides": [2, 2]}}],
                 [{"op": "conv", "in": ["i1", "kd"], "out": ["d0"],
                   "attrs": {"act": "none", "group": "?cg", "pads": [1, 1, 2, 2], "strides": [2, 2]}}],
                 {"i1": "any", "kd": "const"}, {"s0": "d0"})
#: Zero padding commutes with a product of equal shapes: pad(x * x) -> pad(x) * pad(x).
PAD_PRODUCT = _rule([{"op": "mul", "in": ["i1", "i1"], "out": ["s0"]},
                     {"op": "pad", "in": ["s0"], "out": ["s1"], "attrs": {"pads": [0, 0, 1, 1, 0, 0, 2, 2]}}],
                    [{"op": "pad", "in": ["i1"], "out": ["d0"], "attrs": {"pads": [0, 0, 1, 1, 0, 0, 2, 2]}},
                     {"op": "mul", "in": ["d0", "d0"], "out": ["d1"]}],
                    {"i1": "any"}, {"s1": "d1"}, ("rank(i1) == 4",))


@pytest.mark.parametrize("raw", [ZEROS, END_PADS, PAD_PRODUCT], ids=["zeros", "end_pads", "pad_product"])
def test_the_new_axioms_prove_true_candidates_within_the_generation_budget(raw):
    result = prove_rule(parse_rule(raw), GENERATION_RLIMIT)
    assert result.status == OutcomeStatus.PROVED, result
    assert result.rlimit_used < GENERATION_RLIMIT // 3


def test_a_zero_is_not_every_tensor():
    """x * (x - x) -> x is false: with the zero axiom it stays unproved, and the numeric check refutes it before
    z3 is asked."""
    false = {**ZERO_PRODUCT, "dst": [], "outputs": {"s1": "i1"}}
    assert prove_rule(parse_rule(false), 1_000_000).status != OutcomeStatus.PROVED
    outcome = verify_candidate(false, rlimit=1_000_000)
    assert outcome.status == OutcomeStatus.REFUTED and outcome.rlimit_used == 0, outcome


def test_pads_that_move_the_windows_are_refuted():
    """Moving a conv's pad from its start to its end keeps the output's size and moves every window: no axiom
    proves it, and the numeric check refutes it before z3 is asked."""
    wrong = {**END_PADS, "dst": [{"op": "conv", "in": ["i1", "kd"], "out": ["d0"],
                                  "attrs": {"act": "none", "group": "?cg", "pads": [0, 0, 2, 2], "strides": [2, 2]}}]}
    assert prove_rule(parse_rule(wrong), GENERATION_RLIMIT).status != OutcomeStatus.PROVED
    outcome = verify_candidate(wrong, rlimit=GENERATION_RLIMIT)
    assert outcome.status == OutcomeStatus.REFUTED and outcome.rlimit_used == 0, outcome


def test_a_larger_budget_proves_what_the_generation_budget_leaves_unknown():
    """ZERO_PRODUCT_SQUARED needs about a million units: unknown at generate-rules' default, proved at verify-rules'
    (``--rlimit`` raises the first), the same count both times."""
    small = verify_candidate(ZERO_PRODUCT_SQUARED, rlimit=GENERATION_RLIMIT)
    assert small.status == OutcomeStatus.UNKNOWN and small.rlimit_used >= GENERATION_RLIMIT, small
    large = [verify_candidate(ZERO_PRODUCT_SQUARED, rlimit=DEFAULT_RLIMIT) for _ in range(2)]
    assert [o.status for o in large] == ["proved", "proved"]
    assert large[0].rlimit_used == large[1].rlimit_used
    assert GENERATION_RLIMIT < large[0].rlimit_used < DEFAULT_RLIMIT


def test_generate_rules_defaults_to_the_generation_budget_and_verify_rules_to_the_full_one():
    from xflow.cli import main

    def default(name: str) -> int:
        command = main.commands[name]
        option = next(p for p in command.params if p.name == "rlimit")
        with click.Context(command):
            return option.get_default(click.get_current_context(), call=True)

    assert default("generate-rules") == GENERATION_RLIMIT
    assert default("verify-rules") == DEFAULT_RLIMIT


class _Shapes:
    """The op table's ``ShapeFacts`` on concrete shapes (tuples)."""

    rank = staticmethod(len)
    dim = staticmethod(lambda t, i: t[i])
    symbolic = staticmethod(lambda v: False)
    int = staticmethod(int)
    both = staticmethod(lambda *facts: all(facts))
    div = staticmethod(lambda a, b: a // b)


def test_conv_facts_hold_exactly_where_its_shape_rule_accepts():
    """The channel fact the cpool/avgpool candidates need (input channels = group x kernel input channels) is
    the shape rule's: on random shapes, the facts hold wherever conv's shape rule accepts, and a channel count
    that breaks the fact is rejected by it."""
    import numpy as np

    from xflow.ops import OPS, ShapeError

    conv, rng = OPS["conv"], np.random.default_rng(0)
    accepted = rejected = 0
    for _ in range(400):
        group = int(rng.choice([1, 2, 4]))
        image = (1, int(rng.choice([1, 2, 4, 8])), 5, 5)
        kernel = (int(rng.choice([4, 8])), int(rng.choice([1, 2, 4])), 3, 3)
        attrs = conv.normalize_attrs({"group": group, "pads": (1, 1, 1, 1), "strides": (1, 1)})
        facts = conv.facts(_Shapes, attrs, [image, kernel])
        try:
            conv.infer([image, kernel], attrs)
        except ShapeError:
            rejected += 1
            continue
        accepted += 1
        assert all(facts), (image, kernel, group)
    assert accepted > 50 and rejected > 50
    assert not all(conv.facts(_Shapes, conv.normalize_attrs({"group": 2}), [(1, 4, 5, 5), (4, 1, 3, 3)]))


def test_a_proof_verify_rules_would_not_repeat_is_checked_on_its_schedule():
    """With ``replay`` (generate-rules), a variant proved by a call larger than verify-rules' first round is
    proved again as verify-rules would: still proved here, and those units are counted; without it they are not."""
    plain = verify_candidate(ZERO_PRODUCT, rlimit=300_000, rounds=(1_000,))
    replayed = verify_candidate(ZERO_PRODUCT, rlimit=300_000, rounds=(1_000,), replay=True)
    assert plain.status == replayed.status == OutcomeStatus.PROVED
    again = verify_candidate(ZERO_PRODUCT)  # verify-rules' budget and rounds
    assert replayed.rlimit_used == plain.rlimit_used + again.rlimit_used
    cheap = verify_candidate(ZERO_PRODUCT, rlimit=300_000, replay=True)  # proved in the first round: no replay
    assert cheap.rlimit_used == verify_candidate(ZERO_PRODUCT, rlimit=300_000).rlimit_used


def _conv(src: str, kernel: str, out: str, stride: int) -> dict:
    return {"op": "conv", "in": [src, kernel], "out": [out],
            "attrs": {"act": "none", "group": 1, "pads": [0, 0, 0, 0], "strides": [stride, stride]}}


#: A stride moved from a conv to the 1x1 conv after it: true for 1x1 kernels only, which the rule does not say,
#: and the sizes it was found on keep the second kernel 1x1 in most draws of the first numeric check.
STRIDE_TO_1X1 = {"name": "t", "inputs": {"i1": "any", "k31": "const", "k11": "const"},
                 "src": [_conv("i1", "k31", "s0", 2), _conv("s0", "k11", "s1", 1)],
                 "dst": [_conv("i1", "k31", "d0", 1), _conv("d0", "k11", "d1", 2)], "outputs": {"s1": "d1"},
                 "provenance": {"found_on": {"i1": [1, 4, 7, 7], "k31": [4, 4, 3, 1], "k11": [4, 4, 1, 1]}}}


def test_a_candidate_z3_leaves_unknown_is_checked_on_more_shapes():
    """The first check (6 instances) does not refute STRIDE_TO_1X1 and z3 spends its budget; the wider check
    (``WIDE_TRIALS`` more instances) finds a second kernel of 2x2 where the two sides differ, once z3's first round
    has not settled the candidate: the later rounds' budget is not spent on it."""
    from xflow.verifier.batch import GENERATION_ROUNDS, WIDE_TRIALS

    plain = verify_candidate(STRIDE_TO_1X1, rlimit=GENERATION_RLIMIT, rounds=GENERATION_ROUNDS)
    assert plain.status == OutcomeStatus.UNKNOWN, plain
    wide = verify_candidate(STRIDE_TO_1X1, rlimit=GENERATION_RLIMIT, rounds=GENERATION_ROUNDS,
                            wide_trials=WIDE_TRIALS)
    assert wide.status == OutcomeStatus.REFUTED and "wider numeric check after z3's first round" in wide.reason, wide
    assert wide.rlimit_used < plain.rlimit_used / 4, (wide.rlimit_used, plain.rlimit_used)
    # a true candidate z3 cannot settle stays unknown
    assert verify_candidate(ZERO_PRODUCT_SQUARED, rlimit=GENERATION_RLIMIT,
                            wide_trials=WIDE_TRIALS).status == OutcomeStatus.UNKNOWN


def _bn_conv(src: str, out: str, pad: list) -> list:
    """A zero pad of ``src``, a stride-2 conv by k33 (group and pads variables) and a batchnorm."""
    bn = ["bn_scale_k33", "bn_shift_k33", "bn_mean_k33", "bn_var_k33"]
    return [{"op": "pad", "in": [src], "out": [f"{out}_pad"], "attrs": {"pads": pad, "value": 0.0}},
            {"op": "conv", "in": [f"{out}_pad", "k33"], "out": [f"{out}_conv"],
             "attrs": {"act": "none", "group": "?cg", "pads": "?cp", "strides": [2, 2]}},
            {"op": "batchnorm", "in": [f"{out}_conv", *bn], "out": [out], "attrs": {"epsilon": "?eps"}}]


#: A batchnorm lift of the <= 2-op run (g2_0d799ac141_batchnorm): a stride-2 conv reads the same windows of an
#: image padded 2 or 1 at its end where the outputs keep one size. In a fresh process generate-rules' second call
#: proves it in 91k units, after its first call (20k) failed in the same z3 context; verify-rules, from a fresh
#: context, needs 1.3M: more than its first two rounds (1.1M).
BN_AFTER_A_FAILED_CALL = {
    "name": "g2_0d799ac141_batchnorm", "doc": "batchnorm lift: conv(pad(x, end 2)) -> conv(pad(x, end 1)), stride 2",
    "inputs": {"i1": "any", "k33": "const", "bn_scale_k33": "const", "bn_shift_k33": "const",
               "bn_mean_k33": "const", "bn_var_k33": "const"},
    "provenance": {"found_on": {"i1": [1, 4, 7, 7], "k33": [4, 4, 3, 3], "bn_scale_k33": [4],
                                "bn_shift_k33": [4], "bn_mean_k33": [4], "bn_var_k33": [4]}},
    "src": _bn_conv("i1", "s1", [0, 0, 1, 1, 0, 0, 2, 2]),
    "dst": _bn_conv("i1", "d1", [0, 0, 1, 1, 0, 0, 1, 1]),
    "outputs": {"s1": "d1"}}


def _fresh_process_outcomes() -> None:
    """Print generate-rules' outcome of BN_AFTER_A_FAILED_CALL without and with ``replay``, and verify-rules' with
    whether it needed more than its first rounds."""
    from xflow.verifier.batch import ESCALATION, GENERATION_ROUNDS

    for replay in (False, True):
        outcome = verify_candidate(BN_AFTER_A_FAILED_CALL, rlimit=GENERATION_RLIMIT, rounds=GENERATION_ROUNDS,
                                   replay=replay)
        print(outcome.status, outcome.statuses[0].split(":")[0])
    outcome = verify_candidate(BN_AFTER_A_FAILED_CALL)
    print(outcome.status, "last round" if outcome.rlimit_used > sum(ESCALATION) else "first rounds")


@pytest.mark.slow
def test_a_proof_after_a_failed_call_in_its_context_is_checked_on_verify_rules_schedule():
    """z3's search follows the order of the terms its context holds, so a proof found after another call in the
    same context may not repeat from a fresh one: generate-rules (``replay``) proves it again as verify-rules
    would in its first rounds, and does not write it when that fails (here verify-rules needs its last round:
    seconds each time it checks the file). Its file then re-verifies quickly. Run in a fresh process: which of
    these calls proves it also depends on what the process proved before."""
    import subprocess
    import sys
    from pathlib import Path

    code = "import test_verifier_speed as t; t._fresh_process_outcomes()"
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parent, capture_output=True,
                         text=True, check=True).stdout.split("\n")
    assert out[:3] == ["proved unknown", "unknown unknown", "proved last round"]  # the second call proves it
