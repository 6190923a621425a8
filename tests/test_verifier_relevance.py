"""Relevant-axiom selection: z3 gets the axioms a rule's ops can reach; a subset never refutes on its own,
and the full axiom set does not prove false rules through a shape collapse."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from xflow.verifier import AXIOMS, prove_rule
from xflow.verifier.axioms import _relu
from xflow.verifier.relevance import axioms_for, relevant_axioms
from xflow.verifier.status import OutcomeStatus

from xflow.rules import default_rules_path, parse_rule

RELU_TWICE = {"name": "relu_twice", "inputs": {"x": "any"},
              "src": [{"op": "relu", "in": ["x"], "out": ["a"]}, {"op": "relu", "in": ["a"], "out": ["b"]}],
              "dst": [{"op": "relu", "in": ["x"], "out": ["c"]}], "outputs": {"b": "c"}}


def _names(axioms):
    return {a.name for a in axioms}


def test_selection_follows_the_ops_each_axiom_mentions():
    """Axioms join by op-table name: a sub rule reaches neg through sub's definition, and erf_odd through neg;
    conv, matmul and the pools stay out."""
    chosen = _names(relevant_axioms({"sub", "erf"}))
    assert {"ewsub_def_neg", "neg_involution", "erf_odd"} <= chosen
    assert "ewadd_comm" in chosen  # sub's definition introduces add
    assert "transpose_erf" not in chosen  # its trigger needs a transpose
    assert not any(name.startswith(("conv", "matmul", "maxpool", "avgpool", "transpose")) for name in chosen)
    assert _names(relevant_axioms(set())) == set()
    every_op = set().union(*(a.ops for a in AXIOMS))
    assert relevant_axioms(every_op) == AXIOMS


def test_each_axiom_declares_the_ops_of_its_sides():
    by_name = {a.name: a for a in AXIOMS}
    assert by_name["conv_cpool_avgpool"].ops == {"conv", "const_pool", "avgpool"}
    assert by_name["split_concat_0"].ops == {"split", "concat/2"}  # a variadic op with its arity
    assert by_name["rank_matmul"].ops == {"matmul"}  # rank and dim are shape functions, not ops
    assert by_name["ewdiv_def"].triggers == (frozenset({"div"}),)  # triggered by its left side only


def test_a_variadic_op_is_selected_by_its_arity():
    """z3 has one concat function per arity: the one-input concat's axiom stays out of a two-input concat rule's
    set (where it could only move z3's search) and joins a one-input one's."""
    def concat_rule(arity):
        names = ["a", "b"][:arity]
        return parse_rule({"name": f"concat{arity}", "inputs": dict.fromkeys(names, "any"),
                           "src": [{"op": "concat", "in": names, "out": ["s"], "attrs": {"axis": 0}},
                                   {"op": "relu", "in": ["s"], "out": ["t"]}],
                           "dst": [{"op": "relu", "in": names[:1], "out": ["u"]}], "outputs": {"t": "u"}})
    assert "concat_single" in _names(axioms_for(concat_rule(1)))
    two = _names(axioms_for(concat_rule(2)))
    assert "concat_single" not in two and {"concat_relu", "concat_assoc"} <= two


def test_a_refutation_from_the_selected_axioms_is_retried_with_all_of_them():
    """relu(relu(x)) -> relu(x) needs relu_idempotent; triggered here only by a neg term, the selection for a
    relu-only rule leaves it out, z3 finds a countermodel of the rest, and the full set proves the rule."""
    hidden = tuple(replace(a, pattern=("neg", {}, _relu("x"))) if a.name == "relu_idempotent" else a
                   for a in AXIOMS)
    rule = parse_rule(RELU_TWICE)
    assert "relu_idempotent" not in _names(axioms_for(rule, hidden))
    subset_only = prove_rule(rule, rlimit=2_000_000, axioms=axioms_for(rule, hidden), relevant_only=False)
    assert subset_only.status == OutcomeStatus.REFUTED, subset_only
    result = prove_rule(rule, rlimit=2_000_000, axioms=hidden)
    assert result.status == OutcomeStatus.PROVED, result
    assert "relevant ones gave a countermodel" in result.reason


def test_the_selection_never_refutes_a_shipped_rule():
    """A sample of the shipped file across its whole length: proved with the selected axioms, each from
    fewer than all of them."""
    rules = json.loads(default_rules_path().read_text())["rules"]
    for raw in rules[::97]:
        rule = parse_rule(raw)
        assert len(axioms_for(rule)) < len(AXIOMS)
        result = prove_rule(rule)
        assert result.status == OutcomeStatus.PROVED, (raw["name"], result)


def test_a_false_rule_on_tensors_of_another_rank_is_not_proved():
    """relu(x) -> neg(x) on a rank-1 x is false. Every axiom together must not prove it: an identity
    conv(x, identity kernel) = x without x's shape in its guard, with conv's rank fact, gave every tensor rank
    4 and so proved any rule on rank-1 tensors."""
    rule = parse_rule({"name": "relu_is_neg_false", "inputs": {"x": "any"},
                       "src": [{"op": "relu", "in": ["x"], "out": ["a"]}],
                       "dst": [{"op": "neg", "in": ["x"], "out": ["b"]}], "outputs": {"a": "b"},
                       "where": ["rank(x) == 1"]})
    result = prove_rule(rule, rlimit=1_000_000, relevant_only=False)
    assert result.status != OutcomeStatus.PROVED, result


def _pad(src: str, out: str, spatial: tuple[int, int, int, int]) -> dict:
    top, left, bottom, right = spatial
    return {"op": "pad", "in": [src], "out": [out], "attrs": {"pads": [0, 0, top, left, 0, 0, bottom, right]}}


def _conv_sum_false(name: str, images: tuple[str, ...], kernels: tuple[str, ...], found_on: dict[str, list[int]],
                    pads: int, stride: int) -> dict:
    """conv(a, k) + conv(b, l) -> one conv of the summed operands (the images or the kernels, whichever are two),
    on 4-d inputs of the spatial sizes of ``found_on``."""
    attrs = {"pads": [pads] * 4, "strides": [stride, stride]}
    pairs = [(i, k) for i in images for k in kernels]
    summed, image, kernel = (images, "s", kernels[0]) if len(images) == 2 else (kernels, images[0], "s")
    return {"name": name, "inputs": {**dict.fromkeys(images, "any"), **dict.fromkeys(kernels, "const")},
            "src": [*({"op": "conv", "in": [i, k], "out": [f"c{n}"], "attrs": attrs} for n, (i, k) in enumerate(pairs)),
                    {"op": "add", "in": ["c0", "c1"], "out": ["c"]}],
            "dst": [{"op": "add", "in": list(summed), "out": ["s"]},
                    {"op": "conv", "in": [image, kernel], "out": ["d"], "attrs": attrs}],
            "outputs": {"c": "d"},
            "where": [cond for t, shape in found_on.items()
                      for cond in (f"rank({t}) == 4", f"dim({t}, 2) == {shape[2]}", f"dim({t}, 3) == {shape[3]}")],
            "provenance": {"found_on": found_on}}


#: False rules of the families the unknowns' axioms added, each next to a true one: zero padding commutes with a
#: concat on axis 0 or 1 (pad_concat_*), the pieces in their order; enlarging a difference of kernels of
#: one shape is the difference of the enlarged kernels (enlarge_ewsub), not for a 1x1 kernel broadcast against a 3x3
#: one (enlarged, it sits at the center only); an explicit pad before a conv adds to the conv's pads
#: (conv_pad_into_pads_*), at the end where it was at the end; a conv is linear in kernels, and in images, of one shape
#: only.
FALSE_PADDING_RULES = [
    {"name": "pad_concat_pieces_swapped_false", "inputs": {"a": "any", "b": "any"},
     "src": [{"op": "concat", "in": ["a", "b"], "out": ["c"], "attrs": {"axis": 1}}, _pad("c", "p", (1, 1, 1, 1))],
     "dst": [_pad("a", "pa", (1, 1, 1, 1)), _pad("b", "pb", (1, 1, 1, 1)),
             {"op": "concat", "in": ["pb", "pa"], "out": ["q"], "attrs": {"axis": 1}}],
     "outputs": {"p": "q"}, "where": ["rank(a) == 4", "rank(b) == 4"],
     "provenance": {"found_on": {"a": [1, 2, 3, 3], "b": [1, 2, 3, 3]}}},
    {"name": "enlarge_broadcast_difference_false", "inputs": {"w": "const", "v": "const"},
     "src": [{"op": "sub", "in": ["w", "v"], "out": ["d"]},
             {"op": "enlarge", "in": ["d"], "out": ["e"], "attrs": {"size": [3, 3]}}],
     "dst": [{"op": "enlarge", "in": ["w"], "out": ["ew"], "attrs": {"size": [3, 3]}},
             {"op": "enlarge", "in": ["v"], "out": ["ev"], "attrs": {"size": [3, 3]}},
             {"op": "sub", "in": ["ew", "ev"], "out": ["f"]}],
     "outputs": {"e": "f"},
     "where": ["rank(w) == 4", "rank(v) == 4", "dim(w, 2) == 3", "dim(w, 3) == 3", "dim(v, 2) == 1",
               "dim(v, 3) == 1"], "provenance": {"found_on": {"w": [2, 2, 3, 3], "v": [2, 2, 1, 1]}}},
    # conv(x, w) + conv(x, v) = conv(x, w + v) for kernels of one shape (conv_ewadd_weight's guard), not for a 1x1
    # kernel broadcast against a 3x3 one: at a stride as large as the image both outputs are 1x1, the 1x1 kernel
    # reads one pixel, the broadcast sum nine (a shipped rule, g3_c910ab3475, was proved without the guard)
    _conv_sum_false("conv_sum_of_broadcast_kernels_false", ("x",), ("w", "v"),
                    {"x": [1, 2, 3, 3], "w": [2, 2, 1, 1], "v": [2, 2, 3, 3]}, pads=0, stride=3),
    # and linear in images of one shape only (conv_ewadd_input's guard): a 1x1 image broadcast against a 5x5 one
    # convolves at every window, while its own conv, padded, reads it once (shipped rules g3_abbb15a92e and
    # g3_185565f2d0 were proved without the guard)
    _conv_sum_false("conv_sum_of_broadcast_images_false", ("x", "y"), ("w",),
                    {"x": [1, 2, 5, 5], "y": [1, 2, 1, 1], "w": [2, 2, 3, 3]}, pads=1, stride=1),
    {"name": "pad_into_conv_at_the_wrong_end_false", "inputs": {"x": "any", "w": "const"},
     "src": [_pad("x", "p", (0, 0, 1, 1)),
             {"op": "conv", "in": ["p", "w"], "out": ["y"], "attrs": {"pads": [1, 1, 1, 1], "strides": [1, 1]}}],
     "dst": [{"op": "conv", "in": ["x", "w"], "out": ["z"], "attrs": {"pads": [2, 2, 1, 1], "strides": [1, 1]}}],
     "outputs": {"y": "z"}, "provenance": {"found_on": {"x": [1, 2, 5, 5], "w": [2, 2, 3, 3]}}},
]


def _pinned(found_on: dict[str, list[int]]) -> list[str]:
    """where clauses holding each input to its rank and dims in ``found_on``."""
    return [cond for t, shape in found_on.items()
            for cond in (f"rank({t}) == {len(shape)}", *(f"dim({t}, {i}) == {d}" for i, d in enumerate(shape)))]


def _linear_false(name: str, op: str, attrs: dict, operands: tuple[str, ...], found_on: dict[str, list[int]]) -> dict:
    """op(x) + op(y) -> op(x + y) (``operands`` read by op after the ones summed: a kernel and a bias), on the
    broadcasting shapes of ``found_on``."""
    rest = list(operands)
    return {"name": name, "inputs": {"x": "any", "y": "any", **dict.fromkeys(rest, "const")},
            "src": [{"op": op, "in": ["x", *rest], "out": ["a"], "attrs": attrs},
                    {"op": op, "in": ["y", *rest], "out": ["b"], "attrs": attrs},
                    {"op": "add", "in": ["a", "b"], "out": ["c"]}],
            "dst": [{"op": "add", "in": ["x", "y"], "out": ["s"]},
                    {"op": op, "in": ["s", *rest], "out": ["d"], "attrs": attrs}],
            "outputs": {"c": "d"}, "where": _pinned(found_on), "provenance": {"found_on": found_on}}


#: False rules an unguarded linearity axiom over a broadcasting op proved (found by
#: ``Axiom.check_perturbed``; the shipped g3_6c4143f153 and g3_aabe71d98f were of the first and last form).
FALSE_BROADCAST_RULES = [
    # avgpool of a sum: a 1-row image broadcast against a 5-row one is pooled once per row on one side only
    _linear_false("avgpool_of_broadcast_sum_false", "avgpool",
                  {"kernel": [3, 3], "pads": [1, 1, 1, 1], "strides": [1, 1], "count_include_pad": 1}, (),
                  {"x": [1, 1, 5, 5], "y": [1, 1, 1, 5]}),
    # reducesum over axis 0 counts a broadcast operand once per row of the other
    _linear_false("reducesum_of_broadcast_sum_false", "reducesum", {"axes": [0], "keepdims": 1}, (),
                  {"x": [2, 3], "y": [1, 3]}),
    # conv with a bias, linear in kernel and bias together for kernels of one shape only
    {"name": "conv_bias_sum_of_broadcast_kernels_false",
     "inputs": {"x": "any", "w": "const", "v": "const", "b": "const", "c": "const"},
     "src": [{"op": "conv", "in": ["x", "w", "b"], "out": ["p"], "attrs": {"pads": [0, 0, 0, 0], "strides": [3, 3]}},
             {"op": "conv", "in": ["x", "v", "c"], "out": ["q"], "attrs": {"pads": [0, 0, 0, 0], "strides": [3, 3]}},
             {"op": "add", "in": ["p", "q"], "out": ["r"]}],
     "dst": [{"op": "add", "in": ["w", "v"], "out": ["k"]}, {"op": "add", "in": ["b", "c"], "out": ["e"]},
             {"op": "conv", "in": ["x", "k", "e"], "out": ["z"], "attrs": {"pads": [0, 0, 0, 0], "strides": [3, 3]}}],
     "outputs": {"r": "z"},
     "where": _pinned({"x": [1, 2, 3, 3], "w": [2, 2, 1, 1], "v": [2, 2, 3, 3], "b": [2], "c": [2]}),
     "provenance": {"found_on": {"x": [1, 2, 3, 3], "w": [2, 2, 1, 1], "v": [2, 2, 3, 3], "b": [2], "c": [2]}}},
]


@pytest.mark.parametrize("raw", [*FALSE_PADDING_RULES, *FALSE_BROADCAST_RULES], ids=lambda r: r["name"])
def test_false_rules_of_the_padding_families_are_not_proved(raw):
    """Every axiom together does not prove them (and the numeric check refutes each)."""
    from xflow.verifier import numeric_check

    rule = parse_rule(raw)
    assert prove_rule(rule, rlimit=1_000_000, relevant_only=False).status != OutcomeStatus.PROVED
    numeric = numeric_check(rule, trials=3, found_on=raw["provenance"]["found_on"])
    assert numeric.trials_run and not numeric.ok, numeric
