"""The write pass: the graph chosen, or the original (a byte-for-byte copy of its file where its weights are in
it); and the check of the output path made before any work."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from xflow.check.certificate import with_certificate
from xflow.errors import XflowError
from xflow.files import check_output_file, copy_atomically, write_json
from xflow.ir import Graph
from xflow.onnx_io import save
from xflow.optimize.load import Source
from xflow.optimize.passes import PassResult


@dataclass(kw_only=True)
class Written(PassResult):
    """The write pass's result: the graph written (None: the original), its ONNX nodes, and whether the file is a
    byte-for-byte copy of the input."""

    nodes: int
    copied: bool


def check_output_path(in_path: str, out_path: str) -> None:
    """Refuse IN == OUT and outputs that cannot be written, before any work is done."""
    if os.path.abspath(in_path) == os.path.abspath(out_path) or (
            os.path.exists(out_path) and os.path.exists(in_path) and os.path.samefile(in_path, out_path)):
        raise XflowError(out_path, "output is the input file; choose another output path")
    check_output_file(out_path)
    directory = os.path.dirname(os.path.abspath(out_path))
    if not os.path.isdir(directory):
        raise XflowError(out_path, "output directory does not exist")
    if not os.access(directory, os.W_OK):
        raise XflowError(out_path, "output directory is not writable")


def write(source: Source, graph: Graph | None, out_path: str, scratch: str,
          certificate: Mapping[str, Any] | None = None, certificate_path: str | None = None) -> Written:
    """The write pass: ``graph``, or the original when None. A rewritten graph's model carries ``certificate``
    (None: none, and not one the input carried: it would not be OUT's); ``certificate_path`` also gets it alone."""
    if graph is None and source.copyable:
        assert source.path is not None
        copy_atomically(source.path, out_path, scratch)
        return Written(graph=None, nodes=source.onnx_nodes, copied=True)
    if graph is not None:
        if certificate is not None and certificate_path is not None:
            write_json(certificate_path, certificate, scratch)
        graph = with_certificate(graph, certificate)
    # a rewritten model's Constant nodes as initializers; the original re-encoded as it was
    nodes = save(graph if graph is not None else source.graph, out_path, scratch=scratch,
                 constant_nodes=graph is None)
    return Written(graph=graph, modified=graph is not None, nodes=nodes, copied=False)
