"""Graph IR -> jaxpr: the inverse of ``frontend.from_jaxpr``."""
from __future__ import annotations

from typing import Any

from ..ir.region import Region
from ..ir.value import Value
from ..jax_adapter import ClosedJaxpr, Jaxpr, Literal, Var, fit_debug_info, new_jaxpr_eqn


def region_to_jaxpr(region: Region) -> tuple[Jaxpr, list[Any] | None]:
    """Emit ``region`` as an open Jaxpr plus its consts (None for an open region)."""
    env: dict[Value, Var] = {}

    def binder(v: Value) -> Var:
        var = env[v] = Var(v.aval)
        return var

    constvars = [binder(v) for v in region.constvars]
    invars = [binder(v) for v in region.invars]
    eqns = []
    for eqn in region.topo_order():
        ins = [a if type(a) is Literal else env[a] for a in eqn.inputs]
        outs = [binder(v) for v in eqn.outputs]
        params = eqn.params
        if eqn.has_regions():
            params = {k: _emit_param(p) for k, p in params.items()}
        eqns.append(new_jaxpr_eqn(ins, outs, eqn.prim, params, eqn.effects,
                                  eqn.source_info, eqn.ctx))
    outvars = [a if type(a) is Literal else env[a] for a in region.outvars]
    dbg = fit_debug_info(region.debug_info, len(invars), len(outvars))
    jaxpr = Jaxpr(constvars, invars, outvars, eqns, region.effects, dbg)
    return jaxpr, (list(region.consts) if region.consts is not None else None)


def region_to_closed_jaxpr(region: Region) -> ClosedJaxpr:
    jaxpr, consts = region_to_jaxpr(region)
    return ClosedJaxpr(jaxpr, consts or [])


def _emit_param(p: Any) -> Any:
    if isinstance(p, Region):
        jaxpr, consts = region_to_jaxpr(p)
        return ClosedJaxpr(jaxpr, consts) if consts is not None else jaxpr
    if type(p) is tuple and p and isinstance(p[0], Region):
        return tuple(_emit_param(x) for x in p)
    return p
