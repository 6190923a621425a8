"""Whether an optimized model computes what the original computes, on given inputs.

The rule, element by element for every float output (docs/OPTIMIZE.md, "How outputs are compared"):

* NaN and ±inf must sit at the same positions, infinities with the same sign.
* Finite elements are compared with a reference ``r``: the original run in float64 where ONNX Runtime can
  run a float64 copy of it (``xflow.onnx_io.widen``), else the original itself. ``E``, the original's own
  float32 error against ``r`` on that output, sets the scale a reordered sum may reach; an element
  passes when ``|b_i - r_i| <= atol + rtol * |r_i| + ERROR_FACTOR * E``. No element's tolerance grows
  with another element's magnitude (a 1e6 elsewhere widens nothing), and no infinity enters it.
* Integer and boolean outputs must be equal.

Outputs with non-finite values on the inputs tried are reported and other inputs are drawn
(``check_equivalence``); when an output is NaN/inf at every element on every draw, the check refuses
(``NonFiniteReference``): a comparison of NaN with NaN proves nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from xflow.digest import feeds_digest
from xflow.errors import XflowError
from xflow.ort import Sessions

#: How many times the original's own float32 error (against the float64 reference) a rewrite may make.
ERROR_FACTOR = 16.0
#: Other seeded draws tried when the original's outputs are not finite on the first inputs.
EXTRA_DRAWS = 3


class EquivalenceError(XflowError):
    """The optimized model computes something else than the original."""


class NonFiniteReference(XflowError):
    """The original's outputs hold NaN or ±inf on every input tried, so equality on them proves nothing."""


@dataclass(frozen=True)
class Tolerance:
    """Per-element tolerance of one float dtype: ``atol + rtol * |r_i| + error_factor * E``."""

    rtol: float
    atol: float
    error_factor: float = ERROR_FACTOR


def tolerance(dtype: np.dtype) -> Tolerance:
    """The tolerance for outputs of ``dtype``. float32: about 800 ulps of each element, plus 1e-5 for
    elements near zero that are sums of cancelling O(1) terms."""
    if dtype == np.float16:
        return Tolerance(1e-2, 1e-3)
    if dtype == np.float32:
        return Tolerance(1e-4, 1e-5)
    if dtype == np.float64:
        # Not tighter: ORT computes some double models with float32 constants (a scalar Mul fused into
        # FusedMatMul with a float32 alpha), so one side may be off by float32 rounding (~6e-8).
        return Tolerance(1e-6, 1e-9)
    return Tolerance(0.0, 0.0, 0.0)


@dataclass(frozen=True)
class OutputCheck:
    """One output compared: the largest |optimized - original|, the original's own error against the
    reference (0 without one), and how many of its elements are NaN or infinite."""

    name: str
    max_abs_diff: float
    reference_error: float
    nonfinite: int
    size: int


def _signed_nonfinite(x: np.ndarray) -> np.ndarray:
    """0 where finite, 1 for NaN, 2 for +inf, 3 for -inf."""
    return np.select([np.isnan(x), np.isposinf(x), np.isneginf(x)], [1, 2, 3], 0)


