"""Which variables of a (raw JAX) jaxpr hold the same value, by construction.

A value number is a hashable key per variable: two variables with equal keys
compute the same value from the same inputs.  Equations are keyed by their
primitive, params and operands' keys, with the operands of commutative
primitives in a canonical order and the identities that leave a value unchanged
(``x + 0``, ``x * 1``, a copy, a conversion to its own type) seen through.  It
is conservative: different keys say nothing.  The transposition of bwd loops
asks it whether a "previous iterate" carry starts equal to the iterate
(``(x0 + 0.0, x0)`` or ``(g * c, c * g)``), so that the loop never runs.
"""
from __future__ import annotations

import numpy as np

from .. import jax_adapter as jx

#: Primitives whose two operands commute.
_COMMUTATIVE = frozenset({"add", "add_any", "mul", "max", "min", "and", "or", "xor", "eq", "ne"})

#: ``primitive -> (literal operand value that makes it the identity, positions it may sit at)``.
_IDENTITY = {"add": (0, (0, 1)), "add_any": (0, (0, 1)), "sub": (0, (1,)),
             "mul": (1, (0, 1)), "div": (1, (1,))}

#: Primitives that return their one operand's value unchanged.
_COPIES = frozenset({"copy", "copy_p", "optimization_barrier"})


def value_numbers(jaxpr) -> dict:
    """``{var: key}`` for ``jaxpr``'s inputs, constants and equation results."""
    keys: dict = {}
    for v in [*jaxpr.constvars, *jaxpr.invars]:
        keys[v] = ("input", id(v))

    def key(atom):
        if isinstance(atom, jx.Literal):
            val = np.asarray(atom.val)
            return ("literal", str(val.dtype), val.shape, val.tobytes())
        return keys.get(atom, ("unknown", id(atom)))

    # Sums of scaled values (``-(-u)``, ``0.5 u + 0.5 u``, ``u + 0 g``): the key of
    # a sum is that of its terms' combination, ``{key: coefficient}``.
    forms: dict = {}

    def form(atom):
        if isinstance(atom, jx.Literal):
            return {} if np.ndim(atom.val) == 0 and np.asarray(atom.val) == 0 else None
        return forms.get(atom, {key(atom): 1.0})

    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        ins = [key(a) for a in eqn.invars]
        same = _unchanged_operand(eqn, name)
        if same is not None:
            keys[eqn.outvars[0]] = ins[same]
            if not isinstance(eqn.invars[same], jx.Literal) and eqn.invars[same] in forms:
                forms[eqn.outvars[0]] = forms[eqn.invars[same]]
            continue
        combined = _linear_combination(eqn, name, form)
        if combined is not None:
            out = eqn.outvars[0]
            forms[out] = combined
            terms = [(k, c) for k, c in combined.items() if c != 0]
            keys[out] = terms[0][0] if len(terms) == 1 and terms[0][1] == 1.0 else \
                ("sum", str(out.aval), tuple(sorted(terms, key=repr)))
            continue
        if any(isinstance(p, (jx.ClosedJaxpr, jx.Jaxpr)) for p in _param_values(eqn.params)):
            # Calls and control flow: not compared (each result is its own value).
            for i, v in enumerate(eqn.outvars):
                keys[v] = ("equation", id(eqn), i)
            continue
        if name in _COMMUTATIVE and len(ins) == 2:
            ins = sorted(ins, key=repr)
        params = tuple(sorted((k, repr(v)) for k, v in eqn.params.items()))
        for i, v in enumerate(eqn.outvars):
            keys[v] = (name, params, tuple(ins), i)
    return keys


def _linear_combination(eqn, name: str, form) -> dict | None:
    """``{key: coefficient}`` of an inexact sum, difference, negation or product
    with a scalar literal of values of known forms; None for anything else."""
    if len(eqn.outvars) != 1 or not np.issubdtype(eqn.outvars[0].aval.dtype, np.inexact):
        return None
    out = eqn.outvars[0].aval
    if any(not isinstance(a, jx.Literal) and a.aval != out for a in eqn.invars):
        return None  # a broadcast operand: not a term of the same shape
    if name == "neg":
        f = form(eqn.invars[0])
        return None if f is None else {k: -c for k, c in f.items()}
    if name in ("add", "add_any", "sub") and len(eqn.invars) == 2:
        a, b = (form(x) for x in eqn.invars)
        if a is None or b is None:
            return None
        sign = -1.0 if name == "sub" else 1.0
        out_form = dict(a)
        for k, c in b.items():
            out_form[k] = out_form.get(k, 0.0) + sign * c
        return out_form
    if name == "mul" and len(eqn.invars) == 2:
        for pos in (0, 1):
            lit, other = eqn.invars[pos], eqn.invars[1 - pos]
            if isinstance(lit, jx.Literal) and np.ndim(lit.val) == 0:
                scale = complex(np.asarray(lit.val)) if np.iscomplexobj(lit.val) \
                    else float(np.asarray(lit.val))
                if scale == 0:
                    return {}
                f = form(other)
                return None if f is None else {k: scale * c for k, c in f.items()}
    return None


def _param_values(params: dict):
    for v in params.values():
        yield from (v if isinstance(v, (tuple, list)) else (v,))


def _unchanged_operand(eqn, name: str) -> int | None:
    """The position of the operand ``eqn`` returns unchanged, or None."""
    if len(eqn.outvars) != 1:
        return None
    out = eqn.outvars[0].aval
    if name in _COPIES and len(eqn.invars) == 1:
        return 0
    if name == "convert_element_type" and eqn.invars[0].aval == out:
        return 0
    identity = _IDENTITY.get(name)
    if identity is None or len(eqn.invars) != 2:
        return None
    neutral, positions = identity
    for pos in positions:
        lit, other = eqn.invars[pos], eqn.invars[1 - pos]
        if (isinstance(lit, jx.Literal) and np.ndim(lit.val) == 0
                and getattr(other, "aval", None) == out and np.asarray(lit.val) == neutral):
            return 1 - pos
    return None
