"""Functions for worker-process tests (importable by spawned workers)."""

from __future__ import annotations

import os


def double_or_die(value: int) -> int:
    """``2 * value``; the process exits at once (as if killed for memory) when ``value`` is negative."""
    if value < 0:
        os._exit(3)
    return 2 * value
