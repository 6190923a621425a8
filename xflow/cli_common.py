"""What every ``xflow`` command shares: one-line user errors, exit codes, atomic JSON writes."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from functools import wraps
from typing import Any

import click

from xflow.errors import XflowError

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
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory) or not os.access(directory, os.W_OK):
        raise XflowError(path, "cannot write here (directory missing or not writable)")


def write_atomically(path: str, write: Callable[[str], None]) -> None:
    """``write(tmp)`` then rename onto ``path``: readers never see a partial file, and the temporary file is
    removed when writing fails or is interrupted."""
    tmp = f"{path}.xflow-tmp"
    try:
        write(tmp)
        os.replace(tmp, path)
    except OSError as exc:
        raise XflowError(path, f"cannot write: {exc.strerror or exc}") from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_json(path: str, data: Any) -> None:
    """Write ``data`` as indented JSON, atomically."""

    def dump(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2)

    write_atomically(path, dump)


def save_model(model: Any, path: str) -> None:
    """Save an ONNX ModelProto (inline weights), atomically."""
    import onnx

    write_atomically(path, lambda tmp: onnx.save(model, tmp))
