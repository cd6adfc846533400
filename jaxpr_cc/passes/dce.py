"""``dce``: remove equations whose results never reach an output, in every region.

Liveness runs backwards from the outputs.  Each equation is handled by a rule
looked up by primitive name (``DCE_RULES``); a rule may also shrink the equation's
signature -- drop unused results and operands of calls, branches and loops -- and
recurse into its regions:

* calls (``jit``, ``closed_call``, ``core_call``, ``remat``, ``shard_map``):
  unused results and the operands only they needed disappear, inside and out;
* ``cond``: unused results of every branch, and operands no branch reads;
* ``while`` / ``scan``: loop-carried values that never reach an output (or the
  loop condition) are dropped, to a fixpoint, with the constants and scanned
  inputs only they needed;
* everything else (custom-rule equations, unknown primitives): the equation is
  kept whole if any result is live, and its regions only lose equations that do
  not reach their own outputs, so its signature -- which custom rules must keep
  consistent between primal and rule -- never changes.  (Pruning custom rules'
  signatures is left to a rule-aware rewrite.)

An equation whose results are all dead is removed unless it has side effects
(``passes.effects``): printing, callbacks and other effects are never removed.
Operands of equations whose effects name inputs by position are never dropped.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..ir.layouts import LAYOUTS, Layout, loop_of, resized_params
from ..ir.region import Region
from ..ir.value import Value
from ..jax_adapter import is_input_effect
from .base import Pass, PassContext, register_pass
from .effects import CALLBACK_PRIMITIVES, EffectOracle, has_kept_effects
from .sharing import RegionOwnership
from .signature import (detach, has_regions, keep_entries, keep_outputs, keep_region_inputs, keep_region_outputs,
                        remove_unused_consts, set_inputs, used_binders)


@register_pass("dce")
@dataclass(frozen=True)
class DeadCodeElimination(Pass):
    summary = "remove equations whose results never reach an output, in every region"

    def run(self, program, ctx: PassContext):
        body = program.body
        dce = _DCE(ctx, body)
        dce.rewrite(body, [True] * len(body.outvars))
        n_params = len(program.params)
        if n_params:
            read = used_binders(body)
            keep = [v in read for v in body.invars[:n_params]]
            if not all(keep):
                keep_region_inputs(body, keep + [True] * (len(body.invars) - n_params))
                program.params = tuple(p for p, k in zip(program.params, keep) if k)
                ctx.count("params-removed", keep.count(False))
        ctx.changed = dce.changed
        return program


def _has_input_effects(eqn) -> bool:
    return any(is_input_effect(e) for e in eqn.effects)


def _nested_count(eqn) -> int:
    """Equations in the regions ``eqn`` calls, each region counted once."""
    seen: set[int] = set()
    n = 0
    for _, _, sub in eqn.regions():
        for region in sub.regions():
            if id(region) not in seen:
                seen.add(id(region))
                n += len(region)
    return n


class _DCE:
    """One run of the pass: the effect oracle, the analysis memo and the counters."""

    def __init__(self, ctx: PassContext, root: Region):
        self.ctx = ctx
        self.oracle = EffectOracle()
        self.owner = RegionOwnership(root)
        self.memo: dict[int, dict[tuple, list[bool]]] = {}
        self.simplified: set[int] = set()  # regions already simplified in place
        self._alive: list[Region] = []
        self.changed = False

    def removable(self, eqn, used_outs: Sequence[bool]) -> bool:
        return not any(used_outs) and not self.oracle.has_side_effects(eqn)

    def count(self, key: str, n: int) -> None:
        if n:
            self.ctx.count(key, n)
            self.changed = True

    # ----------------------------------------------------------- analysis
    def analyze(self, region: Region, used_outs: Sequence[bool]) -> list[bool]:
        """Which inputs of ``region`` are needed for the outputs ``used_outs``;
        changes nothing."""
        key = tuple(used_outs)
        memo = self.memo.setdefault(id(region), {})
        hit = memo.get(key)
        if hit is not None:
            return hit
        # While a region that calls itself is analysed, its inner call needs every input.
        memo[key] = [True] * len(region.invars)
        live = {a for a, u in zip(region.outvars, used_outs) if u and type(a) is Value}
        for eqn in reversed(region.equations):
            used = [o in live for o in eqn.outputs]
            used_ins = _rule_for(eqn).analyze(self, eqn, used)
            if used_ins is None:
                continue
            for a, u in zip(eqn.inputs, used_ins):
                if u and type(a) is Value:
                    live.add(a)
        result = memo[key] = [v in live for v in region.invars]
        return result

    # ------------------------------------------------------------ rewrite
    def rewrite(self, region: Region, used_outs: Sequence[bool]) -> list[bool]:
        """Remove what does not reach the outputs ``used_outs`` (the region's
        signature is left to the caller); returns which inputs are still read."""
        self.memo.pop(id(region), None)
        live = {a for a, u in zip(region.outvars, used_outs) if u and type(a) is Value}
        # Dead equations are erased as soon as they are found: walking backwards,
        # every reader of an equation's results has been visited already, so a
        # rule that drops results sees only live readers.
        dead = 0
        rules = DCE_RULES
        for eqn in reversed(region.equations):
            live_out = False
            for o in eqn.outputs:
                if o in live:
                    live_out = True
                    break
            rule = rules.get(eqn.prim.name)
            if rule is None and not has_regions(eqn):
                # The hot path: a plain primitive.
                if not live_out and not (eqn.effects and has_kept_effects(eqn)) \
                        and eqn.prim.name not in CALLBACK_PRIMITIVES:
                    detach(region, eqn)
                    dead += 1
                    continue
            else:
                rule = rule or DEFAULT_RULE
                used = [o in live for o in eqn.outputs] if live_out else [False] * len(eqn.outputs)
                if not rule.rewrite(self, region, eqn, used):
                    dead += 1 + _nested_count(eqn)
                    detach(region, eqn)
                    continue
            for a in eqn.inputs:
                if type(a) is Value:
                    live.add(a)
        self.count("equations-removed", dead)
        self.count("constants-removed", remove_unused_consts(region))
        return [v in live for v in region.invars]

    def internal(self, eqn) -> None:
        """DCE inside every region of ``eqn``, keeping each region's signature.
        The result does not depend on the caller, so a region shared by several
        equations is simplified once, in place."""
        for _, _, sub in eqn.regions():
            self.simplify(sub)

    def simplify(self, region: Region) -> None:
        if id(region) in self.simplified:
            return
        self.simplified.add(id(region))
        self._alive.append(region)
        self.rewrite(region, [True] * len(region.outvars))


# --------------------------------------------------------------------------- rules
class DefaultRule:
    """Keep the equation whole if any result is live or it has side effects; its
    regions only lose equations that do not reach their own outputs."""

    def analyze(self, dce: _DCE, eqn, used_outs):
        if dce.removable(eqn, used_outs):
            return None
        return [True] * len(eqn.inputs)

    def rewrite(self, dce: _DCE, region: Region, eqn, used_outs) -> bool:
        if dce.removable(eqn, used_outs):
            return False
        dce.internal(eqn)
        return True


class CallRule(DefaultRule):
    """A call of one region with operands = region inputs, results = region outputs;
    the params with one entry per operand or result (``ir.layouts``) shrink with them."""

    def __init__(self, param: str, layout: Layout):
        self.param = param
        self.per_input = tuple(name for name, _ in layout.operand_params)
        self.per_output = layout.result_params

    def analyze(self, dce, eqn, used_outs):
        if dce.removable(eqn, used_outs):
            return None
        if _has_input_effects(eqn):
            return [True] * len(eqn.inputs)
        return dce.analyze(eqn.params[self.param], used_outs)

    def rewrite(self, dce, region, eqn, used_outs) -> bool:
        if dce.removable(eqn, used_outs):
            return False
        if _has_input_effects(eqn) or (
                all(used_outs) and all(dce.analyze(eqn.params[self.param], used_outs))):
            dce.internal(eqn)
            return True
        sub: Region = dce.owner.own(eqn, self.param)
        used_ins = dce.rewrite(sub, used_outs)
        params = dict(eqn.params)
        if not all(used_outs):
            keep_region_outputs(sub, used_outs)
            keep_outputs(region, eqn, used_outs)
            for name in self.per_output:
                if name in params:
                    params[name] = keep_entries(params[name], used_outs)
            dce.count("results-removed", used_outs.count(False))
        if not all(used_ins):
            keep_region_inputs(sub, used_ins)
            set_inputs(region, eqn, [a for a, u in zip(eqn.inputs, used_ins) if u])
            for name in self.per_input:
                if name in params:
                    params[name] = keep_entries(params[name], used_ins)
            dce.count("operands-removed", used_ins.count(False))
        eqn.params = params
        return True


class CondRule(DefaultRule):
    """``cond``: operand 0 is the branch index; the rest are every branch's inputs."""

    def analyze(self, dce, eqn, used_outs):
        if dce.removable(eqn, used_outs):
            return None
        if _has_input_effects(eqn):
            return [True] * len(eqn.inputs)
        union = [False] * (len(eqn.inputs) - 1)
        for branch in eqn.params["branches"]:
            union = [a or b for a, b in zip(union, dce.analyze(branch, used_outs))]
        return [True] + union

    def rewrite(self, dce, region, eqn, used_outs) -> bool:
        if dce.removable(eqn, used_outs):
            return False
        if _has_input_effects(eqn) or (
                all(used_outs) and all(self.analyze(dce, eqn, used_outs))):
            dce.internal(eqn)
            return True
        dce.owner.own_all(eqn)
        branches = eqn.params["branches"]
        union = [False] * (len(eqn.inputs) - 1)
        for branch in branches:
            union = [a or b for a, b in zip(union, dce.rewrite(branch, used_outs))]
        if not all(used_outs):
            for branch in branches:
                keep_region_outputs(branch, used_outs)
            keep_outputs(region, eqn, used_outs)
            dce.count("results-removed", used_outs.count(False))
        if not all(union):
            for branch in branches:
                keep_region_inputs(branch, union)
            set_inputs(region, eqn, [eqn.inputs[0]] + [a for a, u in zip(eqn.inputs[1:], union) if u])
            dce.count("operands-removed", union.count(False))
        return True