def check_output(name: str, expected: Any, actual: Any, reference: Any | None = None) -> OutputCheck:
    """Compare one output (``expected``: the original's, ``actual``: the optimized model's, ``reference``:
    the original's in float64, when there is one) by the module's rule; EquivalenceError when it fails."""
    a, b = np.asarray(expected), np.asarray(actual)
    if a.shape != b.shape or a.dtype != b.dtype:
        raise EquivalenceError(None, f"output {name!r} changed from {a.dtype}{a.shape} to {b.dtype}{b.shape}")
    if not np.issubdtype(a.dtype, np.floating):
        if not np.array_equal(a, b):
            raise EquivalenceError(None, f"output {name!r} differs (integer/boolean values changed)")
        return OutputCheck(name, 0.0, 0.0, 0, int(a.size))
    kinds_a, kinds_b = _signed_nonfinite(a), _signed_nonfinite(b)
    if not np.array_equal(kinds_a, kinds_b):
        at = tuple(int(i) for i in np.argwhere(kinds_a != kinds_b)[0])
        raise EquivalenceError(None, f"output {name!r}: NaN/inf positions differ (at {at}: {a[at]} became {b[at]})")
    finite = kinds_a == 0
    a64, b64 = a[finite].astype(np.float64), b[finite].astype(np.float64)
    r = a64
    if reference is not None:
        ref = np.asarray(reference, dtype=np.float64)
        if ref.shape == a.shape:
            r = ref[finite]
            r = np.where(np.isfinite(r), r, a64)  # float64 can overflow where float32 did not (not the reverse)
    tol = tolerance(a.dtype)
    own_error = float(np.max(np.abs(a64 - r), initial=0.0))
    bound = tol.atol + tol.rtol * np.abs(r) + tol.error_factor * own_error
    excess = np.abs(b64 - r) - bound
    if excess.size and float(np.max(excess)) > 0:
        worst = int(np.argmax(excess))
        at = tuple(int(i) for i in np.argwhere(finite)[worst])
        raise EquivalenceError(None, f"output {name!r} differs at {at}: {b64[worst]:.7g} where the original gives "
                                     f"{a64[worst]:.7g} (reference {r[worst]:.7g}, tolerance {bound[worst]:.3g})")
    return OutputCheck(name, float(np.max(np.abs(a64 - b64), initial=0.0)), own_error,
                       int(a.size - np.count_nonzero(finite)), int(a.size))


def check_outputs(names: Sequence[str], expected: Sequence[Any], actual: Sequence[Any],
                  reference: Sequence[Any] | None = None) -> list[OutputCheck]:
    """``check_output`` for every output, in order."""
    refs = list(reference) if reference is not None else [None] * len(names)
    return [check_output(name, a, b, r) for name, a, b, r in zip(names, expected, actual, refs, strict=True)]


def describe_nonfinite(checks: Sequence[OutputCheck]) -> str:
    """'output 'y': 12 of 12 elements NaN/inf, ...' for the outputs that have any."""
    return ", ".join(f"output {c.name!r}: {c.nonfinite} of {c.size} elements NaN/inf" for c in checks if c.nonfinite)


@dataclass
class EquivalenceReport:
    """What the check compared and found: per output the largest |optimized - original| over every input set
    checked, the reference used, the input sets (the first is the caller's) and what was noted on the way."""

    max_abs_diff: dict[str, float] = field(default_factory=dict)
    reference: str = ""
    inputs: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    scales: list[str] = field(default_factory=list)  # the other scales' draws compared on (``check_at_scales``)


Feeds = Mapping[str, np.ndarray]


def _as_float64(feeds: Feeds) -> dict[str, np.ndarray]:
    return {k: (v.astype(np.float64) if np.issubdtype(v.dtype, np.floating) else v) for k, v in feeds.items()}


def check_equivalence(session_a: Any, session_b: Any, feeds: Feeds, inputs_label: str,
                      draw: Callable[[int], Feeds], reference_session: Any | None = None,
                      reference: str = "the original") -> EquivalenceReport:
    """Run the original (``session_a``) and the optimized model (``session_b``) on ``feeds`` and compare
    every output (``check_outputs``, against ``reference_session``'s float64 outputs where given). While the
    original's outputs hold NaN/inf, the check goes on with ``draw(k)`` for k = 1..EXTRA_DRAWS (other
    inputs) and notes why. NonFiniteReference when an output is NaN/inf at every element on every input
    tried (nothing of it was compared); EquivalenceError on a mismatch."""
    names = [o.name for o in session_a.get_outputs()]
    verdict = EquivalenceReport(reference=reference)
    checked: set[str] = set()  # outputs with at least one finite element compared
    current, label = feeds, inputs_label
    for k in range(EXTRA_DRAWS + 1):
        expected = session_a.run(None, dict(current))
        actual = session_b.run(None, dict(current))
        wide = None
        if reference_session is not None:
            try:
                wide = reference_session.run(None, _as_float64(current))
            except Exception as exc:  # noqa: BLE001 - ORT refused the copy on these inputs: compare without it
                verdict.notes.append(f"float64 reference failed on {label} ({type(exc).__name__})")
        checks = check_outputs(names, expected, actual, wide)
        verdict.inputs.append(label)
        for c in checks:
            verdict.max_abs_diff[c.name] = max(verdict.max_abs_diff.get(c.name, 0.0), c.max_abs_diff)
            if c.nonfinite < c.size or c.size == 0:
                checked.add(c.name)
        if not any(c.nonfinite for c in checks):
            return verdict
        verdict.notes.append(f"the original's outputs on {label} are not all finite ({describe_nonfinite(checks)})")
        if k < EXTRA_DRAWS:
            current, label = draw(k + 1), f"random inputs (draw {k + 1})"
    unchecked = [name for name in names if name not in checked]
    if unchecked:
        raise NonFiniteReference(None, f"cannot verify: the original's output(s) {', '.join(map(repr, unchecked))} "
                                       f"are NaN/inf everywhere on every input tried ({'; '.join(verdict.notes)})")
    return verdict  # every output had finite elements to compare on some inputs; the notes say where not


