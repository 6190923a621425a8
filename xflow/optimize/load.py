"""The load pass: parse and check the model, resolve its shape profile, build its graph; and the original's run on
the check inputs, made once per run (the reference of verify, select and the denormal probe)."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from xflow.errors import XflowError, one_line
from xflow.ir import Graph
from xflow.ir.dims import is_static
from xflow.onnx_io import graph_from_model, read_model
from xflow.onnx_io.load import check_input_shapes, check_proto, model_from_bytes
from xflow.onnx_io.shape_profile import ShapePlan, shape_plan
from xflow.optimize.options import InputSettings
from xflow.optimize.passes import PassResult
from xflow.optimize.size import ModelSize, model_size
from xflow.ort import Sessions
from xflow.runtime import random_feeds


def read_inputs(path: str) -> dict[str, np.ndarray]:
    """The named arrays of an .npz file (``--inputs``); XflowError naming the file when it is not one."""
    try:
        data = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise XflowError(path, "no such file") from None
    except IsADirectoryError:
        raise XflowError(path, "is a directory, not an .npz file of input arrays") from None
    except OSError as exc:
        raise XflowError(path, f"cannot read inputs: {exc.strerror or exc}") from None
    except ValueError:  # numpy's own words for a file it cannot parse speak of pickles
        raise XflowError(path, "not an .npz file of input arrays (numpy cannot read it)") from None
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise XflowError(path, "holds one unnamed array (.npy); give an .npz that names each input "
                               "(numpy.savez(path, x=...))")
    try:
        with data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError) as exc:
        raise XflowError(path, f"cannot read inputs: {one_line(exc)}") from None


@dataclass(kw_only=True)
class Source(PassResult):
    """The load pass's result, the model to optimize: its graph, and the original as ONNX Runtime and the writer
    reach it (a file, or a ModelProto in memory)."""

    graph: Graph
    label: str  # how messages and the report name it
    path: str | None = None
    proto: onnx.ModelProto | None = None
    onnx_nodes: int = 0  # nodes of the ONNX model (the IR may count them differently)
    size: ModelSize | None = None  # the ONNX model's nodes by op type and bytes (weights included)
    shapes: ShapePlan | None = None  # the model's dynamic dims and the sizes it is measured and checked at
    measuring: dict[str, tuple[int, ...]] = field(default_factory=dict)  # input shapes the graph was built at

    def shapes_at(self, point: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
        """Input shapes at a profile point (``--input-shape`` where it gives them)."""
        shapes = self.shapes.shapes_at(point) if self.shapes is not None else {}
        return {**shapes, **{k: v for k, v in self.measuring.items() if k not in shapes}}

    @property
    def dynamic(self) -> ShapePlan | None:
        """The shape plan when the model has dynamic dims, else None."""
        return self.shapes if self.shapes is not None and self.shapes.is_dynamic else None

    @property
    def runnable(self) -> str | onnx.ModelProto:
        """What ONNX Runtime opens for the original: its file when there is one, else the ModelProto."""
        return self.path if self.path is not None else self.proto

    @property
    def copyable(self) -> bool:
        """True when writing the original means copying its file byte for byte (its weights are in it)."""
        return self.path is not None and not (self.graph.context is not None and self.graph.context.external_data)

    @property
    def kept_as(self) -> str:
        """How the original is written when it is kept, in words."""
        return "copied through unchanged" if self.copyable or self.path is None else \
            "written unchanged (re-encoded: its weights are external data)"


def load_source(model: onnx.ModelProto | bytes | str, inputs: InputSettings, sized: bool = True) -> Source:
    """The load pass: parse and check the model, resolve its shape profile, build its graph with the model's own
    dims (dynamic ones as symbols: the search decides rule conditions for every size and costs graphs at the
    profile's points); ``measuring`` are the input shapes at the profile's first point. ``sized`` False leaves
    ``Source.size`` None (``xflow check`` needs no size; measuring a large model's bytes is seconds)."""
    if isinstance(model, bytes | bytearray | memoryview):  # serialized: parsed here, named as what it is
        model = model_from_bytes(model)
    if isinstance(model, onnx.ModelProto):
        check_proto(model, "<ModelProto>")
        label, path, proto, base_dir = "<ModelProto>", None, model, ""
    else:
        path = os.fspath(model)
        label, proto, base_dir = path, read_model(path), os.path.dirname(os.path.abspath(path))
    plan = shape_plan(proto, inputs.profile, inputs.shapes, label)
    given = dict(inputs.shapes)
    if inputs.npz and plan.is_dynamic and not given and not inputs.profile:
        given = _npz_shapes(plan, read_inputs(inputs.npz))  # measured at the user's inputs' shapes
        plan = shape_plan(proto, {}, given, label, plan.relations)
    measuring = {**plan.shapes_at(plan.points()[0]), **given}
    check_input_shapes(proto, given, label)
    # an input of unknown rank has no symbols to size: --input-shape gives it its shape
    unranked = {name: shape for name, shape in given.items() if plan.input_dims.get(name) is None}
    graph = graph_from_model(proto, base_dir, path or "", unranked, plan.relations)  # dims over free symbols
    return Source(graph=graph, label=label, path=path, proto=model if path is None else None,
                  onnx_nodes=len(proto.graph.node), size=model_size(proto) if sized else None, shapes=plan,
                  measuring=measuring)


def _npz_shapes(plan: ShapePlan, arrays: Mapping[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    """The shapes of the ``--inputs`` arrays that fit a dynamic input (rank and fixed dims; the others are
    left for the original's run to refuse, with ONNX Runtime's words)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for name, array in arrays.items():
        dims = plan.input_dims.get(name)
        if dims is None or len(dims) != array.ndim or all(is_static(d) for d in dims):
            continue
        if all(not is_static(d) or int(d) == n for d, n in zip(dims, array.shape, strict=True)):
            shapes[name] = tuple(array.shape)
    return shapes


class OriginalNotRunnable(XflowError):
    """ONNX Runtime cannot load or run the original model, so nothing can be verified or timed."""


@dataclass
class OriginalRun:
    """The original model's ORT session, the inputs and its outputs on them (made once per run). ``held`` is the
    session while this object holds it: ``hand_over`` passes it to a caller that lets it go when done (the A/B's first
    pair), and ``session`` then makes a fresh one with ``reopen``."""

    feeds: dict[str, np.ndarray]
    outputs: list[Any]
    reopen: Callable[[], Any]
    held: Any = None

    @property
    def session(self) -> Any:
        """The original's session (made again if it was handed over)."""
        if self.held is None:
            self.held = self.reopen()
        return self.held

    def release(self) -> None:
        """Let the session go (``session`` makes a fresh one when it is asked for again)."""
        self.held = None

    def hand_over(self) -> Any:
        """The session, no longer held here: its taker alone decides when its weights are released."""
        session, self.held = self.session, None
        return session


def run_original(source: Source, inputs: InputSettings, sessions: Sessions) -> OriginalRun:
    """Run the original on the inputs; OriginalNotRunnable when ORT refuses the model (a custom-domain op
    without a kernel, an opset newer than ORT, inputs that random values cannot fill), XflowError naming
    ``--inputs`` when the user's inputs do not fit it."""
    try:
        session = sessions.open(source.runnable)
        feeds = read_inputs(inputs.npz) if inputs.npz else random_feeds(session, inputs.seed, source.measuring)
        outputs = session.run(None, feeds)
        return OriginalRun(feeds, outputs, functools.partial(sessions.open, source.runnable), session)
    except XflowError:
        raise
    except Exception as exc:  # ORT raises its own types (Fail, InvalidGraph, NotImplemented, ...)
        plan = source.dynamic
        # only the user's sizes can break a relation the graph states: the defaults are derived from them
        broken = plan.broken_relation(plan.points()[0]) if plan is not None else None
        if inputs.npz:  # the user's inputs do not fit the model: their error, not a pass-through
            why = f"they break {broken}: " if broken is not None else ""
            raise XflowError(inputs.npz, f"ONNX Runtime cannot run {source.label} on these inputs: "
                                         f"{why}{one_line(exc)}") from None
        if broken is not None:
            raise XflowError(source.label, f"the sizes given break {broken}, so ONNX Runtime cannot run the model "
                                           f"({one_line(exc)})") from None
        where = f" at {plan.describe(plan.points()[0])}; --shape-profile sets other sizes" if plan is not None else ""
        raise OriginalNotRunnable(source.label, f"ONNX Runtime cannot run the model{where} ({one_line(exc)})") \
            from None


def try_original(source: Source, inputs: InputSettings, sessions: Sessions) -> OriginalRun | OriginalNotRunnable:
    """``run_original``, its OriginalNotRunnable returned rather than raised (the run goes on, keeping the original)."""
    try:
        return run_original(source, inputs, sessions)
    except OriginalNotRunnable as exc:
        return exc
