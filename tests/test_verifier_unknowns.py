"""What settles more of the <= 2-op candidates z3 used to leave unknown: explicit zero pads meeting the pads of a
window op (and each other), the identity kernel at any stride, facts on a window's pads and strides, and a wider
numeric check that refutes candidates claiming strides or sizes the usual draws never reach."""

from __future__ import annotations

import pytest
from xflow.verifier import prove_rule
from xflow.verifier.batch import GENERATION_ROUNDS, WIDE_TRIALS, verify_candidate
from xflow.verifier.prove import GENERATION_RLIMIT
from xflow.verifier.status import OutcomeStatus

from tests.test_verifier_speed import _Shapes
from xflow.ops import OPS
from xflow.rules import parse_rule


def _rule(src: list, dst: list, inputs: dict, outputs: dict, where: tuple = ()) -> dict:
    return {"name": "t", "inputs": inputs, "src": src, "dst": dst, "outputs": outputs, "where": list(where)}


def _pad(src: str, out: str, spatial: tuple[int, int, int, int]) -> dict:
    top, left, bottom, right = spatial
    return {"op": "pad", "in": [src], "out": [out], "attrs": {"pads": [0, 0, top, left, 0, 0, bottom, right]}}


def _conv(src: str, kernel: str, out: str, pads: object, strides: object = (2, 2)) -> dict:
    return {"op": "conv", "in": [src, kernel], "out": [out],
            "attrs": {"act": "none", "group": "?cg", "pads": pads,
                      "strides": strides if isinstance(strides, str) else list(strides)}}


#: A pad of one before a stride-2 conv with pads of its own (a variable: non-negative by conv's facts), against a
#: pad of one and two: the extra end row is never read where the outputs keep one size.
PAD_INTO_PADS = _rule([_pad("i1", "s0", (1, 1, 1, 1)), _conv("s0", "k", "s1", "?cp")],
                      [_pad("i1", "d0", (1, 1, 2, 2)), _conv("d0", "k", "d1", "?cp")],
                      {"i1": "any", "k": "const"}, {"s1": "d1"})
#: Two zero pads are one: pad(pad(x, 1 at the end), 1 around) -> pad(x, 1 before and 2 after).
PAD_OF_PAD = _rule([_pad("i1", "s0", (0, 0, 1, 1)), _pad("s0", "s1", (1, 1, 1, 1))],
                   [_pad("i1", "d0", (1, 1, 2, 2))], {"i1": "any"}, {"s1": "d0"})
#: A 3x3 identity kernel with pads (1, 1, 2, 2) at stride 2 reads what a 1x1 one reads.
ICONV_STRIDED = _rule([{"op": "const_iconv", "out": ["s0"], "attrs": {"shape": [4, 4, 1, 1], "dtype": 1}},
                       {"op": "conv", "in": ["i1", "s0"], "out": ["s1"],
                        "attrs": {"act": "none", "group": 1, "pads": [0, 0, 0, 0], "strides": "?cs"}}],
                      [{"op": "const_iconv", "out": ["d0"], "attrs": {"shape": [4, 4, 3, 3], "dtype": 1}},
                       {"op": "conv", "in": ["i1", "d0"], "out": ["d1"],
                        "attrs": {"act": "none", "group": 1, "pads": [1, 1, 2, 2], "strides": "?cs"}}],
                      {"i1": "any"}, {"s1": "d1"})


@pytest.mark.parametrize("raw", [PAD_INTO_PADS, PAD_OF_PAD, ICONV_STRIDED], ids=["pad_into_pads", "pad_of_pad",
                                                                                "iconv_strided"])
def test_the_new_axioms_prove_true_candidates_within_the_generation_budget(raw):
    result = prove_rule(parse_rule(raw), GENERATION_RLIMIT)
    assert result.status == OutcomeStatus.PROVED, result


def test_conv_and_pool_facts_bound_variable_pads_and_strides():
    """A rule's variable pads are non-negative and its strides positive (what conv's and pooling's shape rules
    accept); literal ones give no fact."""
    import z3
    from xflow.verifier.encode import encode_rule

    enc = encode_rule(parse_rule(PAD_INTO_PADS))
    text = " ".join(str(h) for h in enc.hypotheses)
    assert all(f"cp_{i} >= 0" in text for i in range(4))
    # the strides are literal here: no fact bounds them (a window's size >= 1 is an output fact's)
    assert "strides" not in text
    assert all(str(h).startswith("dim(") for h in enc.hypotheses if str(h).endswith(">= 1"))
    facts = OPS["maxpool"].facts(_Shapes, {"pads": (z3.Int("p"),) * 4, "strides": (z3.Int("s"),) * 2},
                                 [(1, 2, 5, 5)])
    assert any(str(f) == "p >= 0" for f in facts) and any(str(f) == "s >= 1" for f in facts)


#: The generalized candidate (strides a variable) of conv(x, k13, pads (0, 1, 0, 1)) -> conv(x, enlarge(k13) to 3x3,
#: pads (1, 1, 1, 1)): true at strides 1 and 2 (where the generator found it) and false at stride 3, where a 1x1 or
#: 3x3 kernel also keeps the output's size and the windows move.
ENLARGE_ANY_STRIDE = _rule([_conv("i1", "k13", "s0", [0, 1, 0, 1], "?cs")],
                           [{"op": "enlarge", "in": ["k13"], "out": ["d0"], "attrs": {"size": [3, 3]}},
                            _conv("i1", "d0", "d1", [1, 1, 1, 1], "?cs")],
                           {"i1": "any", "k13": "const"}, {"s0": "d1"})
ENLARGE_ANY_STRIDE["provenance"] = {"found_on": {"i1": [1, 4, 7, 7], "k13": [4, 4, 1, 3]}}


