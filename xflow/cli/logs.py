"""The library's messages on the command line: the ``xflow`` logger's records on stderr, their level set by
``-v`` / ``-q`` (the library only logs; the command decides what is shown)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager

import click


class _ClickHandler(logging.Handler):
    """Writes each record's message to the current stderr (``click.echo``: the stream is looked up at each record,
    so a runner that swaps stderr, as click's does, gets the lines); ``around`` keeps a progress line out of the
    way while a message is written."""

    def __init__(self, around: Callable[[], AbstractContextManager[None]] | None = None) -> None:
        super().__init__()
        self.around = around or contextlib.nullcontext

    def emit(self, record: logging.LogRecord) -> None:
        try:
            with self.around():
                click.echo(self.format(record), err=True)
        except Exception:  # noqa: BLE001 - logging's own rule: a handler never raises
            self.handleError(record)


def configure_logging(verbose: bool = False, quiet: bool = False,
                      around: Callable[[], AbstractContextManager[None]] | None = None) -> None:
    """Show the ``xflow`` logger's messages on stderr: errors only with ``quiet``, notes (INFO) by default, and
    debug detail with ``verbose``; each written inside ``around()`` (a progress line's ``paused``). Calling it again
    replaces the handler it added before."""
    logger = logging.getLogger("xflow")
    for handler in [h for h in logger.handlers if isinstance(h, _ClickHandler)]:
        logger.removeHandler(handler)
    handler = _ClickHandler(around)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.ERROR if quiet else logging.DEBUG if verbose else logging.INFO)
    logger.propagate = False  # shown once, here, not again by a root handler
