"""Checking and updating the goldens of a directory of programs.

A program file follows the corpus contract (:mod:`jaxpr_cc.golden.corpus`): ``fun``,
``example_args()``, optionally ``example_kwargs()`` (held fixed: the program is
traced as ``fun(*args, **kwargs)`` with the keyword arguments bound), ``TAGS``,
``SUPPORTS`` (its gradient is recorded when it lists ``grad``), ``DEVICES`` and
``GRAD_ARGNUMS``.  For every selected program the runner computes its views
(:mod:`.views`) with the pipeline (default :data:`jaxpr_cc.jit.DEFAULT_PIPELINE`),
compares them with ``<golden>/expected/<name>/`` (:mod:`.store`) -- or, updating,
writes what changed -- and runs the program's ``# RUN:`` FileCheck lines
(:mod:`.program_checks`).  Programs are always taken in sorted order.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import pathlib
from typing import Iterable, Sequence

from . import store
from .views import KINDS, view_problems

__all__ = ["GoldenReport", "GoldenUsageError", "ProgramFile", "ProgramResult", "check_program",
           "default_programs_dir", "evaluate_program", "run_golden", "select_programs",
           "stale_dirs"]

PROGRAMS_PLACEHOLDER = "<programs>"


class GoldenUsageError(ValueError):
    """Bad paths, a filter that selects nothing, a malformed pipeline."""


@dataclasses.dataclass(frozen=True)
class ProgramFile:
    name: str
    path: pathlib.Path
    programs_dir: pathlib.Path
    expected_root: pathlib.Path

    @property
    def expected_dir(self) -> pathlib.Path:
        return self.expected_root / self.name


def default_programs_dir() -> pathlib.Path:
    """``$JAXPR_CC_CORPUS`` if set, else ``golden/programs`` in the current directory."""
    override = os.environ.get("JAXPR_CC_CORPUS")
    return pathlib.Path(override) if override else pathlib.Path("golden") / store.PROGRAMS_DIRNAME


def _program_files(directory: pathlib.Path) -> list[pathlib.Path]:
    return sorted(p for p in directory.glob("*.py") if not p.name.startswith("_"))


def select_programs(paths: Sequence[str | os.PathLike] | None = None,
                    keywords: Sequence[str] = (), *,
                    expected_root: str | os.PathLike | None = None) -> list[ProgramFile]:
    """The program files named by ``paths`` (files, or directories of programs;
    default :func:`default_programs_dir`) whose name contains one of ``keywords``
    (case-insensitive; all when none), sorted by directory and name."""
    paths = list(paths) if paths else [default_programs_dir()]
    found: dict[pathlib.Path, ProgramFile] = {}
    for raw in paths:
        path = pathlib.Path(raw)
        if path.is_dir():
            files = _program_files(path)
            if not files:
                raise GoldenUsageError(f"{raw}: no program files (*.py) in this directory")
        elif path.is_file():
            if path.suffix != ".py":
                raise GoldenUsageError(f"{raw}: not a Python program file; give NN_name.py files "
                                       f"or directories of them")
            files = [path]
        else:
            raise GoldenUsageError(f"{raw}: no such file or directory (give program files or a "
                                   f"programs directory such as golden/programs)")
        for f in files:
            resolved = f.resolve()
            root = (pathlib.Path(expected_root).resolve() if expected_root is not None
                    else store.expected_root_for(resolved.parent))
            found[resolved] = ProgramFile(resolved.stem, resolved, resolved.parent, root)
    selected = sorted(found.values(), key=lambda p: (str(p.programs_dir), p.name))
    if keywords:
        lowered = [k.lower() for k in keywords]
        selected = [p for p in selected if any(k in p.name.lower() for k in lowered)]
        if not selected:
            raise GoldenUsageError(f"-k {' or '.join(repr(k) for k in keywords)}: matches no "
                                   f"program name")
    return selected


# ---------------------------------------------------------------------------- evaluation
@dataclasses.dataclass
class Evaluation:
    """Everything computed for one program."""
    views: dict[str, str]
    checks: list = dataclasses.field(default_factory=list)
    check_failures: list[str] = dataclasses.field(default_factory=list)
    error: str | None = None


def _bound_function(prog):
    """``fun`` with the example keyword arguments held fixed, keeping its name and
    signature (for readable input names)."""
    if not prog.kwargs:
        return prog.fun

    @functools.wraps(prog.fun)
    def bound(*args):
        return prog.fun(*args, **prog.kwargs)
    return bound


def _aliases(pf: ProgramFile) -> dict[str, str]:
    out = {str(pf.programs_dir): PROGRAMS_PLACEHOLDER}
    real = os.path.realpath(pf.programs_dir)
    out.setdefault(real, PROGRAMS_PLACEHOLDER)
    return out


def evaluate_program(pf: ProgramFile, pipeline: str, *, kinds: Sequence[str] = KINDS,
                     run_checks: bool = True) -> Evaluation:
    """Views and FileCheck results of one program: it is imported and traced once,
    the pipeline runs once (each view is taken as the passes go) and its numerics
    are computed in one compilation."""
    return _evaluate(pf, pipeline, tuple(kinds), run_checks)


def _evaluate(pf: ProgramFile, pipeline: str, kinds: tuple, run_checks: bool) -> Evaluation:
    import jax

    from .corpus import CorpusError, load_program
    from .filecheck import FileCheckSyntaxError
    from .program_checks import parse_program_checks, run_program_checks
    from .views import compute_views

    try:
        prog = load_program(pf.path)
    except CorpusError as e:
        return Evaluation({}, error=str(e).replace(str(pf.path), _display(pf.path)))
    available = len(jax.devices())
    if prog.devices > available:
        return Evaluation({}, error=(
            f"{_display(pf.path)}: needs {prog.devices} devices but only {available} are "
            f"available; set XLA_FLAGS=--xla_force_host_platform_device_count={prog.devices} "
            f"before JAX starts"))
    evaluation = Evaluation({})
    if run_checks:
        try:
            evaluation.checks = parse_program_checks(store.read_text(pf.path), _display(pf.path))
        except FileCheckSyntaxError as e:
            evaluation.check_failures.append(str(e))
    grad_argnums = prog.grad_argnums if "grad" in prog.supports else ()
    result = compute_views(_bound_function(prog), prog.args, {}, pipeline=pipeline, kinds=kinds,
                           grad_argnums=grad_argnums, aliases=_aliases(pf),
                           name=getattr(prog.fun, "__name__", None))
    evaluation.views = result.views
    if evaluation.checks:
        if result.traced is None:
            evaluation.check_failures.append(
                f"{_display(pf.path)}: RUN: cannot check: tracing failed "
                f"({result.views.get('00-trace.ir', '').strip()})")
        else:
            evaluation.check_failures.extend(run_program_checks(evaluation.checks, result.traced))
    return evaluation


def _display(path: pathlib.Path) -> str:
    """``path`` relative to the current directory when it is inside it."""
    try:
        return str(pathlib.Path(path).resolve().relative_to(pathlib.Path.cwd().resolve()))
    except ValueError:
        return str(path)


# ---------------------------------------------------------------------------- results
@dataclasses.dataclass
class ProgramResult:
    program: ProgramFile
    sync: store.SyncResult | None
    check_failures: list[str]
    error: str | None
    missing: bool  # the program had no golden directory at all
    updated: bool

    @property
    def ok(self) -> bool:
        if self.error or self.check_failures:
            return False
        if self.updated:
            return True
        return not self.missing and (self.sync is None or self.sync.ok)

    def render(self, max_diff_lines: int = 0) -> str:
        """What went wrong (or, updating, what was written), for a terminal."""
        name, lines = self.program.name, []
        if self.error:
            lines.append(f"ERROR {name}: {self.error}")
        if self.sync is not None and self.missing and not self.updated:
            lines.append(f"MISSING {name}: no golden directory {_display(self.program.expected_dir)} "
                         f"for {_display(self.program.path)}")
        elif self.sync is not None:
            for v in self.sync.views:
                label = _display(v.path)
                if v.status in ("created", "updated", "removed"):
                    lines.append(f"{v.status} {label}")
                elif v.status == "changed":
                    lines.append(f"CHANGED {label}")
                    lines.append(store.unified_diff(v.expected, v.actual, label,
                                                    max_diff_lines).rstrip("\n"))
                    if v.name.endswith("numerics.txt"):
                        lines.extend(f"  beyond tolerance: {p}" for p in v.problems)
                elif v.status == "missing":
                    lines.append(f"MISSING {label} (a view with no golden file)")
                    lines.append(store.unified_diff(None, v.actual, label,
                                                    max_diff_lines).rstrip("\n"))
                elif v.status == "stale":
                    lines.append(f"STALE {label} (no longer produced; 'jaxpr-cc golden update' "
                                 f"removes it)")
        for failure in self.check_failures:
            lines.append(f"FILECHECK {name}: {failure}")
        return "\n".join(lines)


@dataclasses.dataclass
class GoldenReport:
    results: list[ProgramResult]
    stale: list[pathlib.Path]
    update: bool

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results) and (self.update or not self.stale)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def written(self) -> list[tuple[str, pathlib.Path]]:
        out = []
        for r in self.results:
            if r.sync is not None:
                out.extend((v.status, v.path) for v in r.sync.written)
        out.extend(("removed", p) for p in self.stale if self.update)
        return out

    def render(self, max_diff_lines: int = 0) -> str:
        blocks = [text for r in self.results if (text := r.render(max_diff_lines))]
        for path in self.stale:
            what = "removed" if self.update else "STALE"
            blocks.append(f"{what} {_display(path)} (no program "
                          f"{path.name}.py next to the goldens)")
        blocks.append(self.summary())
        return "\n".join(blocks) + "\n"

    def summary(self) -> str:
        n = len(self.results)
        errors = sum(1 for r in self.results if r.error)
        failed_checks = sum(1 for r in self.results if r.check_failures)
        if self.update:
            counts = {"created": 0, "updated": 0, "removed": 0}
            for status, _ in self.written():
                counts[status] += 1
            unchanged = sum(1 for r in self.results
                            if r.sync is not None and not r.sync.written and not r.error)
            text = (f"golden update: {n} program{'s' * (n != 1)}: {counts['updated']} files "
                    f"updated, {counts['created']} created, {counts['removed']} removed; "
                    f"{unchanged} program{'s' * (unchanged != 1)} unchanged")
        else:
            missing = sum(1 for r in self.results if r.missing and not r.error)
            changed = sum(1 for r in self.results
                          if not r.missing and r.sync is not None and not r.sync.ok)
            ok = sum(1 for r in self.results if r.ok)
            text = (f"golden check: {n} program{'s' * (n != 1)}: {ok} ok, {changed} changed, "
                    f"{missing} missing, {len(self.stale)} stale")
        if failed_checks:
            text += f"; FileCheck failed in {failed_checks}"
        if errors:
            text += f"; {errors} could not be evaluated"
        needs_update = self.stale or any(
            r.missing or (r.sync is not None and not r.sync.ok) for r in self.results)
        if not self.update and needs_update:
            text += "\nrun 'jaxpr-cc golden update' (same arguments) to accept the new output"
        return text


def check_program(pf: ProgramFile, *, pipeline: str, update: bool = False,
                  kinds: Sequence[str] = KINDS) -> ProgramResult:
    """Compare (or update) the goldens of one program and run its FileCheck lines."""
    evaluation = evaluate_program(pf, pipeline, kinds=kinds)
    if evaluation.error:
        return ProgramResult(pf, None, [], evaluation.error, not pf.expected_dir.is_dir(), False)
    missing = not pf.expected_dir.is_dir()
    sync = store.sync_views(pf.expected_dir, evaluation.views, update=update,
                            problems=view_problems)
    return ProgramResult(pf, sync, list(evaluation.check_failures), None, missing, update)


def run_golden(paths: Sequence[str | os.PathLike] | None = None, *,
               keywords: Sequence[str] = (), pipeline: str | None = None, update: bool = False,
               expected_root: str | os.PathLike | None = None,
               on_program=None) -> GoldenReport:
    """Check (or update) the goldens of the selected programs; see :func:`select_programs`.
    ``on_program(program_file)`` is called before each program (for progress)."""
    from ..passes.pipeline import PipelineError, parse_pipeline
    if pipeline is None:
        from ..passes import DEFAULT_PIPELINE
        pipeline = DEFAULT_PIPELINE
    try:
        pipeline = str(parse_pipeline(pipeline))
    except PipelineError as e:
        raise GoldenUsageError(f"--pipeline: {e.one_line()}") from None
    programs = select_programs(paths, keywords, expected_root=expected_root)
    if update:  # a link among the golden files: refused before anything is written
        for pf in programs:
            store.refuse_links_in(pf.expected_dir)
    results = []
    for pf in programs:
        if on_program is not None:
            on_program(pf)
        results.append(check_program(pf, pipeline=pipeline, update=update))
    stale = stale_dirs(programs)
    if update:
        for path in stale:
            store.remove_path(path)
    return GoldenReport(results, stale, update)


def stale_dirs(programs: Iterable[ProgramFile]) -> list[pathlib.Path]:
    """Golden directories (in the expected roots of the selected programs) that
    belong to no program file of the directories those programs come from."""
    names_by_root: dict[pathlib.Path, set[str]] = {}
    dirs_by_root: dict[pathlib.Path, set[pathlib.Path]] = {}
    for pf in programs:
        dirs_by_root.setdefault(pf.expected_root, set()).add(pf.programs_dir)
    for root, dirs in dirs_by_root.items():
        names = names_by_root.setdefault(root, set())
        for d in dirs:
            names.update(p.stem for p in _program_files(d))
    stale: list[pathlib.Path] = []
    for root in sorted(names_by_root):
        stale.extend(store.stale_program_dirs(root, names_by_root[root]))
    return stale
