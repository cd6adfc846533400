"""Writing command results: ``-o -`` is stdout on every subcommand; anything else goes
through jaxpr-cc's one file writer (:mod:`jaxpr_cc.storage.atomic`): a regular file is
replaced atomically (an interrupted command leaves no partial output), a device or
FIFO is written in place and never replaced, a symlink's target is written, and new
files get the user's umask.

Stdout carries command results only.  While a command that may run the user's code
(importing, tracing, executing) is running, :func:`stdout_reserved_for_results`
sends everything else written to stdout (``print`` in the user's module,
``jax.debug.print``, C libraries writing to file descriptor 1) to stderr; results go
to the real stdout through :func:`write_stdout`.

A reader that goes away (``jaxpr-cc exec ... -o - | head -c 10``) ends the command
quietly with exit code 141, what a shell reports for ``cat`` killed by SIGPIPE
(:class:`StdoutClosed`).  A command that started with stdout closed (``>&-``) and
has a result for it fails with one line (exit 2), while a command writing to a
file does not need stdout.

``-o /dev/stdout`` (``/dev/fd/1``, ``/proc/self/fd/1``) is ``-o -``
(:func:`results_path`): opened by name while fd 1 points at stderr, it would reach
stderr."""
from __future__ import annotations

import contextlib
import os
import stat
import re
import sys

from .errors import CliError

STDOUT = "-"

# The real stdout (a file descriptor, or a binary stream when stdout has no file
# descriptor, as under pytest's capsys) while stdout_reserved_for_results is active.
_results_fd: int | None = None
_results_stream = None
_results_closed = False  # the command started with stdout closed

STDOUT_CLOSED_CODE = 141  # 128 + SIGPIPE


STDOUT_CLOSED_MESSAGE = ("cannot write to stdout: Bad file descriptor (stdout is closed; "
                         "redirect it to a file or a pipe)")


class StdoutClosed(Exception):
    """The reader of stdout went away: the command stops quietly (exit code 141)."""


@contextlib.contextmanager
def stdout_reserved_for_results():
    global _results_fd, _results_stream, _results_closed
    real = sys.stdout
    closed = real is None  # Python's sys.stdout when fd 1 was closed at start-up
    if not closed:
        try:
            real.flush()
        except (OSError, ValueError):
            pass
    fd = _fileno(real)
    err_fd = _fileno(sys.stderr)
    saved_fd = None
    borrowed_fd_one = False
    if fd is not None and err_fd is not None:
        saved_fd = os.dup(fd)
        os.set_inheritable(saved_fd, False)
        os.dup2(err_fd, fd)  # C code and child processes writing to fd 1 reach stderr
    elif closed and err_fd is not None and not _is_open(1):
        # fd 1 is free: without this, a file the command opens could become fd 1 and
        # receive what C code writes to "stdout"
        os.dup2(err_fd, 1)
        borrowed_fd_one = True
    old = (_results_fd, _results_stream, _results_closed)
    _results_fd, _results_stream = saved_fd, (None if saved_fd is not None or closed else
                                              getattr(real, "buffer", None))
    _results_closed = closed
    sys.stdout = sys.stderr
    try:
        yield
    finally:
        try:
            if sys.stderr is not None:
                sys.stderr.flush()
        except (OSError, ValueError):
            pass
        sys.stdout = real
        _results_fd, _results_stream, _results_closed = old
        if saved_fd is not None:
            os.dup2(saved_fd, fd)
            os.close(saved_fd)
        if borrowed_fd_one:
            os.close(1)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _fileno(stream) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):
        return None


def stdout_is_terminal() -> bool:
    if _results_closed:
        return False
    if _results_fd is not None:
        return os.isatty(_results_fd)
    isatty = getattr(sys.stdout, "isatty", None)
    return bool(isatty and isatty())


