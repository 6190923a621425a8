"""What every ``xflow`` command shares: one-line user errors, exit codes, checked and atomic writes, loading a
model, the cost model of the placement commands."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from functools import wraps
from typing import Any

import click

from xflow.errors import XflowError, one_line
from xflow.files import check_output_file, write_atomically, write_json

__all__ = ["EXIT_BAD_INPUT", "NO_ONNXRUNTIME", "check_writable", "cost_model", "fail", "load_graph",
           "require_onnxruntime", "save_model", "sigterm_as_interrupt", "user_errors", "write_atomically",
           "write_json"]

EXIT_BAD_INPUT = 2

# ONNX Runtime is an extra, not a core dependency: its two builds (onnxruntime, onnxruntime-gpu) both install the
# module `onnxruntime`, so a core dependency on one would land beside the other on every GPU install.
NO_ONNXRUNTIME = ("onnxruntime is not installed: install xflow with its cpu extra, pip install \"xflow-opt[cpu]\" "
                  "(in a checkout: pip install \".[cpu]\"; on a CUDA machine gpu instead, never both)")


def fail(message: str, code: int = EXIT_BAD_INPUT) -> None:
    """Print ``xflow: error: MESSAGE`` on stderr and exit with ``code``."""
    click.echo(f"xflow: error: {message}", err=True)
    sys.exit(code)


def user_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn XflowError into one line on stderr and exit code 2 (no traceback)."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except XflowError as exc:
            fail(str(exc))
        except ModuleNotFoundError as exc:
            # a path that needs ONNX Runtime and was not refused up front by require_onnxruntime
            if _is_onnxruntime(exc.name):
                fail(NO_ONNXRUNTIME)
            raise
        except KeyboardInterrupt:
            fail("interrupted; nothing written", 130)

    return wrapper


def _is_onnxruntime(module: str | None) -> bool:
    return module is not None and module.split(".")[0] == "onnxruntime"


def require_onnxruntime() -> None:
    """Refuse, before any work, to run a command that needs ONNX Runtime where it cannot be imported."""
    try:
        import onnxruntime  # noqa: F401
    except ModuleNotFoundError as exc:
        if _is_onnxruntime(exc.name):
            raise XflowError(None, NO_ONNXRUNTIME) from None
        raise XflowError(None, f"onnxruntime cannot be imported: {one_line(exc)}") from None
    except ImportError as exc:  # installed but broken (a missing shared library)
        raise XflowError(None, f"onnxruntime cannot be imported: {one_line(exc)}") from None


def check_writable(path: str) -> None:
    """Refuse an output that is not a regular file (a device, FIFO, kernel file system) or cannot be
    written (its directory missing or read-only), before any work is done."""
    check_output_file(path)
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory) or not os.access(directory, os.W_OK):
        raise XflowError(path, "cannot write here (directory missing or not writable)")


def save_model(model: Any, path: str) -> None:
    """Save an ONNX ModelProto (inline weights), atomically."""
    import onnx

    write_atomically(path, lambda tmp: onnx.save(model, tmp))


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While inside, SIGTERM unwinds like Ctrl-C: temp files and scratch copies are removed and nothing
    is written (Python's default would stop at once and leave them). Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def load_graph(path: str):  # noqa: ANN201 - Graph
    """Load a model into the IR; a missing or corrupt file is an XflowError naming it."""
    from xflow.onnx_io import load

    if not os.path.exists(path):
        raise XflowError(path, "no such file")
    try:
        return load(path)
    except XflowError:
        raise
    except Exception as exc:  # onnx raises many types for a corrupt file
        raise XflowError(path, f"cannot load model: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
                         ) from None


def cost_model(kind: str, cost_db: str | None):  # noqa: ANN201 - CostModel
    """The placement commands' node costs: ``analytic``, or measured on the CPU provider and cached."""
    from xflow.cost import AnalyticCost

    if kind == "analytic":
        return AnalyticCost()
    from xflow.cost.cache import CostCache
    from xflow.cost.measured import MeasuredCost

    return MeasuredCost(cache=CostCache(cost_db))
