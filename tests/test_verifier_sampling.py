"""The numeric check's draws fitted to the ops that refuse them; proofs that depend on their candidate only."""

from __future__ import annotations

import pytest
from xflow.verifier import numeric_check, prove
from xflow.verifier.batch import GENERATION_ROUNDS, verify_candidate
from xflow.verifier.numeric import _fitted
from xflow.verifier.prove import GENERATION_RLIMIT, ProofContext, prove_rule
from xflow.verifier.status import OutcomeStatus

from tests.rulebook import CONCAT_SPLIT_CANCEL, CONV_RELU_FOLD, MATMUL_MERGE
from xflow.ops import OPS, ShapeError
from xflow.ops.base import OpDef
from xflow.rules import parse_rule

#: Kernels concatenated along their output channels before a conv = the convs' outputs concatenated: the kernel
#: is read by the concat first (a layout op), so it is drawn as a kernel only because it reaches the conv's
#: kernel position, and its input channels meet the image only when drawn to.
CONCAT_KERNELS = {
    "name": "conv_of_concatenated_kernels",
    "doc": "conv(x, concat(k, k)) -> concat(conv(x, k), conv(x, k))",
    "inputs": {"x": "any", "k": "const"},
    "src": [{"op": "concat", "in": ["k", "k"], "out": ["kk"], "attrs": {"axis": 0}},
            {"op": "conv", "in": ["x", "kk"], "out": ["y"], "attrs": {"group": 1, "act": "none"}}],
    "dst": [{"op": "conv", "in": ["x", "k"], "out": ["c"], "attrs": {"group": 1, "act": "none"}},
            {"op": "concat", "in": ["c", "c"], "out": ["z"], "attrs": {"axis": 1}}],
    "outputs": {"y": "z"},
}


def test_draws_are_fitted_to_the_op_that_refuses_them(monkeypatch):
    rule = parse_rule(CONCAT_KERNELS)
    fitted = numeric_check(rule, trials=20, attempts=25)
    assert fitted.ok and fitted.trials_run == 20, fitted
    monkeypatch.setattr(OpDef, "fit_inputs", lambda self, shapes, attrs, free: None)
    _fitted.cache_clear()  # the check memoizes the fits: the op table changed under it
    try:
        unfitted = numeric_check(rule, trials=20, attempts=25)
    finally:
        monkeypatch.undo()
        _fitted.cache_clear()
    assert unfitted.trials_run < 15, unfitted  # an image's channels meet a drawn kernel's about once in three


@pytest.mark.parametrize(("op", "shapes", "attrs", "free"), [
    ("conv", [(1, 4, 5, 5), (2, 1, 3, 3)], {"group": 2}, {1}),  # kernel to the image
    ("conv", [(1, 4, 5, 5), (2, 1, 3, 3)], {"group": 1}, {0}),  # image to the kernel
    ("conv", [(1, 4, 5, 5), (3, 1, 1, 1), (1,)], {"group": 2}, {1, 2}),  # output channels a multiple of the group
    ("split", [(2, 3, 5)], {"axis": 1, "split": (2, 2)}, {0}),
    ("concat", [(2, 3), (4, 5, 1)], {"axis": 1}, {1}),
    ("matmul", [(2, 3, 4), (5, 6)], {}, {1}),
    ("matmul", [(2, 3, 4), (5, 6)], {}, {0}),
    ("add", [(2, 3), (4, 5)], {}, {1}),
    ("mha", [(2, 3, 8), (1, 4, 6), (5,)], {"num_heads": 2}, {1, 2}),  # key and value to the query
    ("mha", [(2, 3, 5), (1, 4, 8), (1, 4, 6)], {"num_heads": 4}, {0, 2}),  # query and value to the key
    ("mha", [(2, 3), (1, 4, 8), (1, 2, 6)], {"num_heads": 2}, {0, 1}),  # query and key to the value
    ("attention", [(2, 3, 8), (5, 6), (7,)], {"num_heads": 2}, {1, 2}),  # weights and bias to the input
    ("attention", [(2, 3, 5), (4, 24), (7,)], {"num_heads": 4}, {0, 2}),  # input and bias to the weights
    ("attention", [(2, 3, 4), (5, 6), (24,)], {"num_heads": 2}, {0, 1}),  # input and weights to the bias
    ("attention", [(2, 3, 4), (4, 24), (24,)], {"num_heads": 2, "qkv_hidden_sizes": (4, 4, 6)}, {1, 2}),
    ("attention", [(2, 3), (4, 5), (6,)], {"num_heads": 3}, {0, 1, 2}),  # all free: thirds multiples of the heads
])
def test_a_fitted_draw_is_accepted_and_changes_only_free_inputs(op, shapes, attrs, free):
    entry = OPS[op]
    normal = entry.normalize_attrs(attrs)
    with pytest.raises(ShapeError):
        entry.infer(shapes, normal)
    fitted = entry.fit_inputs(shapes, normal, frozenset(free))
    assert fitted is not None
    entry.infer(fitted, normal)  # accepted
    assert all(tuple(fitted[i]) == tuple(s) for i, s in enumerate(shapes) if i not in free)


