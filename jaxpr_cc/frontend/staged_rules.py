"""Materialize custom rules that are still JAX thunks (the ``closure-convert`` pass).

Programs built from a raw ``ClosedJaxpr`` (``jax.make_jaxpr``) carry JAX's staged
rules: a fwd thunk, a bwd callable, a jvp thunk, a transpose thunk.  This pass calls
them now, at the equation's argument types, and stores the results as first-order
rules.  Rules that closed over tracers of a trace that has ended cannot be traced
any more: that is reported in one line naming the rule's function and source line,
with the fix (trace with ``jaxpr_cc.trace``, which materializes rules while the
trace is live).
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any

import jax
import numpy as np
from jax import tree_util

from .. import jax_adapter as jx
from ..closure import naming
from ..closure.errors import ClosureConversionError
from ..closure.ir_rules import FIRST_ORDER_KEYS, SYMBOLIC_ZERO_OUTPUTS, is_first_order_custom
from ..closure.rules import (FORWARD_ONLY_LEVELS, PatternRules, RuleInfo, forward_only, run,
                             forward_only_avals, forward_only_target, is_inexact, marked)
from ..closure.session import (_dedupe, _insert_inputs, _rule_error, _variant_patterns,
                               _with_consts, session)
from ..ir.clone import clone_function
from ..ir.constant_supply import supply_constant
from ..ir.equation import Equation
from ..ir.program_services import region_to_closed_jaxpr
from ..ir.region import Region
from ..ir.structural_key import KeyMaker
from ..ir.value import Value, is_literal
from .from_jaxpr import region_from_closed_jaxpr


def convert_program(program, *, closed_over: str = "auto", max_forward_size: int = 4096,
                    stats: dict | None = None):
    """Make every custom rule of ``program`` first-order, in place; returns it."""
    count = 0
    with session(closed_over=closed_over, max_forward_size=max_forward_size):
        # Converting a rule traces it, and what it traces may hold JAX-form rules of
        # its own (e.g. a jitted helper whose jaxpr JAX cached before this session):
        # repeat until none is left.  Rules traced in the session are first-order at
        # once (recursion included), so each round only meets rules JAX staged earlier.
        done: dict[int, Any] = {}  # id -> the equation, kept alive so ids are not reused
        # A rule JAX staged from one of ours by a transformation (vmap of a custom_jvp
        # whose jvp calls itself, as optimistix's ``_asarray``) stages the same
        # transformed rule again inside its converted body: that inner equation is a
        # call of the rule being converted (recursion), found by its key.
        keys, converted = _RuleKeyMaker(), {}
        # Anything else that stages a JAX-form rule at every level (a library's own
        # re-binding) would go on forever: after a few rounds what is left keeps JAX's
        # form, as the program's own rules would under JAX.
        for _ in range(_MAX_ROUNDS):
            pending = [(region, eqn, enclosing)
                       for region, enclosing in _regions_with_enclosing(program.body)
                       for eqn in region.equations
                       if eqn.prim.name in FIRST_ORDER_KEYS
                       and not is_first_order_custom(eqn.prim.name, eqn.params)]
            if not pending:
                break
            for region, eqn, enclosing in pending:
                if done.get(id(eqn)) is eqn:
                    raise ClosureConversionError(
                        f"{eqn.prim.name}: converting its rule left it in JAX's form")
                done[id(eqn)] = eqn
                if not eqn.inputs and not eqn.outputs and not eqn.effects:
                    # A custom rule call of nothing (JAX's partial evaluation of a
                    # scan body under grad leaves one behind, its fwd still taking
                    # the original operands): it computes nothing, and its rule
                    # cannot be traced.
                    region.erase(eqn)
                    continue
                key = _recursion_key(eqn, keys)
                known = converted.get(key) if key is not None else None
                if known is not None:
                    _call_converted(program.body, region, eqn, *known)
                else:
                    # JAX traces a rule staged inside a shard_map body (a vmapped
                    # custom_vjp's fwd thunk and bwd) in the body's axis context:
                    # outside it, the rule's pvary of closed-over constants names
                    # an unbound axis.
                    with contextlib.ExitStack() as stack:
                        for prim_name, params in enclosing:
                            stack.enter_context(jx.region_trace_context(prim_name, params))
                        made = _CONVERTERS[eqn.prim.name](program.body, region, eqn, closed_over,
                                                          max_forward_size)
                    if key is not None and made is not None:
                        converted[key] = made
                count += 1
    if stats is not None:
        stats["rules-materialized"] = stats.get("rules-materialized", 0) + count
    return program


_MAX_ROUNDS = 5


def _regions_with_enclosing(body: Region):
    """Every region reachable from ``body``, each once (pre-order, as
    ``Region.regions``), with the (primitive name, params) of the equations whose
    regions enclose it on the first path found, outermost first."""
    seen = {id(body)}
    stack = [(body, ())]
    while stack:
        region, enclosing = stack.pop()
        yield region, enclosing
        found = []
        for eqn in region.equations:
            for _, _, sub in eqn.regions():
                if id(sub) not in seen:
                    seen.add(id(sub))
                    found.append((sub, (*enclosing, (eqn.prim.name, eqn.params))))
        stack.extend(reversed(found))
# The staged rule callable of each JAX-form custom equation.
_RULE_CALLABLE = {"custom_jvp_call": "jvp_jaxpr_fun", "custom_vjp_call": "bwd"}


class _RuleKeyMaker(KeyMaker):
    """Structural keys in which a JAX-form custom equation nested in a body stands for
    its rule (as ``_recursion_key`` keys the equation itself), not for the staged
    thunks JAX made afresh at each re-binding.  Without this, a vmapped custom_vjp
    whose fwd calls itself (and whose body holds a vmapped custom_jvp) gives a new
    key at every level of the recursion, so each level is converted again, and each
    symbolic-zeros variant of each level stages one more: the work grows as
    (variants + 1) ** rounds."""

    def params(self, params: dict) -> tuple:
        attr = next((a for a in _RULE_CALLABLE.values() if a in params), None)
        if attr is None or "call_jaxpr" not in params:
            return super().params(params)
        root = jx.find_tagged_function(params[attr], "_jaxpr_cc_rule")
        rule = root._jaxpr_cc_rule if root is not None else _Same(params[attr])
        # The fwd thunk and out_trees come from the same rule: left out, as in
        # ``_recursion_key``.
        rest = {k: v for k, v in params.items()
                if k not in (attr, "fwd_jaxpr_thunk", "out_trees")}
        return (("rule", attr, rule), *super().params(rest))


def _recursion_key(eqn: Equation, keys: KeyMaker):
    """Equal for two JAX-form equations staged from the same rule of ours by the same
    transformation, or holding the same staged rule callable: same rule, primal
    body, operand types and flags.  None for equations with no rule callable."""
    name = eqn.prim.name
    attr = _RULE_CALLABLE.get(name)
    if attr is None:
        return None
    p = eqn.params
    root = jx.find_tagged_function(p[attr], "_jaxpr_cc_rule")
    # Not ours: the very same staged callable (a jitted function's cached jaxpr met
    # again inside the rule it holds, as jnp.linalg.slogdet's jvp calls slogdet) is
    # the same rule; another callable may close over other values.
    rule = root._jaxpr_cc_rule if root is not None else _Same(p[attr])
    return (name, rule, keys.region(p["call_jaxpr"]),
            tuple(a.aval for a in eqn.inputs), tuple(v.aval for v in eqn.outputs),
            p["num_consts"], bool(p.get("symbolic_zeros", False)))


class _Same:
    """Equal only to a wrapper of the same object (which it keeps alive)."""
    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __hash__(self):
        return id(self.obj)

    def __eq__(self, other):
        return isinstance(other, _Same) and other.obj is self.obj


def _call_converted(body: Region, region: Region, eqn: Equation, params: dict,
                    extra: list) -> None:
    """``eqn`` becomes a call of an equation already converted (its params: shared
    regions), with the values that conversion closed over as constants here."""
    # The converted operands: (jax consts, lifted arguments, extra, args).
    nc = params["num_consts"] - len(extra)
    ops = list(eqn.inputs)
    _replace_equation(region, eqn, ops[:nc] + _new_consts(body, region, extra) + ops[nc:],
                      params)


def _fail(kind: str, fn: Any, err: Exception) -> ClosureConversionError:
    msg = " ".join(str(err).split())
    first = msg.split(". ")[0][:200]
    return ClosureConversionError(
        f"custom_{kind} rule '{naming.name_of(fn)}' ({naming.source_of(fn)}) cannot be "
        f"materialized: it closes over a value of a trace that has ended ({type(err).__name__}: "
        f"{first}); a JAX transformation inside the function (jax.vjp, jvp, vmap) staged it "
        f"with a value of its own: pass that value to the custom function as an argument "
        f"(for a program made from a jaxpr, tracing the function with jaxpr_cc.trace "
        f"materializes rules while the trace is live)")


def _trace(kind, fn_for_errors, f, avals, label):
    try:
        return jx.trace_flat(f, avals, label)
    except (jx.UnexpectedTracerError, jax.errors.UnexpectedTracerError) as e:
        raise _fail(kind, fn_for_errors, e) from None


def _new_consts(body: Region, region: Region, values: list) -> list[Value]:
    """Operands in ``region`` for values a rule closed over (concrete arrays).  Inside
    a rule body they come from constants of ``body`` through the closed-over
    operands of the rules on the way (rule regions stay constant-free, so they can
    be rebuilt for forward mode); elsewhere they are constants of ``region``
    (hoist-consts moves nested ones out)."""
    return [supply_constant(body, region, v, jx.typeof(v)) for v in values]


def _check_concrete(kind, fn, values):
    for v in values:
        if isinstance(v, jx.Tracer):
            raise _fail(kind, fn, jx.UnexpectedTracerError("a tracer of an ended trace"))


def _convert_vjp(body: Region, region: Region, eqn: Equation, closed_over: str,
                 max_forward_size: int):
    p = eqn.params
    nc = p["num_consts"]
    call_region: Region = p["call_jaxpr"]
    ops = list(eqn.inputs)
    arg_avals = [a.aval for a in ops[nc:]]
    thunk, bwd_fn = p["fwd_jaxpr_thunk"], p["bwd"]
    # A custom_vjp JAX re-bound from a staged call (``jax.vjp`` inside a rule) takes
    # the values the original rule's primal closed over as its leading arguments, and
    # its fwd refuses to perturb them (CustomVJPException).  Those ``lifted``
    # arguments join the rule's closed-over group: their derivative is formed as for
    # any closed-over value (docs/closure.md), where JAX raises.
    lifted = 0
    n_out = len(eqn.outputs)
    out_avals = [v.aval for v in eqn.outputs]
    ct_avals = [jx.to_cotangent_aval(a) for a in out_avals]

    def trace_fwd(perturbed):
        """The staged fwd as JAX runs it with ``perturbed`` arguments: (fwd_consts,
        f_j, f_c, res_avals).  JAX's bwd then reads the residual layout of this call."""
        try:
            fwd_jaxpr, fwd_consts = jx.call_fwd_jaxpr_thunk(thunk, [False] * lifted
                                                            + list(perturbed))
        except (jx.UnexpectedTracerError, jax.errors.UnexpectedTracerError) as e:
            raise _fail("vjp", bwd_fn, e) from None
        _check_concrete("vjp", bwd_fn, fwd_consts)
        # Forwarded inputs (residuals that are arguments) count the primal's consts.
        input_fwds = [f if f is None else f - nc for f in p["out_trees"]()[2]]
        fwd_open = _with_consts(jx.Jaxpr(fwd_jaxpr.constvars, fwd_jaxpr.invars,
                                         fwd_jaxpr.outvars, fwd_jaxpr.eqns, fwd_jaxpr.effects,
                                         fwd_jaxpr.debug_info)
                                if not fwd_jaxpr.constvars else _consts_first(fwd_jaxpr),
                                list(fwd_consts), list(fwd_consts))
        n_pruned = len(fwd_jaxpr.outvars) - n_out
        pruned_avals = [v.aval for v in fwd_jaxpr.outvars[:n_pruned]]
        # Full residual list: forwarded inputs are residuals too.
        res_avals, it = [], iter(pruned_avals)
        for f in input_fwds:
            res_avals.append(arg_avals[f] if f is not None else next(it))

        def fwd_dense(*xs):
            n_fc = len(fwd_consts)
            outs = jx.eval_jaxpr(fwd_open, [], *xs[:n_fc], *xs[n_fc:])
            pruned, y = outs[:n_pruned], outs[n_pruned:]
            it2 = iter(pruned)
            res = [xs[n_fc + f] if f is not None else next(it2) for f in input_fwds]
            return [*y, *res]

        f_j, f_c, _ = _trace("vjp", bwd_fn, fwd_dense,
                             [jx.typeof(c) for c in fwd_consts] + arg_avals, "custom_vjp fwd")
        return list(fwd_consts), f_j, list(f_c), res_avals

    def trace_bwd(res_avals, ct_pattern=None):
        """JAX's bwd on dense cotangents, or (``ct_pattern``, over the inexact
        outputs) with SymbolicZero for the outputs it marks False: ``(b_j, b_c,
        zeros)``, ``zeros`` marking the cotangents of the arguments the user's bwd
        returned as symbolic zeros."""
        store: dict = {}

        def bwd_dense(*xs):
            res, it3 = xs[:len(res_avals)], iter(xs[len(res_avals):])
            nonzero = iter(ct_pattern) if ct_pattern is not None else None
            cts = []
            for a, ct in zip(out_avals, ct_avals):
                if not is_inexact(a):
                    # An integer or bool output's cotangent: SymbolicZero for a
                    # symbolic-zeros bwd, as JAX gives it; float0 zeros otherwise.
                    cts.append(jx.symbolic_zero(ct) if p.get("symbolic_zeros", False)
                               else np.zeros(ct.shape, jax.dtypes.float0))
                    continue
                value = next(it3)
                cts.append(value if nonzero is None or next(nonzero)
                           else jx.symbolic_zero(ct))
            got = jx.call_wrapped(bwd_fn, *res, *cts)
            # JAX's bwd gives cotangents for the arguments, lifted ones included (as
            # symbolic zeros, dropped here), and none for the primal's own consts.
            assert len(got) == len(arg_avals), (len(got), len(arg_avals))
            got = list(zip(got[lifted:], arg_avals[lifted:]))
            store["zeros"] = tuple(jx.is_symbolic_zero(g) for g, a in got if is_inexact(a))
            return [jx.instantiate_zero(g, a.to_ct_aval()) for g, a in got if is_inexact(a)]

        b_j, b_c, _ = _trace("vjp", bwd_fn, bwd_dense,
                             res_avals + [a for a, o in zip(ct_avals, out_avals) if is_inexact(o)],
                             "custom_vjp bwd")
        _check_concrete("vjp", bwd_fn, b_c)
        return b_j, list(b_c), store["zeros"]

    # JAX perturbs only the inexact arguments it differentiates (integers never).
    # A rule whose other patterns read a value of a trace that has ended (a vmapped
    # rule closing over a batched value) is traced for the arguments the program
    # can perturb: its constants and literals never are.
    movable = [is_inexact(a) and not _is_constant(region, x)
               for x, a in zip(ops[nc:], arg_avals)]
    while True:
        try:
            tried = [[is_inexact(a) for a in arg_avals[lifted:]]]
            for flags in [movable[lifted:], *_materialized_patterns(bwd_fn, arg_avals[lifted:])]:
                if flags not in tried:
                    tried.append(flags)
            for k, flags in enumerate(tried):
                try:
                    fwd_consts, f_j, f_c, res_avals = trace_fwd(flags)
                    break
                except ClosureConversionError:
                    if k == len(tried) - 1:
                        raise
            break
        except jx.CustomVJPException:
            lifted = next((i + 1 for i in range(lifted, len(arg_avals))
                           if is_inexact(arg_avals[i])), None)
            if lifted is None:
                raise
    b_j, b_c, b_zeros = trace_bwd(res_avals)
    formal_avals = arg_avals[lifted:]  # the arguments a pattern speaks of
    main = (fwd_consts, f_j, f_c, len(res_avals), b_j, b_c, b_zeros)
    fwd_variants, bwd_variants = [], []
    trace_for = None
    if p.get("symbolic_zeros", False):
        fwd_variants, bwd_variants = _staged_vjp_variants(
            formal_avals, out_avals, res_avals, trace_fwd, trace_bwd)
        inexact = [i for i, a in enumerate(formal_avals) if is_inexact(a)]

        def trace_for(key):
            """The staged rules for a pattern no variant lists, when JAX first gives
            it: ("fwd", pattern) -> (fwd_consts, f_j, f_c, num_res), or None when the
            rule refuses the pattern (the main rule runs, as for the variants);
            ("bwd", pattern, ct_pattern) -> (b_j, b_c, zeros), right after that pattern's
            fwd (JAX's bwd reads the residual layout of the last fwd traced)."""
            flags = [False] * len(formal_avals)
            for i, q in zip(inexact, key[1]):
                flags[i] = q
            if key[0] == "fwd":
                try:
                    v_fc, v_j, v_c, v_res = trace_fwd(flags)
                except Exception:  # noqa: BLE001 -- a pattern the rule refuses
                    return None
                return v_fc, v_j, v_c, len(v_res)
            _, _, _, v_res = trace_fwd(flags)
            ct = key[2]
            return trace_bwd(v_res, None if all(ct) else ct)
    return _finish_vjp(body, region, eqn, closed_over, max_forward_size, nc, lifted,
                       call_region, main, bwd_fn, fwd_variants, bwd_variants, trace_for)


