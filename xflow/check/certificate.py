"""The certificate a rewritten model carries: how OUT was derived from IN, step by step.

A certificate states the rule file's identity, then each step: a rule application (the rule's id and the
content hash of its canonical JSON, the match as node and value names of the graph it applies to, the attribute
and shape bindings, the conditions it had to meet) or a checked computation (constants folded by the op table's
reference kernels, with the digest of each result's bytes; each split simplification as the nodes it removes and
adds, which the checker decides equal as terms, ``xflow.check.identity``; the shape arithmetic folded, shared and
deleted, each value's integers or the value it equals for every size), each with the structural hash of the
graph it makes. ``xflow.check`` replays it. It travels in the model as the ``metadata_props`` entry
``KEY`` (JSON)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from xflow.digest import array_hash
from xflow.errors import XflowError
from xflow.ir import Graph, Node
from xflow.rewrite import Match, MatchTracer, apply_match, find_matches
from xflow.rewrite.evaluate import EvaluatedStep
from xflow.rewrite.shapes import ShapeStep
from xflow.rewrite.share import SharedStep
from xflow.rewrite.simplify import Simplified
from xflow.rules import Rule, default_rules_path
from xflow.rules.proof import content_digest

#: The model's ``metadata_props`` key the certificate is written under.
KEY = "xflow.certificate"
FORMAT = "xflow.certificate/2"  # 2: each split simplification a step of its own


def rule_hash(rule: Rule) -> str:
    """The content hash of a rule: the sha256 of what it computes (``xflow.rules.proof.content_digest``: inputs,
    patterns, output map, conditions), so a proof recorded in its provenance (``optimize --rules`` proves a rule
    that carries none) leaves it as it was, and an edit to what it computes does not."""
    return content_digest(rule).removeprefix("sha256:")


def file_hash(path: str | Path) -> str:
    """sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def plain(value: Any) -> Any:
    """A value as JSON states it: tuples as lists, ints, floats and strings as they are, anything else (a dim
    over symbols) as its text."""
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    if isinstance(value, tuple | list):
        return [plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    return str(value)


def node_label(node: Node) -> str:
    """How a step names a matched node: its name, or its first output's (``Node.label``)."""
    return node.label


def match_record(graph: Graph, match: Match) -> dict[str, Any]:
    """What a rule step states of its match in ``graph``: nodes, values, attribute and shape bindings, conditions."""
    rule = match.rule
    return {"kind": "rule", "rule": rule.name, "rule_sha256": rule_hash(rule),
            "nodes": [node_label(n) for n in match.nodes],
            "values": dict(sorted(match.values.items())),
            "attrs": plain(dict(sorted(match.variables.items()))),
            "shapes": {p: plain(graph.types[v].shape) for p, v in sorted(match.values.items()) if v in graph.types},
            "conditions": [cond.source for cond in rule.where]}


def fold_record(before: Graph, after: Graph) -> dict[str, Any]:
    """What a fold step states: the nodes folded (op, attributes, inputs, outputs) and each new constant's dtype,
    shape and sha256 of its bytes (the checker recomputes them with the op table's kernels)."""
    kept = {id(n) for n in after.nodes}
    folded = [{"op": n.op, "attrs": plain(dict(n.attrs)), "inputs": list(n.inputs), "outputs": list(n.outputs)}
              for n in before.nodes if id(n) not in kept]
    made = {}
    for name in sorted(set(after.constants) - set(before.constants)):
        array = after.constants[name].value()
        made[name] = {"dtype": array.dtype.str, "shape": list(array.shape), "sha256": array_hash(array)}
    return {"kind": "fold", "folded": folded, "constants": made, "graph": after.structural_hash}


def simplify_records(start: Graph, simplified: Simplified) -> list[dict[str, Any]]:
    """The steps of the split simplifications of ``start``: one identity step per simplification taken
    (``xflow.check.identity``), then the fold of the weights they reorder, when there is one."""
    from xflow.check.identity import identity_record

    records = [identity_record(instance) for instance in simplified.trail]
    last = simplified.trail[-1].graph if simplified.trail else start
    if simplified.graph is not last:
        records.append(fold_record(last, simplified.graph))
    return records


def find_stated(graph: Graph, rule: Rule, nodes: Sequence[str], values: Mapping[str, str],
                tracer: MatchTracer | None = None) -> Match | None:
    """The match of ``rule`` in ``graph`` at the nodes labelled ``nodes`` (``node_label``) binding ``values``,
    found by the matcher (None: there is none; ``tracer`` records why the near-misses failed)."""
    by_label = {node_label(n): n for n in graph.nodes}
    if any(label not in by_label for label in nodes):
        return None
    for match in find_matches(graph, rule, tracer, anchor=[by_label[label] for label in nodes]):
        if [node_label(n) for n in match.nodes] == list(nodes) and match.values == values:
            return match
    return None


@dataclass(frozen=True)
class Derived:
    """What the optimizer made after its search: the graph its steps made (``unfolded``), that graph with its
    constant-only subgraphs folded, the split simplifications of that, and its shape arithmetic folded, shared and
    deleted (``xflow.optimize.finalize``, ``xflow.rewrite.shapes``)."""

    unfolded: Graph
    folded: Graph
    simplified: Simplified
    shaped: ShapeStep | None = None  # the shape arithmetic folded, shared and deleted (None: none was)
    evaluated: EvaluatedStep | None = None  # then the constant subgraphs evaluated (None: none were)
    shared: SharedStep | None = None  # then equal constants and repeated nodes shared (None: none were)


def certify(source: Graph, matches: Sequence[Match], rules_file: str, derived: Derived,
            input_shapes: Mapping[str, Sequence[int]] | None = None) -> dict[str, Any]:
    """The certificate of ``derived``: ``matches`` applied to ``source`` in order (each found again in the graph it
    applies to), then the folding and the split simplifications ``derived`` holds (stated from it: nothing is
    computed twice); ``input_shapes``: the ``--input-shape``s the input was loaded with (they give an input of
    unknown rank its shape). XflowError when the steps do not make ``derived.unfolded`` (the certificate would not
    check)."""
    graph = source
    steps: list[dict[str, Any]] = []
    for applied in matches:
        # the search's match may hold target nodes made for another graph of its path: the same match is found
        # again in this one, by the labels of its nodes and its values, as the checker will find it
        match = find_stated(graph, applied.rule, [node_label(n) for n in applied.nodes], applied.values)
        if match is None:
            raise _uncertified(rules_file, f"step {len(steps) + 1} ({applied.rule.name}) does not match again")
        record = match_record(graph, match)
        made = apply_match(graph, match)
        if made is None:
            raise _uncertified(rules_file, f"step {len(steps) + 1} ({match.rule.name}) makes a cycle")
        graph = made
        record["graph"] = graph.structural_hash
        steps.append(record)
    if graph.structural_hash != derived.unfolded.structural_hash:
        raise _uncertified(rules_file, "replaying the search's steps does not give the graph chosen")
    steps.append(fold_record(derived.unfolded, derived.folded))
    steps.extend(simplify_records(derived.folded, derived.simplified))
    result = derived.simplified.graph
    if derived.shaped is not None:
        steps.append(derived.shaped.record())
        result = derived.shaped.graph
    if derived.evaluated is not None:
        steps.append(derived.evaluated.record())
        result = derived.evaluated.graph
    if derived.shared is not None:
        steps.append(derived.shared.record())
        result = derived.shared.graph
    return {"format": FORMAT,
            "rules": {"path": str(Path(rules_file).resolve()), "sha256": file_hash(rules_file),
                      # the shipped file is found where the checking machine has it
                      "shipped": Path(rules_file).resolve() == default_rules_path().resolve()},
            "input": {"graph": source.structural_hash,
                      "shapes": {name: list(shape) for name, shape in sorted((input_shapes or {}).items())}},
            "steps": steps,
            "output": {"graph": result.structural_hash}}


def _uncertified(rules_file: str, why: str) -> XflowError:
    """A derivation that does not replay is a fault of xflow's, said as such (the optimize run then writes the model
    without a certificate and says so)."""
    return XflowError(rules_file, f"cannot certify the rewritten model: {why} (an xflow bug)")


def to_text(certificate: Mapping[str, Any]) -> str:
    """The certificate as the JSON text the model carries."""
    return json.dumps(certificate, sort_keys=False, separators=(",", ":"))


def carry(model: onnx.ModelProto, certificate: Mapping[str, Any] | None) -> None:
    """Make ``model`` carry ``certificate`` (None: carry none; an earlier one is dropped), in place."""
    entries = [(p.key, p.value) for p in model.metadata_props if p.key != KEY]
    if certificate is not None:
        entries.append((KEY, to_text(certificate)))
    del model.metadata_props[:]
    for key, value in entries:
        model.metadata_props.add(key=key, value=value)


def with_certificate(graph: Graph, certificate: Mapping[str, Any] | None) -> Graph:
    """``graph`` whose model carries ``certificate`` (``carry``)."""
    if graph.context is None:
        return graph
    template = onnx.ModelProto()
    template.CopyFrom(graph.context.template)
    carry(template, certificate)
    return dataclasses.replace(graph, context=dataclasses.replace(graph.context, template=template))


def carried(model: onnx.ModelProto) -> str | None:
    """The certificate text a model carries (None: none)."""
    return next((p.value for p in model.metadata_props if p.key == KEY), None)


def parse(text: str, where: str) -> dict[str, Any]:
    """A certificate from its JSON text; XflowError naming ``where`` when it is not one."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise XflowError(where, f"not a certificate: {exc.msg} at line {exc.lineno}") from None
    if isinstance(data, dict) and str(data.get("format", "")).startswith("xflow.certificate/") and \
            data.get("format") != FORMAT:
        raise XflowError(where, f"a certificate of format {data['format']}; this xflow checks {FORMAT} (make it again "
                                "with this xflow, or check it with the xflow that made it)")
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("steps"), list):
        raise XflowError(where, f"not an xflow certificate (expected {{\"format\": \"{FORMAT}\", ...}})")
    return data


def read_certificate(path: str) -> dict[str, Any]:
    """The certificate in a file: a certificate's JSON, or an ONNX model carrying one."""
    try:
        with open(path, "rb") as f:
            head = f.read(1)
    except OSError as exc:
        raise XflowError(path, f"cannot read: {exc.strerror or exc}") from None
    if head in (b"{", b" ", b"\n"):
        return parse(Path(path).read_text(encoding="utf-8"), path)
    try:
        model = onnx.load(path, load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - any parse failure is bad input, said in one line
        raise XflowError(path, f"neither a certificate nor an ONNX model: {exc}") from None
    text = carried(model)
    if text is None:
        raise XflowError(path, f"the model carries no certificate ({KEY} in its metadata)")
    return parse(text, path)


def rule_matches(steps: Iterable[Any]) -> list[Match]:
    """The matches of search steps (``xflow.search.Step``), in order; ValueError where a step has none."""
    out = []
    for step in steps:
        if step.match is None:
            raise ValueError(f"step {step.rule} does not hold its match")
        out.append(step.match)
    return out


__all__ = [
    "FORMAT", "KEY", "Derived", "array_hash", "carried", "carry", "certify", "file_hash", "find_stated", "fold_record",
    "match_record", "parse", "plain", "read_certificate", "rule_hash", "rule_matches", "simplify_records", "to_text",
    "with_certificate",
]
