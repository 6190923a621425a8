"""xflow: a graph-substitution superoptimizer for ONNX models.

Pipeline: ``xflow.onnx_io.load`` -> ``xflow.search`` (rules from ``rules/``, costs from ``xflow.cost``)
-> ``xflow.rewrite.fold_constants`` -> verified and timed with ONNX Runtime -> ``xflow.onnx_io.save``
(``xflow.pipeline``; ``xflow.optimize(model, **options)`` for pipelines).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnx

__version__ = "0.1.0"
__all__ = ["optimize"]


def optimize(model: onnx.ModelProto | str, **options: Any) -> onnx.ModelProto:
    """Optimize an ONNX model (ModelProto or path) for pipelines: verified, never slower by default.
    Options are the fields of ``xflow.pipeline.OptimizeOptions``; see ``xflow.pipeline.optimize``."""
    from xflow.pipeline import optimize as run

    return run(model, **options)
