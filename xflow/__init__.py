"""xflow: a graph-substitution superoptimizer for ONNX models.

Pipeline: ``xflow.onnx_io.load`` -> ``xflow.search`` (rules from ``rules/``, costs from ``xflow.cost``)
-> ``xflow.rewrite.fold_constants`` -> verified and timed with ONNX Runtime -> ``xflow.onnx_io.save``.
"""

__version__ = "0.1.0"
