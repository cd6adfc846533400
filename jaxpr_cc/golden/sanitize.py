"""Keeping machine-specific text out of golden files.

Goldens must read the same on every machine and in every process: absolute paths
(the checkout's location, the Python installation) and memory addresses are
replaced before anything is recorded.
"""
from __future__ import annotations

import re
from typing import Mapping

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+|0x[0-9a-fA-F]{6,}")
# An absolute POSIX or Windows path up to the last separator: kept is the base name.
_ABSOLUTE_DIRS = re.compile(r"(?:(?<=[\s'\"(=])|^)(?:/|[A-Za-z]:\\)(?:[^\s'\"():,]*[/\\])")
MAX_ERROR_CHARS = 300


def apply_aliases(text: str, aliases: Mapping[str, str]) -> str:
    """Replace each directory in ``aliases`` (longest first) by its placeholder."""
    for directory in sorted(aliases, key=len, reverse=True):
        text = text.replace(directory, aliases[directory])
    return text


def error_line(exc: BaseException, aliases: Mapping[str, str] = {}) -> str:
    """``Type: first line of the message``, with paths reduced to base names and
    addresses removed, so the line is the same on every machine."""
    cause = exc
    # A pass failure wraps the pass's exception; the wrapper names a reproducer file
    # in the temp directory, the cause does not.
    if type(exc).__name__ == "PassError" and exc.__cause__ is not None:
        cause = exc.__cause__
        prefix = f"pass {getattr(exc, 'pass_name', '?')!r} failed: "
    else:
        prefix = ""
    message = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
    message = apply_aliases(message, aliases)
    message = _ABSOLUTE_DIRS.sub("", message)
    message = _ADDRESS.sub("", message)
    text = f"{prefix}{type(cause).__name__}" + (f": {message.rstrip()}" if message else "")
    if len(text) > MAX_ERROR_CHARS:
        text = text[:MAX_ERROR_CHARS - 3] + "..."
    return text
