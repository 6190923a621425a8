"""``python -m xflow.cli``: the same as the ``xflow`` entry point."""

from xflow.cli import main

main()
