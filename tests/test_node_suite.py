"""Every case of ONNX's node-test suite round-trips through the IR and runs the same in ONNX Runtime.

For each case that the installed ONNX Runtime can run (opset within what it supports, ops it
implements), the model goes through ``graph_from_model`` and ``to_model_proto`` twice:

* ``reuse_protos=True``: the written model must be byte-identical to the source (lossless load/save),
  pass the checker, and give bitwise-identical outputs;
* ``reuse_protos=False``: every node the op table decoded is re-encoded through the op table's ONNX
  mapping; the model must pass the checker and give identical outputs (NaN positions included), except
  for the few re-encodings listed in ``REENCODING_CHANGES_ARITHMETIC``.

The suite (about 1,900 cases) is built once per session in memory; each test aggregates its failures
and reports them all at once.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper

from xflow.onnx_io import graph_from_model, to_model_proto

ort = pytest.importorskip("onnxruntime")

MIN_CHECKED = 1000  # the suite of onnx 1.16+ with any recent ONNX Runtime has well over this many
MIN_DECODED = 150  # cases where at least one node decodes into the op table

# Re-encodings (reuse_protos=False) that legitimately compute with different arithmetic, by the source
# ONNX op type. Only cases whose source model has one of these ops AND whose re-encoded model no longer
# has it (it really was rewritten) get the tolerance below; every other case must match exactly.
REENCODING_CHANGES_ARITHMETIC = {
    # GlobalAveragePool decodes into the op table's avgpool with the whole plane as kernel and is written
    # back as AveragePool(kernel_shape=[H, W]). ONNX Runtime's AveragePool kernel accumulates the window
    # in a different order than its GlobalAveragePool kernel (and divides by the count rather than
    # multiplying by its reciprocal), so results may differ in the last bit or two of float32.
    "GlobalAveragePool": "AveragePool",
}
RTOL, ATOL = 1e-6, 1e-7


@dataclasses.dataclass
class Case:
    name: str
    model: onnx.ModelProto
    feeds: dict[str, Any]
    expected: list[Any]  # ONNX Runtime's outputs on the source model
    full_check: bool  # whether the source model passes onnx.checker with full_check=True


def _session_options() -> Any:
    options = ort.SessionOptions()
    options.log_severity_level = 4  # the suite has many models ONNX Runtime refuses; no logs for those
    options.intra_op_num_threads = 1  # deterministic reductions, and fast on small CI machines
    options.inter_op_num_threads = 1
    return options


def run_ort(model: onnx.ModelProto, feeds: dict[str, Any]) -> list[Any]:
    session = ort.InferenceSession(model.SerializeToString(), _session_options(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def default_opset(model: onnx.ModelProto) -> int:
    return max([int(i.version) for i in model.opset_import if i.domain in ("", "ai.onnx")] or [1])


def ort_max_opset() -> int:
    """The highest default-domain opset the installed ONNX Runtime accepts."""
    best = 0
    for version in range(7, onnx.defs.onnx_opset_version() + 1):
        graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "probe",
                                  [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                                  [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", version)], ir_version=8)
        try:
            run_ort(model, {"x": np.zeros(1, np.float32)})
        except Exception:
            break
        best = version
    return best


@functools.cache
def suite() -> tuple[list[Case], dict[str, int]]:
    """The suite's cases that ONNX Runtime runs on the source model, with its outputs; and counts."""
    from onnx.backend.test import loader

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the suite's generators overflow casts and divide by zero on purpose
        cases = loader.load_node_model_tests()
    ort.set_default_logger_severity(4)
    max_opset = ort_max_opset()
    counts = {"total": len(cases), "opset_too_new": 0, "ort_cannot_run": 0}
    kept: list[Case] = []
    for case in cases:
        model = case.model
        if default_opset(model) > max_opset:
            counts["opset_too_new"] += 1
            continue
        initializers = {t.name for t in model.graph.initializer}
        names = [vi.name for vi in model.graph.input if vi.name not in initializers]
        inputs, _ = case.data_sets[0]
        feeds = dict(zip(names, inputs, strict=False))
        try:
            expected = run_ort(model, feeds)
        except Exception:
            counts["ort_cannot_run"] += 1
            continue
        try:
            onnx.checker.check_model(model, full_check=True)
            full = True
        except Exception:  # a few suite models fail the full check themselves (e.g. test_mvn)
            full = False
        kept.append(Case(case.name, model, feeds, expected, full))
    counts["checked"] = len(kept)
    return kept, counts


def _describe(x: Any) -> str:
    if isinstance(x, np.ndarray):
        return f"{x.dtype}{list(x.shape)}"
    return type(x).__name__


