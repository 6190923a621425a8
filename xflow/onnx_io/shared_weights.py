"""Several graphs written as ONNX files whose weights are in one shared data file, for ONNX Runtime sessions
of all of them at once.

The select pass keeps a session of every finalist open while it times them. Made from serialized bytes, each
session holds its own copy of every weight, and each maker the bytes; the finalists share almost all their
weights, so the run held the model's weights about twice per finalist. Written once as external data, a weight
the graphs share is one entry of the data file, which ONNX Runtime maps into memory: each session then owns only
what its kernels prepack.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass

from xflow.ir import Graph
from xflow.onnx_io.save import Deferred, _align, _write_deferred, point_at_external, to_model_proto

PAGE = 4096  # data file offsets ONNX Runtime can map without copying


@dataclass
class SharedWeightsFiles:
    """The written model files (one per graph, in order) and their one data file."""

    model_paths: list[str]
    data_path: str

    def remove(self) -> None:
        """Delete every file written (sessions made from them keep their mappings)."""
        for path in (*self.model_paths, self.data_path):
            with contextlib.suppress(OSError):
                os.remove(path)


def weights_in_memory(graph: Graph) -> bool:
    """True when every weight of ``graph`` is in memory (weights in a source model's external files keep
    their own files, whose locations a model written elsewhere cannot name)."""
    return not any(c.is_external for c in graph.constants.values())


def write_sharing_weights(graphs: Sequence[Graph], directory: str, stem: str) -> SharedWeightsFiles:
    """Write ``graphs`` to ``directory`` as ``<stem><i>.onnx`` with their weights in ``<stem>.data``, each
    weight object once however many graphs hold it. Every graph must satisfy ``weights_in_memory``. Raises
    OSError when a file cannot be written (nothing is left behind then)."""
    data_name = f"{stem}.data"
    files = SharedWeightsFiles([], os.path.join(directory, data_name))
    placed: dict[int, tuple[int, int]] = {}  # id of a weight's source -> (offset, length) in the data file
    written: list[object] = []  # the sources placed: alive while their ids key ``placed``
    try:
        with open(files.data_path, "wb") as out:
            for i, graph in enumerate(graphs):
                if not weights_in_memory(graph):
                    raise ValueError("a graph with weights in external files cannot share a data file")
                deferred: Deferred = {}
                model = to_model_proto(graph, deferred=deferred)
                for tensor in model.graph.initializer:
                    source = deferred.get(tensor.name)
                    if source is None:
                        continue
                    where = placed.get(id(source))
                    if where is None:
                        start = _align(out, PAGE)
                        where = placed[id(source)] = (start, _write_deferred(out, source))
                        written.append(source)
                    point_at_external(tensor, data_name, *where)
                path = os.path.join(directory, f"{stem}{i}.onnx")
                files.model_paths.append(path)
                with open(path, "wb") as f:
                    f.write(model.SerializeToString())
    except BaseException:
        files.remove()
        raise
    return files

