"""xflow: a graph-substitution superoptimizer for ONNX models.

Pipeline (``xflow.pipeline``, a chain of in-memory stages): load (``xflow.onnx_io``) -> search
(``xflow.search``; rules from ``rules/``, costs from ``xflow.cost``) -> finalize (complete, fold,
simplify) -> select (finalists timed end to end) -> verify (outputs and A/B timing in ONNX Runtime)
-> place (optional) -> write. ``xflow.optimize(model, **options)`` for pipelines.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnx

__version__ = "0.1.0"
__all__ = ["optimize"]


def optimize(model: onnx.ModelProto | bytes | str, **options: Any) -> onnx.ModelProto:
    """Optimize an ONNX model (ModelProto, its bytes or a path) for pipelines: verified, never slower by default.
    Options are the fields of ``xflow.pipeline.OptimizeOptions``; see ``xflow.pipeline.optimize``."""
    from xflow.pipeline import optimize as run

    return run(model, **options)
