"""Which values of a graph hold float denormals on the original's inputs: what decides where a rule whose gain is
in the values (``Rule.gain_in_values``) is applied in finalize."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from xflow.ir import Graph
from xflow.onnx_io.shared_weights import write_sharing_weights
from xflow.ort import Sessions
from xflow.ort.graphs import fits_in_memory


def denormal_values(graph: Graph, names: Sequence[str], feeds: Mapping[str, np.ndarray],
                    sessions: Sessions) -> frozenset[str] | None:
    """Which of ``names`` (float values of ``graph``) hold a denormal (a nonzero element below its type's smallest
    normal) when ``graph`` runs on ``feeds``: inputs and constants read as they are, the others from one ORT session
    of the graph with them as outputs too. None when that cannot be run (weights in external data, or ORT refuses):
    then nothing is known."""
    wanted = [n for n in dict.fromkeys(names) if (t := graph.types.get(n)) is not None and _is_float(t.dtype)]
    known = {n: feeds[n] if n in feeds else graph.constants[n].value() for n in wanted
             if n in feeds or n in graph.constants}
    computed = [n for n in wanted if n not in known]
    if computed:
        if not fits_in_memory(graph):
            return None  # written to a file for ORT (external or very large weights): not probed
        try:
            session = _probing_session(graph, computed, sessions)
            known |= dict(zip(computed, session.run(computed, dict(feeds)), strict=True))
        except Exception:  # noqa: BLE001 - ORT's own types: unknown, so every match is kept
            return None
    return frozenset(n for n, v in known.items() if _holds_denormals(np.asarray(v)))


def _probing_session(graph: Graph, outputs: Sequence[str], sessions: Sessions) -> Any:
    """A session of ``graph`` with ``outputs`` as outputs too, read from files in a scratch folder (the weights in a
    data file beside a small model file, as ``write_sharing_weights`` writes them): neither the model with its
    weights nor its bytes are held in memory while the session is built. No memory arena: it is never timed."""
    with sessions.folder() as folder:
        path = write_sharing_weights([graph], folder, "probe").model_paths[0]
        model = onnx.load(path, load_external_data=False)
        model.graph.output.extend(onnx.helper.make_tensor_value_info(n, graph.types[n].dtype, None)
                                  for n in outputs if n not in graph.outputs)
        onnx.save(model, path)
        return sessions.open(path, arena=False)


@dataclass
class DenormalProbe:
    """``denormal_values`` on the original's inputs, and every value it found denormal (the report lists them)."""

    feeds: Mapping[str, np.ndarray]
    sessions: Sessions
    held: set[str] = field(default_factory=set)

    def __call__(self, graph: Graph, names: Sequence[str]) -> frozenset[str] | None:
        found = denormal_values(graph, names, self.feeds, self.sessions)
        self.held.update(found or ())
        return found


def _is_float(dtype: int) -> bool:
    try:
        return bool(np.issubdtype(onnx.helper.tensor_dtype_to_np_dtype(dtype), np.floating))
    except (KeyError, TypeError, ValueError):  # undefined or not a numpy type
        return False


def _holds_denormals(array: np.ndarray) -> bool:
    magnitude = np.abs(array)
    return bool(((magnitude > 0) & (magnitude < np.finfo(array.dtype).tiny)).any())
