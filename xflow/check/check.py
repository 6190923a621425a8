"""``xflow check IN OUT``: does OUT compute what IN computes, by the certificate it carries (or one given)?

The checker loads IN as ``xflow optimize`` does, replays the certificate's steps on it (``replay``: each rule in
the rule file with the same content hash and re-proved, each match found again by the matcher, its conditions
decided for every value of the symbolic dims; folded constants recomputed), and requires the model of the
graph that makes to equal OUT: interface, nodes, weights byte for byte, everything but the certificate itself."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from xflow.check.certificate import KEY, carried, parse, read_certificate
from xflow.check.replay import Replayed, StepRefused, replay, rules_for
from xflow.errors import XflowError
from xflow.ir import Graph
from xflow.onnx_io import to_model_proto
from xflow.onnx_io.load import read_model
from xflow.optimize.load import load_source
from xflow.optimize.options import InputSettings
from xflow.rules import Rule


@dataclass(frozen=True)
class Verdict:
    """What ``check`` found: ``ok``, the line to print, and the counts it states."""

    ok: bool
    line: str
    steps: int = 0
    rules: int = 0


def replay_input(in_path: str, certificate: dict[str, Any], rules: dict[str, Rule],
                 prove: Callable[[Rule], str | None] | None = None) -> Replayed:
    """IN loaded as ``xflow optimize`` loaded it, with the certificate's steps replayed (StepRefused)."""
    return replay(load_source(in_path, input_settings(certificate), sized=False).graph, certificate, rules, prove)


def input_settings(certificate: dict[str, Any]) -> InputSettings:
    """The input settings that shape the graph loaded (``--input-shape``s), as the certificate states them."""
    shapes = certificate.get("input", {}).get("shapes", {})
    return InputSettings(shapes={name: tuple(shape) for name, shape in shapes.items()})


def check(in_path: str, out_path: str, certificate_path: str | None = None, rules_path: str | None = None,
          prove: Callable[[Rule], str | None] | None = None) -> Verdict:
    """Check that OUT is what the certificate's steps make of IN (``prove``: each rule applied re-proved;
    None trusts the rule file's rules by content hash). XflowError for bad input."""
    # read once (a large model's parse is much of check's time), without ONNX's checker: OUT is compared field by
    # field with the model the steps make of IN (checked), or with IN itself
    out_model = read_model(out_path, full_check=False)
    if certificate_path is not None:
        certificate: dict[str, Any] | None = read_certificate(certificate_path)
    else:
        text = carried(out_model)
        certificate = parse(text, out_path) if text is not None else None
    if certificate is None:  # the original written back needs none; anything else does
        if _same_file_bytes(in_path, out_path, out_model) or \
                model_difference(_read_whole(in_path), _with_data(out_model, out_path)) is None:
            return Verdict(True, _CHECKS.format(steps=0, rules=0))
        raise XflowError(out_path, f"the model carries no certificate ({KEY}) and is not IN; give one with "
                                   "--certificate")
    rules = rules_for(certificate, rules_path)
    try:
        replayed = replay_input(in_path, certificate, rules, prove)
    except StepRefused as refused:
        return Verdict(False, f"OUT does not check: {refused}")
    difference = model_difference(_model_of(replayed.graph), _with_data(out_model, out_path))
    if difference is not None:
        return Verdict(False, f"OUT does not check: every one of the certificate's {replayed.steps} steps replays on "
                              f"IN, but OUT is not the model they make: {difference}")
    line = _CHECKS.format(steps=replayed.steps, rules=len(replayed.rules))
    if prove is None:
        line = line.replace(" proved rules", " rules trusted by their content hash")
    return Verdict(True, line, replayed.steps, len(replayed.rules))


_CHECKS = "OUT computes what IN computes for every input at every size its interface allows: {steps} steps, " \
          "{rules} proved rules"


def _read_whole(path: str) -> onnx.ModelProto:
    """A model file with its external data read in."""
    return _with_data(read_model(path), path)


def _with_data(model: onnx.ModelProto, path: str) -> onnx.ModelProto:
    """``model`` (read from ``path``) with its external data read in, in place."""
    onnx.load_external_data_for_model(model, os.path.dirname(os.path.abspath(path)))
    return model


