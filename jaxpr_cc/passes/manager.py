"""Running pipelines: ``PassManager``, ``run_passes``, instrumentation, crash reproducers.

The manager copies the caller's program once; the passes then work in place on
that copy, so the caller's program is never changed.  By default the input and the
result are checked structurally, once each (a full check costs about as much as
tracing the program again); when the result's check fails, the pipeline is
replayed with a check after every pass to name the pass at fault.  With
``verify_each`` (``mlir-opt --verify-each``) the input and every pass's result are
checked in full, JAX's own type checker included.  It can also print the IR before/after
chosen passes (or all, or only those that changed it), time each pass, collect
each pass's statistics, and call user callbacks.

When a pass raises (or leaves an invalid program behind), the manager writes a
reproducer -- the input program of the failing pass (``jaxpr_cc.save``) and the
pipeline from that pass on -- and raises :class:`PassError` whose message is the
one command that replays it: ``jaxpr-cc opt <file> -p '<pipeline>'``.  Passes
are deterministic, so the failing pass's input is recreated by replaying the
passes before it on a fresh copy of the original program; nothing is copied
while the pipeline succeeds.
"""
from __future__ import annotations

import gc
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence, TextIO

from ..ir.verifier import VerificationError, verify_program
from .base import Pass, PassContext, PassOptionError
from .donation import drop_unsafe_donations
from .pipeline import Pipeline, as_pipeline

Callback = Callable[[Pass, Any, Any, PassContext], None]


class PassError(RuntimeError):
    """A pass raised, or produced an invalid program; says how to reproduce it."""

    def __init__(self, message: str, *, pass_name: str, pipeline: str,
                 reproducer: str | None = None):
        super().__init__(message)
        self.pass_name = pass_name
        self.pipeline = pipeline
        self.reproducer = reproducer


@dataclass
class PassRecord:
    """What one pass of a run did."""
    pass_: Pass
    seconds: float
    stats: dict[str, int | float]
    changed: bool | None
    equations_before: int | None = None
    equations_after: int | None = None
    verify_seconds: float = 0.0


