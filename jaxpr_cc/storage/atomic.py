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
  by the kernel when the temporary file is created); a replaced file keeps its mode,
  and its owner and group when the system allows it (as root).  The setuid, setgid
  and sticky bits are kept only for a replacement of the same owner and group.
* A path that cannot name a file (empty, ending in a slash, a directory, under a
  regular file) is refused with a ``SaveError`` before anything is written.
"""
from __future__ import annotations

import io
import os
import secrets
import stat
from typing import BinaryIO, Callable

from .errors import SaveError

__all__ = ["write_file", "write_bytes", "check_path"]


def write_bytes(path, data: bytes) -> None:
    """Write ``data`` to ``path`` (see the module docstring for what is replaced)."""
    write_file(path, lambda f: f.write(data))


def write_file(path, write: Callable[[BinaryIO], None]) -> None:
    """Write ``path`` through ``write(fileobj)``; ``fileobj`` is a seekable binary
    file (zip and npz writers need that even when the target is a pipe).

    Raises ``SaveError`` when ``path`` cannot name a file (:func:`check_path`), and
    ``OSError`` for what the operating system refuses."""
    path = os.fspath(path)
    existing = check_path(path)
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
    if not os.path.isdir(directory):  # (check_path saw it; it changed since)
        raise SaveError(f"{path}: directory {directory} does not exist")
    _write_replacing(target, directory, existing, write)


def check_path(path) -> os.stat_result | None:
    """What ``path`` names now (``None``: nothing yet), or ``SaveError`` when it cannot
    name a file to write: empty, ending in a slash, a directory, under something that
    is not a directory, or in a directory that does not exist."""
    path = os.fspath(path)
    if path == "":
        raise SaveError("the output path is empty")
    separators = (os.sep, os.altsep) if os.altsep else (os.sep,)
    if path.endswith(separators):
        if os.path.isdir(path):
            raise SaveError(f"{path}: is a directory")
        raise SaveError(f"{path}: a path ending in {os.sep!r} names a directory, not a file")
    try:
        existing = os.stat(path)  # follows symlinks
    except FileNotFoundError:
        existing = None
    except NotADirectoryError:
        raise SaveError(f"{path}: {_first_non_directory(path)} is not a directory") from None
    if existing is not None:
        if stat.S_ISDIR(existing.st_mode):
            raise SaveError(f"{path}: is a directory")
        return existing
    parent = os.path.dirname(os.path.realpath(path))
    if not os.path.exists(parent):
        raise SaveError(f"{path}: directory {parent} does not exist")
    if not os.path.isdir(parent):
        raise SaveError(f"{path}: {parent} is not a directory")
    return None


def _first_non_directory(path: str) -> str:
    """The leading part of ``path`` that exists and is not a directory (the one that
    makes ``path`` unreachable)."""
    parents = []
    parent = os.path.dirname(path)
    while parent and parent != os.path.dirname(parent):
        parents.append(parent)
        parent = os.path.dirname(parent)
    for parent in reversed(parents):  # the outermost one is the culprit
        if os.path.exists(parent) and not os.path.isdir(parent):
            return parent
    return os.path.dirname(path)


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
            _keep_owner_and_mode(tmp, existing)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _sync_directory(directory)


_SPECIAL_BITS = stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX


def _keep_owner_and_mode(tmp: str, existing: os.stat_result) -> None:
    """The replacement gets the replaced file's owner and group when the system lets
    us (root; a group of the user's own), and its mode; the setuid, setgid and sticky
    bits only when the owner and group are the same as before (a setuid program
    re-owned by whoever ran jaxpr-cc would run as them)."""
    wanted = (existing.st_uid, existing.st_gid)
    st = os.stat(tmp)
    if (st.st_uid, st.st_gid) != wanted:
        try:
            os.chown(tmp, *wanted)
        except OSError:
            try:  # an unprivileged user may still give the file one of its groups
                os.chown(tmp, -1, existing.st_gid)
            except OSError:
                pass
        st = os.stat(tmp)
    mode = stat.S_IMODE(existing.st_mode)
    if (st.st_uid, st.st_gid) != wanted:
        mode &= ~_SPECIAL_BITS
    os.chmod(tmp, mode)  # after chown, which may clear setuid/setgid


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
