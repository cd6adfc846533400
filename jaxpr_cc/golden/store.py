"""Golden files on disk: where they live, reading them, writing only what changed.

Layout of a golden directory (the project's is ``golden/``)::

    golden/programs/<name>.py          a program with example arguments
    golden/expected/<name>/<view>      its expected views (plain text)

A directory of view files under ``expected/`` whose program does not exist is
*stale*, as is a view file the program no longer produces; a program without a
directory under ``expected/`` is *missing*.  Files that are not named like views
(a README, say) are left alone.  Files are UTF-8 with ``\\n`` line ends and are written
atomically (by :mod:`jaxpr_cc.storage.atomic`), and only
when their content changed, so an update touches nothing else.
"""
from __future__ import annotations

import dataclasses
import difflib
import pathlib
import re
import shutil
from typing import Callable, Iterable, Mapping

__all__ = ["EXPECTED_DIRNAME", "PROGRAMS_DIRNAME", "SyncResult", "expected_root_for",
           "list_view_files", "read_text", "stale_program_dirs", "sync_views",
           "unified_diff", "write_text_atomic", "GoldenFileError", "refuse_links_in"]

EXPECTED_DIRNAME = "expected"
PROGRAMS_DIRNAME = "programs"


def expected_root_for(programs_dir: pathlib.Path) -> pathlib.Path:
    """``<golden>/expected`` for ``<golden>/programs``."""
    return programs_dir.parent / EXPECTED_DIRNAME


def read_text(path: pathlib.Path) -> str:
    with open(path, "r", encoding="utf-8", newline="") as f:
        return f.read().replace("\r\n", "\n")


class GoldenFileError(ValueError):
    """A golden file that ``update`` must not write (a one-line CLI error)."""


def refuse_link(path: pathlib.Path) -> None:
    """Golden files are regular files ``update`` writes; a link there is someone
    else's, and writing through it would replace its target."""
    if path.is_symlink():
        raise GoldenFileError(f"{path}: is a symbolic link, not a golden file update wrote; "
                              f"replace it with a regular file or remove it")


def refuse_links_in(directory: pathlib.Path) -> None:
    """``refuse_link`` for a program's expected directory and the view files in it:
    ``update`` checks every program's before it writes any."""
    refuse_link(directory)
    if directory.is_dir():
        for name in list_view_files(directory):
            refuse_link(directory / name)


def write_text_atomic(path: pathlib.Path, text: str) -> None:
    from ..storage.atomic import write_bytes  # jaxpr-cc's one file writer
    refuse_link(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes(path, text.encode("utf-8"))


# The names views have (see .views): other files are never reported or removed,
# so pointing --expected at the wrong directory cannot delete anything else.
VIEW_FILE = re.compile(r"(?:\d{2,}-[A-Za-z0-9_.-]+\.ir|emitted-jaxpr\.ir|python\.py\.txt|"
                       r"python\.npz\.txt|numerics\.txt)")


def is_view_file(name: str) -> bool:
    return VIEW_FILE.fullmatch(name) is not None


def list_view_files(directory: pathlib.Path) -> list[str]:
    """Names of the view files in a program's golden directory, sorted."""
    if not directory.is_dir():
        return []
    return sorted(p.name for p in directory.iterdir() if p.is_file() and is_view_file(p.name))


def is_golden_dir(path: pathlib.Path) -> bool:
    """A directory holding view files and nothing else."""
    if not path.is_dir() or path.is_symlink():
        return False
    children = list(path.iterdir())
    return bool(children) and all(c.is_file() and is_view_file(c.name) for c in children)


def stale_program_dirs(expected_root: pathlib.Path, program_names: Iterable[str]) -> list[pathlib.Path]:
    """Golden directories in ``expected_root`` that belong to no program, sorted."""
    if not expected_root.is_dir():
        return []
    names = set(program_names)
    return sorted(p for p in expected_root.iterdir() if p.name not in names and is_golden_dir(p))


def remove_path(path: pathlib.Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


@dataclasses.dataclass
class ViewStatus:
    """One view file: ``status`` is ``same``, ``changed``, ``missing`` (no file),
    ``stale`` (a file no view produces), or after an update ``created``,
    ``updated``, ``removed``."""
    name: str
    path: pathlib.Path
    status: str
    expected: str | None = None
    actual: str | None = None
    problems: tuple = ()


@dataclasses.dataclass
class SyncResult:
    directory: pathlib.Path
    views: list[ViewStatus]

    @property
    def ok(self) -> bool:
        return all(v.status == "same" for v in self.views)

    @property
    def written(self) -> list[ViewStatus]:
        return [v for v in self.views if v.status in ("created", "updated", "removed")]


def sync_views(directory: pathlib.Path, views: Mapping[str, str], *, update: bool,
               problems: Callable[[str, str, str], list[str]]) -> SyncResult:
    """Compare ``views`` with the files in ``directory`` (``problems(view, expected,
    actual)`` says why two texts differ, empty when they agree); with ``update``,
    write the views that differ and remove stale files."""
    statuses: list[ViewStatus] = []
    present = set(list_view_files(directory))
    if update:  # refused before anything is written
        refuse_link(directory)
        for name in sorted(views):
            refuse_link(directory / name)
    for name in sorted(views):
        path = directory / name
        actual = views[name]
        if name not in present:
            if update:
                write_text_atomic(path, actual)
            statuses.append(ViewStatus(name, path, "created" if update else "missing",
                                       None, actual))
            continue
        expected = read_text(path)
        why = problems(name, expected, actual)
        if not why:
            statuses.append(ViewStatus(name, path, "same", expected, actual))
            continue
        if update:
            write_text_atomic(path, actual)
        statuses.append(ViewStatus(name, path, "updated" if update else "changed",
                                   expected, actual, tuple(why)))
    for name in sorted(present - set(views)):
        path = directory / name
        expected = read_text(path) if path.is_file() else None
        if update:
            remove_path(path)
        statuses.append(ViewStatus(name, path, "removed" if update else "stale", expected, None))
    return SyncResult(directory, statuses)


def unified_diff(expected: str | None, actual: str | None, label: str,
                 max_lines: int = 0) -> str:
    """A unified diff from the golden ``expected`` to ``actual``, labelled with the
    golden file's path; ``max_lines`` > 0 cuts long diffs (saying how much was cut)."""
    a = (expected or "").splitlines(keepends=True)
    b = (actual or "").splitlines(keepends=True)
    lines = []
    for line in difflib.unified_diff(a, b, fromfile=label if expected is not None else "/dev/null",
                                     tofile=f"{label} (actual)" if actual is not None else "/dev/null",
                                     n=3):
        if not line.endswith("\n"):
            line += "\n\\ No newline at end of file\n"
        lines.append(line)
    if max_lines and len(lines) > max_lines:
        cut = len(lines) - max_lines
        lines = lines[:max_lines] + [f"... ({cut} more diff lines not shown)\n"]
    return "".join(lines)
