"""Hand-written rules used by the engine tests (the shipped rules come from the generator)."""

from xflow.rules import rules_from_json

MATMUL_MERGE = {
    "name": "matmul_merge_shared_lhs",
    "doc": "x@a, x@b -> split(x @ concat(a, b))",
    "inputs": {"x": "any", "a": "const", "b": "const"},
    "src": [{"op": "matmul", "in": ["x", "a"], "out": ["y1"]},
            {"op": "matmul", "in": ["x", "b"], "out": ["y2"]}],
    "dst": [{"op": "concat", "in": ["a", "b"], "out": ["w"], "attrs": {"axis": "=rank(a) - 1"}},
            {"op": "matmul", "in": ["x", "w"], "out": ["y"]},
            {"op": "split", "in": ["y"], "out": ["z1", "z2"],
             "attrs": {"axis": "=rank(y1) - 1", "split": "=(dim(a, -1), dim(b, -1))"}}],
    "outputs": {"y1": "z1", "y2": "z2"},
    "where": ["rank(a) == 2", "rank(b) == 2"],
}

CONV_RELU_FOLD = {
    "name": "conv_relu_fold",
    "doc": "relu(conv(x, w)) -> conv(x, w, act=relu)",
    "inputs": {"x": "any", "w": "any"},
    "src": [{"op": "conv", "in": ["x", "w"], "out": ["c"],
             "attrs": {"strides": "?s", "pads": "?p", "group": "?g", "act": "none"}},
            {"op": "relu", "in": ["c"], "out": ["y"]}],
    "dst": [{"op": "conv", "in": ["x", "w"], "out": ["z"],
             "attrs": {"strides": "?s", "pads": "?p", "group": "?g", "act": "relu"}}],
    "outputs": {"y": "z"},
}

CONCAT_SPLIT_CANCEL = {
    "name": "concat_split_cancel",
    "doc": "split(concat(a, b)) with matching sizes -> a, b",
    "inputs": {"a": "any", "b": "any"},
    "src": [{"op": "concat", "in": ["a", "b"], "out": ["c"], "attrs": {"axis": "?axis"}},
            {"op": "split", "in": ["c"], "out": ["s1", "s2"], "attrs": {"axis": "?axis", "split": "?sizes"}}],
    "dst": [],
    "outputs": {"s1": "a", "s2": "b"},
    "where": ["sizes == (dim(a, axis), dim(b, axis))"],
}

SPLIT_SPLIT_MERGE = {
    "name": "split_split_merge",
    "doc": "split the first part of a split again -> one three-way split",
    "inputs": {"y": "any"},
    "src": [{"op": "split", "in": ["y"], "out": ["p", "q"], "attrs": {"axis": "?ax", "split": "?s1"}},
            {"op": "split", "in": ["p"], "out": ["r", "t"], "attrs": {"axis": "?ax", "split": "?s2"}}],
    "dst": [{"op": "split", "in": ["y"], "out": ["r2", "t2", "q2"],
             "attrs": {"axis": "?ax", "split": "=(s2[0], s2[1], s1[1])"}}],
    "outputs": {"r": "r2", "t": "t2", "q": "q2"},
}

ALL = rules_from_json([MATMUL_MERGE, CONV_RELU_FOLD, CONCAT_SPLIT_CANCEL, SPLIT_SPLIT_MERGE])
