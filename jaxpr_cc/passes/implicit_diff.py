"""``implicit-diff``: differentiate fixed-point loops by the implicit function theorem.

A ``while`` loop that iterates ``x <- f(theta, x)`` until a convergence test
stops it (see ``fixed_point_match`` for the carry layouts recognised) is
replaced by a first-order ``custom_vjp_call``:

* primal / fwd: the original loop, unchanged (fwd also saves ``theta`` and the
  fixed point ``x*`` -- no iterates, so reverse mode uses memory independent of
  the iteration count, and works where JAX refuses to differentiate a while_loop);
* bwd: solve the adjoint equation ``w = ct + (df/dx)^T w`` at ``x*``, then
  ``ct_theta = (df/dtheta)^T w``.  Cotangents reach every value the loop reads:
  body constants (closed-over values included) and invariant carries.  The
  initial guess gets a zero cotangent (the fixed point does not depend on it);
  a "previous iterate" carry, equal to ``x*`` at convergence, passes its
  cotangent to ``x*``.

The adjoint solve is a ``lax.custom_linear_solve`` of ``(I - J^T) w = ct``
(``J = df/dx`` at ``x*``) whose transpose solve is the forward equation
``(I - J) u = v``: the bwd is linear in ``ct`` and transposable, so
``implicit-diff,vjp-to-jvp`` gives forward mode (``jax.jvp``, ``jax.jacfwd``) by
the implicit function theorem too, and the solve's own derivative is implicit
(no differentiation through solver iterations).  On its own, ``implicit-diff``
turns the loop into a custom_vjp, which JAX does not differentiate in forward
mode.  The rule's fwd computes ``x*`` with the same rule one level down
(``depth`` levels, the innermost running the plain loop), so reverse-over-reverse
derivatives up to that order need no stored iterates either.

Options: ``adjoint`` -- ``fixed-point`` (iterate the adjoint map: it contracts
as fast as the forward map, so it can cost as much as the forward loop),
``gmres`` or ``bicgstab`` (Krylov solves of ``(I - J^T) w = ct``), ``dense``
(materialize ``J`` and solve; small states) or ``auto`` (dense up to
``dense-max-size`` state elements, else bicgstab); ``max-iter`` and ``tol`` bound
the iterative solvers (relative tolerance), ``restart`` is gmres's Krylov
dimension.  ``loops=0,2`` or ``loops=name``
selects loops by position (pre-order over the program, nested regions
included) or by the name of the Python function the loop was traced in; a
selected loop is rewritten even when its condition does not test the iterates.
Loops that do not match are left alone and listed in the pass statistics with
the reason.

This changes derivatives on purpose: the implicit derivative is that of the
exact fixed point, not of the finite sequence of iterates the loop computed.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import jax_adapter as jx
from ..closure.rules import RuleInfo
from ..frontend.from_jaxpr import region_from_closed_jaxpr
from ..ir.equation import Equation
from ..ir.region import Region
from ..ir.value import Value
from .base import Pass, PassContext, register_pass
from .fixed_point_match import INVARIANT, FixedPointLoop, match_fixed_point

#: Rules this pass creates are named ``implicit_diff.<function>``; their regions
#: (which hold the original loop and the adjoint solver's loops) are not searched
#: again, so running the pass twice changes nothing more.
RULE_PREFIX = "implicit_diff."

@register_pass("implicit-diff")
@dataclass(frozen=True)
class ImplicitDiff(Pass):
    summary = ("while loops iterating x <- f(theta, x) to a fixed point -> custom_vjp whose bwd "
               "solves the adjoint equation (implicit function theorem; changes derivatives)")
    loops: tuple[str, ...] = ()      # positions or function names; empty = every matching loop
    adjoint: Literal["auto", "fixed-point", "gmres", "bicgstab", "dense"] = "auto"
    max_iter: int = 1000
    tol: float = 1e-6
    dense_max_size: int = 64
    restart: int = 20
    depth: int = 2

    def __post_init__(self):
        if self.max_iter < 1:
            raise ValueError(f"max-iter must be >= 1, got {self.max_iter}")
        if not self.tol >= 0:
            raise ValueError(f"tol must be >= 0, got {self.tol}")
        if self.restart < 1:
            raise ValueError(f"restart must be >= 1, got {self.restart}")
        if self.depth < 1:
            raise ValueError(f"depth must be >= 1, got {self.depth}")

    def run(self, program, ctx: PassContext):
        found = _while_loops(program.body)
        selected = self._selection(found)
        changed = False
        # Reverse pre-order: loops nested in a loop body are rewritten before the
        # loop that contains them, whose update then uses their implicit rule.
        for position in reversed(range(len(found))):
            region, eqn = found[position]
            where = _where(eqn)
            if selected is not None and position not in selected:
                ctx.count("loops-not-selected")
                continue
            match = match_fixed_point(eqn, forced=selected is not None,
                                      result_used=[region.has_users(v) for v in eqn.outputs])
            if isinstance(match, str):
                ctx.count("loops-skipped")
                ctx.count(f"loop {position} ({where}) skipped: {match}")
                continue
            _replace(region, eqn, match, self, where)
            ctx.count("loops-rewritten")
            changed = True
        ctx.changed = changed
        return program

    def _selection(self, found) -> set[int] | None:
        if not self.loops:
            return None
        chosen: set[int] = set()
        names = {i: _function_name(eqn) for i, (_, eqn) in enumerate(found)}
        for item in self.loops:
            if item.isdigit():
                pos = int(item)
                if pos >= len(found):
                    raise ValueError(f"implicit-diff: loops={item}: the program has {len(found)} "
                                     f"while loops (positions 0..{len(found) - 1})")
                chosen.add(pos)
            else:
                hits = {i for i, n in names.items() if n == item}
                if not hits:
                    known = ", ".join(sorted({n for n in names.values() if n})) or "none"
                    raise ValueError(f"implicit-diff: loops={item}: no while loop was traced in a "
                                     f"function named {item!r} (loops are in: {known})")
                chosen |= hits
        return chosen


def _while_loops(body: Region) -> list[tuple[Region, Equation]]:
    """Every distinct while equation, pre-order (a shared region is visited once),
    outside the rules this pass made."""
    seen: set[int] = set()
    out: list[tuple[Region, Equation]] = []

    def visit(region: Region) -> None:
        if id(region) in seen:
            return
        seen.add(id(region))
        for eqn in region.equations:
            if eqn.prim.name == "while":
                out.append((region, eqn))
            if eqn.prim.name == "custom_vjp_call" and \
                    str(eqn.params.get("name", "")).startswith(RULE_PREFIX):
                continue
            for _, _, sub in eqn.regions():
                visit(sub)

    visit(body)
    return out


def _where(eqn) -> str:
    text = jx.source_summary(eqn.source_info)
    return text or "unknown source"


def _function_name(eqn) -> str:
    text = jx.source_summary(eqn.source_info)
    if text.endswith(")") and "(" in text:
        return text[text.rindex("(") + 1:-1]
    return ""


def _short_source(where: str) -> str:
    """``/path/file.py:27:19 (fn)`` -> ``file.py:27`` (the form rule ``source`` has)."""
    import os
    head = where.split(" (")[0]
    parts = os.path.basename(head).split(":")
    return ":".join(parts[:2])


def _inexact(aval) -> bool:
    return jnp.issubdtype(aval.dtype, jnp.inexact)


# ------------------------------------------------------------------ rewriting
def _replace(region: Region, eqn: Equation, loop: FixedPointLoop, options: ImplicitDiff,
             where: str) -> None:
    params = _custom_vjp_params(eqn, loop, options, where)
    outputs = [Value(v.aval, name=v.name) for v in eqn.outputs]
    new = Equation(jx.custom_vjp_call_p, list(eqn.inputs), outputs, params,
                   eqn.effects, eqn.source_info, eqn.ctx)
    region.insert_before(eqn, new)
    for old, out in zip(eqn.outputs, outputs):
        region.replace_all_uses_with(old, out)
    region.erase(eqn)


def _loop_region(eqn: Equation, extra_outputs, inner_params: dict | None = None) -> Region:
    """A Region ``(operands) -> (loop results, *extra)``: a copy of the loop (its
    cond/body Regions shared), or -- with ``inner_params`` -- a custom_vjp_call of
    the rule one level down.  ``extra_outputs(invars, results)`` picks the extras."""
    r = Region()
    invars = [r.add_input(a.aval) for a in eqn.inputs]
    results = [Value(v.aval) for v in eqn.outputs]
    if inner_params is None:
        inner = Equation(eqn.prim, list(invars), results, dict(eqn.params), eqn.effects,
                         eqn.source_info, eqn.ctx)
    else:
        inner = Equation(jx.custom_vjp_call_p, list(invars), results, dict(inner_params),
                         eqn.effects, eqn.source_info, eqn.ctx)
    r.append(inner)
    r.set_outvars(results + list(extra_outputs(invars, results)))
    return r


def _custom_vjp_params(eqn: Equation, loop: FixedPointLoop, options: ImplicitDiff,
                       where: str) -> dict:
    op_avals = [a.aval for a in eqn.inputs]
    out_avals = [v.aval for v in eqn.outputs]
    theta = loop.theta
    theta_ops = [loop.const_operand(k) if kind == "const" else loop.carry_operand(k)
                 for kind, k in theta]
    theta_avals = [op_avals[j] for j in theta_ops]
    state_avals = [out_avals[i] for i in loop.state]
    name = _function_name(eqn) or "while"
    info = RuleInfo(name=f"{RULE_PREFIX}{name}", source=_short_source(where), const_names=())
    f_eval = _state_update(loop, theta)
    solver = _Solver(options, sum(int(np.prod(a.shape)) for a in state_avals))
    bwd = _bwd_region(info, loop, f_eval, solver, theta_ops, theta_avals, state_avals,
                      op_avals, out_avals)
    call = _loop_region(eqn, lambda invars, results: [])

    def residuals(invars, results):
        return [invars[j] for j in theta_ops] + [results[i] for i in loop.state]

    params = None
    for _ in range(options.depth):
        # Level 1's fwd runs the loop; level k's runs level k-1's rule, so that
        # differentiating the fwd (reverse over reverse) is implicit as well.
        params = dict(call_jaxpr=call, fwd_jaxpr=_loop_region(eqn, residuals, params),
                      bwd_jaxpr=bwd, num_consts=0, num_res=len(theta_avals) + len(state_avals),
                      symbolic_zeros=False, depth_limit=None, name=info.name, source=info.source,
                      const_names=(), closed_over="auto", max_forward_size=4096, reverse_ok=True)
    return params


def _state_update(loop: FixedPointLoop, theta):
    """``f(theta_values, state_values) -> new state values`` evaluating the body's
    state update (the dead-code-eliminated body)."""
    theta_index = {src: i for i, src in enumerate(theta)}
    state_index = {c: i for i, c in enumerate(loop.state)}

    def f(theta_vals, state_vals):
        ins = []
        for src in loop.f_inputs:
            if src[0] == "carry" and src[1] in state_index:
                ins.append(state_vals[state_index[src[1]]])
            else:
                ins.append(theta_vals[theta_index[src]])
        return list(jx.eval_jaxpr(loop.f_jaxpr, (), *ins))

    return f


class _Solver:
    """``solve(matvec, b)``: ``w`` with ``matvec(w) = b`` on lists of arrays, for
    ``matvec = I - A`` with ``A`` a contraction (the solve and transpose-solve of
    ``lax.custom_linear_solve``)."""

    def __init__(self, options: ImplicitDiff, size: int):
        method = options.adjoint
        if method == "auto":
            method = "dense" if size <= options.dense_max_size else "bicgstab"
        self.method = method
        self.max_iter = options.max_iter
        self.tol = options.tol
        self.restart = options.restart

    def __call__(self, matvec, b):
        b = list(b)
        if self.method == "fixed-point":
            return self._fixed_point(matvec, b)
        if self.method == "gmres":
            return self._gmres(matvec, b)
        if self.method == "bicgstab":
            return self._bicgstab(matvec, b)
        return self._dense(matvec, b)

    def _bicgstab(self, matvec, b):
        from jax.scipy.sparse.linalg import bicgstab
        w, _ = bicgstab(lambda w: list(matvec(w)), b, x0=b, tol=self.tol, atol=0.0,
                        maxiter=self.max_iter)
        return list(w)

    def _fixed_point(self, matvec, b):
        """Iterate ``w <- b + A w = w + (b - matvec(w))`` until it stops changing."""
        tol, max_iter = self.tol, self.max_iter

        def keep_going(carry):
            k, _, gap = carry
            return (k < max_iter) & (gap > tol)

        def step(carry):
            k, w, _ = carry
            new = [wi + bi - mi for wi, bi, mi in zip(w, b, matvec(w))]
            change = functools.reduce(jnp.maximum, [jnp.max(jnp.abs(n - o)) for n, o in zip(new, w)])
            scale = 1.0 + functools.reduce(jnp.maximum, [jnp.max(jnp.abs(n)) for n in new])
            return k + 1, new, (change / scale).astype(jnp.float32)

        _, w, _ = lax.while_loop(keep_going, step, (0, b, jnp.float32(jnp.inf)))
        return w

    def _gmres(self, matvec, b):
        from jax.scipy.sparse.linalg import gmres
        size = sum(int(np.prod(jnp.shape(x))) for x in b)
        restart = min(self.restart, max(1, size))
        w, _ = gmres(lambda w: list(matvec(w)), b, x0=b, tol=self.tol, atol=0.0,
                     restart=restart, maxiter=max(1, self.max_iter // restart),
                     solve_method="batched")
        return list(w)

    def _dense(self, matvec, b):
        from jax.flatten_util import ravel_pytree
        flat_b, unravel = ravel_pytree(b)
        n = flat_b.shape[0]

        def column(e):
            return ravel_pytree(list(matvec(unravel(e))))[0]

        # Row i of vmap(column)(I) is M e_i: the matrix of M, transposed.
        m_t = jax.vmap(column)(jnp.eye(n, dtype=flat_b.dtype))
        return list(unravel(jnp.linalg.solve(m_t.T, flat_b)))


def _closed(fn, avals, name: str):
    jaxpr, consts, _ = jx.trace_flat(fn, list(avals), name)
    if consts:
        raise RuntimeError(f"implicit-diff: {name} captured {len(consts)} constants")
    return jx.ClosedJaxpr(jaxpr, [])


def _bwd_region(info, loop: FixedPointLoop, f_eval, solver: _Solver, theta_ops,
                theta_avals, state_avals, op_avals, out_avals) -> Region:
    """bwd: ``(theta, x*, ct of the float results) -> ct of the float operands``."""
    nt, ns = len(theta_avals), len(state_avals)
    out_inexact = [_inexact(a) for a in out_avals]
    ct_avals = [jx.to_cotangent_aval(a) for a, inexact in zip(out_avals, out_inexact) if inexact]
    state_pos = {c: i for i, c in enumerate(loop.state)}
    hot = [k for k, a in enumerate(theta_avals) if _inexact(a)]

    def bwd(*args):
        theta_vals, x_star, cts = list(args[:nt]), list(args[nt:nt + ns]), args[nt + ns:]
        it = iter(cts)
        ct_of = {i: next(it) for i, inexact in enumerate(out_inexact) if inexact}
        ct_x = [ct_of[c] for c in loop.state]
        for prev, src in loop.copies.items():
            if prev in ct_of:
                ct_x[state_pos[src]] = ct_x[state_pos[src]] + ct_of[prev]
        # Adjoint equation (I - J^T) w = ct_x, J = df/dx at the fixed point.
        _, pull_x = jax.vjp(lambda *xs: f_eval(theta_vals, list(xs)), *x_star)

        def matvec(w):
            return [wi - pi for wi, pi in zip(w, pull_x(list(w)))]

        w = lax.custom_linear_solve(matvec, ct_x, solver, solver)
        ct_ops: dict[int, object] = {}

        def add(j, ct):
            ct_ops[j] = ct_ops[j] + ct if j in ct_ops else ct

        if hot:
            def through_theta(*hv):
                full = list(theta_vals)
                for k, v in zip(hot, hv):
                    full[k] = v
                return f_eval(full, x_star)
            _, pull_theta = jax.vjp(through_theta, *[theta_vals[k] for k in hot])
            for k, ct in zip(hot, pull_theta(list(w))):
                add(theta_ops[k], ct)
        for i, kind in enumerate(loop.kinds):
            if kind == INVARIANT and i in ct_of:
                add(loop.carry_operand(i), ct_of[i])
        return [ct_ops[j] if j in ct_ops else jnp.zeros(a.shape, a.dtype)
                for j, a in enumerate(op_avals) if _inexact(a)]

    closed = _closed(bwd, [*theta_avals, *state_avals, *ct_avals], f"{info.name}_bwd")
    return region_from_closed_jaxpr(closed)