def compare(expected: Any, got: Any, exact_bits: bool, tolerance: bool) -> str | None:
    """None when the outputs agree, else what differs."""
    if isinstance(expected, list):
        if not isinstance(got, list) or len(got) != len(expected):
            return f"sequence of {len(expected)} vs {_describe(got)}"
        for k, (e, g) in enumerate(zip(expected, got, strict=True)):
            problem = compare(e, g, exact_bits, tolerance)
            if problem:
                return f"[{k}] {problem}"
        return None
    if expected is None or got is None:
        return None if expected is got else f"{_describe(expected)} vs {_describe(got)}"
    e, g = np.asarray(expected), np.asarray(got)
    if e.dtype != g.dtype or e.shape != g.shape:
        return f"{_describe(e)} vs {_describe(g)}"
    if e.dtype.kind == "O" or not exact_bits:
        if np.array_equal(e, g, equal_nan=e.dtype.kind in "fc"):
            return None
    elif e.tobytes() == g.tobytes():
        return None
    if tolerance and e.dtype.kind in "fc" and np.allclose(g, e, rtol=RTOL, atol=ATOL, equal_nan=True):
        return None
    if e.dtype.kind in "fc":
        diff = np.abs(e.astype(np.float64) - g.astype(np.float64))
        diff = diff[np.isfinite(diff)]
        nan_mismatch = int(np.sum(np.isnan(e) != np.isnan(g)))
        worst = float(diff.max()) if diff.size else 0.0
        return f"{_describe(e)} differs: max abs diff {worst:g}, NaN positions differing {nan_mismatch}"
    return f"{_describe(e)} differs in {int(np.sum(e != g))} elements"


def check_case(case: Case, reuse_protos: bool) -> tuple[str | None, bool]:
    """(problem or None, whether any node decoded into the op table)."""
    graph = graph_from_model(case.model)
    decoded = any(not n.is_opaque for n in graph.nodes)
    out = to_model_proto(graph, reuse_protos=reuse_protos)
    if reuse_protos and out.SerializeToString(deterministic=True) != \
            case.model.SerializeToString(deterministic=True):
        return "written model is not byte-identical to the source", decoded
    try:
        onnx.checker.check_model(out, full_check=case.full_check)
    except Exception as exc:
        return f"checker: {str(exc).strip().splitlines()[0]}", decoded
    try:
        got = run_ort(out, case.feeds)
    except Exception as exc:
        return f"ONNX Runtime cannot run the written model: {str(exc).strip().splitlines()[0][:300]}", decoded
    source_ops = {n.op_type for n in case.model.graph.node}
    written_ops = {n.op_type for n in out.graph.node}
    tolerance = not reuse_protos and any(op in source_ops and op not in written_ops
                                         for op in REENCODING_CHANGES_ARITHMETIC)
    if len(got) != len(case.expected):
        return f"{len(got)} outputs instead of {len(case.expected)}", decoded
    for k, (e, g) in enumerate(zip(case.expected, got, strict=True)):
        problem = compare(e, g, exact_bits=reuse_protos, tolerance=tolerance)
        if problem:
            return f"output {k}: {problem}", decoded
    return None, decoded


@pytest.mark.parametrize("reuse_protos", [True, False], ids=["reuse_protos", "reencode"])
def test_node_suite_round_trip(reuse_protos: bool) -> None:
    cases, counts = suite()
    failures: list[str] = []
    decoded = 0
    for case in cases:
        try:
            problem, any_decoded = check_case(case, reuse_protos)
        except Exception as exc:  # a crash in load or save is a failure of that case, not of the run
            problem, any_decoded = f"{type(exc).__name__}: {exc}", False
        decoded += any_decoded
        if problem:
            failures.append(f"{case.name}: {problem}")
    print(f"\nnode suite ({'reuse_protos' if reuse_protos else 're-encode'}): {counts}, "
          f"cases with decoded nodes: {decoded}, failures: {len(failures)}")
    assert not failures, f"{len(failures)} of {len(cases)} node-suite cases fail:\n" + "\n".join(failures)
    assert counts["checked"] >= MIN_CHECKED, counts
    assert decoded >= MIN_DECODED, f"only {decoded} cases decode any node into the op table"


def test_decoded_cases_compute_what_onnx_runtime_computes() -> None:
    """The verifier proves rules about the op table's kernels, so a decoded node must mean what its ONNX node
    computes: every case whose nodes all decode, evaluated with the kernels on the suite's inputs, gives ONNX
    Runtime's outputs (shapes, dtypes, values within float32 rounding)."""
    from xflow.ops import OPS

    cases, _ = suite()
    failures, evaluated = [], 0
    for case in cases:
        graph = graph_from_model(case.model)
        if any(n.is_opaque for n in graph.nodes):
            continue
        evaluated += 1
        values = {**case.feeds, **{name: c.value() for name, c in graph.constants.items()}}
        with np.errstate(all="ignore"):
            for node in graph.nodes:
                outs = OPS[node.op].evaluate(np, [values[i] for i in node.inputs], node.attrs)
                values.update(zip(node.outputs, (np.asarray(v) for v in outs), strict=True))
        for k, (want, got) in enumerate(zip(case.expected, (values[o] for o in graph.outputs), strict=True)):
            want = np.asarray(want)
            if want.shape != got.shape or want.dtype != got.dtype or not (
                    np.allclose(got, want, rtol=1e-4, atol=1e-5, equal_nan=True) if want.dtype.kind in "fc"
                    else np.array_equal(got, want)):
                failures.append(f"{case.name} output {k}: {_describe(want)} vs {_describe(got)}")
    assert not failures, "\n".join(failures)
    assert evaluated >= 100, evaluated
