"""``vjp-to-jvp``: give functions that only have a VJP rule a JVP rule built from it.

Each first-order ``custom_vjp_call`` becomes a ``custom_jvp_call`` with the same
operands and primal (``call_jaxpr``), whose jvp rule runs the user's ``fwd`` and
forms the output tangent as

    t_y = linear_call(callee=T, transpose=bwd)(residuals=(c, r); linear=t_x)

where ``bwd`` is the user's backward rule ``(c, r, ct_y) -> ct_x`` and ``T`` is its
transpose with respect to the cotangent, ``(c, r, t_x) -> t_y``, computed from
bwd's jaxpr (``jaxpr_cc.closure.transpose``).  Forward mode (``jax.jvp``, ``jax.jacfwd``)
then runs ``T``; reverse mode transposes the ``linear_call`` and so runs the
user's own ``bwd`` -- ``jax.grad`` is unchanged.  Second derivatives
(``jax.hessian``) differentiate ``T`` or ``bwd`` with respect to the residuals;
reverse over forward (``jax.grad(jax.jacfwd(f))``) reverses that derivative of
``T``, which JAX cannot do when ``T`` holds a while_loop (a transposed adjoint
iteration): the derivative is then bound as a ``linear_call`` transposed by
``transpose_linear`` (registered with ``jax_adapter`` below).
The ``linear_call`` rules this needs (batching, perturbed residuals, partially
known linear operands) are registered from ``jax_adapter`` when this module is
imported.

Closed-over values ``c`` (the rule's leading ``num_consts`` operands) get no
derivative from the user's rule; the new rule keeps the vjp rule's info fields, so
its derivatives with respect to them follow the same ``closed_over`` policy (a jvp
of the primal).  When that policy differentiates them in forward mode for reverse
mode too (``closed_over='forward'``, or 'auto' on a primal with a while_loop, and
at most ``max_forward_size`` elements), the closed-over values are made ordinary
linear inputs of the ``linear_call``, whose transpose forms their cotangents from
forward-mode columns, as the vjp rule did.

The bwd may iterate a linear map in a while_loop (an adjoint fixed-point solve,
a counted loop): ``jaxpr_cc.closure.transpose`` transposes those too.  ``jaxpr_cc.jit``
and calls of a Program under autodiff run this pass by default
(``FORWARD_MODE_PIPELINE``; ``jaxpr_cc.jit(f, forward_mode=False)`` opts out).

A bwd that is not linear in the cotangent (``clip(ct)``, ``sin(ct)``, a loop
that stops on a test of the cotangent that is not one of its carries) has no
transpose.  By default (``untransposable=reverse-only``) such a rule
stays reverse-only: reverse mode still runs its bwd, exactly as the custom_vjp did,
while forward mode through it raises one line naming the rule and the offending
operation (``can't apply forward-mode autodiff ... through a reverse-only rule:
the bwd of custom_vjp rule 'f' (f.py:3) is not linear in its cotangent: 'max' is
not a linear operation ...``); the pass statistics list each such rule with the
reason, and the pass goes on with the others.  ``untransposable=error`` raises
:class:`~jaxpr_cc.closure.transpose.NotTransposableError` instead (run through the pass
manager, the program is left unchanged); ``untransposable=skip`` leaves such rules
as custom_vjp calls (JAX's own forward-mode error, which names no rule);
``untransposable=primal`` takes their forward-mode tangent from the
primal's own jvp (``call_jaxpr`` differentiated in forward mode, through loops
too) while reverse mode still runs bwd -- the two agree when bwd is the true
derivative (a fixed-point solver's adjoint iteration), not when bwd changes
gradients on purpose (gradient clipping).  Every custom_vjp_call is rewritten, in every region -- inside other
rules' primals, fwd and bwd, loops and branches; ``rules=a,b`` selects rules by
the user's function name.  A rule that calls itself is one function, rewritten once.
"""
from __future__ import annotations

import sys
import weakref
from dataclasses import dataclass
from typing import Literal

import numpy as np

from .. import jax_adapter as jx
from ..backends.jaxpr import region_to_closed_jaxpr
from ..closure.ir_rules import (SYMBOLIC_ZERO_OUTPUTS, forward_mode_is_made_as_regions,
                                forward_mode_on_demand, is_first_order_custom,
                                symbolic_zero_masks)
from ..closure.rules import (LinearRule, PatternRules, RuleInfo, _pe_bind_consts,
                             bind_linear_rule, body, is_inexact, marked,
                             run, symbolic_outputs)
from ..frontend.from_jaxpr import region_from_closed_jaxpr
from ..ir.equation import Equation
from ..ir.region import Region
from ..ir.value import Value
from ..closure.transpose import NotTransposableError, transpose_linear
from .base import Pass, PassContext, PassOptionError, register_pass

jx.register_linear_call_batching()
# Reverse mode along a linear_call's perturbed residuals (jax.grad(jax.jacfwd(f))
# through a bwd that iterates an adjoint solve) transposes the callee's jvp here.
jx.set_linear_jaxpr_transposer(
    lambda closed, linear: transpose_linear(closed, linear, what="the derivative of a "
                                            "forward-mode tangent map along its residuals"))

_INFO_FIELDS = ("name", "source", "const_names", "closed_over", "max_forward_size", "reverse_ok")


