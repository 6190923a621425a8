"""Errors a user sees as one line: the file and what is wrong with it."""

from __future__ import annotations


class XflowError(Exception):
    """A problem with the user's input or environment, reported without a traceback."""

    def __init__(self, path: str | None, problem: str) -> None:
        super().__init__(f"{path}: {problem}" if path else problem)
        self.path = path
        self.problem = problem
