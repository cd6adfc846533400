"""Jaxpr -> graph IR.

A generic driver: every equation becomes an :class:`Equation`; every parameter that
holds a ``Jaxpr`` or ``ClosedJaxpr`` (directly or inside a tuple) becomes a nested
:class:`Region`.  No per-primitive code is needed for the structure, so primitives
JAX adds later are held losslessly too.
"""
from __future__ import annotations

from typing import Any, Sequence

from ..closure.ir_rules import FIRST_ORDER_KEYS, import_params
from ..ir.equation import Equation
from ..ir.graph_build import GraphLoader
from ..ir.region import Region
from ..ir.value import Value
from ..jax_adapter import (ClosedJaxpr, DropVar, Jaxpr, Literal, input_effects_by_position,
                           params_for_ir)


def region_from_jaxpr(jaxpr: Jaxpr, consts: Sequence[Any] | None,
                      names: Sequence[str | None] | None = None, memo: dict | None = None) -> Region:
    """Build a Region from an open jaxpr; ``consts`` None keeps it open.

    ``memo`` maps the jaxprs already converted in this conversion to their Regions: a
    jaxpr JAX shares (a jit body called from many sites, a custom rule reused) becomes
    one Region that every call site refers to, converted once.  A Region is entered in
    the memo before its body is converted, so a rule that calls itself (recursion
    through custom rules) refers to the Region being built.
    """
    if memo is None:
        memo = {}
    region = Region(closed=consts is not None, effects=jaxpr.effects,
                    debug_info=jaxpr.debug_info)
    return _fill(region, jaxpr, consts, names, memo)


def _fill(region: Region, jaxpr: Jaxpr, consts, names, memo: dict) -> Region:
    region.effects = input_effects_by_position(region.effects,
                                               [*jaxpr.constvars, *jaxpr.invars])
    env: dict[Any, Value] = {}
    entry = region.entry
    for i, var in enumerate(jaxpr.constvars):
        v = Value(var.aval, entry, i)
        env[var] = v
        region.constvars.append(v)
    if consts is not None:
        region.consts = list(consts)
    n_const = len(jaxpr.constvars)
    for i, var in enumerate(jaxpr.invars):
        name = names[i] if names is not None and i < len(names) else None
        v = Value(var.aval, entry, n_const + i, name)
        env[var] = v
        region.invars.append(v)

    # The graph is written through networkx's adjacency dicts directly (see
    # ir/graph_build.py): this loop is the hot path of every IR build.
    succ, pred, node = region.graph._succ, region.graph._pred, region.graph._node
    order: dict[Equation, None] = {}
    for jeqn in jaxpr.eqns:
        inputs = [var if type(var) is Literal else env[var] for var in jeqn.invars]
        outputs = []
        for var in jeqn.outvars:
            v = Value(var.aval)
            if type(var) is not DropVar:
                env[var] = v
            outputs.append(v)
        params = jeqn.params
        name = jeqn.primitive.name
        first_order = (import_params(name, params, lambda cj: _closed_region(cj, memo))
                       if name in FIRST_ORDER_KEYS else None)
        if first_order is not None:
            params = first_order
        elif _any_jaxpr(params):
            params = {k: _convert_param(p, memo)
                      for k, p in params_for_ir(name, params).items()}
        else:
            params = dict(params)
        # Effects on Ref operands by position: the emitted jaxpr has new Vars.
        eqn = Equation(jeqn.primitive, inputs, outputs, params,
                       input_effects_by_position(jeqn.effects, jeqn.invars),
                       jeqn.source_info, jeqn.ctx)
        eqn.region = region
        order[eqn] = None
        node[eqn] = {}
        succ[eqn] = {}
        pe = pred[eqn] = {}
        for pos, atom in enumerate(inputs):
            if type(atom) is Value:
                src = atom.producer
                keydict = pe.get(src)
                if keydict is None:
                    keydict = pe[src] = succ[src][eqn] = {}
                keydict[pos] = {"value": atom}
    loader = GraphLoader(region.graph)
    outvars = []
    for pos, var in enumerate(jaxpr.outvars):
        if type(var) is Literal:
            outvars.append(var)
        else:
            v = env[var]
            outvars.append(v)
            loader.add_edge(v.producer, region.exit, pos, v)
    region.outvars = outvars
    region._order = order
    return region


def region_from_closed_jaxpr(closed: ClosedJaxpr, names=None, memo: dict | None = None) -> Region:
    return region_from_jaxpr(closed.jaxpr, closed.consts, names, memo)


def _closed_region(closed: ClosedJaxpr, memo: dict) -> Region:
    return _shared_region(closed, closed.jaxpr, closed.consts, memo)


def _open_region(jaxpr: Jaxpr, memo: dict) -> Region:
    return _shared_region(jaxpr, jaxpr, None, memo)


def _shared_region(key_obj, jaxpr: Jaxpr, consts, memo: dict) -> Region:
    """The one Region for a (Closed)Jaxpr object, however many params hold it."""
    hit = memo.get(id(key_obj))
    if hit is None or hit[0] is not key_obj:
        region = Region(closed=consts is not None, effects=jaxpr.effects,
                        debug_info=jaxpr.debug_info)
        hit = memo[id(key_obj)] = (key_obj, region)
        _fill(region, jaxpr, consts, None, memo)
    return hit[1]


_JAXPR_TYPES = (ClosedJaxpr, Jaxpr)


def _any_jaxpr(params: dict) -> bool:
    for p in params.values():
        t = type(p)
        if t is ClosedJaxpr or t is Jaxpr or _jaxpr_tuple(p):
            return True
    return False


def _jaxpr_tuple(p: Any) -> bool:
    """A tuple of jaxprs (cond's branches).  A tuple that mixes a jaxpr with other
    objects (a library primitive's static params) stays an opaque param."""
    return type(p) is tuple and bool(p) and all(type(x) in _JAXPR_TYPES for x in p)


def _convert_param(p: Any, memo: dict) -> Any:
    t = type(p)
    if t is ClosedJaxpr:
        return _closed_region(p, memo)
    if t is Jaxpr:
        return _open_region(p, memo)
    if _jaxpr_tuple(p):
        return tuple(_convert_param(x, memo) for x in p)
    return p
