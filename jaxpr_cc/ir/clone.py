"""Deep copies of regions: passes work on a copy and never mutate their input."""
from __future__ import annotations

from typing import Any

from .equation import Equation
from .graph_build import GraphLoader
from .region import Region
from .value import Value


def clone_region(region: Region, memo: dict | None = None) -> Region:
    """A deep copy; Regions shared between equations (a custom rule used at several
    call sites) stay shared in the copy."""
    if memo is None:
        memo = {}
    new = Region(closed=region.closed, effects=region.effects, debug_info=region.debug_info)
    env: dict[Value, Value] = {}
    for v in region.constvars:
        env[v] = nv = Value(v.aval, new.entry, 0, v.name)
        new.constvars.append(nv)
    if region.consts is not None:
        new.consts = list(region.consts)
    for v in region.invars:
        env[v] = nv = Value(v.aval, new.entry, 0, v.name)
        new.invars.append(nv)
    new._renumber_binders()
    loader = GraphLoader(new.graph)
    order: dict[Equation, None] = {}
    for eqn in region.equations:
        inputs = [env[a] if type(a) is Value else a for a in eqn.inputs]
        outputs = []
        for v in eqn.outputs:
            env[v] = nv = Value(v.aval, None, 0, v.name)
            outputs.append(nv)
        params = eqn.params
        if eqn.has_regions():
            params = {k: _clone_param(p, memo) for k, p in params.items()}
        else:
            params = dict(params)
        ne = Equation(eqn.prim, inputs, outputs, params, eqn.effects, eqn.source_info, eqn.ctx)
        ne.region = new
        order[ne] = None
        loader.add_node(ne)
        for pos, a in enumerate(inputs):
            if type(a) is Value:
                loader.add_edge(a.producer, ne, pos, a)
    new.outvars = [env[a] if type(a) is Value else a for a in region.outvars]
    for pos, a in enumerate(new.outvars):
        if type(a) is Value:
            loader.add_edge(a.producer, new.exit, pos, a)
    new._order = order
    return new


def _clone_param(p: Any, memo: dict) -> Any:
    if isinstance(p, Region):
        hit = memo.get(id(p))
        if hit is None or hit[0] is not p:
            hit = memo[id(p)] = (p, clone_region(p, memo))
        return hit[1]
    if type(p) is tuple and p and isinstance(p[0], Region):
        return tuple(_clone_param(r, memo) for r in p)
    return p
