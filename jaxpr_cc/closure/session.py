"""Trace-time closure conversion: custom rules are traced while the trace is live.

While a :class:`TraceSession` is active on this thread, calls of ``jax.custom_vjp``
/ ``jax.custom_jvp`` functions and binds of ``linear_call`` are intercepted.  Each
rule (primal, fwd/bwd, jvp, transpose) is traced to a jaxpr at once; the values it
closes over — constants and tracers of the enclosing traces — are lifted to explicit
leading operands; and the call is re-bound through a first-order rule
(``rules.build_*``), which JAX stages as an ordinary custom equation.

Rules are cached by (custom function, a fingerprint of everything its rules and static
arguments can read, argument types, level), so 1,000 calls of the same function trace
its rules once, and a call whose closed-over values differ traces its own.  A rule whose own body calls
the same custom function (the tutorial's ``fixed_point`` calls itself in its fwd and
bwd, with a new function at every level; JAX's ``logaddexp`` jvp calls
``logaddexp``) would unfold forever if every level were traced eagerly, so a custom
function's rules are materialized while it appears fewer than ``rule_depth`` times on
the stack of rules being traced; deeper calls keep their primal and raise a clear
error if differentiated to that order.  Chains of different functions are not
limited: they end by themselves.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any

import jax
import numpy as np
from jax import tree_util
from jax.custom_derivatives import CustomVJPPrimal, SymbolicZero

from .. import jax_adapter as jx
from . import naming
from .errors import ClosureConversionError
from .fingerprint import fingerprint
from .rules import (CLOSED_OVER_MODES, JVPRule, LinearRule, RuleInfo, VJPRule, bind_linear_rule,
                    build_custom_jvp, build_custom_vjp, is_inexact)

_local = threading.local()
# JAX's jit tracing cache must not hand a jit body traced inside one session (its rules
# re-bound with that session's options and depth) to code outside it or to a session
# with other options: the session's options are part of JAX's cache key.
_JIT_CACHE_CONTEXT = jax.make_user_context(default_value=None)
_install_lock = threading.Lock()
_installed = False
_originals: dict[str, Any] = {}


def current() -> "TraceSession | None":
    return getattr(_local, "session", None)


class TraceSession:
    def __init__(self, closed_over: str = "auto", max_forward_size: int = 4096,
                 rule_depth: int = 3):
        if closed_over not in CLOSED_OVER_MODES:
            raise ValueError(f"closed_over must be one of {', '.join(CLOSED_OVER_MODES)}, "
                             f"got {closed_over!r}")
        if rule_depth < 1:
            raise ValueError(f"rule_depth must be at least 1, got {rule_depth}")
        self.closed_over = closed_over
        self.max_forward_size = int(max_forward_size)
        self.rule_depth = int(rule_depth)
        self.active: dict[int, int] = {}  # custom function -> rules of it being traced
        self.cache: dict[Any, Any] = {}
        self.keepalive: list[Any] = []
        self.rules_traced = 0
        self.perturbable = jx.PerturbationOracle()

    # ------------------------------------------------------------ helpers
    def level(self, fn_key) -> int:
        """How many rules of this custom function are being traced around this call."""
        return self.active.get(id(fn_key), 0)

    def truncated(self, fn_key) -> bool:
        return self.level(fn_key) >= self.rule_depth

    @contextlib.contextmanager
    def inside_rules_of(self, fn_key):
        self.active[id(fn_key)] = self.active.get(id(fn_key), 0) + 1
        try:
            yield
        finally:
            self.active[id(fn_key)] -= 1

    def info(self, fn, consts, roots) -> RuleInfo:
        return RuleInfo(name=naming.name_of(fn), source=naming.source_of(fn),
                        const_names=naming.const_names(consts, roots),
                        closed_over=self.closed_over, max_forward_size=self.max_forward_size)

    # --------------------------------------------------------- custom_vjp
    def call_custom_vjp(self, cvjp, args, kwargs):
        args = jx.resolve_kwargs(cvjp.fun, args, kwargs)
        if self._jax_can_run_rules(cvjp, args):
            return _originals["vjp"](cvjp, *args)
        return self._call_custom("vjp", cvjp, list(args), self._materialize_vjp)

    def _jax_can_run_rules(self, custom, args) -> bool:
        """Under an AD transformation applied inside the traced function, JAX runs
        the rules at once, while this trace is live: with its exact semantics
        (symbolic zeros, bwd run during the backward pass).  JAX fails only when the
        primal closes over a value that this AD perturbs; such calls are converted."""
        if not jx.inside_autodiff():
            return False
        nondiff = tuple(custom.nondiff_argnums)
        static = [args[i] for i in nondiff]
        flat, in_tree = tree_util.tree_flatten([a for i, a in enumerate(args) if i not in nondiff])
        _, consts, _, _ = self._trace_primal(custom, static, nondiff, len(args), in_tree,
                                             tuple(jx.typeof(x) for x in flat), "custom primal")
        return not any(jx.is_autodiff_tracer(c) for c in consts)

    def _call_custom(self, kind, custom, args, materialize):
        """Bind a call of a custom function through its (cached) first-order rule."""
        nondiff = tuple(custom.nondiff_argnums)
        static = [args[i] for i in nondiff]
        dyn = [a for i, a in enumerate(args) if i not in nondiff]
        flat, in_tree = tree_util.tree_flatten(dyn)
        avals = tuple(jx.typeof(x) for x in flat)
        # Reuse needs the same rule *and* the same closed-over values: the fingerprint
        # covers everything the rules and the static arguments can read.
        seen = fingerprint((_rule_functions(kind, custom), static), self.keepalive)
        # An input JAX could never perturb (a constant, a stop_gradient) gets no
        # tangent: a rule defined with symbolic_zeros=True sees a SymbolicZero for it,
        # and a rule none of whose inputs can be perturbed is never run by JAX.
        perturbed = tuple(is_inexact(a) and self.perturbable(x) for x, a in zip(flat, avals))
        key = (kind, id(custom), seen, in_tree, avals, perturbed,
               min(self.level(custom), self.rule_depth))
        self.keepalive.append(custom)
        hit = self.cache.get(key) if seen is not None else None
        if hit is None:
            hit = materialize(custom, static, nondiff, in_tree, avals, len(args), perturbed)
            if seen is not None:
                self.cache[key] = hit
        rule, consts, out_tree, g = hit
        outs = g(*consts, *flat)
        return tree_util.tree_unflatten(out_tree, outs)

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

    def _materialize_vjp(self, cvjp, static, nondiff, in_tree, avals, n_args, perturbed):
        self.rules_traced += 1
        p_jaxpr, p_consts, out_avals, out_tree = self._trace_primal(
            cvjp, static, nondiff, n_args, in_tree, avals, "custom_vjp primal")
        truncated = self.truncated(cvjp)
        f_jaxpr = b_jaxpr = None
        f_consts: list = []
        b_consts: list = []
        num_res = 0
        if not any(perturbed):
            f_jaxpr, f_consts, b_jaxpr, b_consts = _unperturbed_vjp(p_jaxpr, p_consts, avals,
                                                                    out_avals)
        elif not truncated:
            try:
                with self.inside_rules_of(cvjp):
                    f_jaxpr, f_consts, num_res, res_layout = self._trace_vjp_fwd(
                        cvjp, static, nondiff, n_args, in_tree, avals, out_tree, perturbed)
                    b_jaxpr, b_consts = self._trace_vjp_bwd(
                        cvjp, static, in_tree, avals, out_tree, out_avals, f_jaxpr, num_res,
                        res_layout, perturbed)
            except ClosureConversionError:
                raise
            except Exception as e:  # JAX would raise it only when differentiating
                num_res = 0
                f_jaxpr, f_consts, b_jaxpr, b_consts = _refusing_vjp(
                    p_jaxpr, p_consts, avals, out_avals, _rule_error("vjp", cvjp.fwd, e))
        consts = _dedupe(p_consts + f_consts + b_consts)
        n_c = len(consts)
        call = _close(_with_consts(p_jaxpr, p_consts, consts))
        fwd = _close(_with_consts(f_jaxpr, f_consts, consts)) if f_jaxpr is not None else None
        bwd = _close(_with_consts(b_jaxpr, b_consts, consts)) if b_jaxpr is not None else None
        info = self.info(cvjp.fun, consts, [cvjp.fun, cvjp.fwd, cvjp.bwd, *static])
        info = _with_reverse_ok(info, call)
        rule = VJPRule(info=info, call=call, fwd=fwd, bwd=bwd, num_consts=n_c, num_res=num_res,
                       symbolic_zeros=bool(cvjp.symbolic_zeros),
                       depth_limit=self.rule_depth if truncated else None)
        return rule, consts, out_tree, build_custom_vjp(rule)

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
                       res_layout, perturbed):
        n_out = len(out_avals)
        res_tree, fixed_res = res_layout
        res_avals = [v.aval for v in f_jaxpr.outvars[n_out:]]
        ct_avals = [a for a in out_avals if is_inexact(a)]

        def bwd_flat(*xs):
            traced_res = iter(xs[:num_res])
            res = tree_util.tree_unflatten(
                res_tree, [next(traced_res) if r is None else r for r in fixed_res])
            it = iter(xs[num_res:])
            cts = [next(it) if is_inexact(a) else np.zeros(a.shape, jax.dtypes.float0)
                   for a in out_avals]
            got = cvjp.bwd(*static, res, tree_util.tree_unflatten(out_tree, cts))
            return _flatten_cotangents(got, in_tree, avals, cvjp, perturbed)

        jaxpr, consts, _ = jx.trace_flat(bwd_flat, [*res_avals, *ct_avals], "custom_vjp bwd")
        return jaxpr, consts

    # --------------------------------------------------------- custom_jvp
    def call_custom_jvp(self, cjvp, args, kwargs):
        args = jx.resolve_kwargs(cjvp.fun, args, kwargs)
        if self._jax_can_run_rules(cjvp, args):
            return _originals["jvp"](cjvp, *args)
        nondiff = tuple(cjvp.nondiff_argnums)
        # As JAX does: no derivative flows through non-differentiable arguments.
        args = [tree_util.tree_map(_stop_gradient_arrays, a) if i in nondiff else a
                for i, a in enumerate(args)]
        return self._call_custom("jvp", cjvp, args, self._materialize_jvp)

    def _materialize_jvp(self, cjvp, static, nondiff, in_tree, avals, n_args, perturbed):
        self.rules_traced += 1
        p_jaxpr, p_consts, out_avals, out_tree = self._trace_primal(
            cjvp, static, nondiff, n_args, in_tree, avals, "custom_jvp primal")
        truncated = self.truncated(cjvp)
        j_jaxpr, j_consts = None, []
        if not any(perturbed):
            j_jaxpr, j_consts = _unperturbed_jvp(p_jaxpr, p_consts, avals, out_avals)
        elif not truncated:
            try:
                with self.inside_rules_of(cjvp):
                    j_jaxpr, j_consts = self._trace_jvp(cjvp, static, in_tree, avals, out_tree,
                                                        out_avals, perturbed)
            except ClosureConversionError:
                raise
            except Exception as e:  # JAX would raise it only when differentiating
                j_jaxpr, j_consts = _refusing_jvp(p_jaxpr, p_consts, avals, out_avals,
                                                  _rule_error("jvp", cjvp.jvp, e))
        consts = _dedupe(p_consts + j_consts)
        call = _close(_with_consts(p_jaxpr, p_consts, consts))
        jvp = _close(_with_consts(j_jaxpr, j_consts, consts)) if j_jaxpr is not None else None
        info = self.info(cjvp.fun, consts, [cjvp.fun, cjvp.jvp, *static])
        info = _with_reverse_ok(info, call)
        rule = JVPRule(info=info, call=call, jvp=jvp, num_consts=len(consts),
                       symbolic_zeros=bool(cjvp.symbolic_zeros),
                       depth_limit=self.rule_depth if truncated else None)
        return rule, consts, out_tree, build_custom_jvp(rule)

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
            t_leaves = _flatten_tangents(t_out, out_tree, out_avals, cjvp)
            return [*p_leaves, *t_leaves]

        jaxpr, consts, _ = jx.trace_flat(jvp_flat, [*avals, *t_avals], "custom_jvp jvp")
        return jaxpr, consts

    # --------------------------------------------------------- linear_call
    def bind_linear_call(self, operands, params):
        callee = params["callee"]
        n_cc, n_res = params["num_callee_consts"], params["num_res"]
        thunk = params["transpose_thunk"]
        ops = list(operands)
        callee_consts, res, lin = ops[:n_cc], ops[n_cc:n_cc + n_res], ops[n_cc + n_res:]
        truncated = self.truncated(_LINEAR_CALL)
        t_jaxpr, t_consts = None, []
        if not truncated:
            with self.inside_rules_of(_LINEAR_CALL):
                t_closed, t_consts = thunk()  # the trace that made the call is still live
            t_jaxpr = t_closed
        # New residuals: the callee's and the transpose's closed-over values, then the
        # user's residuals.  callee (cc, r, x) and transpose (tc, r, ct) both become
        # functions of (cc, tc, r, ...), ignoring the other's closed-over values.
        res_all = list(callee_consts) + list(t_consts) + list(res)
        cc_avals = [jx.typeof(c) for c in callee_consts]
        tc_avals = [jx.typeof(c) for c in t_consts]
        callee_new = _close(_insert_inputs(callee.jaxpr, len(callee_consts), tc_avals))
        transpose_new = None
        if t_jaxpr is not None:
            transpose_new = _close(_insert_inputs(t_jaxpr.jaxpr, 0, cc_avals))
        info = RuleInfo(name="linear_call", source="<linear_call>", const_names=(),
                        closed_over=self.closed_over, max_forward_size=self.max_forward_size)
        rule = LinearRule(info=info, callee=callee_new, transpose=transpose_new,
                          num_res=len(res_all),
                          depth_limit=self.rule_depth if truncated else None)
        self.rules_traced += 1
        return bind_linear_rule(rule, [*res_all, *lin])


_LINEAR_CALL = object()  # linear_call transposes share one recursion counter


def _rule_functions(kind: str, custom) -> tuple:
    """The user's Python functions that define a custom function's primal and rules."""
    if kind == "vjp":
        return (custom.fun, custom.fwd, custom.bwd)
    return (custom.fun, custom.jvp)


def _stop_gradient_arrays(x):
    if isinstance(x, (jax.Array, jx.Tracer)):
        return jax.lax.stop_gradient(x)
    return x


def _unperturbed_vjp(p_jaxpr, p_consts, avals, out_avals):
    """fwd and bwd of a custom_vjp whose arguments JAX can never perturb: JAX never
    runs the user's rules, so neither do we (they may refuse to run, as equinox's
    ``nondifferentiable`` does).  fwd is the primal with no residuals; bwd gives zero
    cotangents.  Derivatives with respect to closed-over values still follow the
    closed-over policy."""
    import jax.numpy as jnp
    def fwd(*xs):
        return jx.eval_jaxpr(p_jaxpr, [], *p_consts, *xs)

    def bwd(*cts):
        return [jnp.zeros(a.shape, a.dtype) for a in avals if is_inexact(a)]

    f_jaxpr, f_consts, _ = jx.trace_flat(fwd, avals, "custom_vjp fwd")
    b_jaxpr, b_consts, _ = jx.trace_flat(bwd, [a for a in out_avals if is_inexact(a)],
                                         "custom_vjp bwd")
    return f_jaxpr, f_consts, b_jaxpr, b_consts


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
    zero tangents (the user's rule is never run, as in JAX)."""
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
    if not is_inexact(aval):
        return np.zeros(aval.shape, jax.dtypes.float0)
    if symbolic:
        return SymbolicZero(aval.to_tangent_aval())
    return jnp.zeros(aval.shape, aval.dtype)


