"""Closure conversion: every custom rule first-order, every closed-over value explicit.

* ``session``  — trace-time interception of custom rules (used by ``jaxpr_cc.trace``).
* ``rules``    — first-order rule objects and their re-binding through JAX's APIs.
* ``ir_rules`` — the per-primitive table that moves rules between JAX equations and IR params.
* ``api``      — ``jaxpr_cc.closure_convert``, a drop-in for ``jax.closure_convert``.
"""
from .errors import ClosedOverError, ClosureConversionError

__all__ = ["ClosedOverError", "ClosureConversionError"]
