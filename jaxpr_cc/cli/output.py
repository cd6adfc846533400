"""Writing command results: ``-o -`` is stdout on every subcommand; anything else goes
through jaxpr-cc's one file writer (:mod:`jaxpr_cc.io.atomic`): a regular file is
replaced atomically (an interrupted command leaves no partial output), a device or
FIFO is written in place and never replaced, a symlink's target is written, and new
files get the user's umask."""
from __future__ import annotations

import contextlib
import os
import sys

from .errors import CliError

STDOUT = "-"


def write_output(path: str, data: bytes | str) -> None:
    raw = data.encode("utf-8") if isinstance(data, str) else data
    if path == STDOUT:
        if not isinstance(data, str) and sys.stdout.isatty():
            raise CliError("-o -: refusing to write a binary file to a terminal; redirect "
                           "stdout or give a file name")
        sys.stdout.flush()
        sys.stdout.buffer.write(raw)
        sys.stdout.buffer.flush()
        return
    from ..io.atomic import write_bytes
    with write_errors(path):
        write_bytes(path, raw)


@contextlib.contextmanager
def write_errors(path: str):
    """The file writer's errors for ``path`` as one-line CLI errors."""
    from ..io.errors import SaveError
    try:
        yield
    except SaveError as e:
        raise CliError(str(e)) from None
    except OSError as e:
        raise CliError(f"{path}: cannot write: {e.strerror or e}") from None


def check_writable(path: str) -> None:
    """Fail early (before a long step) when ``path`` cannot be written."""
    if path == STDOUT:
        return
    target = os.path.abspath(path)
    if os.path.isdir(target):
        raise CliError(f"{path}: is a directory; -o takes a file name ('-' for stdout)")
    if os.path.exists(target):
        return  # an existing file, device or FIFO (through any symlinks)
    parent = os.path.dirname(os.path.realpath(target))
    if not os.path.isdir(parent):
        raise CliError(f"{path}: directory {parent} does not exist")
