"""Trace-time closure conversion: custom rules are traced while the trace is live.

While a :class:`TraceSession` is active on this thread, calls of ``jax.custom_vjp``
/ ``jax.custom_jvp`` functions and binds of ``linear_call`` are intercepted.  Each
rule (primal, fwd/bwd, jvp, transpose) is traced to a jaxpr at once; the values it
closes over — constants and tracers of the enclosing traces — are lifted to explicit
leading operands; and the call is re-bound through a first-order rule
(``rules.build_*``), which JAX stages as an ordinary custom equation.

Rules are cached by (custom function, a fingerprint of everything its rules and static
arguments can read, argument types, which arguments JAX could perturb), so 1,000
calls of the same function trace its rules once, and a call whose closed-over values
differ traces its own.

A rule whose body calls the same custom function with the same key (the tutorial's
``fixed_point`` calls itself in its fwd; JAX's ``logaddexp`` jvp calls ``logaddexp``)
is recursion: the inner call refers to the rule being traced, so the rule is
materialized once and recursion is a cycle in the program's call graph, not a tower
of copies.  The inner call must pass the rule's closed-over values, which are known
only once its fwd and bwd have been traced; so a recursive rule is traced twice: first
with the inner calls evaluated as the primal (to find what the rules close over),
then with them bound to the rule itself.
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import threading
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax import tree_util
from jax.custom_derivatives import CustomVJPPrimal, SymbolicZero

from .. import jax_adapter as jx
from . import naming
from .errors import ClosureConversionError
from .fingerprint import fingerprint
from .rules import (CLOSED_OVER_MODES, FORWARD_ONLY_LEVELS, JVPRule, LazyJaxpr, LinearRule,
                    PatternRules, RuleInfo, VJPRule, bind_linear_rule, body, build_custom_jvp,
                    build_custom_vjp, forward_only, is_inexact, marked)

_local = threading.local()
# JAX's tracing caches (jit, scan and cond bodies) must not hand a body traced inside
# one session (its rules re-bound with what they read then) to code outside it or to
# another session: each session is part of JAX's cache key.
_JIT_CACHE_CONTEXT = jax.make_user_context(default_value=None)
_SESSION_TOKENS = itertools.count()
_install_lock = threading.Lock()
_installed = False
_originals: dict[str, Any] = {}


def current() -> "TraceSession | None":
    return getattr(_local, "session", None)


class TraceSession:
    def __init__(self, closed_over: str = "auto", max_forward_size: int = 4096):
        if closed_over not in CLOSED_OVER_MODES:
            raise ValueError(f"closed_over must be one of {', '.join(CLOSED_OVER_MODES)}, "
                             f"got {closed_over!r}")
        self.closed_over = closed_over
        self.max_forward_size = int(max_forward_size)
        self.cache_token = next(_SESSION_TOKENS)
        self.cache: dict[Any, Any] = {}
        self.in_progress: dict[Any, _Pending] = {}  # rules being traced, by cache key
        # Rules traced inside another rule's tracing that called that rule back (mutual
        # recursion: A's jvp calls B, B's jvp calls A): they hold the outer rule as it
        # was on that pass (its primal, on the first), so they are not cached; the
        # outer rule's finished bodies hold them traced again against it.
        self.provisional: set = set()
        self.linear_depth = 0  # linear_call transposes being traced
        self.keepalive: list[Any] = []
        self.rules_traced = 0
        self.perturbable = jx.PerturbationOracle()
        # Inside jaxpr_cc.jit (jax.jit's drop-in), JAX's own errors where jaxpr_cc.trace
        # goes beyond JAX: a tracer in a custom_vjp nondiff position.
        self.jax_errors = getattr(_local, "jax_errors", False)
        # Inside jaxpr_cc.jit no pattern variant is traced up front (see
        # ``patterns_when_given``).
        self.up_front_variants = not getattr(_local, "patterns_when_given", False)
        # custom_vjp calls whose bwd is traced again when the program returns
        # (``rebind_late_bwds``).
        self.late_bwds: list[_LateBwd] = []

    def resumed_for(self, make):
        """``make`` run with this session current again: a pattern's body traced
        when JAX first gives the pattern, after the trace this session served
        ended, holds the custom functions it calls (a fwd calling its own function)
        as first-order rules, as the bodies traced with the program do."""
        def made(key):
            if current() is self:
                return make(key)
            with _resumed(self):
                return make(key)
        return made

    def info(self, fn, consts, roots) -> RuleInfo:
        return RuleInfo(name=naming.name_of(fn), source=naming.source_of(fn),
                        const_names=naming.const_names(consts, roots),
                        closed_over=self.closed_over, max_forward_size=self.max_forward_size)

    # --------------------------------------------------------- custom_vjp
    def call_custom_vjp(self, cvjp, args, kwargs):
        args = jx.resolve_kwargs(cvjp.fun, args, kwargs)
        if self.jax_errors:  # JAX refuses a tracer in a nondiff position first thing
            jx.check_custom_vjp_nondiff_args(args, cvjp.nondiff_argnums)
        if jx.evaluated_eagerly(args) or self._jax_can_run_rules(cvjp, args):
            return _originals["vjp"](cvjp, *args)
        try:
            return self._call_custom("vjp", cvjp, list(args), self._materialize_vjp)
        except _JitReentry:
            return _originals["vjp"](cvjp, *args)

    def _jax_can_run_rules(self, custom, args) -> bool:
        """Under an AD transformation applied inside the traced function, JAX runs
        the rules at once, while this trace is live: with its exact semantics
        (symbolic zeros, bwd run during the backward pass).  JAX fails only when the
        primal closes over a value that this AD perturbs; such calls are converted.
        A call no AD perturbs at all JAX only stages, as a rule it cannot trace
        again once this trace ends (its bwd may close over this trace's values):
        converted too."""
        if not jx.inside_autodiff():
            return False
        nondiff = tuple(custom.nondiff_argnums)
        static = [args[i] for i in nondiff]
        flat, in_tree = tree_util.tree_flatten([a for i, a in enumerate(args) if i not in nondiff])
        if not any(jx.is_autodiff_tracer(x) for x in flat):
            return False
        _, consts, _, _ = self._trace_primal(custom, static, nondiff, len(args), in_tree,
                                             tuple(jx.typeof(x) for x in flat), "custom primal")
        if any(jx.is_autodiff_tracer(c) for c in consts):
            return False
        # Its rules may close over such a value that its primal does not read (a jvp
        # scaling by a parameter): JAX would give zeros or raise there too.
        kind = "vjp" if isinstance(custom, jax.custom_vjp) else "jvp"
        readable: list = []
        if fingerprint((_rule_functions(kind, custom), static), readable) is None:
            return True
        return not any(jx.is_autodiff_tracer(x) for x in readable)

    def _call_custom(self, kind, custom, args, materialize):
        """Bind a call of a custom function through its (cached) first-order rule."""
        nondiff = tuple(custom.nondiff_argnums)
        static = [args[i] for i in nondiff]
        dyn = [a for i, a in enumerate(args) if i not in nondiff]
        flat, in_tree = tree_util.tree_flatten(dyn)
        avals = tuple(jx.typeof(x) for x in flat)
        # Reuse needs the same rule *and* the same closed-over values: the fingerprint
        # covers everything the rules, the static arguments and the arguments'
        # static pytree data can read (_readable_state); the key adds JAX's
        # configuration (a call under ``jax.enable_x64`` traces to other dtypes).
        seen = fingerprint(_readable_state(kind, custom, static, in_tree), self.keepalive)
        # An input JAX could never perturb (a constant, a stop_gradient) gets no
        # tangent: a rule defined with symbolic_zeros=True sees a SymbolicZero for it,
        # and a rule none of whose inputs can be perturbed is never run by JAX.
        perturbed = tuple(is_inexact(a) and self.perturbable(x) for x, a in zip(flat, avals))
        key = (kind, id(custom), seen, in_tree, avals, perturbed, jx.trace_context())
        self.keepalive.append(custom)
        if seen is not None:
            pending = self.in_progress.get(key)
            if pending is not None:  # called from inside its own rules: recursion
                self._called_back(key)
                return tree_util.tree_unflatten(pending.out_tree, pending.call(flat))
            hit = self.cache.get(key)
        else:
            hit = None
        if hit is None:
            family = (kind, id(custom), in_tree, avals, perturbed)
            relatives = [p for p in self.in_progress.values() if p.family == family]
            unfolded = sum(1 for p in self.in_progress.values() if p.family[1] == id(custom))
            refuse = None
            if relatives:
                # The same custom function, called from inside its own rules with other
                # closed-over values (the tutorial's fixed_point: every level of its bwd
                # solves with a new function).  If its primal has the same structure,
                # it is the same rule at other values: recursion.
                p_jaxpr, p_consts, _, out_tree = self._trace_primal(
                    custom, static, nondiff, len(args), in_tree, avals, "custom primal")
                shape = _structure(p_jaxpr, static)
                for relative in relatives:
                    if relative.structure == shape and relative.accepts_relatives:
                        self._called_back(next(k for k, p in self.in_progress.items()
                                               if p is relative))
                        return tree_util.tree_unflatten(
                            out_tree, relative.call_relative(p_jaxpr, p_consts, flat))
            if refuse is None and unfolded >= _MAX_UNFOLDING:
                refuse = (f"the rules of '{naming.name_of(custom.fun)}' call it again "
                          f"{_MAX_UNFOLDING} levels deep with arguments or closed-over values of "
                          f"another structure at every level, so its derivative rules were not "
                          f"materialized to this order")
            hit = materialize(custom, static, nondiff, in_tree, avals, len(args), perturbed,
                              key if seen is not None else None, refuse)
            if seen is not None and refuse is None and key not in self.provisional:
                self.cache[key] = hit
            self.provisional.discard(key)
        rule, consts, out_tree, g = hit
        outs = g(*consts, *flat)
        return tree_util.tree_unflatten(out_tree, outs)

    def _primal_of(self, p_jaxpr, p_consts: list):
        """What the fwd of a custom_vjp whose arguments JAX never perturbs computes
        its outputs with: its primal body.  When AD can perturb a value it closes
        over and its primal runs a while_loop, the rule's derivative along that
        value is formed by forward mode (``RuleInfo.const_mode``), and so must the
        outputs' own derivatives at the next order be (JAX's fwd would call the
        custom function again): the body is ``forward_only``.  (``build_custom_jvp``
        does the same for a custom_jvp.)"""
        def plain(flat):
            return jx.eval_jaxpr(p_jaxpr, [], *p_consts, *flat)
        hot = [c for c in p_consts if self.perturbable(c)]
        if (not hot or self.closed_over not in ("auto", "forward") or not _has_while(p_jaxpr)
                or sum(int(np.prod(jx.typeof(c).shape)) for c in hot) > self.max_forward_size):
            return plain
        staged = forward_only(lambda *ops: jx.eval_jaxpr(p_jaxpr, [], *ops), FORWARD_ONLY_LEVELS)
        return lambda flat: staged(*p_consts, *flat)

    def _called_back(self, key) -> None:
        """The rule being traced under ``key`` was called from inside the rules of
        those traced since (or from its own): they are provisional."""
        keys = list(self.in_progress)
        self.provisional.update(keys[keys.index(key) + 1:])

    def _traced_recursively(self, key, pending: "_Pending", trace_rules, finish):
        """Trace a rule's bodies with ``key`` marked in progress.  ``trace_rules()``
        returns the rule's bodies and their closed-over values; ``finish(traced,
        consts)`` builds the rule.  A rule that turned out to call itself is traced
        again with those calls bound to the rule (see the module docstring)."""
        if key is None:  # no fingerprint: only calls of the same structure recur
            key = ("unfingerprinted", object())
        self.in_progress[key] = pending
        try:
            traced = trace_rules()
            if not pending.recursive:
                return finish(traced, None)
            consts = _dedupe(pending.p_consts + traced.consts)
            if pending.relative_hits and len(consts) > len(pending.p_consts):
                # Its rules close over values its primal does not read, so a call at
                # other values cannot be given them: unfold those calls instead.
                pending.accepts_relatives = False
                pending.recursive = pending.relative_hits = False
                traced = trace_rules()
                if not pending.recursive:
                    return finish(traced, None)
                consts = _dedupe(pending.p_consts + traced.consts)
            for _ in range(_SETTLE_ROUNDS):
                pending.bind_to(consts)
                traced = trace_rules()
                grown = _dedupe(consts + pending.p_consts + traced.consts)
                if len(grown) == len(consts):
                    break
                if pending.relative_hits:
                    raise ClosureConversionError(
                        f"the rules of '{pending.name}' close over values its primal does not "
                        f"read only when they call it recursively; pass those values as arguments")
                consts = grown
            else:
                raise ClosureConversionError(
                    f"the rules of '{pending.name}' close over different values at every level "
                    f"of their own recursion; pass those values as arguments")
            rule, *rest = finish(traced, consts)
            pending.resolve(rule)
            return (rule, *rest)
        finally:
            del self.in_progress[key]

    def _merge(self, static, nondiff, n_args, dyn):
        full, s, d = [], iter(static), iter(dyn)
        for i in range(n_args):
            full.append(next(s) if i in nondiff else next(d))
        return full

    def _trace_primal(self, custom, static, nondiff, n_args, in_tree, avals, label):
        """The custom function's primal as a jaxpr with its closure lifted to inputs;
        returns ``(jaxpr, consts, out_avals, out_tree)``."""
        out_store = {}

        def primal_flat(*xs):
            out = custom.fun(*self._merge(static, nondiff, n_args, tree_util.tree_unflatten(in_tree, xs)))
            leaves, out_store["tree"] = tree_util.tree_flatten(out)
            return leaves

        jaxpr, consts, out_avals = jx.trace_flat(primal_flat, avals, label)
        return jaxpr, consts, out_avals, out_store["tree"]

    def _materialize_vjp(self, cvjp, static, nondiff, in_tree, avals, n_args, perturbed, key,
                         refuse=None):
        self.rules_traced += 1
        p_jaxpr, p_consts, out_avals, out_tree = self._trace_primal(
            cvjp, static, nondiff, n_args, in_tree, avals, "custom_vjp primal")
        pending = _Pending(naming.name_of(cvjp.fun), p_jaxpr, p_consts, out_tree,
                           ("vjp", id(cvjp), in_tree, avals, perturbed),
                           _structure(p_jaxpr, static))

        def trace_rules() -> _Traced:
            if not any(perturbed):
                primal = self._primal_of(p_jaxpr, p_consts)
                return _Traced(*_unperturbed_vjp(primal, avals, out_avals), 0)
            if refuse is not None:
                return _Traced(*_refusing_vjp(p_jaxpr, p_consts, avals, out_avals, refuse), 0)
            traced = trace_pattern(perturbed, None)
            # A rule that raised for the main pattern (one asserting which inputs
            # are perturbed, or which cotangents are symbolic zeros) gets its
            # variants up front even inside jaxpr_cc.jit.
            # A rule closing over a value of a vmap inside the program cannot be
            # traced for another pattern once that vmap has ended: its patterns
            # are traced now.
            inner = any(jx.is_transformation_tracer(c) for c in (*p_consts, *traced.consts))
            if cvjp.symbolic_zeros and (inner or self._variants_allowed(traced.raised)):
                traced.add_vjp_variants(self._vjp_variants(avals, out_avals, perturbed,
                                                           trace_pattern, traced))
            return traced

        def trace_pattern(in_perturbed, ct_pattern, fwd=None) -> _Traced:
            """fwd and bwd as traced for one perturbation pattern (``fwd``: the
            pattern's fwd, already traced, when only a bwd is wanted)."""
            try:
                if fwd is None:
                    fwd = self._trace_vjp_fwd(cvjp, static, nondiff, n_args, in_tree, avals,
                                              out_tree, in_perturbed)
            except ClosureConversionError:
                raise
            except Exception as e:  # JAX would raise it only when differentiating
                if jx.is_jit_reentry_error(e):
                    raise _JitReentry() from e
                refused = _Traced(*_refusing_vjp(p_jaxpr, p_consts, avals, out_avals,
                                                 _rule_error("vjp", cvjp.fwd, e)), 0)
                refused.raised = True
                return refused
            f_jaxpr, f_consts, num_res, res_layout = fwd
            zeros, raised = (), False
            try:
                b_jaxpr, b_consts, zeros = self._trace_vjp_bwd(
                    cvjp, static, in_tree, avals, out_tree, out_avals, f_jaxpr, num_res,
                    res_layout, in_perturbed, ct_pattern)
            except ClosureConversionError:
                raise
            except Exception as e:
                if jx.is_jit_reentry_error(e):
                    raise _JitReentry() from e
                # Only this pattern's bwd raised (a bwd that asserts which cotangents
                # are symbolic zeros): fwd and its residuals stay, so the bwd variants
                # of the same fwd take the residuals this rule's fwd gives.
                raised = True
                b_jaxpr, b_consts = _refusing_bwd(
                    [v.aval for v in f_jaxpr.outvars[len(out_avals):]], avals, out_avals,
                    _rule_error("vjp", cvjp.bwd, e))
            traced = _Traced(f_jaxpr, f_consts, b_jaxpr, b_consts, num_res, zeros=zeros)
            traced.fwd_traced = fwd
            traced.raised = raised
            return traced

        main_pattern = tuple(q for q, a in zip(perturbed, avals) if is_inexact(a))
        made_by = cvjp.symbolic_zeros and any(perturbed) and refuse is None
        unchanged = self._unchanged_since_call("vjp", cvjp, static, key)

        def rule_for(consts, fwd, bwd, num_res, fwd_variants=(), bwd_variants=(),
                     pattern_rules=None):
            call = _close(_with_consts(p_jaxpr, p_consts, consts))
            named = self.info(cvjp.fun, consts, [cvjp.fun, cvjp.fwd, cvjp.bwd, *static])
            return VJPRule(info=_with_reverse_ok(named, call), call=call, fwd=fwd, bwd=bwd,
                           num_consts=len(consts), num_res=num_res,
                           symbolic_zeros=bool(cvjp.symbolic_zeros),
                           fwd_variants=fwd_variants, bwd_variants=bwd_variants,
                           pattern_rules=pattern_rules)

        def provisional(consts):
            later = _delegate(pending, len(consts), main_pattern) if made_by else None
            return build_custom_vjp(rule_for(consts, LazyJaxpr(lambda: pending.rule.fwd),
                                             LazyJaxpr(lambda: pending.rule.bwd), 0,
                                             pattern_rules=later))

        def pattern_rules_for(main: "_Traced", consts) -> PatternRules:
            """fwd and bwd for the patterns JAX gives that no variant was traced for,
            traced when first given (``rules.PatternRules``)."""
            inexact = [i for i, a in enumerate(avals) if is_inexact(a)]
            by_pattern = {main_pattern: main}

            def traced_for(in_pattern) -> "_Traced":
                if in_pattern not in by_pattern:
                    by_pattern[in_pattern] = trace_pattern(_flags(inexact, len(avals),
                                                                  in_pattern), None)
                return by_pattern[in_pattern]

            def make(key):
                what, in_pattern = key[0], key[1]
                if what == "fwd":
                    if in_pattern == main_pattern or not unchanged():
                        return None  # the main rule (see _unchanged_since_call)
                    t = traced_for(in_pattern)
                    return _close_made(t.first, t.first_consts, consts, cvjp.fwd), t.num_res
                t, ct_pattern = traced_for(in_pattern), key[2]
                fwd = getattr(t, "fwd_traced", None)
                if fwd is not None and any(not c for c in ct_pattern) and unchanged():
                    t = trace_pattern(_flags(inexact, len(avals), in_pattern), ct_pattern, fwd)
                return marked(_close_made(t.second, t.second_consts, consts, cvjp.bwd), t.zeros)
            return PatternRules(self.resumed_for(make), len(consts), main_pattern)

        def finish(t: "_Traced", consts):
            if consts is None:
                consts = _dedupe(p_consts + t.consts)
            def closed(jaxpr, own):
                return _close(_with_consts(jaxpr, own, consts))
            fwd_variants = tuple((pattern, closed(v.first, v.first_consts), v.num_res)
                                 for pattern, v in t.fwd_variants)
            bwd_variants = tuple((family, ct_pattern,
                                  marked(closed(v.second, v.second_consts), v.zeros))
                                 for family, ct_pattern, v in t.bwd_variants)
            rule = rule_for(consts, closed(t.first, t.first_consts),
                            marked(closed(t.second, t.second_consts), t.zeros), t.num_res,
                            fwd_variants, bwd_variants,
                            pattern_rules_for(t, consts) if made_by else None)
            g = build_custom_vjp(rule)
            fwd = getattr(t, "fwd_traced", None)
            if fwd is not None:
                # (A state too large to fingerprint, None, is traced again whatever.)
                state = functools.partial(_readable_state, "bwd", cvjp, static, in_tree)
                seen = fingerprint(state(), self.keepalive)
                inexact = [i for i, a in enumerate(avals) if is_inexact(a)]
                fwd_of = {(): fwd, **{p: getattr(v, "fwd_traced", None)
                                      for p, v in t.fwd_variants}}

                def retrace_for(family, ct_pattern=None):
                    f = fwd_of.get(family)
                    flags = perturbed if family == () else _flags(inexact, len(avals), family)
                    return None if f is None else functools.partial(
                        self._trace_vjp_bwd, cvjp, static, in_tree, avals, out_tree,
                        out_avals, f[0], f[2], f[3], flags, ct_pattern)
                variants = tuple((family, ct, retrace_for(family, ct))
                                 for family, ct, _ in t.bwd_variants)
                self.late_bwds.append(_LateBwd(g, consts, state, seen, retrace_for(()),
                                               cvjp, variants))
            return rule, consts, out_tree, g

        pending.provisional = provisional
        return self._traced_recursively(key, pending, trace_rules, finish)

    def rebind_late_bwds(self) -> None:
        """JAX traces a custom_vjp's bwd when it differentiates, after the function
        that called it has returned: a bwd reading a variable rebound since the call
        (a loop variable, a name assigned again) sees the value it has then.  So
        when the program returns, each bwd whose readable state changed since its
        call is traced again, and the program's equation takes that bwd (fwd and the
        primal ran at the call, as in JAX).  A bwd that now reads a traced value
        the call did not give it refuses to run, in one line: JAX reads a value
        computed after the call, which a first-order rule cannot take."""
        for late in self.late_bwds:
            if late.seen is not None and fingerprint(late.state(), self.keepalive) == late.seen:
                continue
            rule = late.g.bwd._jaxpr_cc_rule
            bwd, zeros, message = None, (), None
            try:
                b_jaxpr, b_consts, zeros = late.retrace()
                bwd = _late_bwd_body(b_jaxpr, b_consts, late.consts)
            except ClosureConversionError:
                raise
            except Exception as e:  # noqa: BLE001 -- JAX raises it when it runs bwd
                message = _rule_error("vjp", late.custom.bwd, e)
            if bwd is None:
                bwd, zeros = late.refusing(message or (
                    f"custom_vjp rule '{naming.name_of(late.custom.bwd)}' "
                    f"({naming.source_of(late.custom.bwd)}) reads a value the program rebound "
                    f"after the call to a traced value; JAX's bwd reads the rebound value when "
                    f"it runs, which a first-order rule cannot take: pass that value to the "
                    f"custom function as an argument")), ()
            rule.take_late_bwd(marked(bwd, zeros), self._late_variants(late))
        self.late_bwds.clear()

    def _late_variants(self, late: "_LateBwd") -> tuple | None:
        """The rule's per-pattern bwds traced again as its main one is, or None when
        one cannot be (the main fwd and bwd then serve every pattern)."""
        out = []
        for family, ct_pattern, retrace in late.variants:
            if retrace is None:
                return None
            try:
                b_jaxpr, b_consts, zeros = retrace()
                made = _late_bwd_body(b_jaxpr, b_consts, late.consts)
            except ClosureConversionError:
                raise
            except Exception as e:  # noqa: BLE001 -- raises as in JAX, when JAX runs it
                made, zeros = late.refusing(_rule_error("vjp", late.custom.bwd, e), family), ()
            if made is None:
                return None
            out.append((family, ct_pattern, marked(made, zeros)))
        return tuple(out)

    def _unchanged_since_call(self, kind, custom, static, key):
        """``() -> bool``: can the user's rules still be traced as they were at this
        call?  A pattern JAX gives only when it differentiates is traced then, after
        the program returned; a rule reading a cell rebound since the call would
        see the new value.  So it is traced only while everything the rules can read
        has the fingerprint it had at the call (as for reuse, ``_call_custom``);
        otherwise the pattern runs the main rule (traced with every perturbable
        input perturbed, at the call) -- exact unless the rule depends on which
        inputs are perturbed (docs/closure.md)."""
        if key is None:
            return lambda: False
        seen, in_tree = key[2], key[3]
        return lambda: fingerprint(_readable_state(kind, custom, static, in_tree),
                                   self.keepalive) == seen

    def _variants_allowed(self, needed: bool = False) -> bool:
        """Per-pattern variants only for a rule called outside other rules' bodies:
        a rule traced inside another's variant would trace variants of its own, a
        cost exponential in the nesting (equinox's solvers nest filter_custom_vjp
        rules); a nested rule's patterns are traced when JAX first gives them
        (``PatternRules``).  ``needed``: even inside jaxpr_cc.jit."""
        return (self.up_front_variants or needed) and len(self.in_progress) <= 1

    def _vjp_variants(self, avals, out_avals, perturbed, trace_pattern, main):
        """A symbolic-zeros custom_vjp traced per perturbation pattern: its fwd for
        each pattern of perturbed inputs (``perturbed`` in CustomVJPPrimal), and its
        bwd for each such pattern and each pattern of output cotangents that are not
        SymbolicZero.  Returns ``(fwd_variants, bwd_variants)``: ``[(in_pattern,
        traced)]`` and ``[(family, ct_pattern, traced)]``, where family is the
        in_pattern of the fwd whose residuals bwd takes, ``()`` for the main fwd."""
        inexact = [i for i, a in enumerate(avals) if is_inexact(a)]
        in_patterns = _variant_patterns(avals, perturbed)
        n_ct = sum(1 for a in out_avals if is_inexact(a))
        budget = _MAX_VJP_VARIANTS // (1 + len(in_patterns)) - 1
        ct_patterns = _cotangent_patterns(n_ct, budget)
        # The pattern at the call (every perturbable input perturbed: grad of a loss
        # with auxiliary outputs) gets each "one output dropped" pattern, whatever
        # the budget left per family: at most n_ct - 1 traces more.
        main_ct_patterns = _cotangent_patterns(n_ct, max(budget, n_ct))
        full_ct = (True,) * n_ct
        fwd_variants, bwd_variants = [], []
        families = [((), tuple(perturbed), getattr(main, "fwd_traced", None))]
        for pattern in in_patterns:
            flags = [False] * len(avals)
            for i, q in zip(inexact, pattern):
                flags[i] = q
            traced = trace_pattern(tuple(flags), None)
            fwd_variants.append((pattern, traced))
            bwd_variants.append((pattern, full_ct, traced))
            families.append((pattern, tuple(flags), getattr(traced, "fwd_traced", None)))
        for family, flags, fwd in families:
            for ct_pattern in (main_ct_patterns if family == () else ct_patterns):
                bwd_variants.append((family, ct_pattern, trace_pattern(flags, ct_pattern, fwd)))
        return fwd_variants, bwd_variants

    def _trace_vjp_fwd(self, cvjp, static, nondiff, n_args, in_tree, avals, out_tree, perturbed):
        store = {}

        def fwd_flat(*xs):
            if cvjp.symbolic_zeros:
                xs = [CustomVJPPrimal(x, p) for x, p in zip(xs, perturbed)]
            dyn = tree_util.tree_unflatten(in_tree, xs)
            pair = cvjp.fwd(*self._merge(static, nondiff, n_args, dyn))
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise ClosureConversionError(
                    f"custom_vjp fwd '{naming.name_of(cvjp.fwd)}' ({naming.source_of(cvjp.fwd)}) "
                    f"must return a pair (output, residuals)")
            out, res = pair
            out_leaves, tree = tree_util.tree_flatten(out)
            if tree != out_tree:
                raise ClosureConversionError(
                    f"custom_vjp fwd '{naming.name_of(cvjp.fwd)}' ({naming.source_of(cvjp.fwd)}) "
                    f"returns outputs of structure {tree}, but the function returns {out_tree}")
            res_leaves, res_tree = tree_util.tree_flatten(res)
            # A residual that is not traced (a Python bool, a constant array) reaches
            # JAX's bwd as that very value, not as a tracer: bwd rules branch on them
            # (equinox passes its `perturbed` flags this way).  Only traced residuals
            # are outputs of fwd.
            traced = [isinstance(r, jx.Tracer) for r in res_leaves]
            store["res"] = (res_tree, [None if t else r for r, t in zip(res_leaves, traced)])
            store["n_res"] = sum(traced)
            return [*out_leaves, *(r for r, t in zip(res_leaves, traced) if t)]

        jaxpr, consts, _ = jx.trace_flat(fwd_flat, avals, "custom_vjp fwd")
        return jaxpr, consts, store["n_res"], store["res"]

    def _trace_vjp_bwd(self, cvjp, static, in_tree, avals, out_tree, out_avals, f_jaxpr, num_res,
                       res_layout, perturbed, ct_pattern=None):
        """``ct_pattern`` (over the inexact outputs): which output cotangents are not
        symbolic zeros; the others reach a symbolic-zeros bwd as SymbolicZero.
        Returns ``(jaxpr, consts, zeros)``, ``zeros`` marking the cotangents the bwd
        returned as None or SymbolicZero."""
        n_out = len(out_avals)
        res_tree, fixed_res = res_layout
        res_avals = [v.aval for v in f_jaxpr.outvars[n_out:]]
        ct_avals = [a for a in out_avals if is_inexact(a)]

        def bwd_flat(*xs):
            traced_res = iter(xs[:num_res])
            res = tree_util.tree_unflatten(
                res_tree, [next(traced_res) if r is None else r for r in fixed_res])
            it = iter(xs[num_res:])
            # A symbolic-zeros bwd sees SymbolicZero for an integer or bool output's
            # cotangent, as in JAX; a dense one sees float0 zeros.
            cts = [next(it) if is_inexact(a) else
                   _unperturbed_tangent(a, bool(cvjp.symbolic_zeros)) for a in out_avals]
            if ct_pattern is not None:
                nonzero = iter(ct_pattern)
                cts = [ct if not is_inexact(a) or next(nonzero)
                       else SymbolicZero(a.to_tangent_aval()) for ct, a in zip(cts, out_avals)]
            got = cvjp.bwd(*static, res, tree_util.tree_unflatten(out_tree, cts))
            out, store["zeros"] = _flatten_cotangents(got, in_tree, avals, cvjp, perturbed)
            return out

        store: dict = {}
        jaxpr, consts, _ = jx.trace_flat(bwd_flat, [*res_avals, *ct_avals], "custom_vjp bwd")
        return jaxpr, consts, store["zeros"]

    # --------------------------------------------------------- custom_jvp
    def call_custom_jvp(self, cjvp, args, kwargs):
        args = jx.resolve_kwargs(cjvp.fun, args, kwargs)
        if jx.evaluated_eagerly(args) or self._jax_can_run_rules(cjvp, args):
            return _originals["jvp"](cjvp, *args)
        nondiff = tuple(cjvp.nondiff_argnums)
        # As JAX does: no derivative flows through non-differentiable arguments.
        args = [tree_util.tree_map(_stop_gradient_arrays, a) if i in nondiff else a
                for i, a in enumerate(args)]
        try:
            return self._call_custom("jvp", cjvp, args, self._materialize_jvp)
        except _JitReentry:
            return _originals["jvp"](cjvp, *args)

    def _materialize_jvp(self, cjvp, static, nondiff, in_tree, avals, n_args, perturbed, key,
                         refuse=None):
        self.rules_traced += 1
        p_jaxpr, p_consts, out_avals, out_tree = self._trace_primal(
            cjvp, static, nondiff, n_args, in_tree, avals, "custom_jvp primal")
        pending = _Pending(naming.name_of(cjvp.fun), p_jaxpr, p_consts, out_tree,
                           ("jvp", id(cjvp), in_tree, avals, perturbed),
                           _structure(p_jaxpr, static))

        def trace_rules() -> _Traced:
            if not any(perturbed):
                return _Traced(*_unperturbed_jvp(p_jaxpr, p_consts, avals, out_avals))
            if refuse is not None:
                return _Traced(*_refusing_jvp(p_jaxpr, p_consts, avals, out_avals, refuse))
            try:
                j, c, zeros = self._trace_jvp(cjvp, static, in_tree, avals, out_tree,
                                              out_avals, perturbed)
                # A symbolic-zeros jvp's other patterns are traced when JAX first
                # gives them (pattern_rules_for), or when the program is saved or
                # emitted (frontend.saved_patterns): tracing them with the program
                # re-traces every rule the jvp calls once per pattern (optimistix's
                # solvers: 6x the trace time).
                return _Traced(j, c, zeros=zeros)
            except ClosureConversionError:
                raise
            except Exception as e:  # JAX would raise it only when differentiating
                if jx.is_jit_reentry_error(e):
                    raise _JitReentry() from e
                return _Traced(*_refusing_jvp(p_jaxpr, p_consts, avals, out_avals,
                                              _rule_error("jvp", cjvp.jvp, e)))

        made_by = cjvp.symbolic_zeros and any(perturbed) and refuse is None
        main_pattern = tuple(q for q, a in zip(perturbed, avals) if is_inexact(a))
        unchanged = self._unchanged_since_call("jvp", cjvp, static, key)

        def rule_for(consts, jvp, variants, pattern_rules=None):
            call = _close(_with_consts(p_jaxpr, p_consts, consts))
            info = self.info(cjvp.fun, consts, [cjvp.fun, cjvp.jvp, *static])
            return JVPRule(info=_with_reverse_ok(info, call), call=call, jvp=jvp,
                           num_consts=len(consts), symbolic_zeros=bool(cjvp.symbolic_zeros),
                           variants=variants, pattern_rules=pattern_rules)

        def provisional(consts):
            # Calls from inside the rule (recursion) get its patterns from the rule,
            # once made.
            later = _delegate(pending, len(consts), main_pattern) if made_by else None
            return build_custom_jvp(rule_for(consts, LazyJaxpr(lambda: pending.rule.jvp),
                                             (), later))

        def pattern_rules_for(consts) -> PatternRules:
            """The rule for the patterns JAX gives that no variant was traced for,
            traced when first given (``rules.PatternRules``)."""
            inexact = [i for i, a in enumerate(avals) if is_inexact(a)]

            def make(pattern):
                if pattern == main_pattern or not unchanged():
                    return None  # the main rule (see _unchanged_since_call)
                zeros = ()
                try:
                    jaxpr, cs, zeros = self._trace_jvp(cjvp, static, in_tree, avals, out_tree,
                                                       out_avals,
                                                       _flags(inexact, len(avals), pattern))
                except ClosureConversionError:
                    raise
                except Exception as e:  # raises as in JAX, when JAX runs this pattern
                    jaxpr, cs = _refusing_jvp(p_jaxpr, p_consts, avals, out_avals,
                                              _rule_error("jvp", cjvp.jvp, e))
                return marked(_close_made(_without_dead_equations(jaxpr), cs, consts, cjvp.jvp),
                              zeros)
            return PatternRules(self.resumed_for(make), len(consts), main_pattern)

        def finish(t: "_Traced", consts):
            if consts is None:
                consts = _dedupe(p_consts + t.consts)
            later = pattern_rules_for(consts) if made_by else None
            if later is not None and any(jx.is_transformation_tracer(c) for c in consts):
                # It closes over a value of a vmap inside the program, which ends
                # before JAX gives the other patterns: they are traced now.
                for pattern in _variant_patterns(avals, perturbed):
                    later.raw(pattern)
            rule = rule_for(consts, marked(_close(_with_consts(t.first, t.first_consts, consts)),
                                           t.zeros), (), later)
            return rule, consts, out_tree, build_custom_jvp(rule)

        pending.provisional = provisional
        return self._traced_recursively(key, pending, trace_rules, finish)

    def _trace_jvp(self, cjvp, static, in_tree, avals, out_tree, out_avals, perturbed):
        n = len(avals)
        t_avals = [a for a in avals if is_inexact(a)]

        def jvp_flat(*xs):
            primals, it = xs[:n], iter(xs[n:])
            # The layout has a tangent input per inexact leaf; an input JAX never
            # perturbs gets what JAX would give it instead.
            tangents = [next(it) if is_inexact(a) else np.zeros(a.shape, jax.dtypes.float0)
                        for a in avals]
            tangents = [t if p else _unperturbed_tangent(a, cjvp.symbolic_zeros)
                        for t, p, a in zip(tangents, perturbed, avals)]
            p = tree_util.tree_unflatten(in_tree, primals)
            t = tree_util.tree_unflatten(in_tree, tangents)
            pair = cjvp.jvp(*static, tuple(p), tuple(t))
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise ClosureConversionError(
                    f"custom_jvp rule '{naming.name_of(cjvp.jvp)}' ({naming.source_of(cjvp.jvp)}) "
                    f"must return a pair (primal_out, tangent_out)")
            p_out, t_out = pair
            p_leaves, tree = tree_util.tree_flatten(p_out)
            if tree != out_tree:
                raise ClosureConversionError(
                    f"custom_jvp rule '{naming.name_of(cjvp.jvp)}' ({naming.source_of(cjvp.jvp)}) "
                    f"returns primal outputs of structure {tree}, but the function returns {out_tree}")
            t_leaves, store["zeros"] = _flatten_tangents(t_out, out_tree, out_avals, cjvp)
            return [*p_leaves, *t_leaves]

        store: dict = {}
        jaxpr, consts, _ = jx.trace_flat(jvp_flat, [*avals, *t_avals], "custom_jvp jvp")
        return jaxpr, consts, store["zeros"]

    # --------------------------------------------------------- linear_call
    def bind_linear_call(self, operands, params):
        callee = params["callee"]
        n_cc, n_res = params["num_callee_consts"], params["num_res"]
        thunk = params["transpose_thunk"]
        ops = list(operands)
        callee_consts, res, lin = ops[:n_cc], ops[n_cc:n_cc + n_res], ops[n_cc + n_res:]
        # A transpose is traced now, while the trace is live.  One whose body binds
        # linear_call with a transpose that binds it again, without end, would never
        # finish: refuse nesting deeper than any real linear operator needs.
        if self.linear_depth >= _MAX_LINEAR_NESTING:
            raise ClosureConversionError(
                f"linear_call transposes nest more than {_MAX_LINEAR_NESTING} deep: a transpose "
                f"that binds linear_call with a transpose that binds it again never ends when "
                f"traced; give the inner linear_call a transpose that does not")
        self.linear_depth += 1
        try:
            t_jaxpr, t_consts = thunk()  # the trace that made the call is still live
        finally:
            self.linear_depth -= 1
        # New residuals: the callee's and the transpose's closed-over values, then the
        # user's residuals.  callee (cc, r, x) and transpose (tc, r, ct) both become
        # functions of (cc, tc, r, ...), ignoring the other's closed-over values.
        res_all = list(callee_consts) + list(t_consts) + list(res)
        cc_avals = [jx.typeof(c) for c in callee_consts]
        tc_avals = [jx.typeof(c) for c in t_consts]
        callee_new = _close(_insert_inputs(callee.jaxpr, len(callee_consts), tc_avals))
        transpose_new = _close(_insert_inputs(t_jaxpr.jaxpr, 0, cc_avals))
        info = RuleInfo(name="linear_call", source="<linear_call>", const_names=(),
                        closed_over=self.closed_over, max_forward_size=self.max_forward_size)
        rule = LinearRule(info=info, callee=callee_new, transpose=transpose_new,
                          num_res=len(res_all))
        self.rules_traced += 1
        return bind_linear_rule(rule, [*res_all, *lin])


_MAX_LINEAR_NESTING = 32
# Calls of one custom function nested in its own rules, each of another structure (the
# JAX docs' fixed_point packs its residuals into a deeper tuple at every level), beyond
# which further levels are not materialized: differentiating to that order raises,
# naming the function.  Each level traces the next twice when it also recurses on
# itself, so the bound keeps tracing cheap.
_MAX_UNFOLDING = 4
_MATCH_RELATIVES = True  # calls of the same structure at other values are recursion
_SETTLE_ROUNDS = 8  # a recursive rule's closed-over values settle in one or two rounds
# A symbolic-zeros custom_vjp's fwd is traced once per perturbation pattern of its
# perturbable inputs (2**n - 2 extra traces) up to this many such inputs, with a
# program ``jaxpr_cc.trace`` makes; the other patterns, and every pattern of a
# custom_jvp, are traced when JAX first gives them (``PatternRules``).
_MAX_PATTERN_INPUTS = 3
# A symbolic-zeros custom_vjp: at most this many (fwd pattern x cotangent pattern)
# traces; beyond it, bwd is traced with every cotangent dense for each fwd pattern.
# 64 holds every pattern of a rule with up to 3 perturbable inputs and 3 float
# outputs (7 x 7): a pattern left out is traced when JAX gives it, which a rule
# closing over a value of an inner trace (a vmap inside the function) cannot be.
_MAX_VJP_VARIANTS = 64


class _Traced:
    """A rule's traced bodies: (first, its closed-over values) and, for custom_vjp,
    (second, its closed-over values) = fwd and bwd; for custom_jvp, first = jvp."""

    def __init__(self, first, first_consts, second=None, second_consts=(), num_res=0,
                 zeros=()):
        self.first, self.first_consts = _without_dead_equations(first), list(first_consts)
        self.second, self.second_consts = _without_dead_equations(second), list(second_consts)
        self.num_res = num_res
        # Which outputs of the derivative body (jvp's tangents, bwd's cotangents) the
        # user's rule returned as symbolic zeros (rules.marked).
        self.zeros = tuple(zeros)
        self.consts = _dedupe(self.first_consts + self.second_consts)

    fwd_variants: list = []
    bwd_variants: list = []
    raised = False  # the user's fwd or bwd raised when traced for these bodies

    def add_vjp_variants(self, variants) -> None:
        """(fwd_variants, bwd_variants) of _vjp_variants: their closed-over values
        are the rule's too."""
        self.fwd_variants, self.bwd_variants = (list(v) for v in variants)
        more = [c for _, v in self.fwd_variants for c in v.consts]
        more += [c for _, _, v in self.bwd_variants for c in v.consts]
        self.consts = _dedupe(self.consts + more)


def _without_dead_equations(jaxpr):
    """``jaxpr`` without the equations none of its outputs needs (and that have no
    effect); its inputs stay, so the rule's operand layout does not change.

    A rule body is traced from the user's Python rule, which often computes what it
    then drops: the primal outputs of ``jax.vjp`` inside a bwd, or a whole adjoint
    solve whose cotangent is zero (the tutorial fixed_point's bwd at the adjoint's
    level).  JAX never stages a rule body, so nothing of it is printed or kept that
    the rule's outputs do not need; a dead call of a custom function would otherwise
    keep that function's own rules in the program."""
    if jaxpr is None:
        return None
    live = {v for v in jaxpr.outvars if isinstance(v, jx.Var)}
    kept = []
    for eqn in reversed(jaxpr.eqns):
        if eqn.effects or any(not isinstance(v, jx.DropVar) and v in live for v in eqn.outvars):
            kept.append(eqn)
            live.update(v for v in eqn.invars if isinstance(v, jx.Var))
    if len(kept) == len(jaxpr.eqns):
        return jaxpr
    return jx.Jaxpr(jaxpr.constvars, jaxpr.invars, jaxpr.outvars, kept[::-1], jaxpr.effects,
                    jaxpr.debug_info)


class _Pending:
    """A custom function whose rules are being traced.  A call of it with the same
    key from inside those rules is recursion: on the first tracing it evaluates the
    primal (so the rules' closed-over values can be found), afterwards it binds a
    function whose rule bodies are this rule's, once it is finished."""

    def __init__(self, name: str, p_jaxpr, p_consts: list, out_tree, family, structure):
        self.name = name
        self.p_jaxpr, self.p_consts, self.out_tree = p_jaxpr, list(p_consts), out_tree
        self.family, self.structure = family, structure
        self.recursive = False
        self.relative_hits = False  # called at other closed-over values (same structure)
        self.accepts_relatives = _MATCH_RELATIVES
        self.provisional = None  # consts -> the rule's function, with lazy bodies
        self.consts: list | None = None
        self.g = None
        self.rule = None

    def call(self, flat: list) -> list:
        self.recursive = True
        if self.g is None:
            return jx.eval_jaxpr(self.p_jaxpr, [], *self.p_consts, *flat)
        return list(self.g(*self.consts, *flat))

    def call_relative(self, p_jaxpr, p_consts: list, flat: list) -> list:
        """A call with the same structure at other closed-over values ``p_consts``
        (in the same positions as this rule's, which close over nothing else)."""
        self.recursive = self.relative_hits = True
        if self.g is None:
            return jx.eval_jaxpr(p_jaxpr, [], *p_consts, *flat)
        return list(self.g(*p_consts, *flat))

    def bind_to(self, consts: list) -> None:
        self.consts = list(consts)
        self.g = self.provisional(self.consts)

    def resolve(self, rule) -> None:
        """The rule is finished: calls bound during its tracing are this rule."""
        self.rule = rule
        for attr in ("bwd", "jvp"):
            fn = getattr(self.g, attr, None)
            if fn is not None and hasattr(fn, "_jaxpr_cc_rule"):
                fn._jaxpr_cc_rule = rule


@dataclass(eq=False)
class _LateBwd:
    """A custom_vjp call whose bwd may be traced again when the program returns."""
    g: Any              # the first-order custom function bound at the call
    consts: list        # the rule's closed-over values (its leading operands)
    state: Any          # () -> what bwd can read (``_readable_state``)
    seen: Any           # its fingerprint at the call
    retrace: Any        # () -> (jaxpr, consts, zeros) of bwd, traced now
    custom: Any         # the user's custom_vjp
    variants: tuple = ()  # (family, cotangent pattern, retrace or None) per bwd variant

    def refusing(self, message: str, family: tuple = ()):
        """A bwd for the residuals of the rule's fwd for ``family`` (its main fwd
        for ``()``) whose cotangents raise ``message``."""
        rule = self.g.bwd._jaxpr_cc_rule
        call = body(rule.call)
        fwd = next((f for pattern, f, _ in rule.fwd_variants if pattern == family), rule.fwd) \
            if family else rule.fwd
        res_avals = [v.aval for v in body(fwd).jaxpr.outvars[len(call.out_avals):]]
        b_jaxpr, b_consts = _refusing_bwd(res_avals, list(call.in_avals[rule.num_consts:]),
                                          list(call.out_avals), message)
        return _close(_with_consts(b_jaxpr, b_consts, self.consts))


def _late_bwd_body(jaxpr, consts: list, rule_consts: list):
    """A bwd traced after the call, taking the rule's closed-over values: those it
    reads are the call's; new concrete values become literals.  None when it reads
    a traced value the call did not close over."""
    known = {_const_identity(c) for c in rule_consts}
    new = [i for i, c in enumerate(consts) if _const_identity(c) not in known]
    if not new:
        return _close(_with_consts(jaxpr, consts, rule_consts))
    if any(isinstance(consts[i], jx.Tracer) for i in new):
        return None
    n = len(consts)
    order = new + [i for i in range(n) if i not in new]
    moved = jx.Jaxpr(jaxpr.constvars, [jaxpr.invars[i] for i in order] + list(jaxpr.invars[n:]),
                     jaxpr.outvars, jaxpr.eqns, jaxpr.effects, jaxpr.debug_info)
    inlined = jx.inline_host_consts(moved, [consts[i] for i in new])
    if inlined is None:
        return None
    kept = [consts[i] for i in order[len(new):]]
    return _close(_with_consts(inlined, kept, rule_consts))


def _flags(inexact: list[int], n: int, pattern) -> tuple[bool, ...]:
    """A pattern over the inexact leaves -> perturbed flags over all ``n`` leaves."""
    flags = [False] * n
    for i, q in zip(inexact, pattern):
        flags[i] = bool(q)
    return tuple(flags)


def _delegate(pending: "_Pending", num_consts: int, main) -> PatternRules:
    """The pattern rules of a rule still being traced (for its recursive calls): those
    of the finished rule, which has the same closed-over values."""
    def make(key):
        rules = pending.rule.pattern_rules
        return None if rules is None else rules.raw(key)
    return PatternRules(make, num_consts, main)


def _close_made(jaxpr, own: list, consts: list, fn):
    """A body traced for a pattern when JAX first gave it: its closed-over values as
    the rule's leading inputs (``consts``).  A value only this pattern reads stays a
    constant of the body if it is concrete; a traced one cannot be given to it."""
    known = {_const_identity(c) for c in consts}
    extra = _dedupe([c for c in own if _const_identity(c) not in known])
    for c in extra:
        if isinstance(c, jx.Tracer):
            raise ClosureConversionError(
                f"custom rule '{naming.name_of(fn)}' ({naming.source_of(fn)}) reads a traced "
                f"value only for some patterns of perturbed inputs (it reads it after JAX "
                f"decided which inputs are perturbed); pass that value as an argument")
    closed = _with_consts(jaxpr, own, list(consts) + extra)
    if not extra:
        return _close(closed)
    n = len(consts)
    invars = list(closed.invars)
    extra_vars = invars[n:n + len(extra)]
    del invars[n:n + len(extra)]
    return jx.ClosedJaxpr(jx.Jaxpr(extra_vars, invars, closed.outvars, closed.eqns,
                                   closed.effects, jx.fit_debug_info(closed.debug_info,
                                                                     len(invars),
                                                                     len(closed.outvars))),
                          list(extra))


def _variant_patterns(avals, perturbed) -> list[tuple[bool, ...]]:
    """The perturbation patterns (over the inexact leaves) a symbolic-zeros rule is
    traced for besides "all perturbable inputs": every nonempty proper subset of
    those inputs, when there are 2 to ``_MAX_PATTERN_INPUTS`` of them."""
    inexact = [i for i, a in enumerate(avals) if is_inexact(a)]
    hot = [k for k, i in enumerate(inexact) if perturbed[i]]
    if len(hot) < 2 or len(hot) > _MAX_PATTERN_INPUTS:
        return []
    out = []
    for mask in range(1, 2 ** len(hot) - 1):
        chosen = {hot[j] for j in range(len(hot)) if mask >> j & 1}
        out.append(tuple(k in chosen for k in range(len(inexact))))
    return out


def _cotangent_patterns(n_ct: int, budget: int) -> list[tuple[bool, ...]]:
    """The patterns of nonzero output cotangents a symbolic-zeros bwd is traced for
    besides "all nonzero", at most ``budget`` of them: every nonempty proper subset
    when they fit, else the likeliest first -- one output without a cotangent (an
    auxiliary output the caller drops), then one output with a cotangent."""
    if n_ct < 2 or budget <= 0:
        return []
    if n_ct <= _MAX_PATTERN_INPUTS and 2 ** n_ct - 2 <= budget:
        return [tuple(bool(mask >> j & 1) for j in range(n_ct))
                for mask in range(1, 2 ** n_ct - 1)]
    all_but_one = [tuple(j != k for j in range(n_ct)) for k in range(n_ct)]
    only_one = [tuple(j == k for j in range(n_ct)) for k in range(n_ct)] if n_ct > 2 else []
    return (all_but_one + only_one)[:budget]


def _structure(p_jaxpr, static) -> tuple:
    """What makes two calls of one custom function the same rule at other closed-over
    values: the primal's jaxpr (closed-over values as inputs) and, for each static
    argument, its code (a function) or its value."""
    def shape(x):
        code = getattr(x, "__code__", None)
        if code is not None:
            return ("code", code)
        if isinstance(x, functools.partial):
            return ("partial", shape(x.func), tuple(shape(a) for a in x.args))
        try:
            hash(x)
            return ("value", x)
        except TypeError:
            return ("object", id(x))
    return (str(p_jaxpr), tuple(shape(x) for x in static))


def _readable_state(kind, custom, static, in_tree) -> tuple:
    """What a call's rules can read besides its arrays, fingerprinted for reuse:
    the rule functions, the static arguments, and the arguments' static pytree
    data (by type and bits: a ``-0.0`` field equals ``0.0``, so the structures
    compare equal)."""
    return _rule_functions(kind, custom), static, _node_data(in_tree)


def _node_data(treedef) -> tuple:
    """The static data of a pytree structure's nodes that equality can confuse
    (a dataclass's or Module's static fields, dict keys that are not strings),
    in order; structures of tuples, lists, None and string-keyed dicts, which
    compare exactly, give ``()``."""
    out = []
    todo = [treedef]
    while todo:
        node = todo.pop()
        data = node.node_data()
        if data is not None:
            kind, aux = data
            if kind not in _EXACT_NODES and not (
                    kind is dict and all(isinstance(k, str) for k in aux)):
                out.append(data)
        todo.extend(reversed(node.children()))
    return tuple(out)


#: Pytree node types whose structure equality is exact (no static data).
_EXACT_NODES = (tuple, list, type(None))


def _rule_functions(kind: str, custom) -> tuple:
    """The user's Python functions that define a custom function's primal and rules
    (``"bwd"``: a custom_vjp's bwd alone)."""
    if kind == "bwd":
        return (custom.bwd,)
    if kind == "vjp":
        return (custom.fun, custom.fwd, custom.bwd)
    return (custom.fun, custom.jvp)


def _stop_gradient_arrays(x):
    if isinstance(x, (jax.Array, jx.Tracer)):
        return jax.lax.stop_gradient(x)
    return x


def _unperturbed_vjp(primal, avals, out_avals):
    """fwd and bwd of a custom_vjp whose arguments JAX can never perturb: JAX never
    runs the user's rules, so neither do we (they may refuse to run, as equinox's
    ``nondifferentiable`` does).  fwd is ``primal`` with no residuals; bwd gives zero
    cotangents.  Derivatives with respect to closed-over values still follow the
    closed-over policy."""
    import jax.numpy as jnp
    def fwd(*xs):
        return primal(list(xs))

    def bwd(*cts):
        return [jnp.zeros(a.shape, a.dtype) for a in avals if is_inexact(a)]

    f_jaxpr, f_consts, _ = jx.trace_flat(fwd, avals, "custom_vjp fwd")
    b_jaxpr, b_consts, _ = jx.trace_flat(bwd, [a for a in out_avals if is_inexact(a)],
                                         "custom_vjp bwd")
    return f_jaxpr, f_consts, b_jaxpr, b_consts


class _JitReentry(Exception):
    """A rule calls a ``jax.jit`` function whose trace is in progress: the custom
    function is called inside that jitted function, and its rule calls it again
    (``jnp.linalg.slogdet``: its jvp calls ``slogdet``).  JAX traces the rule only
    when differentiating, after that trace has ended; tracing it now makes
    ``jax.jit`` refuse the re-entry.  The call is then staged in JAX's form and
    materialized when the trace has ended (``convert_program``, which
    ``jaxpr_cc.trace`` runs on what is left in JAX's form)."""




def _rule_error(kind: str, fn, error: BaseException) -> str:
    text = " ".join(str(error).split())
    return (f"custom_{kind} rule '{naming.name_of(fn)}' ({naming.source_of(fn)}) raised when it was "
            f"traced with the arguments JAX could perturb, so differentiating through it fails "
            f"as in JAX: {type(error).__name__}: {text[:500]}")


def _refusing_vjp(p_jaxpr, p_consts, avals, out_avals, message: str):
    """fwd and bwd of a custom_vjp whose rules raised when traced: fwd is the primal
    and bwd's cotangents raise ``message`` when evaluated, i.e. only when JAX would
    run the user's bwd (an argument is perturbed)."""
    def fwd(*xs):
        return jx.eval_jaxpr(p_jaxpr, [], *p_consts, *xs)

    def bwd(*cts):
        return jx.refuse_forward_mode(cts, [a for a in avals if is_inexact(a)], message)

    f_jaxpr, f_consts, _ = jx.trace_flat(fwd, avals, "custom_vjp fwd")
    b_jaxpr, b_consts, _ = jx.trace_flat(bwd, [a for a in out_avals if is_inexact(a)],
                                         "custom_vjp bwd")
    return f_jaxpr, f_consts, b_jaxpr, b_consts


def _refusing_bwd(res_avals, avals, out_avals, message: str):
    """A bwd ``(r, ct_y) -> ct_x`` whose cotangents raise ``message`` when evaluated."""
    n_res = len(res_avals)

    def bwd(*xs):
        return jx.refuse_forward_mode(xs[n_res:], [a for a in avals if is_inexact(a)], message)

    b_jaxpr, b_consts, _ = jx.trace_flat(bwd, [*res_avals, *(a for a in out_avals
                                                             if is_inexact(a))],
                                         "custom_vjp bwd")
    return b_jaxpr, b_consts


def _refusing_jvp(p_jaxpr, p_consts, avals, out_avals, message: str):
    """The jvp of a custom_jvp whose rule raised when traced: the primal, and
    tangents that raise ``message`` when evaluated."""
    n = len(avals)

    def jvp(*xs):
        outs = jx.eval_jaxpr(p_jaxpr, [], *p_consts, *xs[:n])
        return [*outs, *jx.refuse_forward_mode(xs[n:], [a for a in out_avals if is_inexact(a)],
                                               message)]

    j_jaxpr, j_consts, _ = jx.trace_flat(jvp, [*avals, *(a for a in avals if is_inexact(a))],
                                         "custom_jvp jvp")
    return j_jaxpr, j_consts


def _unperturbed_jvp(p_jaxpr, p_consts, avals, out_avals):
    """The jvp of a custom_jvp whose arguments JAX can never perturb: the primal and
    zero tangents (the user's rule is never run, as in JAX; ``build_custom_jvp``
    never runs this one either: no argument's tangent is ever other than zero)."""
    import jax.numpy as jnp
    n = len(avals)

    def jvp(*xs):
        outs = jx.eval_jaxpr(p_jaxpr, [], *p_consts, *xs[:n])
        return [*outs, *(jnp.zeros(a.shape, a.dtype) for a in out_avals if is_inexact(a))]

    j_jaxpr, j_consts, _ = jx.trace_flat(jvp, [*avals, *(a for a in avals if is_inexact(a))],
                                         "custom_jvp jvp")
    return j_jaxpr, j_consts


def _unperturbed_tangent(aval, symbolic: bool):
    import jax.numpy as jnp
    # A symbolic-zeros rule sees SymbolicZero for every input JAX does not perturb,
    # integers and bools included (their zero has JAX's float0 tangent type).
    if symbolic:
        return SymbolicZero(aval.to_tangent_aval())
    if not is_inexact(aval):
        return np.zeros(aval.shape, jax.dtypes.float0)
    return jnp.zeros(aval.shape, aval.dtype)


def _flatten_cotangents(got, in_tree, avals, cvjp, perturbed):
    """The user's bwd result -> (dense cotangents of the inexact argument leaves,
    which of them it returned as None or SymbolicZero)."""
    import jax.numpy as jnp
    n_args = in_tree.num_leaves
    if isinstance(got, list):
        got = tuple(got)
    if not isinstance(got, tuple):
        raise ClosureConversionError(
            f"custom_vjp bwd '{naming.name_of(cvjp.bwd)}' ({naming.source_of(cvjp.bwd)}) must "
            f"return a tuple of cotangents, one per differentiable argument; got {type(got).__name__}")
    dummy = tree_util.tree_unflatten(in_tree, list(range(n_args)))
    flat: list = [None] * n_args

    def place(ct, idx_tree):
        # As JAX reads a bwd's result: the cotangents' own structure is the prefix
        # (None stands for zeros, at a leaf or for a whole subtree), and a cotangent
        # given for an argument subtree with no leaves is dropped (equinox's
        # filter_custom_vjp has None there for a Python float argument).
        idxs = tree_util.tree_leaves(idx_tree)
        if ct is None or not idxs:
            return
        for i in idxs:
            flat[i] = ct

    if len(got) != len(dummy):
        raise ClosureConversionError(
            f"custom_vjp bwd '{naming.name_of(cvjp.bwd)}' ({naming.source_of(cvjp.bwd)}) returned "
            f"{len(got)} cotangents for {len(dummy)} differentiable arguments")
    try:
        for ct, d in zip(got, dummy):
            tree_util.tree_map(place, ct, d, is_leaf=lambda x: x is None)
    except (ValueError, TypeError):
        raise ClosureConversionError(
            f"custom_vjp bwd '{naming.name_of(cvjp.bwd)}' ({naming.source_of(cvjp.bwd)}) "
            f"returned cotangents whose structure does not match the arguments") from None
    out, zeros = [], []
    for ct, a, p in zip(flat, avals, perturbed):
        if not is_inexact(a):
            continue
        if not p:  # JAX drops the cotangent of an input it never perturbed
            ct = None
        symbolic = ct is None or type(ct).__name__ == "SymbolicZero"
        zeros.append(symbolic)
        if symbolic or (hasattr(ct, "dtype") and ct.dtype == jax.dtypes.float0):
            out.append(jnp.zeros(a.shape, a.dtype))
        else:
            out.append(jnp.asarray(ct).astype(a.dtype) if jnp.result_type(ct) != a.dtype else ct)
    return out, tuple(zeros)


def _flatten_tangents(t_out, out_tree, out_avals, cjvp):
    import jax.numpy as jnp
    try:  # tangents have the primal outputs' structure, as JAX requires
        leaves = out_tree.flatten_up_to(t_out)
    except (ValueError, TypeError) as e:
        raise ClosureConversionError(
            f"custom_jvp rule '{naming.name_of(cjvp.jvp)}' ({naming.source_of(cjvp.jvp)}) returns "
            f"tangents whose structure does not match the primal outputs ({out_tree}): "
            f"{' '.join(str(e).split())[:300]}") from None
    out, zeros = [], []
    for t, a in zip(leaves, out_avals):
        if not is_inexact(a):
            continue
        symbolic = t is None or type(t).__name__ == "SymbolicZero"
        zeros.append(symbolic)
        out.append(jnp.zeros(a.shape, a.dtype) if symbolic else t)
    return out, tuple(zeros)


def _const_identity(value):
    """What makes two closed-over values the same: a traced value is itself; a
    concrete array is its type and contents (a rule that builds a constant,
    ``jnp.array([1., 2.])``, builds a new object at every trace of it, and a
    recursive rule must see the same constants at every level)."""
    if isinstance(value, jx.Tracer) or not isinstance(value, (np.ndarray, np.generic, jax.Array)):
        return id(value)
    array = np.asarray(value)
    return ("value", str(jx.typeof(value)), array.tobytes())


def _dedupe(values: list) -> list:
    seen, out = set(), []
    for v in values:
        key = _const_identity(v)
        if key not in seen:
            seen.add(key)
            out.append(v)
    return out


def _with_consts(jaxpr, own_consts: list, all_consts: list):
    """``jaxpr`` takes ``own_consts`` as leading inputs; make it take ``all_consts``."""
    n_own = len(own_consts)
    const_invars, rest = jaxpr.invars[:n_own], jaxpr.invars[n_own:]
    by_id: dict = {}
    same: dict = {}  # a var of a constant equal to an earlier one -> that one's var
    for c, v in zip(own_consts, const_invars):
        first = by_id.setdefault(_const_identity(c), v)
        if first is not v:
            same[v] = first
    invars = []
    for c in all_consts:
        v = by_id.get(_const_identity(c))
        invars.append(v if v is not None else jx.Var(jx.typeof(c)))
    eqns, outvars = jaxpr.eqns, jaxpr.outvars
    if same:
        def read(a):
            return same.get(a, a) if isinstance(a, jx.Var) else a
        eqns = [e.replace(invars=[read(a) for a in e.invars]) for e in eqns]
        outvars = [read(a) for a in outvars]
    return jx.Jaxpr([], invars + list(rest), outvars, eqns, jaxpr.effects,
                    jx.fit_debug_info(jaxpr.debug_info, len(invars) + len(rest), len(jaxpr.outvars)))


def _insert_inputs(jaxpr, position: int, avals):
    """``jaxpr`` with unused inputs of ``avals`` inserted at ``position``."""
    if not avals:
        return jaxpr
    invars = list(jaxpr.invars)
    invars[position:position] = [jx.Var(a) for a in avals]
    return jx.Jaxpr(jaxpr.constvars, invars, jaxpr.outvars, jaxpr.eqns, jaxpr.effects,
                    jx.fit_debug_info(jaxpr.debug_info, len(invars), len(jaxpr.outvars)))


def _inline_consts(closed):
    """A ClosedJaxpr with consts -> an open jaxpr taking them as leading inputs."""
    jaxpr = closed.jaxpr
    if not jaxpr.constvars:
        return jaxpr
    return jx.Jaxpr([], list(jaxpr.constvars) + list(jaxpr.invars), jaxpr.outvars, jaxpr.eqns,
                    jaxpr.effects, jx.fit_debug_info(jaxpr.debug_info,
                                                     len(jaxpr.constvars) + len(jaxpr.invars),
                                                     len(jaxpr.outvars)))


def _close(jaxpr):
    return jx.ClosedJaxpr(jaxpr, [])


def _with_reverse_ok(info: RuleInfo, call) -> RuleInfo:
    import dataclasses
    return dataclasses.replace(info, reverse_ok=not _has_while(call.jaxpr))


def _has_while(jaxpr) -> bool:
    """True if a while_loop is reachable outside custom-rule equations (reverse-mode
    AD of the primal would fail there)."""
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "while":
            return True
        if name in ("custom_vjp_call", "custom_jvp_call", "linear_call"):
            continue
        for p in eqn.params.values():
            for sub in (p if isinstance(p, tuple) else (p,)):
                inner = getattr(sub, "jaxpr", sub)
                if isinstance(inner, jx.Jaxpr) and _has_while(inner):
                    return True
    return False


# ------------------------------------------------------------------ hooks
def _patched_vjp_call(self, *args, **kwargs):
    s = current()
    if s is None or getattr(self, "_jaxpr_cc_rebuilt", False):
        return _originals["vjp"](self, *args, **kwargs)
    return s.call_custom_vjp(self, args, kwargs)


def _patched_jvp_call(self, *args, **kwargs):
    s = current()
    if s is None or getattr(self, "_jaxpr_cc_rebuilt", False):
        return _originals["jvp"](self, *args, **kwargs)
    return s.call_custom_jvp(self, args, kwargs)


def _patched_linear_bind(*args, **params):
    s = current()
    if s is None or hasattr(params.get("transpose_thunk"), "_jaxpr_cc_rule"):
        return _originals["linear"](*args, **params)
    return s.bind_linear_call(args, params)


def install_hooks() -> None:
    """Route custom-rule calls through the active session (a no-op outside one).

    The hooks sit on JAX's public ``custom_vjp`` / ``custom_jvp`` classes and on the
    ``linear_call`` primitive's bind, and defer to JAX whenever no session is active.
    """
    global _installed
    with _install_lock:
        if _installed:
            return
        _originals["vjp"] = jax.custom_vjp.__call__
        _originals["jvp"] = jax.custom_jvp.__call__
        _originals["linear"] = jx.linear_call_p.bind
        jax.custom_vjp.__call__ = _patched_vjp_call
        jax.custom_jvp.__call__ = _patched_jvp_call
        jx.linear_call_p.bind = _patched_linear_bind
        _installed = True


def jax_errors():
    """Sessions opened inside raise JAX's own errors where ``jaxpr_cc.trace`` accepts
    more than JAX (a tracer passed in a custom_vjp ``nondiff_argnums`` position, which
    trace makes a closed-over operand): ``jaxpr_cc.jit`` stands in for ``jax.jit``."""
    return _thread_flag("jax_errors")


def patterns_when_given():
    """Sessions opened inside trace a symbolic-zeros rule for the perturbation
    patterns JAX gives it only when JAX first gives them (``rules.PatternRules``),
    none up front.  For ``jaxpr_cc.jit``: its programs run in this process, where
    a pattern is traced when it is needed, and ``save`` / ``emit_python`` complete
    every pattern anyway (``frontend.saved_patterns``).  Up-front variants of a
    rule whose bwd is a whole solve (diffrax's adjoints) cost a trace each."""
    return _thread_flag("patterns_when_given")


@contextlib.contextmanager
def _thread_flag(name: str):
    prev = getattr(_local, name, False)
    setattr(_local, name, True)
    try:
        yield
    finally:
        setattr(_local, name, prev)


@contextlib.contextmanager
def session(**options):
    install_hooks()
    with _resumed(TraceSession(**options)) as s:
        yield s


@contextlib.contextmanager
def _resumed(s: TraceSession):
    prev = current()
    _local.session = s
    try:
        with _JIT_CACHE_CONTEXT(("jaxpr_cc", s.cache_token)):
            yield s
    finally:
        _local.session = prev
