"""Errors of reading and writing jaxpr-cc's files (saved programs, executable archives).

``LoadError`` and ``SaveError`` are ``ValueError``s with a one-line message that
names the file (or the program) and the problem.  ``FormatError`` is raised inside
the reader with the problem only; ``load`` adds the file name.
"""
from __future__ import annotations

_MAX_MESSAGE = 400


def one_line(text: str, limit: int = _MAX_MESSAGE) -> str:
    """Collapse whitespace (a message must fit on one line) and cap the length."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


class LoadError(ValueError):
    """A file could not be read as a saved program: ``"<path>: <problem>"``."""

    def __init__(self, path: str, problem: str):
        self.path = str(path)
        self.problem = one_line(problem)
        super().__init__(f"{self.path}: {self.problem}")


class SaveError(ValueError):
    """A program cannot be saved; raised before anything is written."""

    def __init__(self, message: str):
        super().__init__(one_line(message, limit=2000))


class FormatError(Exception):
    """Internal to the reader: what is wrong with the file, without the file name."""
