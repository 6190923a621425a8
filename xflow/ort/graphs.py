"""Sessions of an IR graph: from its model serialized once, or, where its weights are external or too large for
one protobuf, from a file in the run's scratch folder (``Sessions.folder``)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

from xflow.ir import Graph
from xflow.onnx_io import save, to_model_proto
from xflow.onnx_io.save import EXTERNAL_THRESHOLD
from xflow.onnx_io.shared_weights import weights_in_memory
from xflow.ort.sessions import Sessions


def fits_in_memory(graph: Graph) -> bool:
    """True when the graph's model can go to ORT as bytes: its weights are inline and one protobuf holds them."""
    return weights_in_memory(graph) and sum(c.nbytes for c in graph.constants.values()) < EXTERNAL_THRESHOLD


def session_maker(sessions: Sessions, graph: Graph, name: str,
                  serialized: Callable[[], bytes] | None = None) -> Callable[[], Any]:
    """A maker of sessions of ``graph`` (the A/B and the select pass make several of one graph): from its model
    serialized once (``serialized`` gives the bytes where the caller holds them already), or (external or very
    large weights) from a file written in the scratch folder for each session and removed once the session
    holds the weights."""
    if fits_in_memory(graph):
        data = serialized() if serialized is not None else to_model_proto(graph).SerializeToString()
        return lambda: sessions.open(data)

    def from_file() -> Any:
        with sessions.folder() as folder:
            path = os.path.join(folder, f"{name}.onnx")
            try:
                save(graph, path, scratch=folder)
                return sessions.open(path)
            finally:
                for leftover in (path, path + ".data"):
                    with contextlib.suppress(OSError):
                        os.remove(leftover)
    return from_file
