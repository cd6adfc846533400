"""Copies of regions.

``clone_region`` copies a region and every region it calls (a whole module: passes
work on a copy and never mutate their input); regions shared between call sites stay
shared in the copy, and a recursive function stays one, cycle included.
``clone_function`` copies one region and keeps its calls pointing at the same
callees: the copy-on-write step when one call site needs its own version.
"""
from __future__ import annotations

import weakref
from typing import Any

from .equation import Equation
from .graph_build import GraphLoader
from .region import Region
from .value import Value


def clone_region(region: Region, memo: dict | None = None) -> Region:
    """A deep copy of ``region`` and of every region it calls."""
    if memo is None:
        memo = {}
    new = Region(closed=region.closed, effects=region.effects, debug_info=region.debug_info)
    memo[id(region)] = (region, new)
    return _copy_into(new, region, lambda p: _clone_param(p, memo))


def clone_function(region: Region) -> Region:
    """A copy of ``region`` alone: its equations call the same regions as before."""
    new = Region(closed=region.closed, effects=region.effects, debug_info=region.debug_info)
    return _copy_into(new, region, None)


def _copy_into(new: Region, region: Region, copy_param) -> Region:
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
    # The loop below is the copy's whole cost on a large program: the loader's
    # adjacency dicts, the region back-reference and Equation's fields are written
    # directly (what ``loader.add_node`` / ``add_edge`` and ``Equation.region`` do).
    succ, pred, nodes = loader.succ, loader.pred, loader.node
    region_ref = weakref.ref(new)
    value_t = Value
    order: dict[Equation, None] = {}
    for eqn in region.equations:
        inputs = [env[a] if type(a) is value_t else a for a in eqn.inputs]
        outputs = []
        for v in eqn.outputs:
            env[v] = nv = value_t(v.aval, None, 0, v.name)
            outputs.append(nv)
        params = eqn.params
        if copy_param is not None and eqn.has_regions():
            params = {k: copy_param(p) for k, p in params.items()}
        else:
            params = dict(params)
        ne = Equation(eqn.prim, inputs, outputs, params, eqn.effects, eqn.source_info, eqn.ctx)
        ne._region_ref = region_ref
        order[ne] = None
        nodes[ne] = {}
        succ[ne] = {}
        ne_pred = pred[ne] = {}
        for pos, a in enumerate(inputs):
            if type(a) is value_t:
                producer = a.producer
                producer_succ = succ[producer]
                keydict = producer_succ.get(ne)
                if keydict is None:
                    keydict = producer_succ[ne] = ne_pred[producer] = {}
                keydict[pos] = {"value": a}
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
            return clone_region(p, memo)
        return hit[1]
    if type(p) is tuple and p and isinstance(p[0], Region):
        return tuple(_clone_param(r, memo) for r in p)
    return p
