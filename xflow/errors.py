"""Errors a user sees as one line: the file and what is wrong with it."""

from __future__ import annotations


class XflowError(Exception):
    """A problem with the user's input or environment, reported without a traceback."""

    def __init__(self, path: str | None, problem: str) -> None:
        path, problem = (_escaped(path) if path else path), _escaped(problem)
        super().__init__(f"{path}: {problem}" if path else problem)
        self.path = path
        self.problem = problem


def _escaped(text: str) -> str:
    """``text`` with line breaks written as escapes: a name holding a newline (an input, a file) must not
    split the one line a user error is."""
    text = str(text)
    return text.replace("\r", "\\r").replace("\n", "\\n") if "\n" in text or "\r" in text else text


def one_line(exc: BaseException) -> str:
    """An exception's whole message on one line (ONNX Runtime's and onnx's span several lines; cutting
    at the first would end mid-sentence), or its type's name when it has none."""
    text = " ".join(str(exc).split())
    return text or type(exc).__name__
