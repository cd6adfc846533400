"""``cse``: merge equations with the same primitive, parameters and operands.

Walking each region in order, an equation's key is its primitive, its parameters
(``structural_key``: exact, with nested regions compared structurally), its
operands (values by identity, literals by dtype and bits).
When an earlier equation has the same key, the later one's results are replaced
by the earlier one's and it is erased; readers of the merged results then match
further equations, so chains of duplicates collapse in one walk.  Regions are
processed innermost first (so identical loops and branches compare equal after
their own bodies were simplified); values never cross regions.

Effectful, random-bit-generating and callback equations -- or equations whose
regions contain one -- are never merged (``passes.effects``), nor are custom_vjp
calls (each call's bwd runs on its own cotangents).

Nor are two equations whose results feed different sharding requests downstream
(a ``with_sharding_constraint``, a ``shard_map``'s in_specs, a jit's in_shardings,
reached directly, through other equations of the region, or inside a region
an equation calls): XLA propagates a
request backwards to the producer, so under jax.jit the two copies get different
layouts, and one merged copy would hand the request's layout to the other's readers
as well (an unconstrained output would come back resharded).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir.region import Region
from ..ir.value import Value
from .base import Pass, PassContext, register_pass
from .effects import CALLBACK_PRIMITIVES, RANDOM_PRIMITIVES, EffectOracle
from .signature import merge_into
from ..ir.structural_key import KeyMaker
from ..jax_adapter import operand_sharding_requests, sharding_request_primitives

_ASKING = sharding_request_primitives()


# Two calls of one custom_vjp are not one call: JAX runs the user's bwd once per
# call, on that call's cotangents (SymbolicZero where that call's output is unused),
# and a bwd need not be linear in them (gradient clipping: clip(g1) + clip(g2) is
# not clip(g1 + g2)).  Merged, the bwd would run once on the summed cotangents.
_NEVER_MERGED = frozenset({"custom_vjp_call"})


@register_pass("cse")
@dataclass(frozen=True)
class CommonSubexpressionElimination(Pass):
    summary = "merge equations with the same primitive, parameters and operands"

    def run(self, program, ctx: PassContext):
        merged = _CSE().region(program.body)
        if merged:
            ctx.count("equations-merged", merged)
        ctx.changed = bool(merged)
        return program


class _CSE:
    def __init__(self):
        self.keys = KeyMaker()
        self.oracle = EffectOracle()
        # Merging inside a region does not depend on who calls it, so a region
        # shared by several equations is processed once.
        self.done: set[int] = set()
        self._alive: list[Region] = []
        self._vjp_inside: dict[int, bool] = {}  # region id -> calls a custom_vjp
        self._requesting: dict[int, bool] = {}  # region id -> makes a sharding request

    def _calls_custom_vjp(self, eqn, subs=None) -> bool:
        """Is ``eqn`` a custom_vjp call, or does any region it holds (``subs``, when
        the caller has them) call one (two identical jitted helpers that call a
        custom_vjp are two calls of it too)?"""
        if eqn.prim.name in _NEVER_MERGED:
            return True
        if subs is None:
            subs = [sub for _, _, sub in eqn.regions()]
        for sub in subs:
            known = self._vjp_inside.get(id(sub))
            if known is None:
                self._vjp_inside[id(sub)] = False  # a recursive rule: no cycle here
                known = self._vjp_inside[id(sub)] = any(
                    self._calls_custom_vjp(inner) for inner in sub.equations)
            if known:
                return True
        return False

    def _requests_inside(self, region: Region) -> bool:
        """Does ``region`` (or any region below it) make a sharding request?"""
        known = self._requesting.get(id(region))
        if known is None:
            self._requesting[id(region)] = False  # a recursive rule: no cycle here
            known = self._requesting[id(region)] = any(
                operand_sharding_requests(e) is not None
                or any(self._requests_inside(sub) for _, _, sub in e.regions())
                for e in region.equations)
        return known

    def _nested_requests(self, eqn, subs: list) -> tuple | None:
        """Requests made inside ``eqn``'s regions (``subs``), as seen from its
        operands: each operand may reach them (which ones depends on the body), so it
        is labelled with the equation's structure -- equal for equal calls, which
        still merge."""
        if not subs or not any(self._requests_inside(sub) for sub in subs):
            return None
        label = ("nested", eqn.prim, self.keys.params(eqn.params))
        return tuple((label, i) for i in range(len(eqn.inputs)))

    def region(self, region: Region) -> int:
        if id(region) in self.done:
            return 0
        self.done.add(id(region))
        self._alive.append(region)
        merged = 0
        seen: dict[tuple, object] = {}
        keys = self.keys
        blocked = CALLBACK_PRIMITIVES | RANDOM_PRIMITIVES
        # Program order need not be topological for this walk to be sound: merging
        # two equations with identical operands can never create a cycle, and the
        # emitter orders equations topologically anyway.
        literal = keys.literal
        plain_params = keys.plain_params
        blocked_prims: dict = {}  # Primitive -> whether its name is in ``blocked``
        # Nested regions first: a request inside one is keyed by the region's
        # (simplified) structure.
        # One walk also collects the equations that make sharding requests.
        direct = []
        nested: dict = {}  # equation -> the regions it holds
        asking = _ASKING
        asks_by_prim: dict = {}  # Primitive -> whether it may ask for a sharding
        for eqn in region.equations:
            prim = eqn.prim
            asks = asks_by_prim.get(prim)
            if asks is None:
                asks = asks_by_prim[prim] = prim.name in asking
            req = operand_sharding_requests(eqn) if asks else None
            if eqn.params and eqn.has_regions():
                subs = nested[eqn] = [sub for _, _, sub in eqn.regions()]
                for sub in subs:
                    merged += self.region(sub)
                if req is None:
                    req = self._nested_requests(eqn, subs)
            if req is not None:
                direct.append((eqn, req))
        requests = _downstream_requests(region, direct) if direct else {}
        # An equation is first keyed by its primitive and operands (and the requests
        # its results reach); its parameters are keyed only when an earlier
        # equation matches that far -- most do not, and keying the params of every
        # call site (shardings, layouts, flags) was most of the pass's cost.
        pkeys: dict = {}

        def params_key(e):
            k = pkeys.get(e)
            if k is None:
                if e in nested:
                    if not self.oracle.is_mergeable(e) or self._calls_custom_vjp(e, nested[e]):
                        k = _UNMERGEABLE
                    else:
                        k = keys.params(e.params)
                else:
                    k = plain_params(e.params) if e.params else ()
                pkeys[e] = k
            return k

        for eqn in region.equations:
            prim = eqn.prim
            if eqn not in nested:
                is_blocked = blocked_prims.get(prim)
                if is_blocked is None:
                    is_blocked = blocked_prims[prim] = prim.name in blocked
                if is_blocked or (eqn.effects and not self.oracle.is_mergeable(eqn)):
                    continue
            # Result types are not part of the key: a primitive's abstract evaluation
            # is a function of its parameters and operand types.  Values hash by
            # identity; Literals do not hash at all, so an equation with a literal
            # operand takes the slower path that keys literals by dtype and bits.
            key = (prim, tuple(eqn.inputs))
            if requests:
                key += (tuple(requests.get(o, _NONE) for o in eqn.outputs),)
            try:
                bucket = seen.get(key)
            except TypeError:
                key = (prim, tuple([a if type(a) is Value else literal(a) for a in eqn.inputs]))
                if requests:
                    key += (tuple(requests.get(o, _NONE) for o in eqn.outputs),)
                bucket = seen.get(key)
            if bucket is None:
                seen[key] = eqn
                continue
            pkey = params_key(eqn)
            if pkey is _UNMERGEABLE:
                continue
            candidates = bucket if type(bucket) is list else [bucket]
            for first in candidates:
                if params_key(first) == pkey:
                    merge_into(region, eqn, first)
                    merged += 1
                    break
            else:
                candidates.append(eqn)
                seen[key] = candidates
        return merged


_NONE: frozenset = frozenset()
_UNMERGEABLE = object()  # the params key of an equation that is never merged


def _downstream_requests(region: Region, direct: list) -> dict:
    """Value -> the set of sharding requests its value reaches, directly or through
    the equations of ``region`` that read it.  ``direct``: ``(eqn, per-operand
    requests)`` for each equation of ``region`` that makes one (itself or inside
    its regions)."""
    out: dict = {}
    for eqn, req in direct:
        for atom, r in zip(eqn.inputs, req):
            if r is not None and type(atom) is Value:
                try:
                    hash(r)
                except TypeError:  # an unhashable request: distinct from every other
                    r = ("request", id(eqn))
                out[atom] = out.get(atom, _NONE) | {r}
    # Backwards over the region: an equation's operands reach every request its
    # results reach.  Reverse program order visits readers before producers when
    # the order is topological; a fixed point covers any other order.
    eqns = list(region.equations)
    changed = True
    while changed:
        changed = False
        for eqn in reversed(eqns):
            reached = _NONE
            for o in eqn.outputs:
                reached = reached | out.get(o, _NONE)
            if not reached:
                continue
            for atom in eqn.inputs:
                if type(atom) is Value:
                    have = out.get(atom, _NONE)
                    if not reached <= have:
                        out[atom] = have | reached
                        changed = True
    return out
