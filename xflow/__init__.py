"""xflow: a graph-substitution superoptimizer for ONNX models.

``xflow.optimize``, a chain of in-memory passes: load (``xflow.onnx_io``) -> search
(``xflow.search``; rules from ``rules/``, costs from ``xflow.cost``) -> finalize (complete, fold,
simplify) -> select (finalists timed end to end) -> verify (outputs and A/B timing in ONNX Runtime)
-> place (optional) -> write. ``xflow.optimize(model, **options)`` for pipelines.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

__version__ = "0.1.0"

# The rule generator and verifier are top-level folders of the repository (``generator/``, ``verifier/``) and
# install as ``xflow.generator`` and ``xflow.verifier`` (setup.py maps them). In a checkout, where they sit beside
# this package rather than in it, the repository's root is searched for them after this folder.
_CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if not os.path.isdir(os.path.join(__path__[0], "generator")) and \
        os.path.isfile(os.path.join(_CHECKOUT, "generator", "__init__.py")):
    __path__.append(_CHECKOUT)
__all__ = ["optimize"]


def __getattr__(name: str) -> Any:
    """``xflow.optimize``: the package, loaded when first asked for (its imports are slow), and callable as
    ``xflow.optimize(model, **options) -> ModelProto`` (verified, never slower by default; options are the flat
    names of ``xflow.optimize.OptimizeOptions.of``)."""
    if name == "optimize":
        return importlib.import_module("xflow.optimize")
    raise AttributeError(f"module 'xflow' has no attribute {name!r}")