def test_no_fit_without_a_free_input():
    entry = OPS["conv"]
    normal = entry.normalize_attrs({"group": 1})
    assert entry.fit_inputs([(1, 4, 5, 5), (2, 1, 3, 3)], normal, frozenset()) is None


def test_a_candidates_answer_and_count_do_not_depend_on_the_proofs_before_it():
    """All of a candidate's proofs share one z3 context of its own: proving others first in the same process
    changes neither its status nor the resource units it spends."""
    def run(candidate: dict) -> tuple[str, int]:
        outcome = verify_candidate({**candidate, "variants": [candidate]}, GENERATION_RLIMIT,
                                   rounds=GENERATION_ROUNDS)
        return outcome.status, outcome.rlimit_used

    first = run(CONCAT_SPLIT_CANCEL)
    for other in (MATMUL_MERGE, CONV_RELU_FOLD, CONCAT_KERNELS):
        run(other)
    assert run(CONCAT_SPLIT_CANCEL) == first
    assert first[0] == "proved" and first[1] > 0


class _FiresAtOnce:
    """A wall-clock guard that fires as soon as it is started, whatever the machine's speed."""

    def __init__(self, seconds: float, callback) -> None:
        self.callback, self.daemon = callback, True

    def start(self) -> None:
        self.callback()

    def cancel(self) -> None:
        pass


def test_a_proof_after_the_wall_clock_guard_fired_starts_from_a_fresh_context(monkeypatch):
    """What a stopped proof left in the candidate's context depends on the load: the next proof must not see it."""
    rule = parse_rule(MATMUL_MERGE)
    context = ProofContext()
    with monkeypatch.context() as patch:
        patch.setattr(prove.threading, "Timer", _FiresAtOnce)
        stopped = prove_rule(rule, context=context)
    assert stopped.status in ("timeout", "proved"), stopped  # z3 may have begun its check before the interrupt
    after = prove_rule(rule, context=context)
    alone = prove_rule(rule, context=ProofContext())
    assert after.status == alone.status == OutcomeStatus.PROVED
    assert after.rlimit_used == alone.rlimit_used


#: A stride-2 depthwise conv's output multiplied by its own 3 x 3 kernel as a matrix, compared at two end paddings
#: (a <= 3-op candidate): the product exists only where the conv's output is as wide as the kernel is tall, so few
#: draws near the found shapes are valid (2 in the first 500).
RARELY_VALID = {
    "name": "g3_6dce1a93de",
    "doc": "conv(matmul(dwconv(i1, kd), kd), k31) at two end paddings of the depthwise conv",
    "inputs": {"i1": "any", "k31": "const", "kd": "const"},
    "provenance": {"found_on": {"i1": [1, 4, 7, 7], "k31": [4, 4, 3, 1], "kd": [4, 1, 3, 3]}},
    "src": [{"op": "conv", "in": ["i1", "kd"], "out": ["s0"],
             "attrs": {"act": "none", "group": 4, "pads": [0, 0, 0, 0], "strides": [2, 2]}},
            {"op": "matmul", "in": ["s0", "kd"], "out": ["s1"]},
            {"op": "conv", "in": ["s1", "k31"], "out": ["s2"],
             "attrs": {"act": "none", "group": 1, "pads": [1, 0, 1, 0], "strides": [1, 1]}}],
    "dst": [{"op": "conv", "in": ["i1", "kd"], "out": ["d0"],
             "attrs": {"act": "none", "group": 4, "pads": [0, 0, 1, 1], "strides": [2, 2]}},
            {"op": "conv", "in": ["d0", "k31"], "out": ["d1"],
             "attrs": {"act": "none", "group": 1, "pads": [1, 0, 1, 0], "strides": [1, 1]}},
            {"op": "matmul", "in": ["d1", "kd"], "out": ["d2"]}],
    "outputs": {"s2": "d2"},
}


def test_a_rarely_valid_variant_is_drawn_longer_not_left_unchecked():
    from xflow.verifier.batch import ATTEMPTS, Outcome, _checked

    rule = parse_rule(RARELY_VALID)
    found_on = RARELY_VALID["provenance"]["found_on"]
    first = numeric_check(rule, trials=3, seed=0, attempts=ATTEMPTS, found_on=found_on)
    assert first.ok and 0 < first.trials_run < 3, first  # what the first draws give: too few to count
    outcome = Outcome(RARELY_VALID["name"], OutcomeStatus.UNCHECKED)
    checked = _checked(rule, RARELY_VALID, 3, 0, outcome)
    assert checked is not None and checked.ok and checked.trials_run >= 3, outcome.statuses
    verified = verify_candidate(RARELY_VALID, rlimit=GENERATION_RLIMIT, rounds=GENERATION_ROUNDS)
    assert verified.status != OutcomeStatus.UNCHECKED, verified.statuses