def test_the_wider_check_refutes_a_candidate_claiming_strides_it_was_not_found_at():
    outcome = verify_candidate(ENLARGE_ANY_STRIDE, rlimit=GENERATION_RLIMIT, rounds=GENERATION_ROUNDS,
                               wide_trials=WIDE_TRIALS)
    assert outcome.status == OutcomeStatus.REFUTED, outcome
    assert "wider numeric check" in outcome.reason
    plain = verify_candidate(ENLARGE_ANY_STRIDE, rlimit=GENERATION_RLIMIT, rounds=GENERATION_ROUNDS)
    assert plain.status == OutcomeStatus.UNKNOWN, plain  # the usual draws (strides 1 and 2) find no counterexample




def _conv1(src: str, kernel: str, out: str, pads: list[int]) -> dict:
    return {"op": "conv", "in": [src, kernel], "out": [out],
            "attrs": {"act": "none", "group": 1, "pads": pads, "strides": "?cs"}}


def _enlarge_any_kernel() -> dict:
    """The generator's candidate conv(x, k, no pads) -> conv(x, enlarge(k) to 3x3, pads 1), strides a variable,
    as it emits it (the general variant, then the same with ranks pinned): true for a 1x1 kernel (its one tap
    lands on the center), false for a 1x3 or 3x1 one, which enlarge also takes and whose outputs keep their
    size on some images. The generator names the input k11 but pins no size."""
    general = _rule([_conv1("i1", "k11", "s0", [0, 0, 0, 0])],
                    [{"op": "enlarge", "in": ["k11"], "out": ["d0"], "attrs": {"size": [3, 3]}},
                     _conv1("i1", "d0", "d1", [1, 1, 1, 1])],
                    {"i1": "any", "k11": "const"}, {"s0": "d1"})
    general["provenance"] = {"found_on": {"i1": [1, 4, 7, 7], "k11": [4, 4, 1, 1]}}
    pinned = {**general, "where": ["rank(i1) == 4", "rank(k11) == 4"]}
    return {**general, "variants": [general, pinned]}


def test_the_wider_check_draws_enough_to_refute_a_candidate_that_holds_for_one_kernel_size():
    """30 usual and 30 wider draws (the check before) left it unknown; WIDE_TRIALS wider draws find a 1x3
    kernel where the two sides differ."""
    candidate = _enlarge_any_kernel()
    plain = verify_candidate(candidate, rlimit=GENERATION_RLIMIT, rounds=GENERATION_ROUNDS)
    assert plain.status == OutcomeStatus.UNKNOWN, plain
    outcome = verify_candidate(candidate, rlimit=GENERATION_RLIMIT, rounds=GENERATION_ROUNDS,
                               wide_trials=WIDE_TRIALS)
    assert outcome.status == OutcomeStatus.REFUTED and "wider numeric check" in outcome.reason, outcome
    assert outcome.rlimit_used < plain.rlimit_used  # refuted before the later rounds spend the budget


def _window(op: str, src: str, out: str, strides: list[int]) -> dict:
    if op == "conv":
        return {"op": "conv", "in": [src, "k13"], "out": [out],
                "attrs": {"act": "relu", "group": 1, "pads": [0, 0, 0, 0], "strides": strides}}
    return {"op": "maxpool", "in": [src], "out": [out],
            "attrs": {"kernel": [3, 3], "pads": [1, 1, 1, 1], "strides": strides}}


def _stride_moved(op: str, kernel_size: int | None = None) -> dict:
    """The generator's candidate: a 1x1 conv after a stride-2 window op -> the 1x1 conv at stride 2 (end pads
    1, never read where the outputs keep one size) after the window at stride 1. The kernel k11 is a rule input
    of no pinned size; ``kernel_size`` pins one."""
    inputs = {"i1": "any", "k11": "const", **({"k13": "const"} if op == "conv" else {})}
    one_by_one = {"act": "none", "group": 1}
    where = [f"dim(k11, {axis}) == {kernel_size}" for axis in (2, 3)] if kernel_size else []
    return _rule([_window(op, "i1", "s0", [2, 2]),
                  {"op": "conv", "in": ["s0", "k11"], "out": ["s1"],
                   "attrs": {**one_by_one, "pads": [0, 0, 0, 0], "strides": [1, 1]}}],
                 [_window(op, "i1", "d0", [1, 1]),
                  {"op": "conv", "in": ["d0", "k11"], "out": ["d1"],
                   "attrs": {**one_by_one, "pads": [0, 0, 1, 1], "strides": [2, 2]}}],
                 inputs, {"s1": "d1"}, where)


@pytest.mark.parametrize("op", ["conv", "maxpool"])
def test_a_stride_moved_across_a_1x1_conv_is_proved_from_the_window_arithmetic(op):
    """Equal output sizes pin the kernel k11 to 1x1 only through conv's output-size arithmetic (its output facts);
    with them and the stride-through-1x1 axioms the candidate is proved within the generation budget."""
    from xflow.verifier.encode import encode_rule

    rule = parse_rule(_stride_moved(op))
    assert prove_rule(rule, GENERATION_RLIMIT).status == OutcomeStatus.PROVED
    text = " ".join(str(h) for h in encode_rule(rule).hypotheses)
    assert "dim(in_k11, 2)" in text  # the output facts name the kernel's window


def test_a_stride_moved_across_a_3x3_conv_never_applies():
    """The same candidate with a 3x3 kernel pinned: its two outputs never have one size (the facts say so), so it
    is vacuous, where the 1x1 one is not."""
    from xflow.verifier.prove import vacuous

    assert vacuous(parse_rule(_stride_moved("maxpool", kernel_size=3)))
    assert not vacuous(parse_rule(_stride_moved("maxpool", kernel_size=1)))
