"""``xflow optimize`` as passes: load -> search -> finalize -> select -> verify -> place (optional) -> write.

One module per pass (``load`` also runs the original once on the check inputs), each returning a result after
onnx-ir's ``PassResult`` (``passes``: the graph it hands on, whether it changed it, its own figures); ``options``
holds every setting and ``DEFAULTS``, the one place a default is written; ``costing`` makes the run's cost model;
``denormal_probe`` tells finalize where values hold denormals; ``report`` assembles the report from the passes'
results; ``decision`` says what was written and why; ``chain`` runs the passes before write and ``run`` holds the
entry points (``optimize_file`` for the CLI, ``optimize_model`` and ``optimize`` for pipelines)."""

import sys
import types
from typing import Any

from xflow.optimize.decision import Decision
from xflow.optimize.load import read_inputs
from xflow.optimize.options import DEFAULTS, OptimizeOptions
from xflow.optimize.place import PlaceRequest
from xflow.optimize.report import OptimizeReport
from xflow.optimize.run import optimize, optimize_file, optimize_model

__all__ = ["DEFAULTS", "Decision", "OptimizeOptions", "OptimizeReport", "PlaceRequest", "optimize", "optimize_file",
           "optimize_model", "read_inputs"]


class _CallablePackage(types.ModuleType):
    """This package is also the public API's function ``xflow.optimize(model, **options)``: importing a submodule
    binds the package's name in ``xflow``, so the package itself is what that call reaches."""

    def __call__(self, model: Any, **options: Any) -> Any:
        return optimize(model, **options)


sys.modules[__name__].__class__ = _CallablePackage