#: Float64 copies above this many bytes of weights are not made (the check falls back to the original):
#: widening and loading one takes tens of seconds for a model of a few hundred MB of weights.
MAX_REFERENCE_BYTES = 512 << 20


def float64_reference(model: Any, sessions: Sessions | None = None) -> tuple[Any | None, str]:
    """A session running ``model`` (a path or a ModelProto) in float64 and what it is, or (None, why there is none)."""
    import onnx

    from xflow.onnx_io.shell import elements
    from xflow.onnx_io.widen import float64_session, widened_external

    try:
        # read once: a file's inline weights come with its graph; only external ones are read after the size check
        proto = model if isinstance(model, onnx.ModelProto) else onnx.load(model, load_external_data=False)
        weight_bytes = 8 * sum(elements(t) for t in proto.graph.initializer)
        if weight_bytes > MAX_REFERENCE_BYTES:
            return None, f"the original ({weight_bytes >> 20} MB of weights in float64 is too large for a copy)"
        if not isinstance(model, onnx.ModelProto) and any(t.data_location == onnx.TensorProto.EXTERNAL
                                                          for t in proto.graph.initializer):
            onnx.load_external_data_for_model(proto, os.path.dirname(os.path.abspath(model)))
    except Exception as exc:  # noqa: BLE001 - the original loaded before; anything here only costs the reference
        return None, f"the original (no float64 copy: {type(exc).__name__})"
    maker = sessions if sessions is not None else Sessions()
    # No graph optimizations: they cost the build most of its time on a float64 model, and a fusion may bring
    # float32 constants back (ORT fuses a scalar Mul into FusedMatMul with a float32 alpha). The copy's weights,
    # twice the model's, are written widened one tensor at a time beside a model file ORT reads (from bytes, they
    # would be held by the copy, its bytes, ORT's parse of them and its tensors at once while the session is built).
    # No memory arena: the reference is never timed, and a float64 run's buffers, twice the model's, are freed after
    # each run instead of kept by the arena for the rest of the run.
    with maker.folder() as folder:
        try:
            wide = widened_external(proto, folder, "float64")
        except OSError:  # no room for the file: the copy in memory, to ORT as bytes
            session, what = float64_session(proto, lambda m: maker.open(m, optimization="none", arena=False))
            return (session, what) if session is not None else (None, f"the original ({what})")
        except Exception as exc:  # noqa: BLE001 - a tensor numpy cannot read: no float64 reference
            return None, f"the original (no float64 copy: {type(exc).__name__})"
        del proto  # the float32 weights read from the file (a caller's ModelProto stays the caller's)

        def open_float64(m: onnx.ModelProto) -> Any:
            path = os.path.join(folder, "float64.onnx")
            with open(path, "wb") as f:
                f.write(m.SerializeToString())  # nodes and small tensors: the weights are in float64.data
            return maker.open(path, optimization="none", arena=False)
        session, what = float64_session(wide, open_float64, widen=False)
    return (session, what) if session is not None else (None, f"the original ({what})")


#: The most bytes of float64 outputs a recorded reference keeps (beyond them the copy stays open instead)
MAX_RECORDED_BYTES = 64 << 20