def write_stdout(data: bytes | str) -> None:
    """A command result to the real stdout (see the module docstring)."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    if _results_closed or (_results_fd is None and _results_stream is None
                           and sys.stdout is None):
        # Closed from the start (`>&-`): nobody ever read it, so unlike a reader
        # that went away this is a mistake worth one line (as `cat f >&-` says).
        raise CliError(STDOUT_CLOSED_MESSAGE)
    try:
        if _results_fd is not None:
            view = memoryview(raw)
            while view:
                view = view[os.write(_results_fd, view):]
            return
        stream = _results_stream
        if stream is None:
            sys.stdout.flush()
            stream = sys.stdout.buffer
        stream.write(raw)
        stream.flush()
    except BrokenPipeError:
        raise StdoutClosed() from None
    except OSError as e:  # a full disk, /dev/full
        raise CliError(f"stdout: cannot write: {e.strerror or e}") from None


def silence_stdout() -> None:
    """After StdoutClosed: nothing more may reach the closed pipe (the interpreter's
    final flush of sys.stdout would print a BrokenPipeError otherwise)."""
    fd = _fileno(sys.__stdout__) if sys.__stdout__ is not None else None
    if fd is None:
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


# Names of the process's own file descriptor 1, once their directory is resolved.
_FD_ONE = re.compile(r"/proc/(\d+)(?:/task/\d+)?/fd/1")


def results_path(path: str) -> str:
    """``-`` for a path naming the process's own stdout (``/dev/stdout``,
    ``/dev/fd/1``, ``/proc/self/fd/1``, a symlink to one of them), else ``path``.
    While stdout is reserved, fd 1 points at stderr, so such a path opened by name
    would reach stderr; it is recognised by name, before anything is opened."""
    if path == STDOUT:
        return path
    current = path
    for _ in range(40):  # the kernel's limit on nested symlinks
        head, tail = os.path.split(os.path.abspath(current))
        try:
            resolved = os.path.join(os.path.realpath(head), tail)
        except (OSError, ValueError):
            return path
        match = _FD_ONE.fullmatch(resolved)
        if match and int(match.group(1)) == os.getpid():
            return STDOUT
        try:
            target = os.readlink(resolved)
        except (OSError, ValueError):
            return path
        current = os.path.join(os.path.dirname(resolved), target)
    return path


def write_output(path: str, data: bytes | str) -> None:
    raw = data.encode("utf-8") if isinstance(data, str) else data
    path = results_path(path)
    if path != STDOUT:
        refuse_imported_files(path)
    if path == STDOUT:
        if not isinstance(data, str) and stdout_is_terminal():
            raise CliError("-o -: refusing to write a binary file to a terminal; redirect "
                           "stdout or give a file name")
        write_stdout(raw)
        return
    from ..storage.atomic import write_bytes
    with write_errors(path):
        write_bytes(path, raw)


@contextlib.contextmanager
def write_errors(path: str):
    """The file writer's errors for ``path`` as one-line CLI errors."""
    from ..storage.errors import SaveError
    try:
        yield
    except SaveError as e:
        raise CliError(str(e)) from None
    except OSError as e:
        raise CliError(f"{path}: cannot write: {e.strerror or e}") from None


def check_writable(path: str, inputs=()) -> None:
    """Fail early (before a long step) when ``path`` cannot be written; the same
    rules as the file writer's (:func:`jaxpr_cc.storage.atomic.check_path`).
    ``inputs``: ``(given, what)`` for each file the command reads (a path, or a
    ``FILE.py:FUNCTION`` target): ``-o`` naming one of them is refused, since the
    command would replace what it reads."""
    if results_path(path) == STDOUT:
        return
    for given, what in inputs:
        if given == "-":  # read from stdin: a file redirected into it is read too
            if _is_stdin(path):
                raise CliError(f"-o {path}: is {what}, read from stdin; the command would "
                               f"replace it: choose another output name")
            continue
        read = _input_file(given) if given else None
        if read is not None and _same_file(path, read):
            raise CliError(f"-o {path}: is {what} ({given}); the command would replace it: "
                           f"choose another output name")
    from ..storage.atomic import check_path
    from ..storage.errors import SaveError
    try:
        check_path(path)
    except SaveError as e:
        raise CliError(f"{e}; -o takes a file name ('-' for stdout)") from None


def _input_file(given: str) -> str | None:
    """The file a command's input names: the path itself, or the file of a
    ``FILE.py:FUNCTION`` target; None for a module name."""
    if os.path.exists(given):
        return given
    head, sep, _ = given.rpartition(":")
    return head if sep and os.path.isfile(head) else None


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False  # a new output


def _is_stdin(path: str) -> bool:
    try:
        given, read = os.stat(path), os.fstat(0)
    except (OSError, ValueError):
        return False
    return stat.S_ISREG(read.st_mode) and (given.st_dev, given.st_ino) == (read.st_dev,
                                                                           read.st_ino)


_FILES_READ: set = set()  # paths this process opened (Python's "open" audit event)
_RECORDING = [False]


def _on_audit_event(event: str, args) -> None:
    if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
        # Absolute now: the code may change directory before -o is checked.
        _FILES_READ.add(os.path.abspath(os.fsdecode(args[0])))


def record_files_read() -> None:
    """Record every file the command opens from now on -- a target's module,
    modules it imports (from zips too, or loaded by hand), files it reads -- so
    that ``-o`` never replaces one of them (``refuse_imported_files``).  Each
    command starts a new record (a test may run several in one process)."""
    _FILES_READ.clear()
    if not _RECORDING[0]:
        _RECORDING[0] = True
        sys.addaudithook(_on_audit_event)


def refuse_imported_files(path: str) -> None:
    """Refuse ``-o`` naming a file the command read (a ``MODULE:FUNCTION``
    target's module, a module it imports, a file the traced code opened):
    checked before writing, once the code has run."""
    try:
        given = os.stat(path)
    except (OSError, ValueError):
        return  # a new file
    if not stat.S_ISREG(given.st_mode):
        return
    sources = {getattr(m, "__file__", None) for m in list(sys.modules.values())}
    for source in sorted(s for s in sources | set(_FILES_READ) if s):
        # (A module imported from a zip names a file inside the archive.)
        while source and not os.path.exists(source) and os.path.dirname(source) != source:
            source = os.path.dirname(source)
        try:
            st = os.stat(source)
        except (OSError, ValueError):
            continue
        if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) == (given.st_dev, given.st_ino):
            raise CliError(f"-o {path}: is {source}, a file the command read; it would "
                           f"replace it: choose another output name")
