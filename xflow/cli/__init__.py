"""The ``xflow`` command line: the click group ``main`` and one thin module per command.

Each command module parses its options and calls the library; ``common`` holds what every command shares
(one-line errors, exit codes, checked writes), ``options`` the options several take, ``progress`` the progress
lines, ``placing`` and ``summary`` the text ``place`` and ``optimize`` print."""

from __future__ import annotations

import click

from xflow import __version__
from xflow.cli import (
    bench,
    check,
    denormals,
    generate_rules,
    optimize,
    place,
    place_calibrate,
    rules,
    run,
    verify_rules,
    zoo,
)

__all__ = ["main"]

COMMAND_MODULES = (optimize, check, verify_rules, zoo, generate_rules, rules, bench, place, run, place_calibrate,
                   denormals)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(version=__version__)  # not the installed metadata: a PYTHONPATH run has none
def main() -> None:
    """xflow: a graph-substitution superoptimizer for ONNX models.

    Rewrites a model with substitution rules that were generated and proved (z3) beforehand,
    chooses rewrites by costs measured with ONNX Runtime, and writes the result only after checking
    that it computes the same outputs and runs faster.
    """


def _register_commands() -> None:
    """Add every command module's ``COMMANDS`` to ``main``."""
    for module in COMMAND_MODULES:
        for command in module.COMMANDS:
            main.add_command(command)


_register_commands()