class LoopRule(DefaultRule):
    """A loop (``while``, ``scan``; its carry layout is ``ir.layouts.loop_of``):
    operands are constant groups, the initial carry, then per-iteration operands;
    results are the final carry, then per-iteration results.  A carried value is
    live if it is a used result, is read by an exit test, or feeds a live carried
    value (to a fixpoint); unused per-iteration results, and constants and
    per-iteration operands only dead values needed, are dropped."""

    def _liveness(self, dce, eqn, used_outs):
        """(which operands are needed, which carried values are live)."""
        loop = loop_of(eqn)
        n_carry = loop.n_carry
        live = list(used_outs[:n_carry])
        used_ys = list(used_outs[n_carry:])
        group_used: list[list[bool] | None] = [None] * len(loop.groups)
        for slot, g in loop.tests:
            n = loop.group_size(g)
            test_used = dce.analyze(slot.region(eqn), [True])
            group_used[g] = test_used[:n]
            live = [a or b for a, b in zip(live, test_used[n:])]
        n = loop.group_size(loop.step_group)
        step = loop.step.region(eqn)
        while True:
            step_used = dce.analyze(step, live + used_ys)
            grown = [a or b for a, b in zip(live, step_used[n:n + n_carry])]
            if grown == live:
                break
            live = grown
        group_used[loop.step_group] = step_used[:n]
        needed = [False] * len(eqn.inputs)
        for group, used in zip(loop.groups, group_used):
            needed[group.start:group.stop] = used if used is not None \
                else [True] * (group.stop - group.start)
        needed[loop.carry_start:loop.carry_start + n_carry] = live
        needed[loop.carry_start + n_carry:] = step_used[n + n_carry:]
        return loop, needed, live

    def analyze(self, dce, eqn, used_outs):
        if dce.removable(eqn, used_outs):
            return None
        if _has_input_effects(eqn):
            return [True] * len(eqn.inputs)
        return self._liveness(dce, eqn, used_outs)[1]

    def rewrite(self, dce, region, eqn, used_outs) -> bool:
        if dce.removable(eqn, used_outs):
            return False
        if _has_input_effects(eqn):
            dce.internal(eqn)
            return True
        loop, needed, live = self._liveness(dce, eqn, used_outs)
        outs_keep = live + list(used_outs[loop.n_carry:])
        if all(needed) and all(outs_keep):
            dce.internal(eqn)
            return True
        for slot in (loop.step, *(slot for slot, _ in loop.tests)):
            dce.owner.own(eqn, slot.key, slot.index)
        groups = loop.groups
        xs_keep = needed[loop.carry_start + loop.n_carry:]
        for slot, g in loop.tests:
            test = slot.region(eqn)
            dce.rewrite(test, [True])
            keep_region_inputs(test, needed[groups[g].start:groups[g].stop] + live)
        step = loop.step.region(eqn)
        dce.rewrite(step, outs_keep)
        if not all(outs_keep):
            keep_region_outputs(step, outs_keep)
            keep_outputs(region, eqn, outs_keep)
            dce.count("loop-carries-removed", live.count(False))
            dce.count("results-removed", outs_keep[loop.n_carry:].count(False))
        step_group = groups[loop.step_group]
        keep_region_inputs(step, needed[step_group.start:step_group.stop] + live + xs_keep)
        params = resized_params(eqn, needed)
        if not all(needed):
            set_inputs(region, eqn, [a for a, k in zip(eqn.inputs, needed) if k])
            carried = loop.carried
            dce.count("operands-removed", sum(1 for i, k in enumerate(needed)
                                              if not k and i not in carried))
        eqn.params = params
        return True


DEFAULT_RULE = DefaultRule()

#: Per-primitive DCE rules, by primitive name; anything else uses DEFAULT_RULE.
DCE_RULES: dict[str, DefaultRule] = {
    name: CallRule(key, LAYOUTS[name])
    for name, key in (("jit", "jaxpr"), ("pjit", "jaxpr"), ("closed_call", "call_jaxpr"),
                      ("core_call", "call_jaxpr"), ("remat2", "jaxpr"), ("checkpoint", "jaxpr"),
                      ("shard_map", "jaxpr"))
}
DCE_RULES["cond"] = CondRule()
DCE_RULES.update({
    name: LoopRule() for name, layout in LAYOUTS.items() if layout.loop is not None
})


def _rule_for(eqn) -> DefaultRule:
    rule = DCE_RULES.get(eqn.prim.name)
    return rule if rule is not None else DEFAULT_RULE


def eliminate_dead_code(program, ctx: PassContext | None = None):
    """Run ``dce`` in place on ``program`` (no copy); returns it."""
    return DeadCodeElimination().run(program, ctx or PassContext())
