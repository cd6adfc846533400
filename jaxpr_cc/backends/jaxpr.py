"""Graph IR -> jaxpr: the inverse of ``frontend.from_jaxpr``."""
from __future__ import annotations

from typing import Any

from ..closure.ir_rules import FIRST_ORDER_KEYS, export_params, is_first_order_custom
from ..ir.region import Region
from ..ir.value import Value
from ..jax_adapter import (ClosedJaxpr, Jaxpr, Literal, Var, fit_debug_info, jaxpr_from_parts,
                           input_effects_on, new_jaxpr_eqn, params_for_jax,
                           region_trace_context)


def region_to_jaxpr(region: Region, memo: dict | None = None) -> tuple[Jaxpr, list[Any] | None]:
    """Emit ``region`` as an open Jaxpr plus its consts (None for an open region).

    ``memo`` caches work for Regions shared between equations (custom rules reused at
    many call sites): each is emitted, and each rule re-bound, once per emission.
    """
    if memo is None:
        memo = {}
    env: dict[Value, Var] = {}

    def binder(v: Value) -> Var:
        var = env[v] = Var(v.aval)
        return var

    constvars = [binder(v) for v in region.constvars]
    invars = [binder(v) for v in region.invars]
    eqns = []
    append = eqns.append
    for eqn in region.topo_order():
        ins = [env[a] if type(a) is Value else a for a in eqn.inputs]
        outs = []
        for v in eqn.outputs:
            var = env[v] = Var(v.aval)
            outs.append(var)
        params, prim = eqn.params, eqn.prim
        if prim.name in FIRST_ORDER_KEYS and is_first_order_custom(prim.name, params):
            prim, params = _export_custom(eqn, memo)
        elif eqn.has_regions():
            # Custom rules inside a shard_map body are re-bound in its context (its
            # manual axes), as JAX traced them there.
            with region_trace_context(prim.name, params):
                params = params_for_jax(prim.name, {k: _emit_param(p, memo)
                                                    for k, p in params.items()})
        append(new_jaxpr_eqn(ins, outs, prim, params, eqn.effects, eqn.source_info, eqn.ctx))
    outvars = [env[a] if type(a) is Value else a for a in region.outvars]
    dbg = fit_debug_info(region.debug_info, len(invars), len(outvars))
    # (equation effects on Refs by position are resolved by new_jaxpr_eqn)
    effects = input_effects_on(region.effects, constvars + invars)
    jaxpr = jaxpr_from_parts(constvars, invars, outvars, eqns, effects, dbg)
    return jaxpr, (list(region.consts) if region.consts is not None else None)


def region_to_closed_jaxpr(region: Region, memo: dict | None = None) -> ClosedJaxpr:
    jaxpr, consts = region_to_jaxpr(region, memo)
    return ClosedJaxpr(jaxpr, consts or [])


def _emit_param(p: Any, memo: dict) -> Any:
    if isinstance(p, Region):
        hit = memo.get(("region", id(p)))
        if hit is None or hit[0] is not p:
            jaxpr, consts = region_to_jaxpr(p, memo)
            hit = memo[("region", id(p))] = (p, ClosedJaxpr(jaxpr, consts) if consts is not None else jaxpr)
        return hit[1]
    if type(p) is tuple and p and isinstance(p[0], Region):
        return tuple(_emit_param(x, memo) for x in p)
    return p


def _export_custom(eqn, memo: dict):
    """JAX's params for a first-order custom equation (cached per shared rule)."""
    in_avals = tuple(a.aval for a in eqn.inputs)
    regions = tuple(r for _, _, r in eqn.regions())
    key = ("custom", eqn.prim.name, tuple(id(r) for r in regions), in_avals)
    hit = memo.get(key)
    if hit is None or any(a is not b for a, b in zip(hit[0], regions)):
        def closed(region):
            out = _emit_param(region, memo)
            return out if isinstance(out, ClosedJaxpr) else ClosedJaxpr(out, [])
        prim, params = export_params(eqn.prim.name, eqn.params, in_avals, closed)
        hit = memo[key] = (regions, prim, params)
    return hit[1], hit[2]