class RecordedReference:
    """The float64 copy's outputs recorded on the inputs the check is known to run (``record``), then the copy
    released: its weights, twice the model's, are then not resident beside the optimized model's session. Asked
    for inputs it was not run on (the extra draws a non-finite output asks for), it opens the copy again
    (``reopen``). Its ``run`` answers as the session's would, a refusal included."""

    def __init__(self, session: Any, reopen: Callable[[], Any | None]) -> None:
        self.session = session
        self.reopen = reopen
        self.outputs: dict[str, list[Any] | Exception] = {}

    def record(self, inputs: Sequence[Feeds]) -> None:
        """Run the copy on each of ``inputs`` (float64 feeds) and keep its outputs; release the copy after, unless
        they would hold more than ``MAX_RECORDED_BYTES`` (then it stays open, as without recording)."""
        from xflow import heap

        held = 0
        for feeds in inputs:
            key = feeds_digest(feeds)
            try:
                found: list[Any] | Exception = self.session.run(None, dict(feeds))
            except Exception as exc:  # noqa: BLE001 - the copy refused these inputs: said again when asked
                found = exc
            held += sum(np.asarray(a).nbytes for a in found) if isinstance(found, list) else 0
            if held > MAX_RECORDED_BYTES:
                self.outputs.clear()
                return
            self.outputs[key] = found
        self.session = None
        heap.trim()  # the copy's weights and buffers, handed back before the optimized model's session is made

    def run(self, names: Any, feeds: Feeds) -> list[Any]:
        """The copy's outputs on ``feeds``: recorded, or run now (the copy opened again if it was released)."""
        found = self.outputs.get(feeds_digest(feeds))
        if found is None:
            if self.session is None:
                self.session = self.reopen()
                if self.session is None:
                    raise RuntimeError("the float64 copy cannot be opened again")
            return self.session.run(names, dict(feeds))
        if isinstance(found, Exception):
            raise found
        return list(found)


@dataclass
class PreparedCheck:
    """What the equivalence check needs before the optimized model's session exists: the draws at the other scales,
    the original's float64 copy's outputs on those and on the run's inputs (``RecordedReference``; None: there is no
    copy), and what the reference is, in words."""

    draws: list[tuple[str, Feeds]]
    reference: Any | None
    label: str


def prepare_check(model: Any, session_a: Any, feeds: Feeds, seed: int = 0,
                  input_shapes: Mapping[str, tuple[int, ...]] | None = None, sessions: Sessions | None = None,
                  users_feeds: bool = False) -> PreparedCheck:
    """The draws and the float64 reference of ``verify_against_original``, the reference run on ``feeds`` and the
    draws and released (so that a caller that makes the optimized model's session after this never holds the copy
    beside it)."""
    # before the float64 copy is opened: reading the model's graph again costs its weights once more for a moment
    scaled_integers = arithmetic_inputs(model)
    reference_session, reference = float64_reference(model, sessions)
    draws = scale_draws(session_a, seed, input_shapes, feeds if users_feeds else None, scaled_integers)
    if reference_session is None:
        return PreparedCheck(draws, None, reference)
    recorded = RecordedReference(reference_session, lambda: float64_reference(model, sessions)[0])
    del reference_session
    recorded.record([_as_float64(feeds), *(_as_float64(d) for _, d in draws)])
    return PreparedCheck(draws, recorded, reference)


def positive_feeds(feeds: Feeds) -> dict[str, np.ndarray]:
    """``feeds`` with every float made positive (|x|, zeros moved to 0.5): the last draw, for models whose
    outputs are NaN on negative inputs (log, sqrt, pow)."""
    return {k: (np.where(v == 0, 0.5, np.abs(v)).astype(v.dtype) if np.issubdtype(v.dtype, np.floating) else v)
            for k, v in feeds.items()}


