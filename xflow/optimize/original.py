"""The original model's run on the check inputs, made once per run: the reference of verify, select and the
denormal probe."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from xflow.errors import XflowError, one_line
from xflow.optimize.load import Source, read_inputs
from xflow.optimize.options import InputSettings
from xflow.ort import Sessions
from xflow.runtime import random_feeds


class OriginalNotRunnable(XflowError):
    """ONNX Runtime cannot load or run the original model, so nothing can be verified or timed."""


@dataclass
class OriginalRun:
    """The original model's ORT session, the inputs and its outputs on them (made once per run)."""

    session: Any
    feeds: dict[str, np.ndarray]
    outputs: list[Any]


def run_original(source: Source, inputs: InputSettings, sessions: Sessions) -> OriginalRun:
    """Run the original on the inputs; OriginalNotRunnable when ORT refuses the model (a custom-domain op
    without a kernel, an opset newer than ORT, inputs that random values cannot fill), XflowError naming
    ``--inputs`` when the user's inputs do not fit it."""
    try:
        session = sessions.open(source.runnable)
        feeds = read_inputs(inputs.npz) if inputs.npz else random_feeds(session, inputs.seed, source.measuring)
        return OriginalRun(session, feeds, session.run(None, feeds))
    except XflowError:
        raise
    except Exception as exc:  # ORT raises its own types (Fail, InvalidGraph, NotImplemented, ...)
        if inputs.npz:  # the user's inputs do not fit the model: their error, not a pass-through
            raise XflowError(inputs.npz, f"ONNX Runtime cannot run {source.label} on these inputs: "
                                         f"{one_line(exc)}") from None
        plan = source.dynamic
        where = f" at {plan.describe(plan.points()[0])}; --shape-profile sets other sizes" if plan is not None else ""
        raise OriginalNotRunnable(source.label, f"ONNX Runtime cannot run the model{where} ({one_line(exc)})") \
            from None


def try_original(source: Source, inputs: InputSettings, sessions: Sessions) -> OriginalRun | OriginalNotRunnable:
    """``run_original``, its OriginalNotRunnable returned rather than raised (the run goes on, keeping the original)."""
    try:
        return run_original(source, inputs, sessions)
    except OriginalNotRunnable as exc:
        return exc
