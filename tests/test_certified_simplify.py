"""The split simplifications are steps of the certificate that ``xflow check`` re-establishes on its own: each one
the nodes it removes and adds, decided equal as terms (``xflow.check.identity``), never ``simplify_splits`` run
again and trusted; a step edited after the fact is refused, naming it."""

from __future__ import annotations

import copy
import json

import numpy as np
import onnx
import pytest
from onnx import helper

from tests import test_simplify as forms
from xflow.check.certificate import Derived, certify
from xflow.check.replay import StepRefused, replay
from xflow.ir import Graph
from xflow.onnx_io import graph_from_model, to_model_proto
from xflow.rewrite import fold_constants
from xflow.rewrite.simplify import simplify_splits
from xflow.rules import default_rules_path


def _grid() -> onnx.ModelProto:
    nodes = [helper.make_node("Split", ["x"], ["xa", "xb"], axis=1, split=[3, 3]),
             helper.make_node("Split", ["xa"], [f"xa{t}" for t in range(4)], axis=0, split=[1, 1, 1, 1]),
             helper.make_node("Split", ["xb"], [f"xb{t}" for t in range(4)], axis=0, split=[1, 1, 1, 1])]
    for t in range(4):
        nodes += [helper.make_node("Split", [f"y{t}"], [f"y{t}a", f"y{t}b"], axis=1, split=[3, 3]),
                  helper.make_node("Add", [f"xa{t}", f"y{t}a"], [f"s{t}a"]),
                  helper.make_node("Add", [f"xb{t}", f"y{t}b"], [f"s{t}b"])]
    return forms.model_of(nodes, {"x": [4, 6], **{f"y{t}": [1, 6] for t in range(4)}},
                          {f"s{t}{h}": [1, 3] for t in range(4) for h in "ab"})


def _permuted_matmul() -> onnx.ModelProto:
    perm = [2, 0, 3, 1]
    weight = np.random.default_rng(3).standard_normal((5, 8)).astype(np.float32)
    return forms._with_weight(forms.model_of(
        [helper.make_node("MatMul", ["h", "W"], ["m"]),
         helper.make_node("Split", ["m"], [f"m{i}" for i in range(4)], axis=1, split=[2, 2, 2, 2]),
         helper.make_node("Split", ["a"], [f"a{i}" for i in range(4)], axis=1, split=[2, 2, 2, 2]),
         *[helper.make_node("Add", [f"a{i}", f"m{perm[i]}"], [f"y{i}"]) for i in range(4)]],
        {"a": [1, 8], "h": [1, 5]}, {f"y{i}": [1, 2] for i in range(4)}), "W", weight)


def _nested_and_hoisted() -> onnx.ModelProto:
    return forms.model_of([helper.make_node("Split", ["a"], ["a0", "a12"], axis=1, split=[2, 6]),
                           helper.make_node("Split", ["a12"], ["a1", "a2"], axis=1, split=[3, 3]),
                           helper.make_node("Split", ["b"], ["b0", "b1", "b2"], axis=1, split=[2, 3, 3]),
                           *[helper.make_node("Add", [f"a{i}", f"b{i}"], [f"s{i}"]) for i in range(3)],
                           *[helper.make_node("Tanh", [f"s{i}"], [f"y{i}"]) for i in range(3)]],
                          {"a": [1, 8], "b": [1, 8]}, {"y0": [1, 2], "y1": [1, 3], "y2": [1, 3]})


MODELS = {"grid": (_grid, {"regridded", "elementwise_hoisted"}),
          "weights_permuted": (_permuted_matmul, {"elementwise_hoisted"}),
          "nested": (_nested_and_hoisted, {"nested_splits", "elementwise_hoisted"}),
          "batchnorm": (lambda: forms._split_then_batchnorms((1e-5, 1e-5)), {"channelwise_hoisted"})}


def _certified(model: onnx.ModelProto) -> tuple[Graph, dict]:
    graph = graph_from_model(model)
    folded = fold_constants(graph)
    simplified = simplify_splits(folded)
    certificate = certify(graph, [], str(default_rules_path()), Derived(graph, folded, simplified))
    return graph, certificate


