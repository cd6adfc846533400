"""Keep ``jit`` donation safe after a pass has rewritten operands.

A ``jit`` equation with ``donated_invars`` hands the operand's buffer to XLA,
which may reuse it for an output: once the equation has run, the buffer is gone.
JAX's own programs donate only values nothing reads afterwards.  A pass that
replaces one value by an equal one breaks that: ``simplify`` turns
``jit(donate)(x * 1.0)`` into ``jit(donate)(x)`` (the caller's argument is
deleted), ``cse`` merges a donated value with a later identical one (the
program reads a deleted buffer), copy propagation forwards a program input.

Every pass goes through this check (the pass manager runs it after each pass):
a donated operand that is a binder of its region (an input or constant: the
caller's or an enclosing region's buffer), a literal, passed at another operand
position of the same equation, a region output, or read by an equation after
the donating one, is no longer donated.  Dropping a donation changes memory
use only, never a value.
"""
from __future__ import annotations

from ..ir.value import is_literal

DONATED = "donated_invars"


def drop_unsafe_donations(program) -> int:
    """Clear each unsafe donation flag (see the module docstring) in place;
    returns how many were cleared."""
    dropped = 0
    for region in program.body.regions():
        order = None
        for eqn in region.equations:
            flags = eqn.params.get(DONATED)
            if not flags or not any(flags):
                continue
            if order is None:
                order = {e: i for i, e in enumerate(region.equations)}
            binders = set(map(id, region.invars)) | set(map(id, region.constvars))
            new = list(flags)
            for pos, donated in enumerate(flags):
                if donated and pos < len(eqn.inputs) and \
                        _unsafe(region, eqn, pos, binders, order):
                    new[pos] = False
            if new != list(flags):
                dropped += sum(1 for a, b in zip(flags, new) if a and not b)
                eqn.params = {**eqn.params, DONATED: tuple(new)}
    return dropped


def _unsafe(region, eqn, pos: int, binders: set, order: dict) -> bool:
    atom = eqn.inputs[pos]
    if is_literal(atom) or id(atom) in binders:
        return True
    here = order[eqn]
    for consumer, at in region.users(atom):
        if consumer is eqn:
            if at != pos:
                return True
        elif consumer is region.exit or order.get(consumer, -1) > here:
            return True
    return False
