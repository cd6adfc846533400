"""What a golden records about a program: named text views.

For a function (or a Program), its example arguments and a pipeline:

* ``00-trace.ir`` -- the printed IR ``jaxpr_cc.trace`` gives (our printer, never
  JAX's pretty-printer);
* ``NN-after-<pass>.ir`` -- the printed IR after each pass of the pipeline;
* ``emitted-jaxpr.ir`` -- the printed IR of ``Program.from_jaxpr(program.to_jaxpr())``:
  what the jaxpr backend emits, read back;
* ``python.py.txt`` -- the emitted Python source (``jaxpr_cc.emit_python``), with
  large constants in a sidecar whose arrays ``python.npz.txt`` lists by digest;
* ``numerics.txt`` -- values and gradients (:mod:`.numerics`).

A step that fails records ``error: Type: message`` in its view instead (the views
that need its result are then absent), so a golden also pins what does not work.
Every view is deterministic: no addresses, no absolute paths (directories given in
``aliases`` are replaced by placeholders), nothing ordered by hash or id.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Mapping, Sequence

from .numerics import compare_numerics, compute_numerics
from .sanitize import apply_aliases, error_line

__all__ = ["KINDS", "NUMERICS_VIEW", "JAXPR_VIEW", "PYTHON_VIEW", "SIDECAR_VIEW", "TRACE_VIEW",
           "ViewSet", "compute_views", "pass_view_name", "view_problems"]

KINDS = ("trace", "passes", "jaxpr", "python", "numerics")
TRACE_VIEW = "00-trace.ir"
JAXPR_VIEW = "emitted-jaxpr.ir"
PYTHON_VIEW = "python.py.txt"
SIDECAR_VIEW = "python.npz.txt"
NUMERICS_VIEW = "numerics.txt"
SIDECAR_NAME = "python.npz"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclasses.dataclass
class ViewSet:
    """The views of one program, in the order they were made."""
    views: dict[str, str]
    traced: Any = None   # the traced Program (None when tracing failed)
    final: Any = None    # the Program after the pipeline (None when a step failed)

    def names(self) -> list[str]:
        return list(self.views)


def pass_view_name(index: int, pass_text: str) -> str:
    """``NN-after-<pass>.ir`` for the ``index``-th pass (1-based); options in the
    pass's pipeline form become part of the name (``hoist-consts-min-bytes-1024``)."""
    slug = _UNSAFE.sub("-", pass_text).strip("-.") or "pass"
    return f"{index:02d}-after-{slug}.ir"


def _error_view(exc: BaseException, aliases: Mapping[str, str]) -> str:
    return f"error: {error_line(exc, aliases)}\n"


def compute_views(target: Any, args: Sequence = (), kwargs: Mapping | None = None, *,
                  pipeline: Any = "", kinds: Sequence[str] = KINDS,
                  grad_argnums: Sequence[int] = (), aliases: Mapping[str, str] | None = None,
                  name: str | None = None,
                  trace: Callable | None = None) -> ViewSet:
    """Compute the views ``kinds`` (a subset of :data:`KINDS`) of ``target``.

    ``target`` is a function, traced with ``jaxpr_cc.trace(target, *args, **kwargs)``
    (or with ``trace(target, args, kwargs)`` when given), or an already traced
    Program.  ``pipeline`` is a pipeline string (or Pipeline); ``grad_argnums``
    selects the arguments whose gradient ``numerics.txt`` records.  A malformed
    pipeline raises ``PipelineError``; failures of the program itself are recorded.
    """
    import jax

    import jaxpr_cc
    from ..passes.manager import PassManager
    from ..passes.pipeline import as_pipeline

    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise ValueError(f"unknown golden view kind(s) {unknown}; choose from {list(KINDS)}")
    aliases = dict(aliases or {})
    kwargs = dict(kwargs or {})
    passes = as_pipeline(pipeline if pipeline is not None else "")
    views: dict[str, str] = {}
    result = ViewSet(views)

    def record(view: str, text: str) -> None:
        text = apply_aliases(text, aliases)
        views[view] = text if text.endswith("\n") else text + "\n"

    if isinstance(target, jaxpr_cc.Program):
        program = target.copy()
    else:
        # Custom rules inside a jit body JAX cached before the trace reach
        # jaxpr_cc.trace by another route (see frontend/trace.py); cold caches keep
        # the trace independent of whatever ran earlier in the process.
        jax.clear_caches()
        try:
            program = (trace(target, tuple(args), kwargs) if trace is not None
                       else jaxpr_cc.trace(target, *args, **kwargs))
        except Exception as e:  # noqa: BLE001 -- recorded in the golden
            if "trace" in kinds:
                record(TRACE_VIEW, _error_view(e, aliases))
            return result
    if name is not None:
        program = program.replace(name=name)
    result.traced = program.copy()
    if "trace" in kinds:
        record(TRACE_VIEW, str(program))
    for index, pass_ in enumerate(passes):
        view = pass_view_name(index + 1, str(passes[index:index + 1]))
        try:
            program = PassManager(passes[index:index + 1]).run(program, copy=False)
        except Exception as e:  # noqa: BLE001 -- recorded in the golden
            if "passes" in kinds:
                record(view, _error_view(e, aliases))
            return result
        if "passes" in kinds:
            record(view, str(program))
    result.final = program
    if "jaxpr" in kinds:
        try:
            record(JAXPR_VIEW, str(_emitted_jaxpr_program(program)))
        except Exception as e:  # noqa: BLE001 -- recorded in the golden
            record(JAXPR_VIEW, _error_view(e, aliases))
    if "python" in kinds:
        _python_views(program, record, aliases)
    if "numerics" in kinds:
        if isinstance(target, jaxpr_cc.Program) and not args and program.arg_values:
            raise ValueError("the numerics view needs example arguments for the program")
        record(NUMERICS_VIEW, compute_numerics(program, tuple(args), kwargs,
                                               grad_argnums=tuple(grad_argnums),
                                               aliases=aliases))
    return result


def _emitted_jaxpr_program(program):
    """The program the jaxpr backend emits, read back: its own inputs (hoisted
    parameters first) and the original calling convention."""
    from ..ir.program import Program
    emitted = Program.from_jaxpr(program.to_jaxpr(), name=program.name)
    return emitted.replace(in_tree=program.in_tree, out_tree=program.out_tree,
                           params=program.params)


def _python_views(program, record: Callable[[str, str], None],
                  aliases: Mapping[str, str]) -> None:
    from ..backends.python_source import emit_python
    from ..ir.arrays import array_digest
    try:
        source, arrays = emit_python(program, sidecar_name=SIDECAR_NAME)
    except Exception as e:  # noqa: BLE001 -- recorded in the golden
        record(PYTHON_VIEW, _error_view(e, aliases))
        return
    record(PYTHON_VIEW, source)
    if arrays:
        lines = [f"# arrays of the sidecar {SIDECAR_NAME} the module loads (name, dtype, "
                 f"shape, sha256 of dtype+shape+bytes)"]
        for key in sorted(arrays):
            a = arrays[key]
            lines.append(f"{key}: {a.dtype}[{','.join(map(str, a.shape))}] "
                         f"sha256:{array_digest(a, length=64)}")
        record(SIDECAR_VIEW, "\n".join(lines))


def view_problems(view: str, expected: str, actual: str) -> list[str]:
    """Why ``actual`` does not match the golden ``expected`` (empty: it matches).
    Numerics compare within tolerance; every other view exactly."""
    if expected == actual:
        return []
    if view == NUMERICS_VIEW:
        return compare_numerics(expected, actual)
    return [f"{view}: text differs"]