@pytest.mark.parametrize("name", sorted(MODELS))
def test_each_form_certifies_and_replays_to_the_same_model(name):
    make, expected = MODELS[name]
    model = make()
    graph, certificate = _certified(model)
    identities = [s for s in certificate["steps"] if s["kind"] == "simplification"]
    assert {s["form"] for s in identities} == expected
    replayed = replay(graph, json.loads(json.dumps(certificate)), {})
    want = to_model_proto(simplify_splits(fold_constants(graph)).graph)
    assert to_model_proto(replayed.graph).SerializeToString() == want.SerializeToString()


def _refusal(certificate: dict, graph: Graph, edit) -> StepRefused:
    doctored = copy.deepcopy(certificate)
    index = next(k for k, s in enumerate(doctored["steps"]) if s["kind"] == "simplification")
    edit(doctored["steps"][index])
    with pytest.raises(StepRefused) as refused:
        replay(graph, doctored, {})
    assert refused.value.index == index + 1
    return refused.value


def test_a_simplification_edited_after_the_fact_is_refused_naming_its_step():
    graph, certificate = _certified(_permuted_matmul())

    def swap_pieces(step: dict) -> None:  # the hoisted split hands its (equal-sized) pieces out in another order
        split = next(n for n in step["added"] if n["op"] == "split" and len(n["outputs"]) == 4)
        split["outputs"][0], split["outputs"][1] = split["outputs"][1], split["outputs"][0]

    def drop_added(step: dict) -> None:  # the pieces the rest of the graph reads are no longer made
        step["added"] = [n for n in step["added"] if not (n["op"] == "split" and len(n["outputs"]) == 4)]

    def claim_other_node(step: dict) -> None:
        step["removed"][0]["op"] = "mul"

    assert "do not compute what the nodes removed did" in str(_refusal(certificate, graph, swap_pieces))
    assert "no longer made" in str(_refusal(certificate, graph, drop_added))
    assert "is not the" in str(_refusal(certificate, graph, claim_other_node))


def test_a_simplification_whose_weight_permutation_is_wrong_is_refused():
    """The permuted weight is folded after the hoist: a certificate whose concat takes W's blocks in another order
    (which the fold would then compute faithfully) is refused at the identity, not trusted."""
    graph, certificate = _certified(_permuted_matmul())

    def reorder(step: dict) -> None:
        concat = next(n for n in step["added"] if n["op"] == "concat")
        concat["inputs"] = concat["inputs"][::-1]

    assert "do not compute" in str(_refusal(certificate, graph, reorder))


def test_a_certificate_of_the_format_before_is_refused_in_one_line():
    from xflow.check.certificate import parse
    from xflow.errors import XflowError

    with pytest.raises(XflowError, match="format xflow.certificate/1; this xflow checks xflow.certificate/2"):
        parse(json.dumps({"format": "xflow.certificate/1", "steps": []}), "old.json")


def test_a_simplification_over_a_dynamic_batch_checks_with_the_batch_as_a_symbol():
    """The terms are compared with the symbolic batch at two sizes; the split's own axis is static."""
    model = _nested_and_hoisted()
    for value in (*model.graph.input, *model.graph.output):
        value.type.tensor_type.shape.dim[0].dim_param = "batch"
    graph, certificate = _certified(model)
    assert any(s["kind"] == "simplification" for s in certificate["steps"])
    replayed = replay(graph, certificate, {})
    assert replayed.graph.structural_hash == certificate["output"]["graph"]


def test_terms_refuse_an_axis_a_concat_cuts_that_is_a_symbol():
    import sympy

    from xflow.check.terms import NotDecided, same_terms
    from xflow.ir import Attrs, Node, TensorType
    from xflow.ops import OPS

    batch = sympy.Symbol("batch", positive=True, integer=True)
    types = {"a": TensorType(1, (batch, 4)), "b": TensorType(1, (batch, 4)), "c": TensorType(1, (2 * batch, 4))}
    concat = Node("concat", ("a", "b"), ("c",), Attrs(OPS["concat"].normalize_attrs({"axis": 0})))
    along_features = Node("concat", ("a", "b"), ("c",), Attrs(OPS["concat"].normalize_attrs({"axis": 1})))
    with pytest.raises(NotDecided, match="symbolic dim"):
        same_terms([concat], [concat], ["c"], types.__getitem__)
    same_terms([along_features], [along_features], ["c"], types.__getitem__)  # the same term: decided equal
    swapped = Node("concat", ("b", "a"), ("c",), Attrs(OPS["concat"].normalize_attrs({"axis": 1})))
    with pytest.raises(NotDecided, match="not the same expression"):
        same_terms([along_features], [swapped], ["c"], types.__getitem__)
