"""What every ``xflow`` command shares: one-line user errors, exit codes, atomic JSON writes."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from functools import wraps
from typing import Any

import click

from xflow.errors import XflowError
from xflow.files import check_output_file, write_atomically, write_json

__all__ = ["EXIT_BAD_INPUT", "check_writable", "fail", "save_model", "user_errors", "write_atomically", "write_json"]

EXIT_BAD_INPUT = 2


def fail(message: str, code: int = EXIT_BAD_INPUT) -> None:
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
        except KeyboardInterrupt:
            fail("interrupted; nothing written", 130)

    return wrapper


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
