"""``closure-convert``: make every custom rule first-order (see ``jaxpr_cc.closure``).

Custom-rule equations JAX staged with Python callables (``custom_jvp_call``,
``custom_vjp_call``, ``linear_call``) get their rules traced to regions, with the
values the rules close over as explicit operands.  The semantics -- and the
``closed_over`` policy for derivatives with respect to closed-over values -- are
those of ``jaxpr_cc.frontend.staged_rules.convert_program``; this pass only
exposes it in pipelines.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..frontend.staged_rules import convert_program
from .base import Pass, PassContext, register_pass

CLOSED_OVER_POLICIES = ("error", "reverse", "forward", "auto")


@register_pass("closure-convert")
@dataclass(frozen=True)
class ClosureConvert(Pass):
    summary = "make custom rules first-order: closed-over values become explicit operands"
    closed_over: str = "auto"
    max_forward_size: int = 4096

    def __post_init__(self):
        if self.closed_over not in CLOSED_OVER_POLICIES:
            raise ValueError(f"closed-over must be one of {', '.join(CLOSED_OVER_POLICIES)}, "
                             f"got {self.closed_over!r}")
        if self.max_forward_size < 0:
            raise ValueError(f"max-forward-size must be >= 0, got {self.max_forward_size}")

    def run(self, program, ctx: PassContext):
        convert_program(program, closed_over=self.closed_over,
                        max_forward_size=self.max_forward_size, stats=ctx.stats)
        ctx.changed = bool(ctx.stats.get("rules-materialized"))
        return program