@register_pass("vjp-to-jvp")
@dataclass(frozen=True)
class VjpToJvp(Pass):
    summary = ("custom_vjp -> custom_jvp whose tangent is linear_call(transpose of bwd, bwd): "
               "forward mode through VJP-only functions, reverse mode still runs bwd")
    rules: tuple[str, ...] = ()                      # rule function names; empty = all
    untransposable: Literal["reverse-only", "error", "skip", "primal"] = "reverse-only"
    # keep: a rule whose rewrite fails for any other reason (a bug, an unsupported
    # construct) stays a custom_vjp, counted; raise: the pass fails.  jaxpr_cc.jit
    # and Program calls use 'keep' (forward mode is added, never a new failure).
    on_failure: Literal["raise", "keep"] = "raise"

    def run(self, program, ctx: PassContext):
        rewriter = _Rewriter(self, ctx)
        rewriter.region(program.body)
        unknown = sorted(set(self.rules) - rewriter.names)
        if unknown:
            raise PassOptionError(
                f"vjp-to-jvp: rules={','.join(unknown)}: the program has no custom_vjp rule "
                f"of that name (its rules: {', '.join(sorted(rewriter.names)) or 'none'})")
        ctx.changed = rewriter.changed
        return program


def _describe(params: dict) -> str:
    return f"custom_vjp rule '{params.get('name', '?')}' ({params.get('source', '?')})"


