"""Writing output files: the one helper every jaxpr-cc writer uses (``jaxpr_cc.save``,
executables, emitted Python, golden files, crash reproducers, the command line).

* A regular file (or a new file) is written atomically: a temporary file in the same
  directory, flushed to disk, then renamed over the path, so the path holds either
  its old content or the complete new content, even if the writer is interrupted.
* Anything else that already exists (a FIFO, a character or block device such as
  ``/dev/null`` or ``/dev/stdout``) is written in place and never replaced: renaming
  over it would destroy a file jaxpr-cc did not create.
* A symlink is followed: its target is written (by the two rules above) and the link
  stays a link.
* A new file gets the permissions the user's umask gives (``0666 & ~umask``, applied
  by the kernel when the temporary file is created); a replaced file keeps its mode.
"""
from __future__ import annotations

import io
import os
import secrets
import stat
from typing import BinaryIO, Callable

from .errors import SaveError

__all__ = ["write_file", "write_bytes"]


def write_bytes(path, data: bytes) -> None:
    """Write ``data`` to ``path`` (see the module docstring for what is replaced)."""
    write_file(path, lambda f: f.write(data))


def write_file(path, write: Callable[[BinaryIO], None]) -> None:
    """Write ``path`` through ``write(fileobj)``; ``fileobj`` is a seekable binary
    file (zip and npz writers need that even when the target is a pipe).

    Raises ``SaveError`` when ``path`` names a directory or a missing directory, and
    ``OSError`` for what the operating system refuses."""
    path = os.fspath(path)
    try:
        existing = os.stat(path)  # follows symlinks
    except FileNotFoundError:
        existing = None
    if existing is not None and stat.S_ISDIR(existing.st_mode):
        raise SaveError(f"{path}: is a directory")
    if existing is not None and not stat.S_ISREG(existing.st_mode):
        _write_in_place(path, write, truncate=False)
        return
    target = os.path.realpath(path)  # the link's target is replaced; the link survives
    if existing is not None and not _same_file(target, existing):
        # A link the kernel resolves but no name leads to (/dev/stdout, /proc/self/fd/N
        # to a deleted or anonymous file): nothing can be renamed over it.
        _write_in_place(path, write, truncate=True)
        return
    directory = os.path.dirname(target)
    if not os.path.isdir(directory):
        raise SaveError(f"{path}: directory {directory} does not exist")
    _write_replacing(target, directory, existing, write)


def _same_file(name: str, st: os.stat_result) -> bool:
    try:
        other = os.stat(name)
    except OSError:
        return False
    return (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino)


def _write_in_place(path: str, write: Callable[[BinaryIO], None], truncate: bool) -> None:
    # The content is built in memory first: the writer may seek, a FIFO cannot.
    buffer = io.BytesIO()
    write(buffer)
    # No O_CREAT: it exists and must stay what it is.  O_TRUNC only for a regular
    # file (for devices and FIFOs it means nothing).  Opening a FIFO waits for its
    # reader, as a shell's redirection does.
    flags = os.O_WRONLY | getattr(os, "O_CLOEXEC", 0) | (os.O_TRUNC if truncate else 0)
    fd = os.open(path, flags)
    with os.fdopen(fd, "wb", buffering=0) as f:
        view = memoryview(buffer.getbuffer())
        while view:
            written = f.write(view)
            view = view[written:]


def _write_replacing(target: str, directory: str, existing: os.stat_result | None,
                     write: Callable[[BinaryIO], None]) -> None:
    # Created with mode 0666 so the kernel applies the umask (tempfile.mkstemp would
    # give 0600 to every output); O_EXCL makes the random name ours alone.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    prefix = "." + os.path.basename(target) + "."
    for _ in range(100):
        tmp = os.path.join(directory, prefix + secrets.token_hex(6) + ".tmp")
        try:
            fd = os.open(tmp, flags, 0o666)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"{directory}: cannot create a temporary file")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if existing is not None:
            os.chmod(tmp, stat.S_IMODE(existing.st_mode))
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _sync_directory(directory)


def _sync_directory(directory: str) -> None:
    """Make the rename itself durable (best effort: not every system allows it)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
