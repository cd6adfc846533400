"""``canonicalize{max-iterations=10 fast-math=false inline-calls=false max-bytes=1048576}``.

Runs ``constant-fold``, ``simplify``, ``copy-propagation``, ``cse`` and ``dce`` in
that order, over and over, until none of them changes the program (or
``max-iterations`` rounds have run).  Each of them runs to its own fixpoint in
one sweep, so a pass is run again only when another pass has since made a change
it can act on (``ENABLES``): a program nothing applies to costs one sweep of
each, and the run stops as soon as no pass has anything left to look at.

Statistics are each pass's own, prefixed with its name
(``simplify.mul-one``, ``dce.equations-removed``), plus ``rounds`` and
``converged`` (1 when the fixpoint was reached within ``max-iterations``).
"""
from __future__ import annotations

from dataclasses import dataclass

from .base import Pass, PassContext, register_pass
from .constant_fold import ConstantFold
from .copy_propagation import CopyPropagation
from .cse import CommonSubexpressionElimination
from .dce import DeadCodeElimination
from .simplify import Simplify


#: Which passes a change by each pass can give new work.  A merge by cse or a
#: removal by dce never makes a value constant, so neither gives constant-fold
#: work; dce only removes equations, results and operands nothing reads, which
#: creates no identity, no pass-through and no constant, but can make two nested
#: regions identical (cse compares regions whole); a merge by cse can make the
#: two operands of ``x - x`` one value (simplify) and leaves dead code (dce).
ENABLES = {
    "constant-fold": ("simplify", "copy-propagation", "cse", "dce"),
    "simplify": ("constant-fold", "copy-propagation", "cse", "dce"),
    "copy-propagation": ("constant-fold", "simplify", "cse", "dce"),
    "cse": ("simplify", "dce"),
    "dce": ("cse",),
}


@register_pass("canonicalize")
@dataclass(frozen=True)
class Canonicalize(Pass):
    summary = "constant-fold, simplify, copy-propagation, cse and dce to a fixpoint"
    max_iterations: int = 10
    fast_math: bool = False
    inline_calls: bool = False
    max_bytes: int = ConstantFold.max_bytes

    def __post_init__(self):
        if self.max_iterations < 1:
            raise ValueError(f"max-iterations must be >= 1, got {self.max_iterations}")
        if self.max_bytes < 0:
            raise ValueError(f"max-bytes must be >= 0, got {self.max_bytes}")

    def passes(self) -> tuple[Pass, ...]:
        """The passes of one round, in order."""
        return (ConstantFold(max_bytes=self.max_bytes),
                Simplify(fast_math=self.fast_math, inline_calls=self.inline_calls),
                CopyPropagation(),
                CommonSubexpressionElimination(),
                DeadCodeElimination())

    def run(self, program, ctx: PassContext):
        passes = self.passes()
        index = {p.name: i for i, p in enumerate(passes)}
        # stale[i]: pass i never ran, or a change it can act on was made since.
        stale = [True] * len(passes)
        changed = False
        rounds = 0
        while any(stale) and rounds < self.max_iterations:
            rounds += 1
            for i, pass_ in enumerate(passes):
                if not stale[i]:
                    continue
                sub = PassContext()
                program = pass_.run(program, sub)
                stale[i] = False
                for key, value in sub.stats.items():
                    ctx.count(f"{pass_.name}.{key}", value)
                if sub.changed or (sub.changed is None and sub.stats):
                    changed = True
                    for name in ENABLES[pass_.name]:
                        stale[index[name]] = True
        ctx.count("rounds", rounds)
        ctx.stats["converged"] = int(not any(stale))
        ctx.changed = changed
        return program


def canonicalize(program, ctx: PassContext | None = None, **options):
    """Run ``canonicalize`` in place on ``program`` (no copy); returns it."""
    return Canonicalize(**options).run(program, ctx or PassContext())
