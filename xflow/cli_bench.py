"""``xflow bench``: the zoo and given models, original vs optimized, per provider."""

from __future__ import annotations

import click

COMMANDS: list[click.Command] = []
