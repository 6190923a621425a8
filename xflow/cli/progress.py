"""Progress on stderr: shown on a terminal, quiet in pipes (``generate-rules`` also logs a throttled line)."""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click


@dataclass
class ProgressLine:
    """``generate-rules``' progress on stderr. On a terminal, one line rewritten in place; elsewhere (a log file, CI)
    a line whenever the step changes and at most one every ``every_s`` seconds within a step, so that an hour-long
    run written to a log is not silent until its table."""

    tty: bool
    every_s: float = 60.0
    step: str | None = None  # the last line written, up to its first digit
    written_at: float = float("-inf")

    def __call__(self, text: str) -> None:
        if self.tty:
            click.echo(f"\r{text:<78}", err=True, nl=False)
            return
        step = re.split(r"\d", text, maxsplit=1)[0]
        now = time.monotonic()
        if step != self.step or now - self.written_at >= self.every_s:
            click.echo(text, err=True)
            self.step, self.written_at = step, now


def no_progress(_text: str) -> None:
    """A progress callback that shows nothing (``--quiet``)."""
    return None


class StatusLine:
    """One line on stderr rewritten in place (at most ten times a second); only on a TTY."""

    def __init__(self) -> None:
        self.shown = 0
        self.last = 0.0

    def __call__(self, message: str) -> None:
        now = time.monotonic()
        if now - self.last < 0.1:
            return
        self.last = now
        click.echo("\r" + message.ljust(self.shown), err=True, nl=False)
        self.shown = len(message)

    def clear(self) -> None:
        """Erase the line (before the report is printed)."""
        if self.shown:
            click.echo("\r" + " " * self.shown + "\r", err=True, nl=False)
            self.shown = 0


def status_line(quiet: bool) -> StatusLine | None:
    """A status line for the placement commands, or None when quiet or stderr is not a terminal."""
    return None if quiet or not sys.stderr.isatty() else StatusLine()


def clear_status(progress: StatusLine | None) -> None:
    """Erase a status line, if there is one."""
    if progress is not None:
        progress.clear()


def search_progress() -> Callable[[Any], None]:
    """``optimize``'s search progress: expanded and generated graphs and the best cost, rewritten in place."""

    def show(result: Any) -> None:
        click.echo(f"\rsearch: {result.explored} expanded, {result.generated} generated, "
                   f"best cost {result.best_cost * 1e3:.3f} ms ({result.seconds:.1f} s)", err=True, nl=False)

    return show
