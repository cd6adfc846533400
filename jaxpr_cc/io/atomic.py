"""Atomic file writes: a file is either left as it was or replaced by its complete
new content, even if the writer is interrupted (killed, out of disk space)."""
from __future__ import annotations

import os
import tempfile
from typing import BinaryIO, Callable

from .errors import SaveError


def _current_umask() -> int:
    # The temporary file is created 0600; the result gets the usual 0666 & ~umask.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


def write_file_atomic(path: str, write: Callable[[BinaryIO], None]) -> None:
    """Write a file through ``write(fileobj)`` so that ``path`` is either left as it
    was or replaced by the complete new content: a temporary file in the same
    directory, flushed to disk, then renamed over ``path``."""
    target = os.path.abspath(path)
    if os.path.isdir(target):
        raise SaveError(f"{path}: is a directory")
    directory = os.path.dirname(target)
    if not os.path.isdir(directory):
        raise SaveError(f"{path}: directory {directory} does not exist")
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(target) + ".",
                               suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise

