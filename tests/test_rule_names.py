"""Readable rule names: derived from what a rule's patterns do; the hash stays the id."""

from __future__ import annotations

from tests.rulebook import ALL
from xflow.rules import parse_rule
from xflow.rules.naming import by_readable_name


def test_readable_names_say_what_the_rule_does():
    names = {r.name: r.readable_name for r in ALL}
    assert names == {"matmul_merge_shared_lhs": "merge-matmul-shared-lhs", "conv_relu_fold": "fuse-relu-into-conv",
                     "concat_split_cancel": "cancel-concat-split", "split_split_merge": "merge-split"}


def test_the_shared_operand_is_named_by_its_position_or_role():
    shared_rhs = parse_rule({
        "name": "g2_x", "inputs": {"a": "any", "b": "any", "w": "const"},
        "src": [{"op": "matmul", "in": ["a", "w"], "out": ["y1"]}, {"op": "matmul", "in": ["b", "w"], "out": ["y2"]}],
        "dst": [{"op": "concat", "in": ["a", "b"], "out": ["c"], "attrs": {"axis": 0}},
                {"op": "matmul", "in": ["c", "w"], "out": ["y"]},
                {"op": "split", "in": ["y"], "out": ["z1", "z2"],
                 "attrs": {"axis": 0, "split": "=(dim(a, 0), dim(b, 0))"}}],
        "outputs": {"y1": "z1", "y2": "z2"}, "where": ["rank(a) == 2", "rank(b) == 2"]})
    assert shared_rhs.readable_name == "merge-matmul-shared-rhs"
    assert shared_rhs.name == "g2_x"  # the id is unchanged


def test_reordered_ops_and_summaries_by_name():
    swap = parse_rule({
        "name": "t", "inputs": {"x": "any"},
        "src": [{"op": "relu", "in": ["x"], "out": ["r"]},
                {"op": "transpose", "in": ["r"], "out": ["y"], "attrs": {"perm": (1, 0)}}],
        "dst": [{"op": "transpose", "in": ["x"], "out": ["t"], "attrs": {"perm": (1, 0)}},
                {"op": "relu", "in": ["t"], "out": ["z"]}],
        "outputs": {"y": "z"}, "where": ["rank(x) == 2"]})
    assert swap.readable_name == "reorder-relu-transpose"
    assert by_readable_name({"g3_a": 2, "g3_b": 1, "hand": 4}, {"g3_a": "merge-x", "g3_b": "merge-x"}) == \
        {"merge-x": 3, "hand": 4}


def test_an_op_moved_onto_the_weights_is_a_fold():
    """The layer scale folded into a matmul's weight: the Mul read a run-time value, now only constants."""
    fold = parse_rule({
        "name": "g3_f", "inputs": {"x": "any", "w": "const", "g": "const"},
        "src": [{"op": "matmul", "in": ["x", "w"], "out": ["m"]}, {"op": "mul", "in": ["m", "g"], "out": ["y"]}],
        "dst": [{"op": "mul", "in": ["w", "g"], "out": ["wg"]}, {"op": "matmul", "in": ["x", "wg"], "out": ["z"]}],
        "outputs": {"y": "z"}, "where": ["rank(w) == 2", "rank(g) == 1"]})
    assert fold.readable_name == "fold-mul-into-matmul"
    # with a run-time scale the Mul still reads a run-time value: not a fold
    unfolded = parse_rule({**fold.to_json(), "inputs": {"x": "any", "w": "const", "g": "any"}})
    assert unfolded.readable_name != "fold-mul-into-matmul"