def _materialized_patterns(bwd_fn, formal_avals) -> list[list[bool]]:
    """For a custom_vjp JAX re-bound from one of our rules (a vmapped call): the
    patterns of perturbed arguments that rule was traced for when the program was
    (its main pattern and its variants), as flags over ``formal_avals`` (its
    closed-over values, then its arguments).  Another pattern is traced when
    first given, from the user's rules -- which a rule closing over a value of a
    vmap inside the program cannot be once that vmap has ended."""
    root = jx.find_tagged_function(bwd_fn, "_jaxpr_cc_rule")
    rule = getattr(root, "_jaxpr_cc_rule", None)
    made = getattr(rule, "pattern_rules", None)
    if made is None or made.main is None or rule.num_consts > len(formal_avals):
        return []
    nc = rule.num_consts
    consts = [is_inexact(a) for a in formal_avals[:nc]]
    inexact = [i for i, a in enumerate(formal_avals[nc:]) if is_inexact(a)]
    out = []
    for family in [made.main, *(pattern for pattern, _, _ in rule.fwd_variants)]:
        if len(family) != len(inexact):
            continue
        flags = [False] * (len(formal_avals) - nc)
        for i, q in zip(inexact, family):
            flags[i] = q
        out.append(consts + flags)
    return out


def _staged_vjp_variants(arg_avals, out_avals, res_avals, trace_fwd, trace_bwd):
    """A staged symbolic-zeros custom_vjp (one JAX's batching rule re-bound) traced
    per perturbation pattern, as ``jaxpr_cc.trace`` does the user's own calls
    (docs/closure.md): fwd per pattern of perturbed inexact arguments, bwd per
    (that pattern, pattern of nonzero output cotangents).  A pattern the rules raise
    for is left out (the main rule runs for it).  Returns ``([(pattern, fwd_consts,
    f_j, f_c, num_res)], [(family, ct_pattern, b_j, b_c, zeros)])``."""
    from ..closure.session import _MAX_VJP_VARIANTS, _cotangent_patterns
    inexact = [i for i, a in enumerate(arg_avals) if is_inexact(a)]
    in_patterns = _variant_patterns(arg_avals, [is_inexact(a) for a in arg_avals])
    n_ct = sum(1 for a in out_avals if is_inexact(a))
    ct_patterns = _cotangent_patterns(n_ct, _MAX_VJP_VARIANTS // (1 + len(in_patterns)) - 1)
    full_ct = (True,) * n_ct
    fwd_variants, bwd_variants = [], []

    def ct_variants(family, v_res):
        for ct_pattern in ct_patterns:
            try:
                b_j, b_c, zeros = trace_bwd(v_res, ct_pattern)
            except Exception:  # noqa: BLE001 -- a pattern the rule refuses
                continue
            bwd_variants.append((family, ct_pattern, b_j, b_c, zeros))

    # JAX's bwd reads the residual layout of the last fwd JAX traced, and its fwd
    # thunk traces each pattern once (memoized): so each pattern's bwds are traced
    # right after its fwd, the main pattern's (traced last) first.
    ct_variants((), res_avals)
    for pattern in in_patterns:
        flags = [False] * len(arg_avals)
        for i, q in zip(inexact, pattern):
            flags[i] = q
        try:
            fwd_consts, f_j, f_c, v_res = trace_fwd(flags)
            b_j, b_c, zeros = trace_bwd(v_res)
        except Exception:  # noqa: BLE001 -- a pattern the rule refuses: the main rule
            continue
        fwd_variants.append((pattern, fwd_consts, f_j, f_c, len(v_res)))
        bwd_variants.append((pattern, full_ct, b_j, b_c, zeros))
        ct_variants(pattern, v_res)
    return fwd_variants, bwd_variants


def _is_constant(region: Region, operand) -> bool:
    """A literal or one of ``region``'s constants: no input of the program moves it."""
    return is_literal(operand) or operand in region.constvars


def _consts_first(jaxpr):
    return jx.Jaxpr([], list(jaxpr.constvars) + list(jaxpr.invars), jaxpr.outvars, jaxpr.eqns,
                    jaxpr.effects, jx.fit_debug_info(jaxpr.debug_info,
                                                     len(jaxpr.constvars) + len(jaxpr.invars),
                                                     len(jaxpr.outvars)))


def _finish_vjp(body, region, eqn, closed_over, max_forward_size, nc, lifted, call_region,
                main, bwd_fn, fwd_variants=(), bwd_variants=(), trace_for=None):
    """Assemble the first-order equation: operands (jax consts, lifted arguments, new
    consts, args).  ``main``: (fwd_consts, f_j, f_c, num_res, b_j, b_c, b_zeros); the
    variants as ``_staged_vjp_variants`` returns them."""
    fwd_consts, f_j, f_c, num_res, b_j, b_c, b_zeros = main
    ops = list(eqn.inputs)
    nc += lifted
    jax_consts, args = ops[:nc], ops[nc:]
    # fwd_dense takes (fwd_consts, args) plus its own trace consts f_c; bwd takes (res, ct) + b_c.
    extra = _dedupe(list(fwd_consts) + list(f_c) + list(b_c)
                    + [c for _, v_fc, _, v_c, _ in fwd_variants for c in (*v_fc, *v_c)]
                    + [c for _, _, _, v_c, _ in bwd_variants for c in v_c])
    new_vals = _new_consts(body, region, extra)
    n_new = len(extra)
    # call: (jax_consts, args) -> y      ==> (jax_consts, extra, args) -> y
    call = _with_inputs(call_region, nc, [jx.typeof(v) for v in extra])

    def fwd_of(f_j, fwd_consts, f_c):
        # fwd: (f_c, fwd_consts, args) -> (y, r)    ==> (jax_consts, extra, args)
        return _rebase(f_j, list(f_c) + list(fwd_consts), jax_consts, extra,
                       lead=len(fwd_consts) + len(f_c), own=lifted)

    def bwd_of(b_j, b_c):
        return _rebase(b_j, list(b_c), jax_consts, extra, lead=len(b_c))

    info = RuleInfo(name=naming.name_of(bwd_fn), source=naming.source_of(bwd_fn),
                    const_names=tuple(f"const{i}" for i in range(nc + n_new)),
                    closed_over=closed_over, max_forward_size=max_forward_size,
                    reverse_ok=not _reaches_while(call))
    memo: dict = {}

    def region_of(jaxpr):
        return region_from_closed_jaxpr(jx.ClosedJaxpr(jaxpr, []), None, memo)

    params = {
        "call_jaxpr": call,
        "fwd_jaxpr": region_of(fwd_of(f_j, fwd_consts, f_c)),
        "bwd_jaxpr": region_of(bwd_of(b_j, b_c)),
        "num_consts": nc + n_new, "num_res": num_res,
        "symbolic_zeros": bool(eqn.params.get("symbolic_zeros", False)),
        "name": info.name, "source": info.source, "const_names": info.const_names,
        "closed_over": closed_over, "max_forward_size": max_forward_size,
        "reverse_ok": info.reverse_ok,
    }
    if fwd_variants:
        params["fwd_variant_patterns"] = tuple((tuple(pattern), int(n))
                                               for pattern, _, _, _, n in fwd_variants)
        params["fwd_variants"] = tuple(region_of(fwd_of(v_j, v_fc, v_c))
                                       for _, v_fc, v_j, v_c, _ in fwd_variants)
    if bwd_variants:
        params["bwd_variant_patterns"] = tuple((tuple(family), tuple(ct))
                                               for family, ct, _, _, _ in bwd_variants)
        params["bwd_variants"] = tuple(region_of(bwd_of(v_j, v_c))
                                       for _, _, v_j, v_c, _ in bwd_variants)
    masks = tuple(tuple(z) for z in [b_zeros, *(v[4] for v in bwd_variants)])
    if any(masks):
        params[SYMBOLIC_ZERO_OUTPUTS] = masks
    if trace_for is not None:
        main_pattern = tuple(is_inexact(v.aval) for v in args if is_inexact(v.aval))

        def make(key):
            if key[0] == "fwd":
                if key[1] == main_pattern:
                    return None
                got = trace_for(key)
                if got is None:
                    return None
                v_fc, v_j, v_c, n_res = got
                return _made(fwd_of(v_j, v_fc, v_c), list(v_c) + list(v_fc), extra), n_res
            v_j, v_c, zeros = trace_for(key)
            return marked(_made(bwd_of(v_j, v_c), list(v_c), extra), zeros)
        params["pattern_rules"] = PatternRules(make, nc + n_new, main_pattern)
    _replace_equation(region, eqn, jax_consts + new_vals + args, params)
    return params, extra


def _made(rebased, lead_values, extra):
    """A jaxpr ``_rebase`` made for a pattern traced when JAX first gave it.  It must
    read only values the equation's operands (``extra``) hold: the operands were fixed
    when the rule was materialized."""
    known = {id(v) for v in extra}
    more = _dedupe([v for v in lead_values if id(v) not in known])
    if not more:
        return jx.ClosedJaxpr(rebased, [])
    raise ClosureConversionError(
        "a custom rule JAX staged reads values for a perturbation pattern that it does not "
        "read otherwise; trace the program with jaxpr_cc.trace, which materializes rules "
        "while the trace is live")


def _rebase(jaxpr, lead_values, jax_consts, extra, *, lead: int, own: int = 0):
    """A jaxpr taking ``lead`` values (identified in ``lead_values``, which may name
    one value twice) and then its own inputs -> one taking (jax_consts, extra, own
    inputs), where the last ``own`` of ``jax_consts`` are its first ``own`` inputs."""
    assert len(lead_values) == lead
    taking_extra = _with_consts(jaxpr, list(lead_values), list(extra))
    extra_vars = taking_extra.invars[:len(extra)]
    rest = taking_extra.invars[len(extra):]
    invars = ([jx.Var(a.aval) for a in jax_consts[:len(jax_consts) - own]] + rest[:own]
              + extra_vars + rest[own:])
    return jx.Jaxpr([], invars, taking_extra.outvars, taking_extra.eqns, jaxpr.effects,
                    jx.fit_debug_info(jaxpr.debug_info, len(invars), len(jaxpr.outvars)))


def _with_inputs(region: Region, position: int, avals) -> Region:
    """``region`` taking unused inputs of ``avals`` at ``position``: itself when there
    are none (a shared function stays shared), else a copy of it alone."""
    if not avals:
        return region
    new = clone_function(region)
    for i, aval in enumerate(avals):
        new.add_input(aval, position=position + i)
    return new


def _reaches_while(region: Region) -> bool:
    """A while loop reachable outside custom-rule equations (reverse-mode AD of the
    primal would fail there)."""
    seen, stack = {id(region)}, [region]
    while stack:
        for eqn in stack.pop().equations:
            if eqn.prim.name == "while":
                return True
            if eqn.prim.name in FIRST_ORDER_KEYS:
                continue
            for _, _, sub in eqn.regions():
                if id(sub) not in seen:
                    seen.add(id(sub))
                    stack.append(sub)
    return False


def _replace_equation(region: Region, eqn: Equation, inputs, params) -> None:
    outs = [Value(v.aval, None, 0, v.name) for v in eqn.outputs]
    new = Equation(eqn.prim, list(inputs), outs, params, eqn.effects, eqn.source_info, eqn.ctx)
    region.insert_before(eqn, new)
    for old, nv in zip(eqn.outputs, outs):
        region.replace_all_uses_with(old, nv)
    region.erase(eqn)


def _convert_forward_only(region: Region, eqn: Equation) -> dict | None:
    """A ``closure.rules.forward_only`` custom_jvp staged in JAX's form, as the
    first-order rule ``forward_only(f, FORWARD_ONLY_LEVELS)``; None when ``eqn`` is
    not one.  Tracing its JAX jvp would stage the next level in JAX's form again,
    each ~14x larger than the last, without end."""
    holder = jx.find_tagged_function(eqn.params["jvp_jaxpr_fun"], "_jaxpr_cc_forward_only")
    if holder is None or eqn.params["num_consts"]:
        return None
    target = forward_only_target(holder)
    avals = [a.aval for a in eqn.inputs]
    batched = _batched_target(target, forward_only_avals(holder), avals,
                              [v.aval for v in eqn.outputs])
    if batched is not None:
        target = batched
    try:
        jaxpr, consts, _ = _trace("jvp", eqn.params["jvp_jaxpr_fun"],
                                  lambda *xs: forward_only(target, FORWARD_ONLY_LEVELS)(*xs),
                                  avals, "forward_only")
    except (TypeError, ValueError):
        # Operands of types ``target`` was not made for (batched by a jax.vmap
        # whose axes could not be read): converted as any custom_jvp staged in
        # JAX's form.
        return None
    made = [e for e in jaxpr.eqns if e.primitive.name == "custom_jvp_call"]
    if consts or len(jaxpr.eqns) != 1 or len(made) != 1:
        return None
    staged = region_from_closed_jaxpr(jx.ClosedJaxpr(jaxpr, []))
    new = next(e for e in staged.equations if e.prim.name == "custom_jvp_call")
    if not is_first_order_custom("custom_jvp_call", new.params):
        return None
    params = dict(new.params)
    _replace_equation(region, eqn, list(eqn.inputs), params)
    return params


def _batched_target(target, unbatched, avals, out_avals):
    """``target`` batched as JAX batched the equation calling it (jax.vmap of the
    function holding a ``forward_only`` rule: batched operands and results carry
    the batch axis first), or None when the operands are ``target``'s own types or
    the batch axes cannot be read.  The rule made of it is ``forward_only`` of the
    batched function: the same function of the same arrays, so every derivative is
    the batched one."""
    if unbatched is None or len(unbatched) != len(avals):
        return None
    in_axes = []
    for a, u in zip(avals, unbatched):
        if a.shape == u.shape and a.dtype == u.dtype:
            in_axes.append(None)
        elif a.shape[1:] == u.shape and a.dtype == u.dtype:
            in_axes.append(0)
        else:
            return None
    if all(axis is None for axis in in_axes):
        return None
    try:
        per_example = jax.eval_shape(lambda *xs: list(target(*xs)),
                                     *[jax.ShapeDtypeStruct(u.shape, u.dtype) for u in unbatched])
    except (TypeError, ValueError):
        return None
    if len(per_example) != len(out_avals):
        return None
    out_axes = []
    for o, u in zip(out_avals, per_example):
        if o.shape == u.shape:
            out_axes.append(None)
        elif o.shape[1:] == u.shape:
            out_axes.append(0)
        else:
            return None

    def batched(*xs):
        return list(jax.vmap(lambda *ys: list(target(*ys)), in_axes=in_axes,
                             out_axes=out_axes)(*xs))
    return batched


def _convert_jvp(body: Region, region: Region, eqn: Equation, closed_over: str,
                 max_forward_size: int):
    if _convert_forward_only(region, eqn) is not None:
        return None
    p = eqn.params
    nc = p["num_consts"]
    ops = list(eqn.inputs)
    jax_consts, args = ops[:nc], ops[nc:]
    arg_avals = [a.aval for a in args]
    out_avals = [v.aval for v in eqn.outputs]
    n_out = len(out_avals)
    jvp_fun = p["jvp_jaxpr_fun"]
    t_avals = [a for a in arg_avals if is_inexact(a)]

    def jvp_dense(*xs, pattern=None, store=None):
        consts_, primals = xs[:nc], xs[nc:nc + len(args)]
        it = iter(xs[nc + len(args):])
        # JAX's thunk takes "tangent is zero" flags for the arguments only, and its
        # jaxpr the arguments and their nonzero tangents: the primal's own consts
        # (values it closes over) reach the rule as the thunk's consts, as in JAX's
        # ``lift_jvp``.  ``pattern``: which inexact arguments are perturbed (all when None).
        del consts_
        hot = iter(pattern) if pattern is not None else None
        perturbed = [is_inexact(a) and (hot is None or next(hot)) for a in arg_avals]
        jvp_jaxpr, jvp_consts, out_zeros = _call_jvp_thunk(jvp_fun, [not q for q in perturbed])
        tangents = [t for t, q in zip([next(it) for a in arg_avals if is_inexact(a)],
                                      [q for q, a in zip(perturbed, arg_avals) if is_inexact(a)])
                    if q]
        outs = jx.eval_jaxpr(jvp_jaxpr, jvp_consts, *primals, *tangents)
        y, t_nz = outs[:n_out], iter(outs[n_out:])
        t = [jax.numpy.zeros(a.shape, a.dtype) if z else next(t_nz)
             for a, z in zip(out_avals, out_zeros)]
        if store is not None:  # which tangents the user's rule returned as symbolic zeros
            store["zeros"] = tuple(z for z, a in zip(out_zeros, out_avals) if is_inexact(a))
        t = [jx.instantiate_zero(ti, a) for ti, a in zip(t, out_avals)]
        return [*y, *[ti for ti, a in zip(t, out_avals) if is_inexact(a)]]

    in_avals = [a.aval for a in jax_consts] + arg_avals + t_avals
    main_store: dict = {}
    try:
        j_j, j_c, _ = _trace("jvp", jvp_fun, functools.partial(jvp_dense, store=main_store),
                             in_avals, "custom_jvp jvp")
    except ClosureConversionError:
        raise
    except Exception as e:  # noqa: BLE001 -- JAX raises only when it differentiates
        # The rule refuses every argument perturbed (forward mode through a
        # custom_vjp it closes over): the primal runs, and the tangents raise JAX's
        # error when evaluated.  Patterns the rule accepts are variants below.
        message = _rule_error("jvp", jvp_fun, e)
        j_j, j_c, _ = _trace("jvp", jvp_fun,
                             functools.partial(_refusing_jvp, p["call_jaxpr"], nc, len(args),
                                               out_avals, message),
                             in_avals, "custom_jvp jvp")
        main_store["zeros"] = tuple(False for a in out_avals if is_inexact(a))
    _check_concrete("jvp", jvp_fun, j_c)
    # A symbolic-zeros rule is traced per perturbation pattern too (docs/closure.md):
    # which arguments JAX perturbs is known only when it differentiates.
    variants = []
    if p.get("symbolic_zeros", False):
        for pattern in _variant_patterns(arg_avals, [is_inexact(a) for a in arg_avals]):
            store: dict = {}
            try:
                v_j, v_c, _ = _trace("jvp", jvp_fun,
                                     functools.partial(jvp_dense, pattern=pattern, store=store),
                                     in_avals, "custom_jvp jvp")
            except Exception:  # noqa: BLE001 -- a pattern the rule refuses: the main rule
                continue
            _check_concrete("jvp", jvp_fun, v_c)
            variants.append((pattern, v_j, list(v_c), store["zeros"]))
    extra = _dedupe(list(j_c) + [c for _, _, v_c, _ in variants for c in v_c])
    new_vals = _new_consts(body, region, extra)
    call = _with_inputs(p["call_jaxpr"], nc, [jx.typeof(v) for v in extra])
    # jvp: (j_c, jax_consts, args, t) -> ... ==> (jax_consts, extra, args, t)
    def rebased(j_j, j_c):
        lead = j_j.invars[:len(j_c)]
        by_id = {id(v): var for v, var in zip(j_c, lead)}
        invars = list(j_j.invars[len(j_c):len(j_c) + nc])
        invars += [by_id.get(id(v)) or jx.Var(jx.typeof(v)) for v in extra]
        invars += list(j_j.invars[len(j_c) + nc:])
        return jx.Jaxpr([], invars, j_j.outvars, j_j.eqns, j_j.effects,
                        jx.fit_debug_info(j_j.debug_info, len(invars), len(j_j.outvars)))
    jvp_j = rebased(j_j, j_c)
    target = jx.wrapped_fun_target(jvp_fun)
    memo: dict = {}
    variant_params = {}
    if variants:
        variant_params = {
            "jvp_variant_patterns": tuple(pattern for pattern, _, _, _ in variants),
            "jvp_variants": tuple(
                region_from_closed_jaxpr(jx.ClosedJaxpr(rebased(v_j, v_c), []), None, memo)
                for _, v_j, v_c, _ in variants)}
    masks = tuple(tuple(z) for z in [main_store["zeros"], *(v[3] for v in variants)])
    if any(masks):
        variant_params[SYMBOLIC_ZERO_OUTPUTS] = masks
    if p.get("symbolic_zeros", False):
        main_pattern = tuple(True for _ in t_avals)

        def make(pattern):
            """The staged rule for a pattern no variant lists, when JAX first gives
            it (None: the rule refuses it, so the main rule runs, as for variants)."""
            if tuple(pattern) == main_pattern:
                return None
            store: dict = {}
            try:
                v_j, v_c, _ = _trace("jvp", jvp_fun,
                                     functools.partial(jvp_dense, pattern=pattern, store=store),
                                     in_avals, "custom_jvp jvp")
            except Exception:  # noqa: BLE001 -- a pattern the rule refuses
                return None
            _check_concrete("jvp", jvp_fun, v_c)
            return marked(_made(rebased(v_j, v_c), list(v_c), extra), store["zeros"])
        variant_params["pattern_rules"] = PatternRules(make, nc + len(extra), main_pattern)
    params = {
        "call_jaxpr": call,
        "jvp_jaxpr": region_from_closed_jaxpr(jx.ClosedJaxpr(jvp_j, []), None, memo),
        "num_consts": nc + len(extra), "symbolic_zeros": bool(p.get("symbolic_zeros", False)),
        "name": naming.name_of(jvp_fun), "source": naming.source_of(jvp_fun),
        "const_names": tuple(f"const{i}" for i in range(nc + len(extra))),
        "closed_over": closed_over, "max_forward_size": max_forward_size,
        "reverse_ok": not _reaches_while(call),
        **variant_params,
    }
    _replace_equation(region, eqn, jax_consts + new_vals + args, params)
    return params, extra


def _refusing_jvp(call_jaxpr, nc: int, n_args: int, out_avals, message: str, *xs):
    """A staged jvp (JAX's consts, arguments, tangents) whose primal outputs are the
    call's and whose tangents raise ``message`` when evaluated."""
    outs = run(region_to_closed_jaxpr(call_jaxpr), *xs[:nc + n_args])
    return [*outs, *jx.refuse_forward_mode(list(xs[nc + n_args:]),
                                           [a for a in out_avals if is_inexact(a)], message)]


def _call_jvp_thunk(jvp_fun, nonzeros):
    """JAX's staged custom_jvp rule: ``jvp_jaxpr_fun(*zero_flags) -> (jaxpr, consts,
    output_zero_flags)``; the jaxpr takes primals then the nonzero tangents."""
    try:
        out = jx.call_wrapped(jvp_fun, *nonzeros)
    except (jx.UnexpectedTracerError, jax.errors.UnexpectedTracerError) as e:
        raise _fail("jvp", jvp_fun, e) from None
    jaxpr, consts, out_zeros = out
    return jaxpr, consts, list(out_zeros)


def _convert_linear(body: Region, region: Region, eqn: Equation, closed_over: str,
                    max_forward_size: int):
    p = eqn.params
    n_cc, n_res = p["num_callee_consts"], p["num_res"]
    thunk = p["transpose_thunk"]
    try:
        t_closed, t_consts = thunk()
    except (jx.UnexpectedTracerError, jax.errors.UnexpectedTracerError) as e:
        raise _fail("linear_call transpose", thunk, e) from None
    _check_concrete("linear_call transpose", thunk, t_consts)
    ops = list(eqn.inputs)
    cc, res, lin = ops[:n_cc], ops[n_cc:n_cc + n_res], ops[n_cc + n_res:]
    new_vals = _new_consts(body, region, list(t_consts))
    callee = _with_inputs(p["callee"], n_cc, [jx.typeof(v) for v in t_consts])
    t_j = _consts_first(t_closed.jaxpr) if t_closed.jaxpr.constvars else t_closed.jaxpr
    t_j = _insert_inputs(t_j, 0, [a.aval for a in cc])
    memo: dict = {}
    params = {
        "callee": callee,
        "transpose_jaxpr": region_from_closed_jaxpr(jx.ClosedJaxpr(t_j, list(t_closed.consts))
                                                    if t_closed.consts else jx.ClosedJaxpr(t_j, []),
                                                    None, memo),
        "num_callee_consts": 0, "num_res": n_cc + len(t_consts) + n_res,
    }
    _replace_equation(region, eqn, cc + new_vals + res + lin, params)


_CONVERTERS = {"custom_vjp_call": _convert_vjp, "custom_jvp_call": _convert_jvp,
               "linear_call": _convert_linear}
del tree_util