class _Rewriter:
    def __init__(self, options: VjpToJvp, ctx: PassContext):
        self.options = options
        self.ctx = ctx
        self.done: dict[int, Region] = {}       # regions already visited (shared rules: once)
        self.built: dict[tuple, dict | None] = {}  # (call, fwd, bwd) region ids -> new params
        self.changed = False
        self.unchecked = 0  # depth of shard_map(check_vma=False) bodies being visited
        self.names: set[str] = set()  # the names of the custom_vjp rules met

    def region(self, region: Region, primal_differentiated: bool = False) -> None:
        """Rewrite the rules in ``region``.  ``primal_differentiated``: the region is
        the primal of a rule whose closed-over values get forward-mode columns, so
        forward mode through it differentiates the primal, not the user's rules."""
        if id(region) in self.done:
            return
        self.done[id(region)] = region
        for eqn in region.equations:
            # Post-order: rules inside this equation's regions (a fwd that calls
            # the custom function itself, a bwd that uses one) are rewritten before
            # this equation's own rule is built from those regions.
            is_vjp = eqn.prim.name == "custom_vjp_call"
            columns = is_vjp and _primal_gets_forward_columns(eqn.params)
            unchecked = jx.unchecked_replication(eqn.prim.name, eqn.params)
            self.unchecked += unchecked
            for name, _, sub in eqn.regions():
                # Rules rebuilt inside a shard_map body are traced in its context:
                # their tangents keep the manual axes their primals vary over.
                with jx.region_trace_context(eqn.prim.name, eqn.params):
                    self.region(sub, primal_differentiated or (columns and name == "call_jaxpr"))
            self.unchecked -= unchecked
            if is_vjp:
                self.rewrite(region, eqn, primal_differentiated)

    def _build(self, p: dict, mode: str, refusal: str | None = None) -> dict | None:
        options = dict(untransposable=mode, refusal=refusal,
                       untyped_collectives=bool(self.unchecked))
        if self.options.on_failure == "raise":
            return build_jvp_params(p, **options)
        try:
            return build_jvp_params(p, **options)
        except NotTransposableError:
            raise
        except Exception as e:  # noqa: BLE001 -- keep the user's rule, say why
            self.ctx.count(f"rule '{p.get('name', '?')}' ({p.get('source', '?')}) kept as "
                           f"custom_vjp: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            return None

    def rewrite(self, region: Region, eqn: Equation, primal_differentiated: bool) -> None:
        p = eqn.params
        if not is_first_order_custom("custom_vjp_call", p):
            self.ctx.count("calls-skipped-not-first-order")
            return
        self.names.add(p["name"])
        if self.options.rules and p["name"] not in self.options.rules:
            self.ctx.count("calls-not-selected")
            return
        key = (id(p["call_jaxpr"]), id(p["fwd_jaxpr"]), id(p["bwd_jaxpr"]))
        if self.options.on_failure == "keep" and _consts_refused_in_reverse(p):
            # The vjp rule refuses reverse mode w.r.t. its closed-over values (too
            # many forward columns); a jvp rule would differentiate the primal
            # instead.  By default reverse mode must not change: keep the rule.
            self.ctx.count(f"rule '{p.get('name', '?')}' ({p.get('source', '?')}) kept as "
                           f"custom_vjp: its closed-over values exceed max_forward_size")
            return
        if key not in self.built:
            mode = self.options.untransposable
            if primal_differentiated and mode == "reverse-only":
                # Forward columns of an enclosing rule's closed-over values run through
                # this rule (a diffrax BacksolveAdjoint whose vector field closes over
                # the parameter): a refusal would fail reverse mode too.  JAX has no
                # derivative along such a value; the one formed here is the primal's.
                mode = "primal"
            try:
                self.built[key] = self._build(p, mode)
                if self.built[key] is not None:
                    self.ctx.count("rules-rewritten")
            except NotTransposableError as e:
                if mode == "error" and self.options.on_failure == "keep":
                    self.built[key] = None
                    self.ctx.count("rules-kept-untransposable")
                elif mode == "error":
                    raise NotTransposableError(
                        f"{e}; vjp-to-jvp needs a bwd that is linear in the cotangent "
                        f"(untransposable=reverse-only, the default, keeps such rules "
                        f"reverse-only; untransposable=skip leaves them as they are; "
                        f"untransposable=primal takes forward-mode tangents from the primal)",
                        e.equation, e.reason) from None
                elif mode != "reverse-only":
                    self.built[key] = None
                    self.ctx.count("rules-skipped-untransposable")
                else:
                    self.built[key] = self._build(p, mode, refusal=str(e))
                    if self.built[key] is None:
                        return
                    self.ctx.count("rules-reverse-only")
                    self.ctx.count(f"rule '{p.get('name', '?')}' ({p.get('source', '?')}) kept "
                                   f"reverse-only: {e}")
        new_params = self.built[key]
        if new_params is None:
            return
        # The new rule's bodies may call this rule as it was (a fwd that calls its
        # own function, run by the jvp for the primal): rewritten too, to this rule.
        for value in new_params.values():
            for sub in value if isinstance(value, tuple) else (value,):
                if isinstance(sub, Region):
                    self.region(sub)
        outputs = [Value(v.aval, name=v.name) for v in eqn.outputs]
        new = Equation(jx.custom_jvp_call_p, list(eqn.inputs), outputs, dict(new_params),
                       eqn.effects, eqn.source_info, eqn.ctx)
        region.insert_before(eqn, new)
        for old, out in zip(eqn.outputs, outputs):
            region.replace_all_uses_with(old, out)
        region.erase(eqn)
        self.ctx.count("calls-rewritten")
        self.changed = True


def _refuse_untyped_collectives(p: dict) -> None:
    """Inside shard_map(check_vma=False) a collective in bwd has no replication types,
    so its transpose (the tangent map) would be JAX's guess (psum transposed to psum
    multiplies a replicated value's tangent by the axis size): not transposed."""
    for _, eqn in p["bwd_jaxpr"].walk():
        if eqn.prim.name in jx.REPLICATION_DEPENDENT_COLLECTIVES:
            raise NotTransposableError(
                f"{_describe(p)}: its bwd uses {eqn.prim.name} inside "
                f"shard_map(check_vma=False), where JAX does not track which values are "
                f"replicated, so its transpose is unknown (use check_vma=True)",
                None, f"{eqn.prim.name} without varying-axes types")


# ---------------------------------------------------------------- building
def build_jvp_params(p: dict, *, untransposable: str = "error",
                     refusal: str | None = None, untyped_collectives: bool = False) -> dict:
    """First-order ``custom_jvp_call`` params equivalent to the vjp rule ``p``.

    Raises NotTransposableError when bwd is not linear in its cotangent, unless
    ``untransposable='primal'``: then the tangent map is the primal's own jvp
    (``call_jaxpr`` differentiated in forward mode), still transposed by bwd; or
    ``refusal`` is given (``untransposable='reverse-only'``): then the tangent map
    raises a one-line error naming the rule and ``refusal`` (why bwd is not
    linear) when forward mode evaluates it, and reverse mode runs bwd.
    ``untyped_collectives``: the rule is inside shard_map(check_vma=False), where a
    bwd with a collective is not transposed (see ``_refuse_untyped_collectives``).
    """
    what = f"the bwd of {_describe(p)}"
    # One export memo for the rule's bodies and their variants: a rule they all call
    # (a fwd that calls its own function) is exported, and so rebuilt, once.
    exported: dict = {}
    call = region_to_closed_jaxpr(p["call_jaxpr"], exported)
    fwd = region_to_closed_jaxpr(p["fwd_jaxpr"], exported)
    bwd = region_to_closed_jaxpr(p["bwd_jaxpr"], exported)
    nc, nr = p["num_consts"], p["num_res"]
    in_avals, y_avals = list(call.in_avals), list(call.out_avals)
    c_avals = in_avals[:nc]
    x_inexact = [is_inexact(a) for a in in_avals[nc:]]
    y_inexact = [is_inexact(a) for a in y_avals]
    n_ct = len(bwd.in_avals) - nc - nr
    if n_ct != sum(y_inexact) or len(bwd.out_avals) != sum(x_inexact):
        raise NotTransposableError(
            f"{what} takes {n_ct} cotangents and returns {len(bwd.out_avals)}; the rule's "
            f"function has {sum(y_inexact)} float outputs and {sum(x_inexact)} float inputs")
    def tangent_map(b, n_res, late: bool = False):
        """bwd ``b`` transposed w.r.t. its cotangent (forward mode's tangent map), or
        a refusal, or None (the primal's jvp gives forward-mode tangents).  ``late``:
        ``b`` is the bwd of a pattern traced when JAX first gave it, while JAX
        differentiates: one that is not linear refuses forward mode only, since
        reverse mode (which runs ``b`` itself) is under way too."""
        if not (n_ct and b.out_avals):
            return None
        try:
            if untyped_collectives:
                _refuse_untyped_collectives(p)
            return transpose_linear(b, [False] * (nc + n_res) + [True] * n_ct, what=what,
                                    linear_name="its cotangent")
        except NotTransposableError as e:
            if refusal is not None or (late and untransposable != "primal"):
                return _refusing_tangent_map(b, nc, n_res, refusal or str(e))
            if untransposable != "primal":
                raise
            return None

    consts_linear = nc > 0 and _consts_need_forward_columns(p, c_avals)
    families = _families(p, nr, n_ct, exported)

    # One conversion memo for the rule and its variants: the rules they call (a fwd
    # that calls its own function) become one set of Regions, not one per variant;
    # and one set of staged forward-mode columns of the primal.
    memo: dict = {}
    columns: dict = {}

    # Patterns no variant lists, traced when JAX first gives them (rules.PatternRules):
    # the jvp rule of a fwd pattern, and the bwd of a cotangent pattern.
    made = p.get("pattern_rules")
    full_ct = (True,) * n_ct

    def ct_rules(in_pattern):
        if made is None or in_pattern is None:
            return None

        def bwd_for(ct):
            if all(ct):
                return None
            got = made.get(("bwd", in_pattern, ct), c_avals)
            return got if got is None else _late_with_forward_mode(got)
        return bwd_for

    def jvp_for(fwd_f, n_res, bwd_f, ct_variants, in_pattern=None, as_jaxpr=False):
        # bwd_f, and each bwd of ct_variants: a body marked with the cotangents the
        # user's bwd returned as symbolic zeros (rules.marked), which its transposes keep.
        transposed = tangent_map(body(bwd_f), n_res, late=as_jaxpr)
        use_primal = transposed is None and n_ct > 0 and bool(body(bwd_f).out_avals)
        rule = _jvp_rule(_info(p), call, fwd_f, bwd_f, transposed, nc, n_res,
                         consts_linear=consts_linear, use_primal=use_primal,
                         ct_variants=ct_variants, memo=memo, ct_rules=ct_rules(in_pattern),
                         as_jaxpr=as_jaxpr, columns=columns)
        # A bwd that returns a symbolic zero for every argument (as it was traced for
        # this pattern: for each perturbed one too) declares no derivative at all:
        # the tangents are symbolic zeros, as the cotangents JAX gives back are.
        zeros = symbolic_outputs(bwd_f)
        silent = (True,) * n_ct if zeros and all(zeros) and not consts_linear else ()
        if as_jaxpr:
            return marked(rule, silent)
        tangent_zeros[id(rule)] = silent
        return rule

    tangent_zeros: dict = {}

    main = families.pop(())
    jvp = jvp_for(fwd, nr, marked(bwd, main["zeros"]), main["ct_variants"],
                  made.main if made is not None else None)
    params = dict(call_jaxpr=p["call_jaxpr"], jvp_jaxpr=jvp,
                  num_consts=0 if consts_linear else nc,
                  symbolic_zeros=p["symbolic_zeros"])
    if families:
        # A symbolic-zeros custom_vjp traced per perturbation pattern: the jvp rule
        # picked for a pattern runs the fwd traced for it, and its tangent's transpose
        # the bwd traced for it and for the cotangents given (docs/closure.md).
        variants = [(pattern, jvp_for(f["fwd"], f["num_res"], marked(f["bwd"], f["zeros"]),
                                      f["ct_variants"], pattern))
                    for pattern, f in families.items()]
        if consts_linear:
            variants = _with_const_patterns(variants, c_avals)
        if variants:
            params["jvp_variant_patterns"] = tuple(pattern for pattern, _ in variants)
            params["jvp_variants"] = tuple(region for _, region in variants)
    masks = tuple(tangent_zeros.get(id(r), ())
                  for r in (params["jvp_jaxpr"], *params.get("jvp_variants", ())))
    if any(masks):
        params[SYMBOLIC_ZERO_OUTPUTS] = masks
    if made is not None:
        n_c = sum(1 for a in c_avals if is_inexact(a)) if consts_linear else 0

        def make_jvp(pattern):
            x_pattern = tuple(pattern[n_c:])  # the user's rule never sees the consts
            if x_pattern == made.main:
                return None
            got = made.get(("fwd", x_pattern), c_avals)
            if got is None:
                return None
            fwd_f, n_res = got
            bwd_f = made.get(("bwd", x_pattern, full_ct), c_avals)
            # Rules these bodies call (a fwd calling its own function) get forward
            # mode, as those in the bodies traced up front did from this pass.
            fwd_f, bwd_f = _late_with_forward_mode(fwd_f), _late_with_forward_mode(bwd_f)
            if body(bwd_f).consts:
                # Its bwd is transposed, which needs every value it reads as an input
                # (a fwd's constants -- flags built from the pattern -- stay constants
                # of the jvp body, made now).
                raise NotTransposableError(
                    f"{_describe(p)} reads a value, for the pattern of perturbed inputs "
                    f"{x_pattern}, that it does not read otherwise; pass that value as an "
                    f"argument", None, "a value read for one pattern only")
            return jvp_for(fwd_f, n_res, bwd_f, (), x_pattern, as_jaxpr=True)
        # One PatternRules per rewritten rule: a call of the rule in a body traced
        # late (a fwd calling its own function) is rewritten to the same one, which
        # is how a saved program recognizes it as the same rule (recursion).
        memo_key = (tuple(c_avals), consts_linear)
        shared = _REWRITTEN_PATTERN_RULES.setdefault(made, {})
        if memo_key not in shared:
            shared[memo_key] = PatternRules(make_jvp, params["num_consts"], made.main)
        params["pattern_rules"] = shared[memo_key]
    params.update({f: p[f] for f in _INFO_FIELDS})
    params["written_as"] = "vjp"  # errors name the custom_vjp the user wrote
    if consts_linear:
        params["const_names"] = ()  # the closed-over values are ordinary inputs now
    return params


_REWRITTEN_PATTERN_RULES: "weakref.WeakKeyDictionary[PatternRules, dict]" = \
    weakref.WeakKeyDictionary()


def _families(p: dict, nr: int, n_ct: int, exported: dict) -> dict:
    """A symbolic-zeros vjp rule's fwd/bwd per perturbation pattern: ``{in_pattern:
    {fwd, num_res, bwd, ct_variants, zeros}}``, ``()`` for ``fwd_jaxpr``/``bwd_jaxpr``;
    ``bwd`` takes every output cotangent, ``ct_variants`` ((ct_pattern, bwd), ...)
    the patterns with some symbolic-zero cotangents."""
    regions = p.get("bwd_variants", ())
    masks = symbolic_zero_masks(p, 1 + len(regions))
    families = {(): dict(fwd=None, num_res=nr, bwd=None, ct_variants=[], zeros=masks[0])}
    for (pattern, n_res), region in zip(p.get("fwd_variant_patterns", ()),
                                        p.get("fwd_variants", ())):
        families[tuple(pattern)] = dict(fwd=region_to_closed_jaxpr(region, exported), num_res=n_res,
                                        bwd=None, ct_variants=[], zeros=())
    full = (True,) * n_ct
    for (family, ct), region, zeros in zip(p.get("bwd_variant_patterns", ()), regions,
                                           masks[1:]):
        entry = families.get(tuple(family))
        if entry is None:
            continue
        if tuple(ct) == full:
            entry["bwd"], entry["zeros"] = region_to_closed_jaxpr(region, exported), zeros
        else:
            entry["ct_variants"].append(
                (tuple(ct), marked(region_to_closed_jaxpr(region, exported), zeros)))
    # A fwd variant whose bwd (all cotangents) is missing cannot be paired: as the
    # rebuilt custom_vjp does, such a pattern uses the main rule.
    return {k: v for k, v in families.items() if k == () or v["bwd"] is not None}


# Beyond this many patterns of perturbed closed-over values (which a rule whose
# closed-over values are linear inputs also dispatches on) the variants are dropped.
_MAX_CONST_PATTERNS = 8


def _with_const_patterns(variants, c_avals):
    """Variants keyed by the inexact arguments' pattern, rekeyed for a rule whose
    closed-over values are ordinary inputs (leading): the user's rule never sees
    them, so every pattern of them maps to the same variant."""
    n_c = sum(1 for a in c_avals if is_inexact(a))
    if 2 ** n_c > _MAX_CONST_PATTERNS:
        return []
    out = []
    for mask in range(2 ** n_c):
        c_pattern = tuple(bool(mask >> j & 1) for j in range(n_c))
        out.extend((c_pattern + tuple(pattern), region) for pattern, region in variants)
    return out


def _refusing_tangent_map(bwd, nc: int, nr: int, why: str):
    """A jaxpr shaped like bwd's transpose, ``(c, r, t_x) -> t_y``, that raises
    when evaluated: forward mode through a rule that only has a reverse mode."""
    t_avals = [jx.to_cotangent_aval(a) for a in bwd.out_avals]
    out_avals = list(bwd.in_avals[nc + nr:])
    message = (f"can't apply forward-mode autodiff (jvp, jacfwd) through a reverse-only rule: "
               f"{why} (vjp-to-jvp kept the rule reverse-only)")

    def refuse(*ops):
        return list(jx.refuse_forward_mode(list(ops[nc + nr:]), out_avals, message))

    return _closed(refuse, [*bwd.in_avals[:nc + nr], *t_avals], "forward_mode_refused")


def _info(p: dict) -> RuleInfo:
    return RuleInfo(name=p["name"], source=p["source"], const_names=tuple(p["const_names"]),
                    closed_over=p["closed_over"], max_forward_size=p["max_forward_size"],
                    reverse_ok=p["reverse_ok"], written_as="vjp")


def _consts_refused_in_reverse(p: dict) -> bool:
    """True when the vjp rule's policy refuses reverse-mode derivatives w.r.t. its
    closed-over values (forward columns beyond ``max_forward_size``), which a jvp
    rule's policy would give."""
    nc = p["num_consts"]
    if not nc:
        return False
    c_avals = list(region_to_closed_jaxpr(p["call_jaxpr"]).in_avals)[:nc]
    size = sum(int(np.prod(a.shape)) for a in c_avals if is_inexact(a))
    mode = p["closed_over"]
    forward = mode == "forward" or (mode == "auto" and not p["reverse_ok"])
    return forward and size > p["max_forward_size"]


def _primal_gets_forward_columns(p: dict) -> bool:
    """Does the vjp rule ``p`` differentiate its primal in forward mode to form its
    closed-over values' cotangents (see :func:`_consts_need_forward_columns`)?"""
    nc = p.get("num_consts", 0)
    if not nc or not is_first_order_custom("custom_vjp_call", p):
        return False
    c_avals = list(region_to_closed_jaxpr(p["call_jaxpr"]).in_avals)[:nc]
    return _consts_need_forward_columns(p, c_avals)


def _consts_need_forward_columns(p: dict, c_avals) -> bool:
    """True when the vjp rule's policy forms cotangents of the closed-over values by
    forward mode (the primal cannot be reverse-differentiated), within the size
    bound: then the new rule must do the same for reverse mode."""
    mode = p["closed_over"]
    size = sum(int(np.prod(a.shape)) for a in c_avals if is_inexact(a))
    if size == 0 or size > p["max_forward_size"]:
        return False
    return mode == "forward" or (mode == "auto" and not p["reverse_ok"])


def _jvp_rule(info: RuleInfo, call, fwd, bwd, transposed, nc: int, nr: int, *,
              consts_linear: bool, use_primal: bool, ct_variants=(),
              memo: dict | None = None, ct_rules=None, as_jaxpr: bool = False,
              columns: dict | None = None) -> Region:
    """The jvp rule ``(c, x, t) -> (y, t_y)`` as a constant-free Region.

    ``t_y = linear_call(callee, transpose)(residuals; t)``.  In the plain case the
    residuals are ``(c, r)``, ``callee = T`` (bwd transposed) and ``transpose = bwd``.
    With ``consts_linear`` the tangents of the closed-over values are linear inputs
    too (callee adds the primal's jvp along them, transpose adds their cotangents
    by forward-mode columns); with ``use_primal`` the callee is the primal's jvp
    instead of ``T``.  Either needs the primal arguments among the residuals.
    ``ct_variants`` ((ct_pattern, bwd), ...): bwd traced for output cotangents that
    are symbolic zeros, the linear_call's transposes for those patterns; ``ct_rules``
    (ct_pattern -> bwd or None): bwd for the other patterns, traced when first used.
    ``as_jaxpr``: the rule as a ClosedJaxpr (a body made when JAX asks for it).
    ``columns``: the forward-mode columns of ``call`` staged so far, shared by every
    body made for one rule (``_forward_const_cotangents``' ``traced``).
    ``bwd`` and the bwds of ``ct_variants`` and ``ct_rules`` may be marked with the
    cotangents the user's bwd returned as symbolic zeros (``rules.marked``): the
    transposes built from them are marked the same, so reverse mode gives JAX a
    symbolic zero there, as the user's bwd did.
    """
    bwd_marked, bwd = bwd, body(bwd)
    import jax

    from ..closure.rules import FORWARD_ONLY_LEVELS, _forward_const_cotangents
    in_avals, y_avals = list(call.in_avals), list(call.out_avals)
    c_avals, x_avals = in_avals[:nc], in_avals[nc:]
    nx, ny = len(x_avals), len(y_avals)
    r_avals = list(bwd.in_avals[nc:nc + nr])
    ct_avals = list(bwd.in_avals[nc + nr:])
    y_inexact = [is_inexact(a) for a in y_avals]
    hot_c = [i for i, a in enumerate(c_avals) if is_inexact(a)] if consts_linear else []
    columns = {} if columns is None else columns
    hot_x = [i for i, a in enumerate(x_avals) if is_inexact(a)]
    tc_avals = [c_avals[i] for i in hot_c]
    tx_avals = [x_avals[i] for i in hot_x]
    keep_x = consts_linear or use_primal
    res_avals = [*c_avals, *(x_avals if keep_x else []), *r_avals]
    n_res = len(res_avals)

    def split_res(res):
        c = res[:nc]
        x = res[nc:nc + nx] if keep_x else ()
        return c, x, res[len(res) - nr:]

    def primal_jvp(c, x, hot, tangents, along_consts: bool):
        def f(*hv):
            cc, xx = list(c), list(x)
            for i, v in zip(hot, hv):
                (cc if along_consts else xx)[i] = v
            return run(call, *cc, *xx)
        base = c if along_consts else x
        _, t_out = jax.jvp(f, tuple(base[i] for i in hot), tuple(tangents))
        return [t for t, inexact in zip(t_out, y_inexact) if inexact]

    def callee(*ops):
        c, x, r = split_res(ops[:n_res])
        tc, tx = ops[n_res:n_res + len(hot_c)], ops[n_res + len(hot_c):]
        parts = []
        if tx:
            parts.append(primal_jvp(c, x, hot_x, tx, False) if use_primal
                         else run(transposed, *c, *r, *tx))
        if tc:
            parts.append(primal_jvp(c, x, hot_c, tc, True))
        return [sum(ts[1:], ts[0]) for ts in zip(*parts)]

    def transpose_of(rule_bwd, ct_pattern, allow_consts: bool = False):
        """The linear_call's transpose for ``rule_bwd`` (marked like it)."""
        zeros = symbolic_outputs(rule_bwd)
        if not keep_x:
            return rule_bwd  # exactly (c, r; ct_y)
        closed = _closed(transpose_by(body(rule_bwd), ct_pattern), [*res_avals, *ct_avals],
                         f"{info.name}_cotangent", allow_consts=allow_consts)
        # The closed-over values' cotangents come first: never symbolic.
        return marked(closed, (False,) * len(hot_c) + zeros if zeros else ())

    def transpose_by(rule_bwd, ct_pattern):
        def transpose(*ops):
            c, x, r = split_res(ops[:n_res])
            ct = ops[n_res:]
            ct_x = run(rule_bwd, *c, *r, *ct)
            if not hot_c:
                return list(ct_x)
            # Outputs whose cotangent is a symbolic zero add nothing (no forward column).
            nonzero = iter(v if nz else None for v, nz in zip(ct, ct_pattern))
            cts = [next(nonzero) if inexact else None for inexact in y_inexact]
            # Staged into the program: first-order (savable) forward-mode columns.
            ct_c = _forward_const_cotangents(call, list(c), list(x), hot_c, cts, y_avals,
                                             levels=FORWARD_ONLY_LEVELS, traced=columns)
            return [*ct_c, *ct_x]
        return transpose

    rule = None
    if ct_avals and (tx_avals or tc_avals):
        full = (True,) * len(ct_avals)
        if keep_x:
            callee_c = _closed(callee, [*res_avals, *tc_avals, *tx_avals], f"{info.name}_tangent")
        else:
            callee_c = transposed  # exactly (c, r; t_x)
        transpose_c = transpose_of(bwd_marked, full)
        t_variants = tuple((ct, transpose_of(b, ct)) for ct, b in ct_variants)
        t_rules = None
        if ct_rules is not None:
            def make_transpose(ct):
                b = ct_rules(ct)
                return b if b is None else transpose_of(b, ct, allow_consts=True)
            t_rules = PatternRules(make_transpose, n_res)
        rule = LinearRule(info=info, callee=callee_c, transpose=transpose_c, num_res=n_res,
                          transpose_variants=t_variants, pattern_rules=t_rules)
    y_t_avals = [a for a in y_avals if is_inexact(a)]

    def jvp(*ops):
        c, x = ops[:nc], ops[nc:nc + nx]
        t = ops[nc + nx:]
        outs = run(fwd, *c, *x)
        y, r = outs[:ny], outs[ny:]
        if rule is None:
            # Typed like the outputs (inside shard_map: their varying manual axes).
            t_y = [jx.zeros_of_type(a.to_tangent_aval()) for a in y_t_avals]
        else:
            t_y = bind_linear_rule(rule, [*c, *(x if keep_x else ()), *r, *t])
        return [*y, *t_y]

    if as_jaxpr:  # a body made late may hold concrete constants (see PatternRules)
        return _closed(jvp, [*c_avals, *x_avals, *tc_avals, *tx_avals], f"{info.name}_jvp",
                       allow_consts=True)
    closed = _closed(jvp, [*c_avals, *x_avals, *tc_avals, *tx_avals],
                     f"the jvp rule of '{info.name}'")
    return region_from_closed_jaxpr(closed, memo=memo)


def _closed(fn, avals, name, allow_consts: bool = False):
    jaxpr, consts, _ = jx.trace_flat(fn, avals, name)
    if not consts:
        return jx.ClosedJaxpr(jaxpr, [])
    # Array literals of the bodies (a Runge-Kutta tableau) the trace picked up as
    # constants: literals again.
    inlined = jx.inline_host_consts(jaxpr, consts)
    if inlined is not None:
        return jx.ClosedJaxpr(inlined, [])
    if allow_consts:  # values of a body made late: its constants
        return jx.ClosedJaxpr(_pe_bind_consts(jaxpr, len(consts)), list(consts))
    raise RuntimeError(f"vjp-to-jvp: {name} captured {len(consts)} constants")


# ------------------------------------------------------ forward mode by default
# jaxpr_cc.jit and Program calls give every custom_vjp a forward mode: each call
# is evaluated as a custom_jvp whose jvp is the call's rule rewritten by this pass
# (reverse-only rules refuse forward mode in one line; a rule the pass cannot
# rewrite for any other reason keeps the user's custom_vjp semantics), built when
# JAX first differentiates the call (``forward_mode_jaxpr``).  Reverse mode still
# runs the user's bwd: the custom_jvp's tangent is a linear_call whose transpose
# is bwd.
FORWARD_MODE_PIPELINE = "vjp-to-jvp{on-failure=keep}"


def has_custom_vjp(program) -> bool:
    """Does ``program`` (any region) contain a custom_vjp call?"""
    return any(eqn.prim.name == "custom_vjp_call" for _, eqn in program.body.walk())


def with_forward_mode(program):
    """``program`` with forward mode through its custom_vjp rules: a rewritten
    copy, or ``program`` itself when it has no custom_vjp call."""
    if not has_custom_vjp(program):
        return program
    from .manager import run_passes
    # A rewrite builds jvp bodies from fwd and bwd bodies; those of a recursive rule
    # hold calls the run has already passed, so a second run rewrites those.
    once = run_passes(program, FORWARD_MODE_PIPELINE)
    return run_passes(once, FORWARD_MODE_PIPELINE) if has_custom_vjp(once) else once


def forward_mode_jaxpr(program):
    """``program.to_jaxpr()`` with forward mode through its custom_vjp rules, each
    rewritten as ``with_forward_mode`` does when JAX first differentiates it
    (``ir_rules.forward_mode_on_demand``): a rule that is only evaluated costs
    nothing (a diffrax adjoint's rewrite stages a vmapped jvp of its backward
    solve).  Kept on the program while its equations are the same objects (a
    pass that changes it in place rebuilds)."""
    stamp = tuple((id(eqn), id(eqn.params)) for _, eqn in program.body.walk())
    kept = program.__dict__.get("_jaxpr_cc_forward_mode")
    if kept is not None and kept[0] == stamp:
        return kept[1]
    if not has_custom_vjp(program):
        closed = program.to_jaxpr()
    else:
        with forward_mode_on_demand(_rewritten_rule):
            closed = program.to_jaxpr()
    program.__dict__["_jaxpr_cc_forward_mode"] = (stamp, closed)
    return closed


def _rewritten_rule(params: dict, in_avals: list, consts_perturbed: bool = True):
    """The custom_vjp rule ``params`` as ``with_forward_mode`` rewrites it, as a
    ``jax.custom_jvp`` function of its operands; None when the rewrite keeps it.
    A rule kept because its policy refuses derivatives along its closed-over
    values (``_consts_refused_in_reverse``) is rewritten for calls that perturb
    none of them (``consts_perturbed`` False): that policy then never applies."""
    from ..closure.ir_rules import _rule_from_params
    from ..closure.rules import build_custom_jvp
    if not consts_perturbed and _consts_refused_in_reverse(params):
        params = dict(params, max_forward_size=sys.maxsize)
    region = Region()
    ins = [region.add_input(a) for a in in_avals]
    outs = [Value(v.aval) for v in params["call_jaxpr"].outvars]
    region.append(Equation(jx.custom_vjp_call_p, ins, outs, dict(params)))
    region.set_outvars(outs)
    program = _flat_program(region, params.get("name", "rule"))
    (eqn,) = with_forward_mode(program).body.equations
    if eqn.prim.name != "custom_jvp_call":
        return None
    return build_custom_jvp(_rule_from_params("custom_jvp_call", eqn.params,
                                              region_to_closed_jaxpr))


def _late_with_forward_mode(closed):
    """``closed`` (a rule body, maybe marked: ``rules.marked``), traced when JAX first
    gave its pattern (``PatternRules``), with forward mode through the custom_vjp
    rules it calls: the bodies traced up front got it from the pass itself (it
    rewrites the rules inside a rule's bodies first), these come too late for it."""
    plain = body(closed)
    if plain.consts or not jx.calls_primitive(plain.jaxpr, "custom_vjp_call"):
        return closed
    if forward_mode_is_made_as_regions():  # for a saved program: rewritten now
        rewritten = forward_mode_region(region_from_closed_jaxpr(plain),
                                        "vjp-to-jvp{on-failure=keep}")
        out = plain if rewritten is None else region_to_closed_jaxpr(rewritten)
        return marked(out, symbolic_outputs(closed))
    # On demand, as a called Program's rules (``forward_mode_jaxpr``): the body is
    # made while JAX differentiates the outer rule, often in reverse mode, which
    # never runs these rules' forward mode.
    with forward_mode_on_demand(_rewritten_rule):
        out = region_to_closed_jaxpr(region_from_closed_jaxpr(plain))
    return marked(out, symbolic_outputs(closed))


def forward_mode_region(call, pipeline: str | None = None):
    """``call`` with forward mode through the custom_vjp rules it calls (a rewritten
    copy), or None when it calls none.  ``pipeline``: the rewrite (default: a rule
    whose bwd cannot be transposed takes its tangent from its own primal)."""
    from .manager import run_passes
    program = _flat_program(call, "primal")
    if not has_custom_vjp(program):
        return None
    # As the Program's own rewrite does for a primal whose forward columns are formed
    # (vjp_to_jvp's ``primal_differentiated``): a rule whose bwd cannot be transposed
    # takes its tangent from its own primal, since refusing would fail reverse mode.
    for _ in range(2):  # a recursive rule's bodies hold calls a first run has passed
        program = run_passes(program, pipeline or _FORWARD_PRIMAL_PIPELINE)
        if not has_custom_vjp(program):
            break
    return program.body


_FORWARD_PRIMAL_PIPELINE = "vjp-to-jvp{on-failure=keep untransposable=primal}"


def _flat_program(region: Region, name: str):
    """``region`` as a Program taking and returning flat positional values."""
    from jax import tree_util

    from ..ir.program import Program
    return Program(region, tree_util.tree_structure((tuple(range(len(region.invars))), {})),
                   tree_util.tree_structure(list(range(len(region.outvars)))), name=name)


def body_with_forward_mode(closed):
    """A rule body (``forward_only``'s call, differentiated in forward mode by its
    own jvp) with forward mode through every custom_vjp it calls: those JAX staged
    (a bwd's own ``jax.vjp`` of an update that calls another solver) made
    first-order first, then all given their forward mode on demand."""
    from ..frontend.staged_rules import convert_program
    plain = body(closed)
    if not jx.calls_primitive(plain.jaxpr, "custom_vjp_call"):
        return plain
    program = _flat_program(region_from_closed_jaxpr(plain), "forward_only")
    convert_program(program)
    with forward_mode_on_demand(_rewritten_rule):
        return region_to_closed_jaxpr(program.body)