class PassManager:
    """A configured pipeline, reusable across programs.

    ``print_ir_before`` / ``print_ir_after`` name passes (a sequence of names or a
    comma-separated string) whose IR is printed to ``stream`` (default: stderr)
    before / after they run; ``timing`` and ``statistics`` print a table after the
    run.  ``callbacks`` are called after every pass as
    ``callback(pass_, program_before, program_after, ctx)``; ``program_before``
    is a copy taken before the pass (only taken when callbacks are given).
    After a run, ``timings`` and ``statistics`` hold per-pass results.
    """

    def __init__(self, pipeline, *, verify_each: bool = False,
                 print_ir_before: Sequence[str] | str = (), print_ir_after: Sequence[str] | str = (),
                 print_ir_after_all: bool = False, print_ir_after_change: bool = False,
                 timing: bool = False, statistics: bool = False, stream: TextIO | None = None,
                 reproducer_dir: str | None = None, callbacks: Sequence[Callback] = ()):
        from . import available_passes
        self.pipeline: Pipeline = as_pipeline(pipeline)
        known = set(available_passes())
        self.verify_each = bool(verify_each)
        self.print_ir_before = _pass_names(print_ir_before, known, "print_ir_before")
        self.print_ir_after = _pass_names(print_ir_after, known, "print_ir_after")
        self.print_ir_after_all = bool(print_ir_after_all)
        self.print_ir_after_change = bool(print_ir_after_change)
        self.timing = bool(timing)
        self.show_statistics = bool(statistics)
        self.stream = stream
        self.reproducer_dir = reproducer_dir
        self.callbacks = tuple(callbacks)
        self.records: list[PassRecord] = []
        self.final_verify_seconds = 0.0  # the end-of-pipeline check (without verify_each)

    def __repr__(self) -> str:
        return f"PassManager({str(self.pipeline)!r})"

    # ------------------------------------------------------------- results
    @property
    def timings(self) -> list[tuple[str, float]]:
        """``(pass, wall seconds)`` for each pass of the last run."""
        return [(str(r.pass_), r.seconds) for r in self.records]

    @property
    def statistics(self) -> list[tuple[str, dict]]:
        """``(pass, statistics)`` for each pass of the last run."""
        return [(str(r.pass_), dict(r.stats)) for r in self.records]

    # ----------------------------------------------------------------- run
    def run(self, program, *, copy: bool = True):
        """Run the pipeline on ``program`` and return the result.

        With ``copy=False`` the caller hands the program over: passes transform it
        in place (saving the copy), and a crash reproducer can then only save the
        program as it was when the failing pass started changing it.
        """
        self.records = []
        self.final_verify_seconds = 0.0
        out = self._stream()
        try:  # in full with verify_each; else its structure (which copying relies on)
            verify_program(program, types=self.verify_each)
        except VerificationError as e:
            raise VerificationError(f"input program is invalid: {e}") from None
        gc_was_enabled = gc.isenabled()
        # Passes allocate many small objects while a large IR graph is alive; the
        # cyclic collector would otherwise rescan that graph over and over.
        gc.disable()
        try:
            work = program.copy() if copy else program
            total = len(self.pipeline)
            for index, pass_ in enumerate(self.pipeline):
                work = self._run_one(index, total, pass_, work, program if copy else None, out)
        finally:
            if gc_was_enabled:
                gc.enable()
        if not self.verify_each:
            t0 = time.perf_counter()
            self._verify_result(work, program if copy else None)
            self.final_verify_seconds = time.perf_counter() - t0
        if self.timing:
            out.write(self.timing_report())
        if self.show_statistics:
            out.write(self.statistics_report())
        return work

    def _verify_result(self, result, original) -> None:
        """The cheap end-of-pipeline check; on failure, find the pass that broke it."""
        try:
            verify_program(result, types=False)
            return
        except VerificationError as e:
            error = e
        if original is not None:
            replay = original.copy()
            for index, pass_ in enumerate(self.pipeline):
                replay = pass_.run(replay, PassContext())
                try:
                    verify_program(replay, types=False)
                except VerificationError as e:
                    raise self._failure(index, pass_, replay, original, e,
                                        f"produced an invalid program: {e}") from e
        if not len(self.pipeline):
            raise VerificationError(f"input program is invalid: {error}") from None
        last = len(self.pipeline) - 1
        raise self._failure(last, self.pipeline[last], result, original, error,
                            f"the pipeline produced an invalid program: {error}") from error

    def _stream(self) -> TextIO:
        return self.stream if self.stream is not None else sys.stderr

    def _run_one(self, index: int, total: int, pass_: Pass, work, original, out: TextIO):
        name = pass_.name
        label = f"{pass_} ({index + 1}/{total})"
        if self.print_ir_before and name in self.print_ir_before:
            out.write(f"// -----// IR before {label} //----- //\n{work}")
        print_after = self.print_ir_after_all or name in self.print_ir_after
        before_text = str(work) if self.print_ir_after_change and not print_after else None
        before_copy = work.copy() if self.callbacks else None
        n_before = work.num_equations() if self.show_statistics else None
        ctx = PassContext()
        t0 = time.perf_counter()
        try:
            result = pass_.run(work, ctx)
            if result is None:
                raise TypeError(f"{type(pass_).__name__}.run() returned None; a pass must return "
                                f"the resulting Program")
        except PassOptionError:
            raise
        except Exception as e:
            raise self._failure(index, pass_, work, original, e,
                                f"{type(e).__name__}: {e}") from e
        # A pass that replaced a value by an equal one may have made a jit donate a
        # buffer that is still read (see passes/donation.py): drop such donations.
        dropped = drop_unsafe_donations(result)
        if dropped:
            ctx.count("donations-dropped (the donated value is read elsewhere)", dropped)
            ctx.changed = True
        seconds = time.perf_counter() - t0
        record = PassRecord(pass_, seconds, dict(ctx.stats), ctx.changed, n_before)
        if self.verify_each:
            t1 = time.perf_counter()
            try:
                result.verify()
            except VerificationError as e:
                raise self._failure(index, pass_, work, original, e,
                                    f"produced an invalid program: {e}") from e
            record.verify_seconds = time.perf_counter() - t1
        if self.show_statistics:
            record.equations_after = result.num_equations()
        self.records.append(record)
        if print_after:
            out.write(f"// -----// IR after {label} //----- //\n{result}")
        elif before_text is not None and ctx.changed is not False:
            # A pass that reports no change is believed; otherwise compare the text.
            after_text = str(result)
            if after_text != before_text:
                out.write(f"// -----// IR after {label} (changed) //----- //\n{after_text}")
        for callback in self.callbacks:
            callback(pass_, before_copy, result, ctx)
        return result

    # ------------------------------------------------------------- reports
    def timing_report(self) -> str:
        passes = sum(r.seconds for r in self.records)
        verify = sum(r.verify_seconds for r in self.records) + self.final_verify_seconds
        total = passes + verify or 1e-12
        width = max([len(str(r.pass_)) for r in self.records] + [len("(verification)")])
        lines = ["===" + "-" * (width + 24) + "===",
                 f"  jaxpr-cc pass timing: {total:.4f} s wall",
                 "===" + "-" * (width + 24) + "===",
                 f"  {'wall s':>9}  {'share':>6}  pass"]
        for r in self.records:
            lines.append(f"  {r.seconds:9.4f}  {100 * r.seconds / total:5.1f}%  {r.pass_}")
        lines.append(f"  {verify:9.4f}  {100 * verify / total:5.1f}%  (verification)")
        lines.append(f"  {total:9.4f}  100.0%  total")
        return "\n".join(lines) + "\n"

    def statistics_report(self) -> str:
        lines = ["===" + "-" * 50 + "===", "  jaxpr-cc pass statistics", "===" + "-" * 50 + "==="]
        for r in self.records:
            head = f"  {r.pass_}"
            if r.equations_before is not None and r.equations_after is not None:
                head += f"  (equations {r.equations_before} -> {r.equations_after})"
            lines.append(head)
            if not r.stats:
                lines.append("    (nothing to report)")
            for key in sorted(r.stats):
                value = r.stats[key]
                text = f"{value:.6g}" if isinstance(value, float) else str(value)
                lines.append(f"    {text:>12}  {key}")
        return "\n".join(lines) + "\n"

    # ------------------------------------------------------------ failures
    def _failure(self, index: int, pass_: Pass, work, original, error: BaseException,
                 what: str) -> PassError:
        tail = str(self.pipeline[index:])
        snapshot, note = self._failing_input(index, work, original)
        if snapshot is None:
            tail = str(self.pipeline)
        try:
            path, how = write_reproducer(snapshot if snapshot is not None else original,
                                         tail, pass_.name, self.reproducer_dir)
        except OSError as e:
            message = (f"pass {pass_.name!r} failed: {what}; writing a reproducer failed too "
                       f"({e}); pipeline from the failing pass on: '{tail}'")
            return PassError(message, pass_name=pass_.name, pipeline=tail)
        message = f"pass {pass_.name!r} failed: {what}; reproduce with: jaxpr-cc opt {_quote(path)} -p '{tail}'"
        extra = " ".join(x for x in (note, how) if x)
        if extra:
            message += f" ({extra})"
        return PassError(message, pass_name=pass_.name, pipeline=tail, reproducer=path)

    def _failing_input(self, index: int, work, original):
        """The input program of pass ``index``: replayed from the untouched original
        when there is one (passes are deterministic), else the consumed program."""
        if original is None:
            return work, "the program was handed over with copy=False, so the saved " \
                         "program is its state when the pass failed"
        try:
            replay = original.copy()
            for p in self.pipeline.passes[:index]:
                replay = p.run(replay, PassContext())
            return replay, ""
        except Exception as e:  # the earlier passes did not replay: save the original
            return None, (f"replaying the passes before it failed ({type(e).__name__}: {e}), "
                          f"so the saved program is the pipeline's input")


