"""``simplify{fast-math=false inline-calls=false}``: algebraic identities, in every region.

The identities are the table in ``simplify_rules`` (keyed by primitive name).  Each
region is walked once in program order with a worklist: an equation's rules are
tried in table order and the first that matches rewrites it; equations a rewrite
creates (an inlined branch) or changes in place are visited again right away, and
readers of a forwarded result see the new operand when their turn comes, so chains
(``-(-(-(-x)))``, ``reshape(reshape(reshape(x)))``) collapse in one walk.  Nested
regions are simplified before the equation that holds them (each region once:
rewrites inside a region keep its signature and meaning, so a region shared by
several equations -- a custom rule used at two call sites -- is simplified for all
of them at once, and a custom rule's primal and derivative regions each stay
equivalent to what they were, so the rule stays valid for its primal).

By default only identities that are exact for every input are used (see
``simplify_rules``); ``fast-math=true`` adds the ones that are not
(``x + 0.0 -> x``, ``x * 0.0 -> 0``, ``x - x -> 0``, ...).  ``inline-calls=true``
inlines ``jit`` equations that request no sharding, layout, donation or compiler
option, and ``closed_call``/``core_call``.  Statistics count each rule by name.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from ..ir.equation import Equation
from ..ir.region import Region
from ..ir.value import Value
from .base import Pass, PassContext, register_pass
from .constant_fold import become_splat, make_literal, splat_allowed
from .effects import EffectOracle
from .signature import has_regions, set_inputs
from .simplify_rules import RULE_GATES, SIMPLIFY_RULES, Become, Constant, Forward, Inline, RuleContext

# A rewritten equation is visited again; chains of rewrites of one equation are
# short (each shortens a chain of producers), this only guards against a rule
# table that would cycle.
_MAX_REWRITES_PER_EQUATION = 64


@register_pass("simplify")
@dataclass(frozen=True)
class Simplify(Pass):
    summary = "algebraic identities (exact ones unless fast-math), constant branches, no-op equations"
    fast_math: bool = False
    inline_calls: bool = False

    def run(self, program, ctx: PassContext):
        simplifier = _Simplifier(self, ctx)
        simplifier.region(program.body)
        ctx.changed = simplifier.changed
        return program


class _Simplifier:
    def __init__(self, options: Simplify, ctx: PassContext):
        self.cx = RuleContext(fast_math=options.fast_math, inline_calls=options.inline_calls)
        self.ctx = ctx
        self.oracle = EffectOracle()
        self.done: set[int] = set()
        self._alive: list[Region] = []
        self.changed = False
        # Rules this run may use, per primitive (inexact / optional ones filtered out).
        self.rules = {}
        for name, rules in SIMPLIFY_RULES.items():
            usable = tuple(r for r in rules if (r.exact or options.fast_math)
                           and (r.option is None or getattr(options, r.option)))
            if usable:
                self.rules[name] = usable

    def region(self, region: Region) -> None:
        if id(region) in self.done:
            return
        self.done.add(id(region))
        self._alive.append(region)
        table = self.rules
        gates = RULE_GATES
        cx = self.cx
        work = deque(region.equations)
        rewrites: dict[Equation, int] = {}
        while work:
            eqn = work.popleft()
            if eqn.region is not region:
                continue  # removed by an earlier rewrite
            if has_regions(eqn):
                for _, _, sub in eqn.regions():
                    self.region(sub)
            name = eqn.prim.name
            rules = table.get(name)
            if rules is None:
                continue
            gate = gates.get(name)
            if gate is not None and not gate(eqn):
                continue
            for rule in rules:
                rewrite = rule.apply(eqn, cx)
                if rewrite is None:
                    continue
                revisit = self.apply(region, eqn, rewrite)
                if revisit is None:
                    continue  # the rewrite could not be made here after all
                self.ctx.count(rule.name)
                self.changed = True
                n = rewrites[eqn] = rewrites.get(eqn, 0) + 1
                if n >= _MAX_REWRITES_PER_EQUATION:
                    revisit = [e for e in revisit if e is not eqn]
                work.extendleft(reversed(revisit))
                break

    # ------------------------------------------------------------- rewrites
    def apply(self, region: Region, eqn: Equation, rewrite) -> list[Equation] | None:
        """Make ``rewrite``; returns the equations to visit again, or None if it
        could not be made."""
        if isinstance(rewrite, Forward):
            for out, atom in zip(eqn.outputs, rewrite.atoms):
                region.replace_all_uses_with(out, atom)
            self.remove(region, eqn, rewrite.drop_effects)
            return []
        if isinstance(rewrite, Constant):
            out = eqn.outputs[0]
            value = np.asarray(rewrite.value, dtype=out.aval.dtype)
            if out.aval.shape:
                if not splat_allowed(out.aval):
                    return None
                become_splat(region, eqn, value)
                return []
            region.replace_all_uses_with(out, make_literal(value, out.aval))
            self.remove(region, eqn, False)
            return []
        if isinstance(rewrite, Become):
            set_inputs(region, eqn, rewrite.inputs)
            eqn.prim = rewrite.prim
            eqn.params = rewrite.params
            return [eqn]
        if isinstance(rewrite, Inline):
            inlined = inline_region(region, eqn, rewrite.region, rewrite.operands)
            if inlined is None:
                return None
            new_eqns, results = inlined
            for out, atom in zip(eqn.outputs, results):
                region.replace_all_uses_with(out, atom)
            # The equation's effects now belong to the inlined equations.
            self.remove(region, eqn, True)
            return new_eqns
        raise TypeError(f"simplify: a rule returned {type(rewrite).__name__}, not a rewrite")

    def remove(self, region: Region, eqn: Equation, drop_effects: bool) -> None:
        if not drop_effects and self.oracle.has_side_effects(eqn):
            return  # its results are forwarded; the effect stays
        region.erase(eqn)


def inline_region(parent: Region, anchor: Equation, sub: Region, operands: list):
    """Copy the equations of ``sub`` into ``parent`` just before ``anchor``, with
    ``sub``'s inputs bound to ``operands``; returns ``(new equations, the atoms
    ``sub``'s outputs become)``, or None when ``sub``'s constants cannot be held by
    ``parent`` (an open region).  Nested regions of the copied equations are
    shared with ``sub``, not copied."""
    if len(operands) != len(sub.invars) or len(sub.outvars) != len(anchor.outputs):
        return None
    if any(a.aval != v.aval for a, v in zip(operands, sub.invars)) or any(
            a.aval != o.aval for a, o in zip(sub.outvars, anchor.outputs)):
        return None  # a weak type would change
    if sub.constvars and (sub.consts is None or parent.consts is None):
        return None
    env: dict[Value, object] = dict(zip(sub.invars, operands))
    for cv, value in zip(sub.constvars, sub.consts or ()):
        env[cv] = parent.add_const(cv.aval, value, cv.name)
    new_eqns = []
    for e in sub.equations:
        inputs = [env[a] if type(a) is Value else a for a in e.inputs]
        outputs = [Value(o.aval, name=o.name) for o in e.outputs]
        env.update(zip(e.outputs, outputs))
        new_eqns.append(Equation(e.prim, inputs, outputs, dict(e.params), e.effects,
                                 e.source_info, e.ctx))
    if new_eqns:
        parent.insert_before(anchor, new_eqns)
    results = [env[a] if type(a) is Value else a for a in sub.outvars]
    return new_eqns, results


def simplify(program, ctx: PassContext | None = None, **options):
    """Run ``simplify`` in place on ``program`` (no copy); returns it."""
    return Simplify(**options).run(program, ctx or PassContext())