def verify_against_original(model: Any, session_a: Any, session_b: Any, feeds: Feeds, inputs_label: str,
                            seed: int = 0, input_shapes: Mapping[str, tuple[int, ...]] | None = None,
                            sessions: Sessions | None = None, users_feeds: bool = False,
                            prepared: PreparedCheck | None = None) -> EquivalenceReport:
    """``check_equivalence`` of the original ``model`` (a path or a ModelProto, run by ``session_a``) and the
    optimized model (``session_b``) on ``feeds``, against the original's float64 copy where ORT can run one.
    Other inputs, when needed, are seeded random draws; the last one is made positive. Then the check goes on
    at the other scales (``check_at_scales``), and, for the user's own ``feeds``, in their range. ``prepared``:
    the draws and reference ``prepare_check`` made with these arguments before ``session_b`` existed."""
    from xflow.runtime import random_feeds

    def draw(k: int) -> Feeds:
        drawn = random_feeds(session_a, seed + k, input_shapes)
        return positive_feeds(drawn) if k == EXTRA_DRAWS else drawn

    if prepared is None:
        prepared = prepare_check(model, session_a, feeds, seed, input_shapes, sessions, users_feeds)
    draws, reference_session, reference = prepared.draws, prepared.reference, prepared.label
    try:
        verdict = check_equivalence(session_a, session_b, feeds, inputs_label, draw, reference_session, reference)
        check_at_scales(session_a, session_b, draws, verdict, reference_session)
    except EquivalenceError:
        if reference_session is not None:
            raise
        # No float64 copy: the comparison with the original alone has no measure of its own rounding (E = 0),
        # so a proved reordering of a deep model's sums can fail on rounding alone. Asked again against a second
        # float32 evaluation of the original, whose difference from the first is that measure.
        other = other_order_reference(model, sessions)
        if other is None:
            raise
        reference = f"{reference}; against the original without ONNX Runtime's graph optimizations (float32)"
        verdict = check_equivalence(session_a, session_b, feeds, inputs_label, draw, other, reference)
        check_at_scales(session_a, session_b, draws, verdict, other)
    return verdict


class OtherOrderReference:
    """The original run in float32 with none of ONNX Runtime's graph optimizations (no fusions, so its sums in
    another order): the reference where no float64 copy can be made. Its difference from the original is a
    sample of the original's own float32 rounding, the ``E`` of the module's rule. Runs on the float64 feeds a
    reference is given (narrowed back to the session's input types)."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.dtypes = {i.name: _ORT_FLOATS.get(i.type) for i in session.get_inputs()}

    def run(self, names: Any, feeds: Feeds) -> list[Any]:
        """The session's outputs on ``feeds``, each float input in the dtype the model declares."""
        narrowed = {k: (v.astype(self.dtypes[k]) if self.dtypes.get(k) is not None and v.dtype != self.dtypes[k]
                        else v) for k, v in feeds.items()}
        return self.session.run(names, narrowed)


_ORT_FLOATS = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64}


def other_order_reference(model: Any, sessions: Sessions | None = None) -> OtherOrderReference | None:
    """``OtherOrderReference`` of ``model`` (a path or a ModelProto), or None when ORT cannot open it so."""
    maker = sessions if sessions is not None else Sessions()
    try:
        return OtherOrderReference(maker.open(model, optimization="none", arena=False))
    except Exception:  # noqa: BLE001 - ORT's own types: without it, the comparison stands as made
        return None


def feed_ranges(feeds: Feeds) -> dict[str, tuple[float, float]]:
    """Each numeric input's (lowest, highest) finite value: the range of the user's own inputs."""
    ranges: dict[str, tuple[float, float]] = {}
    for name, value in feeds.items():
        array = np.asarray(value)
        if array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.number):
            continue
        finite = array[np.isfinite(array)] if np.issubdtype(array.dtype, np.floating) else array
        if finite.size:
            ranges[name] = (float(finite.min()), float(finite.max()))
    return ranges


#: Ops that read an integer as data (arithmetic, comparisons, casts): an integer input only these read is drawn
#: at every scale; any other reader may take it as a count, a size or an index.
ARITHMETIC_OPS = frozenset({"Add", "Sub", "Mul", "Div", "Mod", "Neg", "Abs", "Max", "Min", "Sum", "Mean", "Equal",
                            "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Where", "Cast", "Sign", "Clip",
                            "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot", "BitShift", "Relu", "Identity"})


def arithmetic_inputs(model: Any) -> frozenset[str]:
    """The graph inputs of ``model`` (a path or a ModelProto) that only arithmetic reads (``ARITHMETIC_OPS``
    in the main graph, none captured by a subgraph); empty when the model cannot be read."""
    import onnx

    try:
        proto = model if isinstance(model, onnx.ModelProto) else onnx.load(model, load_external_data=False)
    except Exception:  # noqa: BLE001 - it loaded before; without it no integer is scaled
        return frozenset()
    readers: dict[str, set[str]] = {vi.name: set() for vi in proto.graph.input}
    for node in proto.graph.node:
        for name in node.input:
            if name in readers:
                readers[name].add(f"{node.domain}:{node.op_type}")
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            for name in readers:  # a subgraph may read any outer value: nothing it could see is data only
                readers[name].add("subgraph")
    return frozenset(name for name, ops in readers.items()
                     if ops and all(op.startswith(":") and op[1:] in ARITHMETIC_OPS for op in ops))