def _pass_names(spec: Sequence[str] | str, known: set[str], option: str) -> frozenset[str]:
    names = [n.strip() for n in spec.split(",")] if isinstance(spec, str) else list(spec)
    if isinstance(spec, str) and spec.strip() and not all(names):
        raise ValueError(f"{option}: empty pass name in {spec!r} (write names separated by "
                         f"single commas, e.g. 'cse,dce')")
    names = [n for n in names if n]
    for n in names:
        if n not in known:
            raise ValueError(f"{option}: unknown pass {n!r} (known passes: {', '.join(sorted(known))})")
    return frozenset(names)


def _quote(path: str) -> str:
    return path if all(c.isalnum() or c in "/._-+:" for c in path) else "'" + path.replace("'", "'\\''") + "'"


REPRODUCER_SUFFIX = ".jcc"


def write_reproducer(program, pipeline: str, pass_name: str,
                     directory: str | None = None) -> tuple[str, str]:
    """Write ``program`` (with ``jaxpr_cc.save``) and a ``.pipeline`` text file next
    to it; returns the program's path and a note when only the printed IR could be
    written.  Both files are written atomically."""
    directory = directory or os.path.join(tempfile.gettempdir(), "jaxpr-cc-reproducers")
    os.makedirs(directory, exist_ok=True)
    stem = os.path.join(directory, f"{program.name}.{pass_name}.reproducer")
    _write_text_atomic(stem + ".pipeline", pipeline + "\n")
    import jaxpr_cc
    save = getattr(jaxpr_cc, "save", None)
    if save is not None:
        path = stem + REPRODUCER_SUFFIX
        try:
            save(program, path)  # atomic: nothing is written when it fails
            return path, ""
        except Exception as e:  # an unsavable program: fall back to the printed IR
            reason = f"jaxpr_cc.save failed: {type(e).__name__}: {e}"
    else:
        reason = "jaxpr_cc.save is not available in this build"
    path = stem + ".txt"
    _write_text_atomic(path, str(program))
    return path, f"{reason}; wrote the printed IR instead, which jaxpr-cc opt cannot load"


def _write_text_atomic(path: str, text: str) -> None:
    from ..storage.atomic import write_bytes  # jaxpr-cc's one file writer
    write_bytes(path, text.encode("utf-8"))


def run_passes(program, pipeline, **options):
    """Run ``pipeline`` (a string such as ``'hoist-consts,cse,dce'``, a Pipeline, or
    a sequence of passes) on ``program`` and return the new program; ``program``
    itself is not changed.  Options are those of :class:`PassManager`."""
    copy = options.pop("copy", True)
    return PassManager(pipeline, **options).run(program, copy=copy)
