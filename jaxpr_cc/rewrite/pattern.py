"""Patterns: small traced functions whose equations are matched in programs.

``Pattern.from_function(fn, *examples)`` traces ``fn`` at example arguments
(arrays or ``jax.ShapeDtypeStruct``s) into a Region.  The pattern's inputs are
*holes* that match any value (the same hole must match the same value
everywhere it is used), its literals match literals of equal value, and its
equations match equations of the same primitive with equal parameters --
except the parameters in ``ignore_params`` (by default those that only spell a
shape or a sharding, so a pattern traced at ``f32[]`` matches ``f32[3, 4]``).
The pattern's single output must be produced by its last equation (the root);
matching is anchored there and walks operands backwards.

``constraint(match) -> bool`` restricts matches, e.g. to floating dtypes
(``floating``) or to holes of one shape (``same_shape``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from .. import jax_adapter as jx
from ..frontend.from_jaxpr import region_from_closed_jaxpr
from ..ir.region import Region
from ..ir.value import is_literal

#: Parameters that only spell shapes or shardings of the traced example.
SHAPE_PARAMS = frozenset({"shape", "sharding", "out_sharding", "broadcast_dimensions",
                          "dimensions", "new_sizes"})

#: Binary primitives whose operands may be matched in either order.
COMMUTATIVE = frozenset({"add", "add_any", "mul", "max", "min", "and", "or", "xor", "eq", "ne"})


class PatternError(ValueError):
    """A pattern function that cannot be used as a pattern."""


@dataclass(frozen=True, eq=False)
class Pattern:
    """A traced pattern (see the module docstring)."""
    region: Region
    name: str = "pattern"
    constraint: Callable[[Any], bool] | None = None
    ignore_params: frozenset = field(default=SHAPE_PARAMS)

    @classmethod
    def from_function(cls, fn: Callable, *examples, name: str | None = None,
                      constraint: Callable[[Any], bool] | None = None,
                      ignore_params: Sequence[str] | str | None = None) -> "Pattern":
        """Trace ``fn(*examples)`` (one array output) into a pattern.

        ``ignore_params`` adds parameter names to ignore when comparing
        equations (``"all"``: compare primitives only)."""
        avals = [jx.get_aval(jnp.zeros(e.shape, e.dtype)) if isinstance(e, jax.ShapeDtypeStruct)
                 else jx.get_aval(e) for e in examples]
        label = name or getattr(fn, "__name__", "pattern")
        jaxpr, consts, _ = jx.trace_flat(lambda *xs: _as_list(fn(*xs)), avals, label)
        if consts:
            raise PatternError(f"pattern {label!r} captures {len(consts)} array constants; write "
                               f"constants as Python scalars (they become literals) or pass them "
                               f"as pattern inputs")
        region = region_from_closed_jaxpr(jx.ClosedJaxpr(jaxpr, []))
        if ignore_params == "all":
            ignored = frozenset({"*"})
        else:
            ignored = SHAPE_PARAMS | frozenset(ignore_params or ())
        pattern = cls(region=region, name=label, constraint=constraint, ignore_params=ignored)
        pattern.check()
        return pattern

    # ----------------------------------------------------------- structure
    @property
    def holes(self):
        return self.region.invars

    @property
    def root(self):
        return self.region.outvars[0].producer

    def check(self) -> None:
        r = self.region
        if len(r.outvars) != 1:
            raise PatternError(f"pattern {self.name!r} has {len(r.outvars)} outputs; a pattern "
                               f"has exactly one")
        out = r.outvars[0]
        if is_literal(out) or out.producer is r.entry:
            raise PatternError(f"pattern {self.name!r} returns an input or a constant; a pattern "
                               f"must compute its output")
        eqns = r.equations
        if not eqns:
            raise PatternError(f"pattern {self.name!r} has no equations")
        for e in eqns:
            if e.has_regions():
                raise PatternError(
                    f"pattern {self.name!r} contains '{e.prim.name}' with nested jaxprs; write "
                    f"patterns with primitive operations (the matcher looks inside jit bodies "
                    f"of the program on its own)")
            if e.effects:
                raise PatternError(f"pattern {self.name!r} contains '{e.prim.name}', which has "
                                   f"side effects")
        reachable = set()
        stack = [self.root]
        while stack:
            e = stack.pop()
            if e in reachable:
                continue
            reachable.add(e)
            stack.extend(a.producer for a in e.inputs
                         if not is_literal(a) and a.producer is not r.entry)
        dead = [e for e in eqns if e not in reachable]
        if dead:
            raise PatternError(f"pattern {self.name!r}: '{dead[0].prim.name}' does not contribute "
                               f"to the output")
        unused = [i for i, h in enumerate(self.holes) if not r.has_users(h)]
        if unused:
            raise PatternError(f"pattern {self.name!r}: input {unused[0]} is not used")

    def params_match(self, pattern_params: dict, target_params: dict) -> bool:
        if "*" in self.ignore_params:
            return True
        keys = (set(pattern_params) | set(target_params)) - self.ignore_params
        for k in keys:
            if k not in pattern_params or k not in target_params:
                return False
            if not _param_equal(pattern_params[k], target_params[k]):
                return False
        return True

    def __repr__(self) -> str:
        ops = " -> ".join(e.prim.name for e in self.region.equations)
        return f"<Pattern {self.name}: {ops}>"


def _as_list(out):
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _param_equal(a, b) -> bool:
    try:
        return bool(a == b)
    except Exception:  # arrays and other values without a boolean ==
        return a is b


# ------------------------------------------------------------- constraints
def floating(match) -> bool:
    """Every hole is a real floating-point value."""
    return all(jnp.issubdtype(a.dtype, jnp.floating) for a in match.hole_avals)


def same_shape(match) -> bool:
    """Every hole has the shape of the pattern's output."""
    out = match.outputs[0].aval.shape
    return all(tuple(a.shape) == tuple(out) for a in match.hole_avals)


def all_of(*constraints: Callable[[Any], bool]) -> Callable[[Any], bool]:
    def both(match) -> bool:
        return all(c(match) for c in constraints)
    return both
