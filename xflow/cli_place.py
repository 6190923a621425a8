"""Placement commands: ``xflow place`` and ``xflow run --plan``."""

from __future__ import annotations

import click

COMMANDS: list[click.Command] = []
