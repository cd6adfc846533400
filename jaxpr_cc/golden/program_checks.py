"""FileCheck directives inside program files, driven by ``# RUN:`` lines.

A program file may carry, in comments::

    # RUN: hoist-consts,cse
    # CHECK-LABEL: func @fun(
    # CHECK: [[X:%[0-9]+]]:f32[3] = sin %x
    # CHECK-NOT: sin
    # CHECK: mul [[X]], [[X]]

Each ``# RUN: <pipeline>`` line traces the program, runs the pipeline on it (an
empty pipeline checks the traced IR itself) and matches the directives against the
printed IR.  ``# RUN: <pipeline> --check-prefix=NAME`` matches the directives
spelled ``NAME:``, ``NAME-NEXT:`` ... instead of ``CHECK:``, so one file can pin
facts about several pipelines (e.g. the IR before and after a pass).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Sequence

from .filecheck import (Directive, FileCheckFailure, FileCheckSyntaxError, match_directives,
                        parse_directives)

__all__ = ["ProgramCheck", "RunLine", "parse_program_checks", "run_program_checks"]

_RUN = re.compile(r"^\s*#\s*RUN:(?P<rest>.*)$")
_PREFIX_OPTION = re.compile(r"(?:^|\s)--check-prefix[= ](?P<prefix>\S+)\s*$")
DEFAULT_PREFIX = "CHECK"


@dataclasses.dataclass(frozen=True)
class RunLine:
    pipeline: str
    prefix: str
    path: str
    line: int

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


@dataclasses.dataclass(frozen=True)
class ProgramCheck:
    run: RunLine
    directives: tuple[Directive, ...]


def parse_program_checks(text: str, path: str) -> list[ProgramCheck]:
    """The RUN lines of a program file with their directives.  Raises
    :class:`FileCheckSyntaxError` for malformed directives, a RUN line whose prefix
    has no directives, or CHECK lines without a RUN line."""
    from ..passes.pipeline import PipelineError, parse_pipeline
    runs: list[RunLine] = []
    for number, line in enumerate(text.splitlines(), start=1):
        m = _RUN.match(line)
        if m is None:
            continue
        rest = m.group("rest").strip()
        prefix = DEFAULT_PREFIX
        opt = _PREFIX_OPTION.search(rest)
        if opt is not None:
            prefix = opt.group("prefix")
            rest = rest[:opt.start()].strip()
        elif "--" in rest.split("{")[0]:
            raise FileCheckSyntaxError(f"{path}:{number}: RUN: unknown option in {rest!r}; the "
                                       f"only option is --check-prefix=NAME")
        try:
            pipeline = parse_pipeline(rest)
        except PipelineError as e:
            raise FileCheckSyntaxError(f"{path}:{number}: RUN: {e.one_line()}") from None
        runs.append(RunLine(str(pipeline), prefix, path, number))
    checks: list[ProgramCheck] = []
    parsed: dict[str, tuple[Directive, ...]] = {}
    for run in runs:
        if run.prefix not in parsed:
            parsed[run.prefix] = tuple(parse_directives(text, path=path, prefix=run.prefix))
        if not parsed[run.prefix]:
            raise FileCheckSyntaxError(f"{run.where}: RUN: no {run.prefix}: directives in the "
                                       f"file for this RUN line to match")
        checks.append(ProgramCheck(run, parsed[run.prefix]))
    if DEFAULT_PREFIX not in parsed:
        stray = parse_directives(text, path=path, prefix=DEFAULT_PREFIX)
        if stray:
            raise FileCheckSyntaxError(f"{stray[0].where}: {stray[0].kind}: the file has no "
                                       f"'# RUN: <pipeline>' line to say what to check")
    return checks


def run_program_checks(checks: Sequence[ProgramCheck], traced) -> list[str]:
    """Run each RUN line's pipeline on a copy of the traced Program and match its
    directives; returns one failure message per RUN line that did not hold."""
    from ..passes.manager import run_passes
    from .sanitize import error_line
    failures = []
    for check in checks:
        run = check.run
        label = f"IR after '{run.pipeline}'" if run.pipeline else "traced IR"
        try:
            program = run_passes(traced, run.pipeline) if run.pipeline else traced
        except Exception as e:  # noqa: BLE001 -- reported as a failed check
            failures.append(f"{run.where}: error: RUN: the pipeline failed: {error_line(e)}")
            continue
        try:
            match_directives(check.directives, str(program), input_name=label)
        except FileCheckFailure as e:
            failures.append(f"{run.where}: RUN: {run.pipeline or '(traced IR)'}"
                            f"{'' if run.prefix == DEFAULT_PREFIX else ' --check-prefix=' + run.prefix}"
                            f"\n{e}")
    return failures
