"""``stable-log1pexp``: ``log(1 + exp(x))`` gets the numerically stable derivative.

The softplus ``log(1 + exp(x))`` written out by hand (also as ``log1p(exp(x))``)
differentiates as ``exp(x) / (1 + exp(x))``, which is ``inf / inf = nan`` once
``exp(x)`` overflows (x > 88 in float32).  This pass wraps every occurrence in a
first-order ``custom_jvp_call`` whose primal is the matched equations themselves
-- values are bit-for-bit unchanged, including the ``inf`` the naive formula
gives for large x -- and whose tangent is ``t * sigmoid(x)``, finite everywhere.

It changes gradients on purpose: where the original gradient is ``nan`` it
becomes the limit ``sigmoid(x)``; elsewhere the two agree to rounding.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import jax
import jax.numpy as jnp

from .. import jax_adapter as jx
from ..closure.rules import JVPRule, RuleInfo, build_custom_jvp, is_inexact, run
from ..rewrite import Pattern, Rewrite, apply_rewrites, floating
from .base import Pass, PassContext, register_pass

_SCALAR = jax.ShapeDtypeStruct((), jnp.float32)


def custom_jvp_replacement(primal, tangent, *, name: str, source: str):
    """A replacement function ``(*holes) -> outputs`` binding a first-order
    custom_jvp whose primal is the ClosedJaxpr ``primal`` and whose output
    tangents are ``tangent(holes, hole_tangents)`` (tangents of float holes only)."""
    in_avals = list(primal.in_avals)
    n = len(in_avals)
    t_avals = [a for a in in_avals if is_inexact(a)]
    out_inexact = [is_inexact(a) for a in primal.out_avals]

    def jvp(*args):
        xs, ts = args[:n], args[n:]
        ys = run(primal, *xs)
        t_out = tangent(list(xs), list(ts))
        return [*ys, *[t for t, keep in zip(t_out, out_inexact) if keep]]

    jaxpr, consts, _ = jx.trace_flat(jvp, [*in_avals, *t_avals], f"{name}_jvp")
    if consts:
        raise RuntimeError(f"{name}: the tangent rule captured {len(consts)} constants")
    rule = JVPRule(info=RuleInfo(name=name, source=source, const_names=()), call=primal,
                   jvp=jx.ClosedJaxpr(jaxpr, []), num_consts=0)
    return build_custom_jvp(rule)


def _sigmoid_tangent(xs, ts):
    (x,), (t,) = xs, ts
    return [t * jax.nn.sigmoid(x)]


_SOURCE = f"stable_log1pexp.py:{_sigmoid_tangent.__code__.co_firstlineno}"


@lru_cache(maxsize=None)
def rewrites() -> tuple[Rewrite, ...]:
    patterns = (
        Pattern.from_function(lambda x: jnp.log(1.0 + jnp.exp(x)), _SCALAR,
                              name="log(1 + exp(x))", constraint=floating),
        Pattern.from_function(lambda x: jnp.log1p(jnp.exp(x)), _SCALAR,
                              name="log1p(exp(x))", constraint=floating),
    )

    def make(match):
        return custom_jvp_replacement(match.subgraph_jaxpr(), _sigmoid_tangent,
                                      name="stable_log1pexp", source=_SOURCE)

    return tuple(Rewrite(p, make, name=p.name) for p in patterns)


@register_pass("stable-log1pexp")
@dataclass(frozen=True)
class StableLog1pExp(Pass):
    summary = ("log(1 + exp(x)) -> custom_jvp with derivative sigmoid(x): finite gradients "
               "where exp overflows (changes gradients on purpose; values unchanged)")

    def run(self, program, ctx: PassContext):
        ctx.changed = apply_rewrites(program, rewrites(), ctx) > 0
        return program