def _flatten_cotangents(got, in_tree, avals, cvjp, perturbed):
    """The user's bwd result -> dense cotangents of the inexact argument leaves."""
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
        idxs, structure = tree_util.tree_flatten(idx_tree)
        if ct is None:
            return
        try:  # None stands for zeros, at a leaf or for a whole subtree
            leaves = structure.flatten_up_to(ct)
        except (ValueError, TypeError):
            raise ClosureConversionError(
                f"custom_vjp bwd '{naming.name_of(cvjp.bwd)}' ({naming.source_of(cvjp.bwd)}) "
                f"returned cotangents whose structure does not match the arguments") from None
        for i, leaf in zip(idxs, leaves):
            flat[i] = leaf

    if len(got) != len(dummy):
        raise ClosureConversionError(
            f"custom_vjp bwd '{naming.name_of(cvjp.bwd)}' ({naming.source_of(cvjp.bwd)}) returned "
            f"{len(got)} cotangents for {len(dummy)} differentiable arguments")
    for ct, d in zip(got, dummy):
        place(ct, d)
    out = []
    for ct, a, p in zip(flat, avals, perturbed):
        if not is_inexact(a):
            continue
        if not p:  # JAX drops the cotangent of an input it never perturbed
            ct = None
        if ct is None or type(ct).__name__ == "SymbolicZero" or (
                hasattr(ct, "dtype") and ct.dtype == jax.dtypes.float0):
            out.append(jnp.zeros(a.shape, a.dtype))
        else:
            out.append(jnp.asarray(ct).astype(a.dtype) if jnp.result_type(ct) != a.dtype else ct)
    return out


