"""Type checking of a loaded program, by JAX's own checker, without redundant work.

A file whose checksums are right can still describe an ill-typed program (written by
hand, or by a buggy tool); ``load`` refuses those.  Running ``check_jaxpr`` on the
whole program costs about as much as tracing it, so instead each top-level equation
is checked on its own, emitted as a one-equation jaxpr by the jaxpr backend (the
form every consumer of the IR sees, custom rules included), and equations that are
identical for the checker (same primitive, operand types, literal values, parameters, result types,
effects and context) are checked once.  Equations that hold regions are checked
whole, regions included; calls of one function with the same types are checked once.  What a whole-program check adds beyond these -- variables
bound once and defined before use, one type per variable -- holds by construction of
the decoded program.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..backends.jaxpr import region_to_jaxpr
from ..ir.equation import Equation
from ..ir.region import Region
from ..ir.value import Value
from ..jax_adapter import Jaxpr, JaxprInputEffect, JaxprTypeError, NamedAxisEffect, check_jaxpr
from ..storage.errors import FormatError


def _signature(eqn) -> Any:
    """A hashable key that is equal for equations the checker treats identically, or
    None when the equation must be checked on its own."""
    params = eqn.params  # Regions hash by identity: calls of one function share a key
    ins = []
    for a in eqn.inputs:
        if type(a) is Value:
            ins.append(a.aval)
        else:
            val = a.val
            ins.append((a.aval, type(val), val.tobytes() if isinstance(val, np.ndarray) else val))
    key = (eqn.prim, tuple(ins), tuple([v.aval for v in eqn.outputs]),
           tuple(params.items()) if params else (), eqn.effects, id(eqn.ctx))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _one_equation_jaxpr(eqn) -> Jaxpr:
    """``eqn`` alone, as a jaxpr emitted by the jaxpr backend (the form every consumer
    of the IR sees, custom rules included)."""
    region = Region(closed=False, effects=eqn.effects)
    env: dict[Value, Value] = {}
    for a in eqn.inputs:
        if type(a) is Value and a not in env:
            env[a] = region.add_input(a.aval)
    outs = [Value(v.aval) for v in eqn.outputs]
    region.append(Equation(eqn.prim, [env[a] if type(a) is Value else a for a in eqn.inputs],
                           outs, eqn.params, eqn.effects, eqn.source_info, eqn.ctx))
    region.set_outvars(outs)
    jaxpr, _ = region_to_jaxpr(region)
    return jaxpr


def check_program_types(program) -> None:
    """Raise FormatError when an equation of ``program`` is ill-typed."""
    body = program.body
    seen: set = set()
    for k, eqn in enumerate(body.equations):
        key = _signature(eqn)
        if key is not None and key in seen:
            continue
        for effect in eqn.effects:
            if not isinstance(effect, (NamedAxisEffect, JaxprInputEffect)) \
                    and effect not in body.effects:
                raise FormatError(f"region 0 equation {k} ({eqn.prim.name}): effect {effect} is "
                                  f"not declared in the region's effects")
        try:
            check_jaxpr(_one_equation_jaxpr(eqn))
        except JaxprTypeError as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else "type error"
            raise FormatError(f"region 0 equation {k} ({eqn.prim.name}) is ill-typed: "
                              f"{first}") from None
        except Exception as e:  # a rule rejecting its operands with its own exception
            raise FormatError(f"region 0 equation {k} ({eqn.prim.name}) is ill-typed: "
                              f"{type(e).__name__}: {e}") from None
        if key is not None:
            seen.add(key)


def check_held_region_types(region, index) -> None:
    """Raise FormatError when an equation of ``region`` or of a region nested in it is
    ill-typed: for regions that reach JAX only as a jaxpr parameter
    (custom_linear_solve's), whose own checks do not look inside nested jaxprs."""
    for _, eqn in region.walk():
        try:
            check_jaxpr(_one_equation_jaxpr(eqn))
        except Exception as e:  # JaxprTypeError, or a rule rejecting its operands
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
            raise FormatError(f"region {index} (a jaxpr parameter): equation {eqn.prim.name} "
                              f"is ill-typed: {first}") from None
