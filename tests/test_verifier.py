"""The verifier: axioms hold numerically and are consistent; good rules prove, unsound ones do not."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import z3
from xflow.verifier import AXIOMS, check_consistency, encode_rule, numeric_check, prove_rule, verify_rule
from xflow.verifier.axioms import FIRST_AXIS, Axiom, _same
from xflow.verifier.encode import Unsupported, translate_expr
from xflow.verifier.status import OutcomeStatus

from tests.rulebook import CONCAT_SPLIT_CANCEL, CONV_RELU_FOLD, MATMUL_MERGE
from tests.test_ops import _random_case
from tests.test_verifier_speed import _Shapes
from xflow.ops import OPS
from xflow.rules import Expr, ShapeEnv, parse_rule

GOOD = [MATMUL_MERGE, CONV_RELU_FOLD, CONCAT_SPLIT_CANCEL]

MATMUL_COMM = {
    "name": "matmul_comm_unsound", "inputs": {"a": "any", "b": "any"},
    "src": [{"op": "matmul", "in": ["a", "b"], "out": ["y"]}],
    "dst": [{"op": "matmul", "in": ["b", "a"], "out": ["z"]}],
    "outputs": {"y": "z"},
}

SPLIT_CONCAT_SWAP = {
    "name": "split_concat_swap_unsound", "doc": "concat(s2, s1) of split(x) -> x: pieces in the wrong order",
    "inputs": {"x": "any"},
    "src": [{"op": "split", "in": ["x"], "out": ["s1", "s2"], "attrs": {"axis": "?axis", "split": "?sizes"}},
            {"op": "concat", "in": ["s2", "s1"], "out": ["y"], "attrs": {"axis": "?axis"}}],
    "dst": [],
    "outputs": {"y": "x"},
}

# split(concat(a, b)) -> a, b with no where condition: the split sizes need not match a's dim, but the
# matcher rejects a rewrite that changes an output's shape, so the rule holds wherever it applies.
SPLIT_CONCAT_UNGUARDED = {
    "name": "split_concat_unguarded", "inputs": {"a": "any", "b": "any"},
    "src": [{"op": "concat", "in": ["a", "b"], "out": ["c"], "attrs": {"axis": "?axis"}},
            {"op": "split", "in": ["c"], "out": ["s1", "s2"], "attrs": {"axis": "?axis", "split": "?sizes"}}],
    "dst": [],
    "outputs": {"s1": "a", "s2": "b"},
}

CONV_MERGE = {
    "name": "conv_merge_shared_input", "inputs": {"x": "any", "w1": "const", "w2": "const"},
    "src": [{"op": "conv", "in": ["x", "w1"], "out": ["y1"], "attrs": {"strides": "?s", "pads": "?p", "act": "?a"}},
            {"op": "conv", "in": ["x", "w2"], "out": ["y2"], "attrs": {"strides": "?s", "pads": "?p", "act": "?a"}}],
    "dst": [{"op": "concat", "in": ["w1", "w2"], "out": ["w"], "attrs": {"axis": 0}},
            {"op": "conv", "in": ["x", "w"], "out": ["y"], "attrs": {"strides": "?s", "pads": "?p", "act": "?a"}},
            {"op": "split", "in": ["y"], "out": ["z1", "z2"],
             "attrs": {"axis": 1, "split": "=(dim(w1, 0), dim(w2, 0))"}}],
    "outputs": {"y1": "z1", "y2": "z2"},
}

TRANSPOSE_MATMUL = {
    "name": "transpose_matmul", "inputs": {"a": "any", "b": "any"},
    "src": [{"op": "transpose", "in": ["a"], "out": ["at"], "attrs": {"perm": [1, 0]}},
            {"op": "transpose", "in": ["b"], "out": ["bt"], "attrs": {"perm": [1, 0]}},
            {"op": "matmul", "in": ["bt", "at"], "out": ["y"]}],
    "dst": [{"op": "matmul", "in": ["a", "b"], "out": ["m"]},
            {"op": "transpose", "in": ["m"], "out": ["z"], "attrs": {"perm": [1, 0]}}],
    "outputs": {"y": "z"},
}

MATMUL_FACTOR = {
    "name": "matmul_factor", "inputs": {"x": "any", "a": "any", "b": "any", "s": "any"},
    "src": [{"op": "matmul", "in": ["x", "a"], "out": ["p"]}, {"op": "matmul", "in": ["x", "b"], "out": ["q"]},
            {"op": "add", "in": ["p", "q"], "out": ["r"]}, {"op": "smul", "in": ["r", "s"], "out": ["y"]}],
    "dst": [{"op": "add", "in": ["b", "a"], "out": ["ab"]}, {"op": "smul", "in": ["ab", "s"], "out": ["abs"]},
            {"op": "matmul", "in": ["x", "abs"], "out": ["z"]}],
    "outputs": {"y": "z"},
}

AVGPOOL_AS_CONV = {
    "name": "avgpool_as_conv", "inputs": {"x": "any"},
    "src": [{"op": "avgpool", "in": ["x"], "out": ["y"],
             "attrs": {"kernel": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1], "count_include_pad": 1}}],
    "dst": [{"op": "const_pool", "out": ["k"], "attrs": {"shape": ["=dim(x, 1)", 1, 3, 3], "dtype": 11}},
            {"op": "conv", "in": ["x", "k"], "out": ["z"],
             "attrs": {"strides": [1, 1], "pads": [1, 1, 1, 1], "group": "=dim(x, 1)"}}],
    "outputs": {"y": "z"},
}

# enlarging a kernel to its own size changes nothing (the kernel's size comes from the target's shape)
ENLARGE_TO_OWN_SIZE = {
    "name": "enlarge_to_own_size", "inputs": {"k33": "const"},
    "src": [{"op": "enlarge", "in": ["k33"], "out": ["e"], "attrs": {"size": [3, 3]}}],
    "dst": [], "outputs": {"e": "k33"},
}

SMUL_TWICE = {
    "name": "smul_twice", "inputs": {"x": "any", "s": "const"},
    "src": [{"op": "smul", "in": ["x", "s"], "out": ["a"]}, {"op": "smul", "in": ["a", "s"], "out": ["b"]}],
    "dst": [{"op": "mul", "in": ["s", "s"], "out": ["ss"]}, {"op": "smul", "in": ["x", "ss"], "out": ["c"]}],
    "outputs": {"b": "c"}, "where": ["rank(s) == 0"],
}

MORE_GOOD = [SPLIT_CONCAT_UNGUARDED, CONV_MERGE, TRANSPOSE_MATMUL, MATMUL_FACTOR, AVGPOOL_AS_CONV, ENLARGE_TO_OWN_SIZE,
             SMUL_TWICE]

GROUPED_CONV_MERGE = {
    "name": "grouped_conv_merge_unguarded", "inputs": {"x": "any", "y": "any", "z": "any", "w": "any"},
    "src": [{"op": "conv", "in": ["x", "y"], "out": ["c1"], "attrs": {"strides": "?s", "pads": "?p", "group": 1}},
            {"op": "conv", "in": ["z", "w"], "out": ["c2"], "attrs": {"strides": "?s", "pads": "?p", "group": 1}},
            {"op": "concat", "in": ["c1", "c2"], "out": ["c"], "attrs": {"axis": 1}}],
    "dst": [{"op": "concat", "in": ["x", "z"], "out": ["xz"], "attrs": {"axis": 1}},
            {"op": "concat", "in": ["y", "w"], "out": ["yw"], "attrs": {"axis": 0}},
            {"op": "conv", "in": ["xz", "yw"], "out": ["d"], "attrs": {"strides": "?s", "pads": "?p", "group": 2}}],
    "outputs": {"c": "d"},
}

RELU_OVER_ADD = {
    "name": "relu_distributes_over_add_unsound", "inputs": {"a": "any", "b": "any"},
    "src": [{"op": "add", "in": ["a", "b"], "out": ["s"]}, {"op": "relu", "in": ["s"], "out": ["y"]}],
    "dst": [{"op": "relu", "in": ["a"], "out": ["ra"]}, {"op": "relu", "in": ["b"], "out": ["rb"]},
            {"op": "add", "in": ["ra", "rb"], "out": ["z"]}],
    "outputs": {"y": "z"},
}

UNSOUND = [MATMUL_COMM, SPLIT_CONCAT_SWAP, GROUPED_CONV_MERGE, RELU_OVER_ADD]


def test_axiom_count_and_names():
    assert len(AXIOMS) >= 43
    assert len({a.name for a in AXIOMS}) == len(AXIOMS)


@pytest.mark.parametrize("axiom", AXIOMS, ids=lambda a: a.name)
def test_axiom_holds_numerically(axiom: Axiom):
    rng = np.random.default_rng(sum(map(ord, axiom.name)))
    for _ in range(3):
        assert axiom.check(rng) <= 1e-9
    assert isinstance(axiom.formula(), z3.QuantifierRef)


@pytest.mark.parametrize("axiom", AXIOMS, ids=lambda a: a.name)
def test_axiom_holds_off_its_generator(axiom: Axiom):
    """Operands of other shapes (broadcasting ones above all) either break the guard, are ill formed, or
    satisfy the axiom: an unguarded linearity axiom over a broadcasting op proved false rules."""
    rng = np.random.default_rng(sum(map(ord, axiom.name)) + 1)
    results = [axiom.check_perturbed(rng) for _ in range(1000)]
    holes = [r for r in results if r is not None and r > 1e-6]
    assert not holes, f"{len(holes)} of {sum(r is not None for r in results)} instances differ"
    assert any(r is not None for r in results)


@pytest.mark.parametrize("lhs, rhs, tensors", [
    # reducesum over axis 0 of a broadcast sum counts the smaller operand once per row
    (("reducesum", FIRST_AXIS, ("add", {}, "x", "y")),
     ("add", {}, ("reducesum", FIRST_AXIS, "x"), ("reducesum", FIRST_AXIS, "y")), ("x", "y")),
    # where(c, x, x) takes c's shape where c is the larger
    (("where", {}, "c", "x", "x"), "x", ("c", "x")),
    # concatenating broadcast differences: (1,) - (2,) and (2,) - (1,) give 4 elements, the other side 3
    (("concat", {"axis": 0}, ("sub", {}, "a", "b"), ("sub", {}, "c", "d")),
     ("sub", {}, ("concat", {"axis": 0}, "a", "c"), ("concat", {"axis": 0}, "b", "d")), ("a", "b", "c", "d")),
])
def test_perturbed_check_finds_an_unguarded_axiom(lhs, rhs, tensors):
    unguarded = Axiom("unguarded", lhs, rhs, tensors, (), _same(" ".join(tensors)))
    rng = np.random.default_rng(0)
    assert any((r := unguarded.check_perturbed(rng)) is not None and r > 1e-6 for _ in range(1000))


@pytest.mark.parametrize("name", sorted(n for n, op in OPS.items()
                                        if op.facts is not None or op.output_facts is not None))
def test_op_facts_hold_wherever_its_shape_rule_accepts(name: str):
    """The z3 facts an op guarantees (``OpDef.facts`` and ``output_facts``, hypotheses of every proof) are the
    numpy shape rule's: on shapes drawn by role, moved toward broadcasting and repaired by the op's fit, every
    fact holds wherever the shape rule accepts, the output facts on the shapes it gives."""
    op = OPS[name]
    rng, accepted = np.random.default_rng(sum(map(ord, name))), 0
    for _ in range(1500):
        if (drawn := _random_case(rng, name)) is None:
            continue
        shapes, node = drawn
        accepted += 1
        assert op.facts is None or all(op.facts(_Shapes, node.attrs, shapes)), (shapes, node.attrs)
        outs = op.infer(shapes, node.attrs)
        assert op.output_facts is None or all(op.output_facts(_Shapes, node.attrs, shapes, outs)), (
            shapes, node.attrs, outs)
    assert accepted >= 20


def test_window_output_facts_pin_the_output_size():
    """The facts give the output size exactly: a size one off breaks them, for conv and for both pools."""
    geometry = {"strides": (2, 1), "pads": (1, 0, 0, 1)}
    pool = {"kernel": (3, 2)}
    for name, shapes, window in (("conv", [(1, 2, 7, 6), (4, 2, 3, 2)], {}), ("maxpool", [(1, 2, 7, 6)], pool),
                                 ("avgpool", [(1, 2, 7, 6)], pool)):
        attrs = OPS[name].normalize_attrs({**geometry, **window})
        out = OPS[name].infer(shapes, attrs)
        facts = OPS[name].output_facts
        assert out[0][2:] == (3, 6) and all(facts(_Shapes, attrs, shapes, out))
        assert not all(facts(_Shapes, attrs, shapes, [(*out[0][:2], 4, 6)]))
        assert not all(facts(_Shapes, attrs, shapes, [(*out[0][:2], 3, 5)]))


def test_axioms_consistent():
    result = check_consistency(rlimit=300_000)
    assert result.consistent, result.answers


def test_consistency_catches_a_bad_axiom():
    # "x + y = x" collapses every pair of tensors together with ewadd_comm; its numeric check fails too
    bogus = Axiom("ewadd_absorbs", ("add", {}, "x", "y"), "x", ("x", "y"), (), _same("x y"))
    assert bogus.check(np.random.default_rng(0)) > 1e-3
    result = check_consistency(AXIOMS + (bogus,), rlimit=300_000)
    assert not result.consistent, result.answers


@pytest.mark.parametrize("raw", [*GOOD, *MORE_GOOD], ids=lambda r: r["name"])
def test_example_rules_proved(raw):
    rule = parse_rule(raw)
    result = prove_rule(rule, rlimit=20_000_000)
    assert result.status == OutcomeStatus.PROVED, result
    assert numeric_check(rule).ok
    assert verify_rule(rule).status == OutcomeStatus.PROVED


@pytest.mark.parametrize("raw", UNSOUND, ids=lambda r: r["name"])
def test_unsound_rules_rejected(raw):
    rule = parse_rule(raw)
    proof = prove_rule(rule, rlimit=3_000_000)
    assert proof.status != OutcomeStatus.PROVED, proof
    numeric = numeric_check(rule, trials=20)
    assert numeric.trials_run >= 1 and not numeric.ok, numeric
    assert verify_rule(rule).status == OutcomeStatus.REFUTED


def _concrete(value: object) -> object:
    """A z3 value simplified to a python int or bool (tuples entry by entry)."""
    if isinstance(value, tuple):
        return tuple(_concrete(v) for v in value)
    if isinstance(value, z3.ExprRef):
        value = z3.simplify(value)
        return z3.is_true(value) if z3.is_bool(value) else value.as_long()
    return value


@pytest.mark.parametrize("source", [
    "a + b * 2 - c // 2", "c % 3 == 1 or b in (1, 2)", "max(a, b) if a < b else min(a, c)", "(a, b) + (c,)",
    "len((a, b)) + sum((a, c))", "abs(b - c) >= 2 and not b == 0", "all((a > 0, b > 0)) and any((a < 0, c > 6))",
    "a < b <= c", "(a, b, c)[1] != 2", "-a + max((b, c)) > 0", "b not in (a, c)", "1 if c == 7 else 2",
])
def test_z3_semantics_agrees_with_python_on_concrete_values(source: str):
    """The verifier's semantics of the rule-expression language overrides the Python one only where z3 differs:
    on the same concrete values, as z3 Ints or as ints, both give the same value."""
    expr = Expr(source)
    values = {"a": 5, "b": 2, "c": 7}
    want = expr.evaluate(ShapeEnv(values, {}))
    assert _concrete(translate_expr(expr, {k: z3.IntVal(v) for k, v in values.items()}, {})) == want
    assert _concrete(translate_expr(expr, dict(values), {})) == want


def test_unsupported_is_never_proved():
    raw = {"name": "reshape_shape_expr", "inputs": {"a": "any"},
           "src": [{"op": "relu", "in": ["a"], "out": ["y"]}],
           "dst": [{"op": "reshape", "in": ["a"], "out": ["r"], "attrs": {"shape": "=shape(a)"}},
                   {"op": "relu", "in": ["r"], "out": ["z"]}],
           "outputs": {"y": "z"}}
    rule = parse_rule(raw)
    with pytest.raises(Unsupported):
        encode_rule(rule)
    assert prove_rule(rule).status == OutcomeStatus.UNSUPPORTED


#: fused_matmul[transA] -> transpose ; matmul: true only where x has rank 4, which only the target's transpose says
UNFUSE_TRANS_A = {"name": "unfuse_trans_a", "inputs": {"x": "any", "y": "any"},
                  "src": [{"op": "fused_matmul", "in": ["x", "y"], "out": ["f"],
                           "attrs": {"alpha": 1.0, "transA": 1, "transB": 0}}],
                  "dst": [{"op": "transpose", "in": ["x"], "out": ["t"], "attrs": {"perm": [0, 1, 3, 2]}},
                          {"op": "matmul", "in": ["t", "y"], "out": ["m"]}], "outputs": {"f": "m"}}


def _fused_matmul_graph(rank: int):
    from onnx import TensorProto, helper

    from xflow.onnx_io import graph_from_model

    lead = (2, 3, 4, 5)[: rank - 2]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [*lead, 6, 7])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [*lead, 6, 8])
    out = helper.make_tensor_value_info("z", TensorProto.FLOAT, [*lead, 7, 8])
    node = helper.make_node("FusedMatMul", ["x", "y"], ["z"], domain="com.microsoft", transA=1, alpha=1.0)
    model = helper.make_model(helper.make_graph([node], "g", [x, y], [out]), ir_version=8,
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    return graph_from_model(model)


def test_a_rule_true_where_its_target_is_well_formed_is_proved_and_applies_only_there():
    """The target's shape facts are hypotheses because the matcher refuses a match whose target does not
    type-check: the unfusing rule is proved, fires on a rank-4 FusedMatMul and not on a rank-3 one."""
    from xflow.rewrite.match import find_matches

    rule = parse_rule(UNFUSE_TRANS_A)
    assert prove_rule(rule).status == OutcomeStatus.PROVED
    assert len(list(find_matches(_fused_matmul_graph(4), rule))) == 1
    assert list(find_matches(_fused_matmul_graph(3), rule)) == []


def test_a_proof_with_no_numeric_instance_is_unchecked_not_proved(monkeypatch):
    """z3 proves a rule whose sides never type-check together vacuously (its shape facts contradict each other);
    only a rule also checked on real instances counts as proved, as in ``verify-rules``."""
    import xflow.verifier.numeric as numeric
    import xflow.verifier.prove as prove

    rule = parse_rule(CONV_RELU_FOLD)
    assert verify_rule(rule).status == OutcomeStatus.PROVED
    # the same rule, with the numeric check given no draws at all: nothing ran, so nothing was checked
    monkeypatch.setattr(prove, "numeric_check", lambda r, **kw: numeric.numeric_check(r, **{**kw, "attempts": 0,
                                                                                           "found_on": None}))
    result = verify_rule(rule)
    assert result.proof.status == OutcomeStatus.PROVED and result.numeric.trials_run == 0
    assert result.status == OutcomeStatus.UNCHECKED and not result.ok


def _unary_rule(src: list, dst: list, out: str) -> object:
    return parse_rule({"name": "t", "inputs": {"x": "any"}, "src": src, "dst": dst, "outputs": {"s0": out}})


def test_a_target_that_computes_nan_where_the_source_is_finite_is_a_mismatch():
    """x - x is zero, so the target is 0 / 0: NaN everywhere. A NaN compares false with any tolerance, so the
    check used to count these instances as agreeing."""
    zero = {"op": "sub", "in": ["x", "x"], "out": ["d0"]}
    rule = _unary_rule([{"op": "relu", "in": ["x"], "out": ["s0"]}],
                       [zero, {"op": "mul", "in": ["x", "d0"], "out": ["d1"]},
                        {"op": "div", "in": ["d1", "d0"], "out": ["d2"]}], "d2")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the check judges non-finite values itself: no RuntimeWarning reaches a user
        result = numeric_check(rule, trials=3)
    assert not result.ok and result.trials_run >= 1 and "mismatch" in result.reason


def test_an_instance_outside_the_source_domain_is_no_evidence():
    """sqrt of a tensor with a negative entry is NaN: such an instance says nothing about the rule (it used to
    pass as agreeing, and three of the first draws did); only draws with no negative entry count now, a few in 50."""
    rule = _unary_rule([{"op": "sqrt", "in": ["x"], "out": ["s0"]}],
                       [{"op": "relu", "in": ["x"], "out": ["d0"]}, {"op": "sqrt", "in": ["d0"], "out": ["d1"]}], "d1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = numeric_check(rule, trials=3, attempts=50)
    assert result.trials_run < 3


def _conv_rule(strides: list[int], act: str) -> dict:
    return {"name": "t", "inputs": {"x": "any", "k": "const"},
            "src": [{"op": "conv", "in": ["x", "k"], "out": ["y"],
                     "attrs": {"act": act, "group": 1, "pads": [0, 0, 0, 0], "strides": strides}}],
            "dst": [{"op": "conv", "in": ["x", "k"], "out": ["z"],
                     "attrs": {"act": act, "group": 1, "pads": [0, 0, 0, 0], "strides": strides}}],
            "outputs": {"y": "z"}}


def test_an_encoding_reused_from_an_earlier_rule_is_the_rules_own():
    """The encoder reuses the terms and facts of an application it built for an earlier rule (``_APPLIED``): a rule
    differing in one attribute gets its own terms, and a rule encoded again gets exactly what a fresh encoder
    gives."""
    from xflow.verifier import encode

    def shape(raw: dict) -> tuple[list[str], list[str]]:
        enc = encode_rule(parse_rule(raw))
        return [h.sexpr() for h in enc.hypotheses], [g[2].sexpr() for g in enc.goals]

    stride1, stride2 = shape(_conv_rule([1, 1], "none")), shape(_conv_rule([2, 2], "none"))
    assert stride1 != stride2
    assert shape(_conv_rule([1, 1], "relu")) != stride1
    again = shape(_conv_rule([1, 1], "none"))
    encode._APPLIED.clear()
    assert again == stride1 == shape(_conv_rule([1, 1], "none"))
