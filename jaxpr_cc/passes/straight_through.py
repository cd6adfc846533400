"""``straight-through{ops=round,sign}``: the straight-through gradient estimator.

Piecewise-constant operations (``round``, ``sign``, ``floor``, ``ceil``) have
derivative zero almost everywhere, which stops training of quantized or binary
networks.  This pass wraps each occurrence of the selected operations in a
first-order ``custom_jvp_call`` whose primal is the operation itself (values
unchanged) and whose tangent is the input tangent unchanged: the identity
("straight-through") estimator.

It changes gradients on purpose: they are no longer the derivative of the
function computed.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import jax
import jax.numpy as jnp
from jax import lax

from ..rewrite import Pattern, Rewrite, apply_rewrites, floating
from .base import Pass, PassContext, register_pass
from .stable_log1pexp import custom_jvp_replacement

_SCALAR = jax.ShapeDtypeStruct((), jnp.float32)

#: op name -> (pattern function, parameters any value of which matches)
OPS = {
    "round": (lambda x: lax.round(x), ("rounding_method",)),
    "sign": (lambda x: lax.sign(x), ()),
    "floor": (lambda x: lax.floor(x), ()),
    "ceil": (lambda x: lax.ceil(x), ()),
}


def _identity_tangent(xs, ts):
    return [ts[0]]


_SOURCE = f"straight_through.py:{_identity_tangent.__code__.co_firstlineno}"


@lru_cache(maxsize=None)
def rewrite_for(op: str) -> Rewrite:
    fn, free_params = OPS[op]
    pattern = Pattern.from_function(fn, _SCALAR, name=op, constraint=floating,
                                    ignore_params=free_params)

    def make(match):
        return custom_jvp_replacement(match.subgraph_jaxpr(), _identity_tangent,
                                      name=f"straight_through_{op}", source=_SOURCE)

    return Rewrite(pattern, make, name=op)


@register_pass("straight-through")
@dataclass(frozen=True)
class StraightThrough(Pass):
    summary = ("round/sign/floor/ceil -> custom_jvp with identity tangent (straight-through "
               "estimator; changes gradients on purpose, values unchanged)")
    ops: tuple[str, ...] = ("round", "sign")

    def __post_init__(self):
        unknown = [op for op in self.ops if op not in OPS]
        if unknown:
            raise ValueError(f"ops: unknown operation {unknown[0]!r}; choose from "
                             f"{', '.join(OPS)}")
        if not self.ops:
            raise ValueError("ops: give at least one operation, e.g. ops=round,sign")

    def run(self, program, ctx: PassContext):
        rewrites = tuple(rewrite_for(op) for op in self.ops)
        ctx.changed = apply_rewrites(program, rewrites, ctx) > 0
        return program
