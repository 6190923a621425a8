"""Progress on stderr: shown on a terminal, quiet in pipes (``generate-rules`` also logs a throttled line); for
``optimize``, every phase of the run (``RunProgress``)."""

from __future__ import annotations

import contextlib
import re
import shutil
import sys
import threading
import time
from collections.abc import Iterator
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


class RunProgress:
    """``optimize``'s progress on a terminal: one stderr line rewritten in place, naming the phase the run is in and
    how long it has taken (redrawn each second by a daemon thread, as the timing phases report nothing while they
    run), the search's figures while it searches. ``paused`` keeps the line out of the way of a log message;
    ``close`` erases it."""

    def __init__(self, tick_s: float = 1.0) -> None:
        self._lock = threading.RLock()  # reentrant: a phase may start inside paused()
        self._name = ""
        self._detail = ""
        self._started = time.monotonic()
        self._shown = 0
        self._tick_s = tick_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def phase(self, name: str) -> None:
        """A phase starts: show its name (and start the clock that redraws the line)."""
        with self._lock:
            self._name, self._detail, self._started = name, "", time.monotonic()
            self._draw()
        if self._thread is None:
            self._thread = threading.Thread(target=self._tick, name="xflow-progress", daemon=True)
            self._thread.start()

    def search(self, report: Any) -> None:
        """The search's figures so far."""
        with self._lock:
            self._detail = (f"{report.explored} expanded, {report.generated} generated, best cost "
                            f"{report.best_cost * 1e3:.3f} ms")
            self._draw()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Inside, the line is erased and not redrawn (a log message is being written); redrawn after."""
        with self._lock:
            self._erase()
            yield
            self._draw()

    def close(self) -> None:
        """Stop redrawing and erase the line."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        with self._lock:
            self._erase()

    def _tick(self) -> None:
        while not self._stop.wait(self._tick_s):
            with self._lock:
                if not self._stop.is_set():
                    self._draw()

    def _draw(self) -> None:
        seconds = time.monotonic() - self._started
        text = f"{self._name}: {self._detail} ({seconds:.0f} s)" if self._detail else f"{self._name} ({seconds:.0f} s)"
        width = shutil.get_terminal_size((80, 24)).columns - 1
        text = text[:width]
        click.echo("\r" + text.ljust(self._shown), err=True, nl=False)
        self._shown = len(text)

    def _erase(self) -> None:
        if self._shown:
            click.echo("\r" + " " * self._shown + "\r", err=True, nl=False)
            self._shown = 0


def run_progress(quiet: bool) -> RunProgress | None:
    """``optimize``'s progress line, or None when quiet or stderr is not a terminal."""
    return None if quiet or not sys.stderr.isatty() else RunProgress()
