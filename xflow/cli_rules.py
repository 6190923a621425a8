"""Rule commands: ``xflow generate-rules`` and ``xflow rules stats``."""

from __future__ import annotations

import click

COMMANDS: list[click.Command] = []