def scale_draws(session: Any, seed: int, shapes: Mapping[str, tuple[int, ...]] | None,
                users_feeds: Feeds | None = None, scaled_integers: Collection[str] = ()) -> list[tuple[str, Feeds]]:
    """The equivalence check's draws beyond the run's own inputs: seeded random inputs at every scale of
    ``xflow.runtime.FEED_SCALES`` but the unit one (integers only where ``scaled_integers`` names them), and,
    given the user's feeds, uniformly within their range (at their shapes); (label, feeds) each."""
    from xflow.runtime import FEED_SCALES, random_feeds

    draws = [(f"{scale} random inputs", random_feeds(session, seed + 100 + i, shapes, scale,
                                                     scaled_integers=scaled_integers))
             for i, scale in enumerate(FEED_SCALES) if scale != "unit"]
    if users_feeds is not None:
        ranges = feed_ranges(users_feeds)
        if ranges:
            at = {name: tuple(np.shape(value)) for name, value in users_feeds.items()}
            draws.append(("random inputs in the range of --inputs", random_feeds(session, seed + 200, at, "unit",
                                                                                 ranges)))
    return draws


def _mask_nonfinite(expected: Any, actual: Any, reference: Any | None) -> tuple[Any, Any, Any | None]:
    """Where the original's output is NaN or infinite (an overflow of large inputs), nothing is compared: those
    elements are set to 0 in all three; the optimized model must be finite wherever the original is."""
    a = np.asarray(expected)
    if not np.issubdtype(a.dtype, np.floating):
        return expected, actual, reference
    bad = ~np.isfinite(a)
    if reference is not None and np.shape(reference) == a.shape:
        bad |= ~np.isfinite(np.asarray(reference))
    if not bad.any():
        return expected, actual, reference
    b = np.asarray(actual).copy() if np.shape(actual) == a.shape else actual
    a = np.where(bad, 0, a).astype(a.dtype)
    if isinstance(b, np.ndarray) and b.shape == a.shape:
        b[bad] = 0
    ref = np.where(bad, 0, np.asarray(reference)) if reference is not None and np.shape(reference) == a.shape \
        else reference
    return a, b, ref


def check_at_scales(session_a: Any, session_b: Any, draws: Sequence[tuple[str, Feeds]], verdict: EquivalenceReport,
                    reference_session: Any | None = None) -> None:
    """Compare the two models on each draw by the module's rule, except at elements where the original's output
    is not finite (large inputs overflow it); a draw the original cannot run (an index out of range) is skipped
    and noted. EquivalenceError on a mismatch, or when ORT runs the original on a draw and not the optimized
    model. The labels compared on go to ``verdict.scales``."""
    names = [o.name for o in session_a.get_outputs()]
    for label, feeds in draws:
        try:
            expected = session_a.run(None, dict(feeds))
        except Exception:  # noqa: BLE001 - ORT's own types: the original refuses these values
            verdict.notes.append(f"the original does not run on {label}; not compared there")
            continue
        try:
            actual = session_b.run(None, dict(feeds))
        except Exception as exc:  # noqa: BLE001
            raise EquivalenceError(None, f"ONNX Runtime runs the original on {label} and not the optimized model "
                                         f"({' '.join(str(exc).split())[:200]})") from None
        wide = None
        if reference_session is not None:
            try:
                wide = reference_session.run(None, _as_float64(feeds))
            except Exception:  # noqa: BLE001 - no float64 reference on these values: compare without it
                wide = None
        refs = list(wide) if wide is not None else [None] * len(names)
        for name, a, b, r in zip(names, expected, actual, refs, strict=True):
            try:
                check_output(name, *_mask_nonfinite(a, b, r))
            except EquivalenceError as exc:
                raise EquivalenceError(None, f"on {label}: {exc.problem}") from None
        verdict.scales.append(label)
