"""Closure conversion: every custom rule first-order, every closed-over value explicit.

* ``session``  — trace-time interception of custom rules (used by ``jaxpr_cc.trace``).
* ``rules``    — first-order rule objects and their re-binding through JAX's APIs.
* ``ir_rules`` — the per-primitive table that moves rules between JAX equations and IR params.
* ``convert``  — the ``closure-convert`` pass for programs whose rules are still thunks.
* ``api``      — ``jaxpr_cc.closure_convert``, a drop-in for ``jax.closure_convert``.
"""
from .errors import ClosedOverError, ClosureConversionError

__all__ = ["ClosedOverError", "ClosureConversionError", "convert_program"]


def convert_program(program, *, closed_over: str = "auto", max_forward_size: int = 4096):
    from .convert import convert_program as _convert
    return _convert(program, closed_over=closed_over, max_forward_size=max_forward_size)