def _flatten_tangents(t_out, out_tree, out_avals, cjvp):
    import jax.numpy as jnp
    try:  # tangents have the primal outputs' structure, as JAX requires
        leaves = out_tree.flatten_up_to(t_out)
    except (ValueError, TypeError) as e:
        raise ClosureConversionError(
            f"custom_jvp rule '{naming.name_of(cjvp.jvp)}' ({naming.source_of(cjvp.jvp)}) returns "
            f"tangents whose structure does not match the primal outputs ({out_tree}): "
            f"{' '.join(str(e).split())[:300]}") from None
    out = []
    for t, a in zip(leaves, out_avals):
        if not is_inexact(a):
            continue
        if t is None or type(t).__name__ == "SymbolicZero":
            out.append(jnp.zeros(a.shape, a.dtype))
        else:
            out.append(t)
    return out


def _dedupe(values: list) -> list:
    seen, out = set(), []
    for v in values:
        if id(v) not in seen:
            seen.add(id(v))
            out.append(v)
    return out


def _with_consts(jaxpr, own_consts: list, all_consts: list):
    """``jaxpr`` takes ``own_consts`` as leading inputs; make it take ``all_consts``."""
    n_own = len(own_consts)
    const_invars, rest = jaxpr.invars[:n_own], jaxpr.invars[n_own:]
    by_id = {id(c): v for c, v in zip(own_consts, const_invars)}
    invars = []
    for c in all_consts:
        v = by_id.get(id(c))
        invars.append(v if v is not None else jx.Var(jx.typeof(c)))
    return jx.Jaxpr([], invars + list(rest), jaxpr.outvars, jaxpr.eqns, jaxpr.effects,
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


@contextlib.contextmanager
def session(**options):
    install_hooks()
    s = TraceSession(**options)
    prev = current()
    _local.session = s
    try:
        with _JIT_CACHE_CONTEXT(("jaxpr_cc", s.closed_over, s.max_forward_size, s.rule_depth)):
            yield s
    finally:
        _local.session = prev
