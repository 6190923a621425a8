"""A rewrite stated as ONNX text before => ONNX text after (egg's ``test_fn!``, onnxscript's ``pattern_test.py``).

``rewrite_case(rule, before, after)`` loads ``before`` (``onnx.parser`` text, opset <= 21), applies the rule at
its first match (``times`` times), writes the result and compares it with ``after`` structurally: the same graph
inputs and outputs by name, and the same computation behind each output, node for node, whatever the internal
values are called and in whatever order the nodes come. A value is the graph input (or original initializer) of
its name, a new constant by its type and contents, or a node output by (domain, op, attributes, inputs, index).
``after=None`` states that the rule does not apply. Inputs named in ``constants`` become seeded random
initializers on both sides (rule inputs of kind ``const`` must be constants), and the rewritten model's outputs
are checked against the original's in ONNX Runtime.

The rule is a ``Rule``, a rule dict, a rule id or readable name (looked up in ``rules``, default the shipped rule
file), or a rule file: with several rules (a readable name many share, a file), the case holds when one of them
that applies gives ``after`` (or, for ``after=None``, when none applies).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnx.parser
import onnx.printer
import onnxruntime as ort
from onnx import helper, numpy_helper

from xflow.ir import Graph
from xflow.onnx_io import graph_from_model, to_model_proto
from xflow.rewrite import apply_match, find_matches
from xflow.rules import Rule, load_rules, rules_from_json

RULES = os.path.join(os.path.dirname(__file__), "..", "rules")
MAX_OPSET = 21


def rewrite_case(rule: Rule | Mapping[str, Any] | str, before: str, after: str | None, *,
                 rules: str = os.path.join(RULES, "default.json"), constants: Sequence[str] = (), times: int = 1,
                 check_values: bool = True, tolerance: float = 1e-5) -> Graph | None:
    """Check that ``rule`` rewrites the model ``before`` into ``after`` (see the module doc) and, with
    ``check_values``, that the written model is a valid one whose outputs equal the original's within ``tolerance``
    (0: exactly); returns the rewritten graph (None for ``after=None``)."""
    candidates = _rules(rule, rules)
    original = _model(before, constants)
    graph = graph_from_model(original)
    applied = [(r, g) for r in candidates if (g := _apply(graph, r, times)) is not None]
    if after is None:
        assert not applied, f"expected no match, but {[r.name for r, _ in applied]} applied"
        return None
    assert applied, f"no rule of {[r.name for r in candidates]} applies to the model"
    kept = {i.name for i in original.graph.input} | {t.name for t in original.graph.initializer}
    expected = _structure(_model(after, constants), kept)
    results = [(r, g, to_model_proto(g)) for r, g in applied]
    for _, rewritten, written in results:
        if _structure(written, kept) == expected:
            if check_values:
                onnx.checker.check_model(written)
                _same_outputs(original, written, tolerance)
            return rewritten
    shown = "\n\n".join(f"{r.name} gave:\n" + "\n".join(onnx.printer.to_text(n) for n in w.graph.node)
                         for r, _, w in results[:3])
    raise AssertionError(f"no rewrite gives the expected model; {shown}")


def _rules(rule: Rule | Mapping[str, Any] | str, rules: str) -> list[Rule]:
    if isinstance(rule, Rule):
        return [rule]
    if isinstance(rule, Mapping):
        return list(rules_from_json([dict(rule)]))
    if rule.endswith(".json") and os.path.exists(rule):
        return list(load_rules(rule))
    found = [r for r in load_rules(rules) if rule in (r.name, r.readable_name)]
    assert found, f"no rule named {rule!r} in {rules}"
    return found


def _model(text: str, constants: Sequence[str]) -> onnx.ModelProto:
    """The model of ONNX text, the inputs named in ``constants`` turned into seeded random initializers."""
    model = onnx.parser.parse_model(text)
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    assert opset <= MAX_OPSET, f"opset {opset} > {MAX_OPSET}"
    rng = np.random.default_rng(0)
    for name in constants:
        (vi,) = [i for i in model.graph.input if i.name == name]
        tensor = vi.type.tensor_type
        shape = [d.dim_value for d in tensor.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        model.graph.input.remove(vi)
        model.graph.initializer.append(numpy_helper.from_array(rng.uniform(0.5, 1.5, shape).astype(dtype), name))
    onnx.checker.check_model(model)
    return model


def _apply(graph: Graph, rule: Rule, times: int) -> Graph | None:
    """``graph`` with ``rule`` applied at its first match ``times`` times; None when it does not apply as often."""
    for _ in range(times):
        match = next(find_matches(graph, rule), None)
        if match is None:
            return None
        graph = apply_match(graph, match)
        if graph is None:
            return None
    return graph


def _attr(value: Any) -> Any:
    if isinstance(value, onnx.TensorProto):
        return _tensor_key(value)
    if isinstance(value, list | tuple):
        return tuple(_attr(v) for v in value)
    return value


def _tensor_key(tensor: onnx.TensorProto) -> tuple:
    array = numpy_helper.to_array(tensor)
    return ("constant", str(array.dtype), array.shape, array.tobytes())


def _structure(model: onnx.ModelProto, kept: set[str]) -> tuple:
    """What a model computes, independent of the names of its internal values and the order of its nodes: its
    input names, the computation of each output by name, and the multiset of its nodes' computations. A value in
    ``kept`` (the original model's inputs and initializers) is itself; another initializer is its contents."""
    g = model.graph
    named = {i.name for i in g.input}
    keys: dict[str, Any] = {t.name: ("value", t.name) if t.name in kept else _tensor_key(t) for t in g.initializer}
    keys.update({i.name: ("value", i.name) for i in g.input})
    nodes: Counter = Counter()
    for node in g.node:  # topological order, as ONNX requires
        attrs = tuple(sorted((a.name, _attr(helper.get_attribute_value(a))) for a in node.attribute))
        key = (node.domain or "", node.op_type, attrs, tuple(keys[i] if i else "" for i in node.input))
        nodes[key] += 1
        for index, out in enumerate(node.output):
            keys[out] = (key, index)
    outputs = tuple((o.name, keys[o.name]) for o in g.output)
    return tuple(sorted(named)), outputs, nodes


def _same_outputs(original: onnx.ModelProto, written: onnx.ModelProto, tolerance: float) -> None:
    rng = np.random.default_rng(1)
    feeds = {}
    for vi in original.graph.input:
        tensor = vi.type.tensor_type
        shape = [d.dim_value for d in tensor.shape.dim]
        feeds[vi.name] = rng.standard_normal(shape).astype(helper.tensor_dtype_to_np_dtype(tensor.elem_type))
    want = _run(original, feeds)
    got = _run(written, feeds)
    for name, a, b in zip([o.name for o in original.graph.output], want, got, strict=True):
        np.testing.assert_allclose(b, a, rtol=tolerance, atol=tolerance, err_msg=name)


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)