def _same_file_bytes(in_path: str, out_path: str, out_model: onnx.ModelProto) -> bool:
    """True when OUT is IN's bytes and holds its weights (a copy written back): equal without parsing IN. A model
    whose weights are in files beside it is compared as a model (the same bytes may name other files there)."""
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in out_model.graph.initializer):
        return False
    try:
        if os.path.getsize(in_path) != os.path.getsize(out_path):
            return False
        with open(in_path, "rb") as a, open(out_path, "rb") as b:
            while True:
                block = a.read(1 << 22)
                if block != b.read(1 << 22):
                    return False
                if not block:
                    return True
    except OSError:
        return False


def _model_of(graph: Graph) -> onnx.ModelProto:
    model = to_model_proto(graph, constant_nodes=False)  # as the write pass writes a rewritten model
    if graph.context is not None and any(t.data_location == onnx.TensorProto.EXTERNAL
                                         for t in model.graph.initializer):
        onnx.load_external_data_for_model(model, graph.context.base_dir)
    return model


def model_difference(expected: onnx.ModelProto, actual: onnx.ModelProto) -> str | None:
    """The first way ``actual`` differs from ``expected`` (None: equal, the certificate entry aside): the
    interface, then the nodes, then the weights byte for byte, then the rest of the model."""
    want, have = expected.graph, actual.graph
    for part in ("input", "output"):
        if [v.SerializeToString(deterministic=True) for v in getattr(want, part)] != \
                [v.SerializeToString(deterministic=True) for v in getattr(have, part)]:
            return f"its graph {part}s differ"
    if len(want.node) != len(have.node):
        return f"it has {len(have.node)} nodes, the steps make {len(want.node)}"
    for k, (a, b) in enumerate(zip(want.node, have.node, strict=True)):
        if a.SerializeToString(deterministic=True) != b.SerializeToString(deterministic=True):
            return f"node {k} ({b.name or b.op_type}) differs"
    weights = {t.name: t for t in want.initializer}
    theirs = {t.name: t for t in have.initializer}
    if weights.keys() != theirs.keys():
        extra = sorted(weights.keys() ^ theirs.keys())
        return f"initializer {extra[0]} is {'missing' if extra[0] in weights else 'not made by the steps'}"
    for name, tensor in weights.items():
        other = theirs[name]
        if tensor.data_type == other.data_type and tensor.dims == other.dims and tensor.HasField("raw_data") \
                and other.HasField("raw_data") and tensor.raw_data == other.raw_data:
            continue  # the same bytes of the same type: equal without decoding them
        a, b = numpy_helper.to_array(tensor), numpy_helper.to_array(other)
        if a.dtype != b.dtype or a.shape != b.shape or np.ascontiguousarray(a).tobytes() != \
                np.ascontiguousarray(b).tobytes():
            return f"weight {name} differs"
    return _rest_difference(expected, actual)


def _rest_difference(expected: onnx.ModelProto, actual: onnx.ModelProto) -> str | None:
    """Everything but the graph's nodes and weights, and the certificate entry."""
    shells = []
    for model in (expected, actual):
        shell = onnx.ModelProto()
        _copy_fields(model, shell, skip="graph")
        _copy_fields(model.graph, shell.graph, skip=("node", "initializer"))  # the weights are not copied
        kept = [(p.key, p.value) for p in shell.metadata_props if p.key != KEY]
        del shell.metadata_props[:]
        for key, value in kept:
            shell.metadata_props.add(key=key, value=value)
        shells.append(shell.SerializeToString(deterministic=True))
    return None if shells[0] == shells[1] else "its model fields (opsets, metadata, value types) differ"


def _copy_fields(source: Any, target: Any, skip: str | tuple[str, ...]) -> None:
    """Copy the fields ``source`` sets into ``target`` (a message of its type), but those named in ``skip``."""
    for field, value in source.ListFields():
        if field.name in skip:
            continue
        # protobuf 5 and later say is_repeated; earlier ones only the label
        repeated = field.is_repeated if hasattr(field, "is_repeated") else field.label == field.LABEL_REPEATED
        if repeated:
            getattr(target, field.name).extend(value)
        elif field.message_type is not None:
            getattr(target, field.name).CopyFrom(value)
        else:
            setattr(target, field.name, value)
