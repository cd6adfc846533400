"""Writing command results: ``-`` is stdout, anything else a file written atomically
(a temporary file renamed into place, so an interrupted command leaves no partial
output)."""
from __future__ import annotations

import os
import sys

from .errors import CliError


def write_output(path: str, data: bytes | str) -> None:
    raw = data.encode("utf-8") if isinstance(data, str) else data
    if path == "-" and not isinstance(data, str) and sys.stdout.isatty():
        raise CliError("-o -: refusing to write a binary file to a terminal; redirect stdout "
                       "or give a file name")
    if path == "-":
        sys.stdout.flush()
        sys.stdout.buffer.write(raw)
        sys.stdout.buffer.flush()
        return
    from ..io.errors import SaveError
    from ..io.atomic import write_file_atomic
    try:
        write_file_atomic(path, lambda f: f.write(raw))
    except SaveError as e:
        raise CliError(str(e)) from None
    except OSError as e:
        raise CliError(f"{path}: cannot write: {e.strerror or e}") from None


def check_writable(path: str) -> None:
    """Fail early (before a long step) when ``path`` cannot be written."""
    if path == "-":
        return
    target = os.path.abspath(path)
    if os.path.isdir(target):
        raise CliError(f"{path}: is a directory")
    parent = os.path.dirname(target)
    if not os.path.isdir(parent):
        raise CliError(f"{path}: directory {parent} does not exist")
