"""What a run shows while it works: the phase it is in and the search's figures, handed to a ``Progress`` (the
CLI's status line on a terminal; nothing by default). The library never prints."""

from __future__ import annotations

from typing import Protocol

from xflow.search import SearchReport


class Progress(Protocol):
    """Told each phase as it starts (``"search"``, ``"timing 3 finalists"``, ``"verify: outputs, then the A/B"``,
    ``"certify"``, ``"write"``, ...) and the search's figures as it goes."""

    def phase(self, name: str) -> None: ...

    def search(self, report: SearchReport) -> None: ...


def enter(progress: Progress | None, name: str) -> None:
    """Tell ``progress`` (None: nobody) that phase ``name`` starts."""
    if progress is not None:
        progress.phase(name)
