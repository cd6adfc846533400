"""``implicit-diff``: differentiate fixed-point loops by the implicit function theorem.

A ``while`` loop that iterates ``x <- f(theta, x)`` and whose exit test is the
convergence of the iterate (see ``fixed_point_match``: the change
``|x_(k+1) - x_k|`` or the residual ``|x - T(x)|`` against a tolerance, with or
without an iteration cap) is
replaced by a first-order ``custom_jvp_call``:

* primal: the original loop, with an iteration counter (an extra, unused result);
* jvp rule: the fixed point ``x*`` (computed by the same rule one level down,
  ``depth`` levels, the innermost running the loop), and its tangent by the
  implicit function theorem, ``(I - df/dx) t_x = df/dtheta . t_theta`` at ``x*``,
  solved with ``lax.custom_linear_solve``.

JAX differentiates that rule in every mode: forward mode (``jax.jvp``,
``jax.jacfwd``) runs the solve; reverse mode transposes it -- the adjoint solve
``(I - df/dx)^T w = ct`` -- so reverse mode stores no iterates (memory independent
of the iteration count) and works where JAX refuses to differentiate a
while_loop; higher derivatives differentiate the solve implicitly (never through
solver iterations) and, up to order ``depth`` (default 3), the fixed point
through the rule; beyond it, forward mode differentiates the loop's iterations
and reverse mode fails as it does on any while_loop.
Tangents reach every value the loop reads: body constants (closed-over values
included) and invariant carries.  The condition's constants (tolerances) get
zero tangents; the initial guess reaches the result through ``J^K t_0`` (added
exactly with the dense adjoint); a "previous iterate" carry, equal to ``x*`` at
convergence, has ``x*``'s tangent; a carried convergence gap has a zero tangent.

The derivative is the loop's own.  The implicit one is used only where a
run-time certificate bounds its gap to the loop's by ``TANGENT_RTOL`` (see
``_certificate``: the loop converged, and a probe of the tangent map carried
along the iterates the loop visited -- in the derivative path only, see
``_probing_loop`` -- with J's rate at the fixed point bounds the gap).  Otherwise
the derivative is formed from the loop's Jacobian by forward mode through its
iterations (so reverse mode works where JAX refuses); when the loop's operands
exceed ``fallback-max-size`` elements, forward mode runs through the iterations
along the given tangents and reverse mode is NaN -- never a different number.
Loops with complex values are left alone (the solve assumes a real Jacobian);
so are loops calling a ``custom_vjp`` rule (no forward mode: run ``vjp-to-jvp``
first), and any loop whose rule cannot be built, each with its reason.

Every other loop -- explicit time stepping ``while t < T``, growth loops
``while x < 10``, counted loops, relative tests -- is left alone, and the pass
statistics list each with the reason.  So is every loop inside a user's custom
rule (a ``custom_vjp``'s primal, fwd and bwd, a ``custom_jvp``'s primal and jvp,
a ``linear_call``'s callee and transpose): the rule defines the derivative there
(see ``_inside_custom_rules``).

Options: ``adjoint`` -- the linear solver, used for the tangent and (transposed)
the adjoint equation: ``fixed-point`` (iterate the linear map: it contracts as
fast as the forward map, so it can cost as much as the forward loop),
``gmres`` or ``bicgstab`` (Krylov solves of ``(I - J) t = b``), ``dense``
(materialize ``J`` and solve; small states) or ``auto`` (dense up to
``dense-max-size`` state elements, else the fixed-point iteration when the
certificate measured a fast contraction, bicgstab otherwise: ``_Solver``);
``max-iter`` and ``tol`` bound
the iterative solvers (relative tolerance), ``restart`` is gmres's Krylov
dimension.  ``loops=0,2`` or ``loops=name``
selects loops by position (pre-order over the program, nested regions
included) or by the name of the Python function the loop was traced in (a traced
program's source locations: a loaded program has none, so by position only); a
selected loop is rewritten even when its condition is not a convergence test
(the user vouches that it converges).  ``depth`` is the number of derivative
orders that are implicit (the levels of the rule).

What the pass buys is the cost of reverse mode, not a different derivative:
memory independent of the iteration count, and a gradient where JAX has none.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import jax_adapter as jx
from ..backends.jaxpr import region_to_closed_jaxpr
from ..closure.rules import JVPRule, RuleInfo, build_custom_jvp
from ..frontend.from_jaxpr import region_from_closed_jaxpr
from ..frontend.staged_rules import convert_program
from ..ir.equation import Equation
from ..ir.region import Region
from ..ir.value import Value
from .base import Pass, PassContext, PassOptionError, register_pass
from .fixed_point_match import (COUNTER, INVARIANT, FixedPointLoop, convergence_only,
                                match_fixed_point)

#: Rules this pass creates are named ``implicit_diff.<function>``; their regions
#: (which hold the original loop and the adjoint solver's loops) are not searched
#: again, so running the pass twice changes nothing more.
RULE_PREFIX = "implicit_diff."

@register_pass("implicit-diff")
@dataclass(frozen=True)
class ImplicitDiff(Pass):
    summary = ("while loops iterating x <- f(theta, x) until it converges -> custom_jvp whose "
               "tangent solves (I - df/dx) t = df/dtheta t_theta (implicit function theorem)")
    loops: tuple[str, ...] = ()      # positions or function names; empty = every matching loop
    adjoint: Literal["auto", "fixed-point", "gmres", "bicgstab", "dense"] = "auto"
    max_iter: int = 1000
    tol: float = 1e-6
    dense_max_size: int = 64
    restart: int = 20
    depth: int = 3
    fallback_max_size: int = 1024

    def __post_init__(self):
        if self.max_iter < 1:
            raise ValueError(f"max-iter must be >= 1, got {self.max_iter}")
        if not self.tol >= 0:
            raise ValueError(f"tol must be >= 0, got {self.tol}")
        if self.restart < 1:
            raise ValueError(f"restart must be >= 1, got {self.restart}")
        if self.dense_max_size < 0:
            raise ValueError(f"dense-max-size must be >= 0, got {self.dense_max_size}")
        if self.depth < 1:
            raise ValueError(f"depth must be >= 1, got {self.depth}")
        if self.fallback_max_size < 0:
            raise ValueError(f"fallback-max-size must be >= 0, got {self.fallback_max_size}")

    def run(self, program, ctx: PassContext):
        found = _while_loops(program.body)
        ruled = _inside_custom_rules(program.body)
        selected = self._selection(found)
        # A loop holding loops is snapshot before those are rewritten: its
        # fallback derivative (the loop's own, by forward mode through its
        # iterations) then runs through the original inner loops -- the same
        # derivative, without tracing the inner rules' levels once per level of
        # the outer one (which made nested fixed points cost minutes).
        originals = {id(eqn): region_to_closed_jaxpr(_loop_region(eqn)).jaxpr
                     for _, eqn in found if _holds_while(eqn)}
        changed = False
        # Reverse pre-order: loops nested in a loop body are rewritten before the
        # loop that contains them, whose update then uses their implicit rule.
        for position in reversed(range(len(found))):
            region, eqn = found[position]
            where = _where(eqn)
            if selected is not None and position not in selected:
                ctx.count("loops-not-selected")
                continue
            match = ruled.get(id(eqn)) or _complex_reason(eqn) or match_fixed_point(
                eqn, forced=selected is not None,
                result_used=[region.has_users(v) for v in eqn.outputs])
            if isinstance(match, str):
                ctx.count("loops-skipped")
                ctx.count(f"loop {position} ({where}) skipped: {match}")
                continue
            reason = _custom_vjp_reason(eqn)
            if reason is None:
                try:
                    _replace(region, eqn, match, self, where, originals.get(id(eqn)),
                             start_may_move=any(_may_move(region, eqn.inputs[match.carry_operand(i)])
                                                for i in match.state))
                except Exception as e:  # noqa: BLE001 -- a loop the rule cannot be built for is left alone
                    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
                    reason = f"building its implicit rule failed ({type(e).__name__}: {first})"
            if reason is not None:
                ctx.count("loops-skipped")
                ctx.count(f"loop {position} ({where}) skipped: {reason}")
                continue
            ctx.count("loops-rewritten")
            changed = True
        if changed:
            _first_order(program)
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
                    raise PassOptionError(f"implicit-diff: loops={item}: the program has {len(found)} "
                                     f"while loops (positions 0..{len(found) - 1})")
                chosen.add(pos)
            else:
                hits = {i for i, n in names.items() if n == item}
                if not hits and found and not any(names.values()):
                    raise PassOptionError(
                        f"implicit-diff: loops={item}: this program has no source locations "
                        f"(a loaded program keeps none), so its loops have no function names; "
                        f"select them by position: loops=0..{len(found) - 1}")
                if not hits:
                    known = ", ".join(sorted({n for n in names.values() if n})) or "none"
                    raise PassOptionError(f"implicit-diff: loops={item}: no while loop was traced in a "
                                     f"function named {item!r} (loops are in: {known})")
                chosen |= hits
        return chosen


def _complex_reason(eqn: Equation) -> str | None:
    """Why a loop with complex values is left alone (None when it has none).

    The implicit solve treats ``I - df/dx`` as a complex-linear matrix, which a
    state update using ``conj``/``abs``/``real`` is not, and the fallback
    Jacobian perturbs operands along real directions only: either would give a
    wrong derivative."""
    for v in [*eqn.inputs, *eqn.outputs]:
        if jnp.issubdtype(v.aval.dtype, jnp.complexfloating):
            return "the loop carries or reads complex values (the implicit solve assumes " \
                   "a real Jacobian)"
    return None


def _custom_vjp_reason(eqn: Equation) -> str | None:
    """Why a loop calling a ``custom_vjp`` rule is left alone (None when it calls
    none).  The implicit rule linearizes the loop's update (the tangent, the
    certificate's rate, the fallback Jacobian), and JAX has no forward mode
    through a custom_vjp; ``vjp-to-jvp`` first turns such rules into custom_jvp."""
    for inner in _nested_equations(eqn):
        if inner.prim.name == "custom_vjp_call":
            name = inner.params.get("name", "") or "a custom_vjp function"
            return (f"the loop calls the custom_vjp rule {name} (no forward-mode "
                    "derivative; run vjp-to-jvp before implicit-diff)")
    return None


def _first_order(program) -> None:
    """Make the rules this pass built first-order.  A level above the first
    computes the fixed point with the level below, which tracing stages as a
    ``custom_jvp_call`` holding JAX's Python callables; converting them now lets
    the result be saved and emitted without a later ``closure-convert``."""
    from types import SimpleNamespace

    for region in list(program.body.regions()):
        for eqn in list(region.equations):
            if eqn.prim.name == "custom_jvp_call" and \
                    str(eqn.params.get("name", "")).startswith(RULE_PREFIX):
                for _, _, sub in eqn.regions():
                    convert_program(SimpleNamespace(body=sub))


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
            if eqn.prim.name in ("custom_jvp_call", "custom_vjp_call") and \
                    str(eqn.params.get("name", "")).startswith(RULE_PREFIX):
                continue
            for _, _, sub in eqn.regions():
                visit(sub)

    visit(body)
    return out


#: The regions of a custom-rule equation, by what they are to the rule.
_RULE_REGIONS = {
    "custom_vjp_call": {"call_jaxpr": "primal", "fwd_jaxpr": "fwd", "bwd_jaxpr": "bwd"},
    "custom_jvp_call": {"call_jaxpr": "primal", "jvp_jaxpr": "jvp rule"},
    "linear_call": {"callee": "callee", "transpose_jaxpr": "transpose"},
}


def _inside_custom_rules(body: Region) -> dict[int, str]:
    """id(while equation) -> why it is left alone, for every loop in a region of a
    user's custom rule (``custom_vjp`` primal/fwd/bwd, ``custom_jvp`` primal/jvp,
    ``linear_call`` callee/transpose), nested calls included.

    The rule defines the derivative there: JAX never differentiates the primal,
    and the fwd/bwd/jvp/transpose compute it (vjp-to-jvp, forward mode and higher
    orders analyze or differentiate them as written -- a bwd's adjoint loop
    rewritten with an iteration counter is no longer seen as linear in its
    cotangent).  A rewrite there can only lose derivatives, never add one.  A
    region reachable both inside and outside a rule is shared, so it counts as
    inside.  (A rule's regions may reach the rule again -- a fwd calling its own
    function -- so regions are visited once per label.)"""
    ruled: dict[int, str] = {}
    seen: set[int] = set()

    def visit(region: Region, why: str | None) -> None:
        key = (id(region), why)
        if key in seen:
            return
        seen.add(key)
        for eqn in region.equations:
            if eqn.prim.name == "while" and why is not None:
                ruled.setdefault(id(eqn), why)
            name = str(eqn.params.get("name", "") or "")
            if name.startswith(RULE_PREFIX):
                continue
            parts = _RULE_REGIONS.get(eqn.prim.name)
            for key_, _, sub in eqn.regions():
                inner = why
                if parts is not None:   # the innermost rule is the one named
                    kind = "custom_vjp" if eqn.prim.name == "custom_vjp_call" else \
                        "custom_jvp" if eqn.prim.name == "custom_jvp_call" else "linear_call"
                    rule = f"{kind} rule {name}" if name else f"a {kind} rule"
                    inner = (f"the loop is inside the {parts.get(key_, key_)} of the {rule}, "
                             f"whose rules define the derivative there (a rewrite could only "
                             f"change what they compute)")
                visit(sub, inner)

    visit(body, None)
    return ruled


def _nested_equations(eqn: Equation):
    """Every equation of the regions ``eqn`` holds, each region once (the shared
    cycle-safe walker)."""
    seen: set[int] = set()
    for _, _, sub in eqn.regions():
        for region in sub.regions():
            if id(region) not in seen:
                seen.add(id(region))
                yield from region.equations


def _holds_while(eqn: Equation) -> bool:
    return any(inner.prim.name == "while" for inner in _nested_equations(eqn))


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
def _may_move(region: Region, atom) -> bool:
    """Whether ``atom`` may depend on ``region``'s inputs (literals and constants
    cannot), so that a derivative can reach it."""
    seen: set[int] = set()
    todo = [atom]
    inputs = {id(v) for v in region.invars}
    while todo:
        a = todo.pop()
        if not isinstance(a, Value) or id(a) in seen:
            continue
        seen.add(id(a))
        if id(a) in inputs:
            return True
        producer = a.producer
        if isinstance(producer, Equation):
            todo.extend(producer.inputs)
    return False


def _replace(region: Region, eqn: Equation, loop: FixedPointLoop, options: ImplicitDiff,
             where: str, original, start_may_move: bool) -> None:
    params = _custom_jvp_params(eqn, loop, options, where, start_may_move, original)
    outputs = [Value(v.aval, name=v.name) for v in eqn.outputs]
    count = Value(params["call_jaxpr"].outvars[-1].aval)   # the iteration count (unused)
    new = Equation(jx.custom_jvp_call_p, list(eqn.inputs), [*outputs, count], params,
                   eqn.effects, eqn.source_info, eqn.ctx)
    region.insert_before(eqn, new)
    for old, out in zip(eqn.outputs, outputs):
        region.replace_all_uses_with(old, out)
    region.erase(eqn)


def _loop_region(eqn: Equation) -> Region:
    """A Region ``(operands) -> (loop results)`` holding a copy of the loop (its
    cond/body Regions shared)."""
    r = Region()
    invars = [r.add_input(a.aval) for a in eqn.inputs]
    results = [Value(v.aval) for v in eqn.outputs]
    r.append(Equation(eqn.prim, list(invars), results, dict(eqn.params), eqn.effects,
                      eqn.source_info, eqn.ctx))
    r.set_outvars(results)
    return r


def _counting_loop(loop: FixedPointLoop, op_avals, name: str):
    """The loop with an iteration counter: ``(operands) -> (results..., count)``.
    The count is what the tangent's certificate and the start's term ``J^K t_0``
    need; it is an extra (unused) result of the rewritten equation."""
    cond_n, body_n = loop.cond_n, loop.body_n
    # A loop the program vmaps has a batched exit test (JAX's while runs while any
    # element's holds, and its body keeps the finished elements): one count per
    # element, advanced while that element's test holds.
    test_shape = loop.cond_jaxpr.outvars[0].aval.shape

    def counting(*ops):
        cond_consts, body_consts = ops[:cond_n], ops[cond_n:cond_n + body_n]

        def test(carry):
            (ran,) = jx.eval_jaxpr(loop.cond_jaxpr, (), *cond_consts, *carry[:-1])
            return ran

        def step(carry):
            # An unbatched body runs only while the test holds: no second
            # evaluation of the test per step (a vmap of this loop batches it,
            # and JAX's batched while keeps the finished elements' carries).
            running = test(carry) if test_shape else jnp.bool_(True)
            new = jx.eval_jaxpr(loop.body_jaxpr, (), *body_consts, *carry[:-1])
            if test_shape:
                # What JAX's lowering of a batched test does: finished elements
                # keep their carries (the select over the leading axes).
                new = [jnp.where(running.reshape(test_shape + (1,) * (jnp.ndim(n) - len(test_shape))),
                                 n, o) for n, o in zip(new, carry[:-1])]
            return [*new, carry[-1] + running.astype(jnp.int32)]

        init = [*ops[cond_n + body_n:], jnp.zeros(test_shape, jnp.int32)]
        return lax.while_loop(lambda c: jnp.any(test(c)), step, init)

    return _closed(counting, op_avals, name)


def _probing_loop(loop: FixedPointLoop, op_avals, name: str):
    """The counting loop that also runs a probe of the loop's tangent map:
    ``(operands) -> (results..., count, read_at..., read_count, path)``: the
    loop's results and step count, the carries and count where the derivative
    is read (below), and ``path``, the pieces of the bound ``_path_bound``
    forms (it needs the rate at ``x*``).

    The loop's tangent follows ``t_(k+1) = J_k t_k + b_k`` with ``J_k``, ``b_k``
    at the iterate ``x_k``; its gap to ``t*`` (the implicit tangent at ``x*``) is
    ``e_K = P_(0,K) e_0 + sum_k P_(k+1,K) delta_k``, with ``P_(i,K)`` the product
    ``J_(K-1) ... J_i`` and ``delta_k = (J_k - J*) t* + b_k - b*`` of the size of
    ``|x_k - x*| <= sum_(j >= k) |x_(j+1) - x_j|`` (relative to the iterate's
    scale).  A probe ``v <- J_k v`` (normalized, its log growth ``g`` summed)
    gives ``|P_(i,K)| ~ G_K / G_i``; then ``sum_k P_(k+1,K) |x_k - x*| <= G_K W``
    with ``W = sum_j |x_(j+1) - x_j| sum_(k <= j) 1 / G_(k+1)``, accumulated as
    the loop runs.  Unlike a rate measured at ``x*``, it sees Jacobians along
    the path far from the final one.  A vmapped loop's finished elements keep
    their carries (and so their tangents): the probe keeps theirs too.  The
    probe restarts from its start vector every ``RATE_STEPS`` steps: a J_k
    that annihilates one of its modes (``J_yy = 0`` at the start) would blind
    it to that mode for the rest of the path, and to its rate at ``x*``.

    The probe follows the path until the iterate stops moving: each state
    leaf's step at rounding level (``SETTLED_ULPS`` ulps of the leaf's scale,
    ``1 + max |x|``).  It then restarts for one last segment of
    ``RATE_STEPS`` steps at the settled iterate: a power iteration at ``x*``
    whose second half gives the certificate J's rate (one carried along the
    path can have lost a mode at any step).  From there the loop runs as
    written, counting its steps: its iterates are ``x*`` to rounding, so its
    Jacobians are ``J*``, whose rate the certificate measures, and its steps
    are bounded by the settled one's size (``_path_bound``; the distance it
    drifts is checked).  Each such step shrinks the bounds on the tangent's
    gap by the rate; once they are met (``_bounds_met``), the derivative is
    read at that iterate and count (``read_at``, ``read_count``), and the rest
    of the loop makes its results only.  A loop run to a tolerance at the
    rounding floor, or to an iteration cap long after it converged, spends
    most of its steps there, and a gradient alone never runs them (XLA drops
    the unused loop).  A vmapped loop probes every step (its elements settle
    at different steps), and its derivative is read at its results.

    The bound takes the update's curvature along the path as at most
    ``PATH_MARGIN`` times the iterate's scale; an update curved far more
    (``sin(1e5 x) / 1e5``) leaves the loop's tangent far from ``t*`` when the
    bound is met.  So the loop's own tangent is carried as well, from a zero
    start along fixed directions of the parameters, one per group
    (``_tangent_directions``), through the probed and read steps; ``path``'s
    last entry is its last change above its rounding floor relative to its
    size (``_tangent_change``): the derivative is read only once it has
    settled (``_bounds_met``)."""
    cond_n, body_n = loop.cond_n, loop.body_n
    test_shape = loop.cond_jaxpr.outvars[0].aval.shape
    state = list(loop.state)
    n_carry = loop.n_carry
    settle = not test_shape
    f = _state_update(loop, loop.theta)
    # Each leaf's rounding unit (a float64 leaf beside a float32 one settles at
    # its own); the bound counts the coarsest.
    ulps = [float(jnp.finfo(op_avals[loop.carry_operand(i)].dtype).eps) for i in state]
    ulp = max(ulps)
    hot = [k for k, j in enumerate(_theta_operands(loop)) if _inexact(op_avals[j])]

    def probing(*ops):
        cond_consts, body_consts = ops[:cond_n], ops[cond_n:cond_n + body_n]
        carry0 = list(ops[cond_n + body_n:])

        def test(carries):
            (ran,) = jx.eval_jaxpr(loop.cond_jaxpr, (), *cond_consts, *carries)
            return ran

        def keep(running, new, old):
            if not test_shape:
                return new
            return jnp.where(running.reshape(test_shape + (1,) * (jnp.ndim(new) - len(test_shape))),
                             new, old)

        half = RATE_STEPS // 2

        def step(c):
            (carries, count, v, tan, tan_excess, log_g, log_h, log_w, late, since, measuring,
             _) = c
            running = test(carries) if test_shape else jnp.bool_(True)
            # The probe restarts from its start vector every RATE_STEPS steps: a
            # mode some J_k annihilated (J_yy = 0 at the start) is excited again,
            # so later growth in it is measured.
            fresh = (since >= RATE_STEPS) & ~measuring
            v = [jnp.where(fresh, v0, vi) for vi, v0 in zip(v, v_start)]
            since = jnp.where(fresh, 0, since)
            late = jnp.where(fresh, 0.0, late)

            new = jx.eval_jaxpr(loop.body_jaxpr, (), *body_consts, *carries)
            new = [keep(running, n, o) for n, o in zip(new, carries)]
            # The probe's step through the state update alone (the body's other
            # carries -- a convergence gap -- have no tangent to carry); its
            # primal is the body's, which XLA computes once.
            theta_vals = [body_consts[k] if kind == "const" else carries[k]
                          for kind, k in loop.theta]
            _, t_new = jax.jvp(lambda *xs: f(theta_vals, list(xs)),
                               tuple(carries[i] for i in state), tuple(v))
            w = [keep(running, t, vi) for t, vi in zip(t_new, v)]
            tan, tan_excess = tangent_step(running, theta_vals, carries, tan, tan_excess)
            norm = _size(w)
            growth = jnp.log(jnp.maximum(norm, 1e-30))
            log_g = log_g + growth
            # A probe J annihilates (J = 0 at the start, say) starts again: the
            # products through that step are ~0, those after it are measured.
            dead = norm <= 1e-30
            v = [jnp.where(dead, v0, wi / jnp.maximum(norm, 1e-30).astype(wi.dtype))
                 for wi, v0 in zip(w, v_start)]
            # Each leaf's largest step and element, in one reduction (the change in
            # the carries' own precision: a float64 step below float32's
            # resolution is not zero).
            steps_and_sizes = [jnp.max(jnp.abs(jnp.stack([jnp.ravel(new[i] - carries[i]),
                                                           jnp.ravel(new[i])])), axis=1,
                                       initial=0.0).astype(jnp.float32) for i in state]
            moved = functools.reduce(jnp.maximum, [m[0] for m in steps_and_sizes])
            log_h = jnp.logaddexp(log_h, -log_g)
            log_w = jnp.logaddexp(log_w, jnp.log(jnp.maximum(moved, 1e-30)) + log_h)
            since = jnp.where(dead, 0, since + 1)
            # J's rate: the mean growth over a segment's second half (the first
            # lets the slowest mode the start vector holds take over).
            late = jnp.where(dead, 0.0, late + jnp.where(since > half, growth, 0.0))
            # Every state leaf's step at rounding level for that leaf's scale (a
            # small leaf still moving keeps the probe on, whatever the largest is).
            settled = functools.reduce(jnp.logical_and, [
                m[0] <= SETTLED_ULPS * u * (1.0 + m[1]) for m, u in zip(steps_and_sizes, ulps)])
            # Once settled, the probe restarts for one last segment: a power
            # iteration at x* (to rounding), whose rate the certificate uses.  An
            # iterate that moves again (a non-normal J's transient after a step at
            # rounding level) ends the segment: its growths are not J*'s, and the
            # next settled step starts a new one.
            measuring = measuring & settled
            start = settled & ~measuring & settle
            v = [jnp.where(start, v0, vi) for vi, v0 in zip(v, v_start)]
            since = jnp.where(start, 0, since)
            late = jnp.where(start, 0.0, late)
            measuring = measuring | start
            done = measuring & settled & (since >= RATE_STEPS)
            return (new, count + running.astype(jnp.int32), v, tan, tan_excess, log_g, log_h,
                    log_w, late, since, measuring, done)

        def tangent_step(running, theta_vals, carries, tan, tan_excess):
            # The loop's own tangents along fixed directions of the parameters
            # (one per group, ``_tangent_directions``), from a zero start: ``t
            # <- J_k t + b_k u``, and the change of their last step, ``(I - J)
            # (t - t*)`` at ``x*``, less its rounding floor (``TANGENT_ULPS``
            # ulps of the terms it sums, ``|J_k t|`` and ``|b_k u|``, per
            # element: an element of 1e-10 beside one of 1e3 is checked to its
            # own size).  A finished element of a vmapped loop keeps its last.
            if not hot:
                return tan, tan_excess
            x_now = [carries[i] for i in state]

            def through_theta(*hv):
                full = list(theta_vals)
                for k, a in zip(hot, hv):
                    full[k] = a
                return f(full, x_now)

            def one(direction, tan, tan_excess):
                _, j_t = jax.jvp(lambda *xs: f(theta_vals, list(xs)), tuple(x_now), tuple(tan))
                _, b_u = jax.jvp(through_theta, tuple(theta_vals[k] for k in hot),
                                 tuple(direction))
                new_tan, moved = [], []
                for jt, bu, t_old, d in zip(j_t, b_u, tan, tan_excess):
                    t = jt + bu
                    floor = (TANGENT_ULPS * float(jnp.finfo(jnp.result_type(t)).eps)
                             * (jnp.abs(jt) + jnp.abs(bu)))
                    moved.append(keep(running, jnp.maximum(jnp.abs(t - t_old) - floor, 0.0), d))
                    new_tan.append(keep(running, t, t_old))
                return new_tan, moved

            return jax.vmap(one)(directions, tan, tan_excess)

        v = v_start = _probe_start([carry0[i] for i in state])
        theta_start = [body_consts[k] if kind == "const" else carry0[k] for kind, k in loop.theta]
        directions = _tangent_directions([theta_start[k] for k in hot], test_shape)
        groups = directions[0].shape[0] if directions else 1
        tan0 = [jnp.zeros((groups, *jnp.shape(carry0[i])), jnp.result_type(carry0[i]))
                for i in state]
        minus_inf = jnp.float32(-jnp.inf)
        init = (carry0, jnp.zeros(test_shape, jnp.int32), v, tan0, tan0, jnp.float32(0.0),
                minus_inf, minus_inf, jnp.float32(0.0), jnp.int32(0), jnp.bool_(False),
                jnp.bool_(False))
        (settled, count, _, tan, tan_excess, log_g, log_h, log_w, late, since, measuring,
         _) = lax.while_loop(lambda c: jnp.any(test(c[0])) & ~c[-1], step, init)
        settled_at = [settled[i] for i in state]
        # J's rate at x* as the segment measured after the iterate settled; NaN
        # when the loop stopped before that segment was complete (the
        # certificate then runs its own power iteration at x*).
        log_rate = jnp.where(measuring & (since >= RATE_STEPS), late / (RATE_STEPS - half),
                             jnp.nan)
        sigma = jnp.float32(SETTLED_ULPS * ulp)

        def path_at(x_now, steps_after, drift, tan, tan_excess):
            scale = 1.0 + _largest(x_now)
            tangent_change = _tangent_change(tan, tan_excess)
            return jnp.stack([log_g, log_h, log_w - jnp.log(scale), log_rate,
                              steps_after.astype(jnp.float32), sigma, drift / scale,
                              tangent_change])

        def plain(c):
            return [*jx.eval_jaxpr(loop.body_jaxpr, (), *body_consts, *c[:-1]), c[-1] + 1]

        carries, after = list(settled), jnp.zeros(test_shape, jnp.int32)
        if settle:
            # The settled iterates run on, unprobed but with the parameters'
            # tangent, only until the certificate's bounds (which shrink with
            # each step at x*) are met: the derivative is read there.  The loop's
            # remaining steps make its results alone, so a program using only
            # the derivative (a gradient) never runs them.
            rate = RATE_MARGIN * jnp.exp(log_rate)
            travelled = _travelled([carry0[i] for i in state], settled_at)

            # (The read segment's carry: the loop's carries, the steps after
            # the settled iterate, the measured tangent and its excess change.)
            def certain(c):
                _, steps_after, tan, tan_excess = c
                return _bounds_met(path_at(settled_at, steps_after, jnp.float32(0.0), tan,
                                           tan_excess), rate, count + steps_after, travelled)

            def reading(c):
                carries, steps_after, tan, tan_excess = c
                theta_vals = [body_consts[k] if kind == "const" else carries[k]
                              for kind, k in loop.theta]
                tan, tan_excess = tangent_step(jnp.bool_(True), theta_vals, carries, tan,
                                               tan_excess)
                *carries, steps_after = plain([*carries, steps_after])
                return carries, steps_after, tan, tan_excess

            carries, after, tan, tan_excess = lax.while_loop(
                lambda c: test(c[0]) & ~certain(c), reading, (carries, after, tan, tan_excess))
        x_read = [carries[i] for i in state]
        path = path_at(x_read, jnp.min(after),
                       _largest([a - b for a, b in zip(x_read, settled_at)]), tan, tan_excess)
        read_at, read_count = list(carries), count + after
        rest = jnp.zeros(test_shape, jnp.int32)
        if settle:
            *carries, rest = lax.while_loop(lambda c: test(c[:-1]), plain, [*carries, rest])
        assert len(carries) == n_carry
        return [*carries, read_count + rest, *read_at, read_count, path.astype(jnp.float32)]

    return _closed(probing, op_avals, name)


def _tangent_directions(theta, batch: tuple = ()) -> list:
    """The directions of the parameters (``theta``: the inexact ones' values)
    the measured tangent follows: one per group, stacked on a leading axis of
    each leaf.  Every leaf is a group of its own, and the elements of small
    leaves are while the groups number at most ``TANGENT_GROUPS``: each
    group's part of the tangent is checked to its own size, so a parameter
    whose effect is 1e-9 of another's is not hidden by it (an effect measured
    once, at the start, to scale parameters sharing a group, is not what it is
    along the path).  A loop the program
    vmaps (``batch``: its exit test's shape) runs one loop per batch element: a
    leaf with those leading axes counts the elements of one (a vmapped
    ``theta[0]`` and ``theta[1]`` are two groups, each over the batch).  Within
    a group the entries are positive and pseudo-random in [1, 2]: an element
    whose entry were tiny would hardly be checked, and entries of one size
    cancel for ``a + b`` or ``a - b``."""
    if not theta:
        return []
    entries = _probe_start(theta, seed=1)
    top = jnp.maximum(_largest(entries), 1e-30)
    entries = [(1.0 + jnp.abs(e) / top.astype(e.dtype)).astype(e.dtype) for e in entries]
    batched = [bool(batch) and tuple(jnp.shape(x)[:len(batch)]) == tuple(batch) for x in theta]
    sizes = [max(int(np.prod(jnp.shape(x)[len(batch):] if b else jnp.shape(x))), 1)
             for x, b in zip(theta, batched)]
    # Whether each leaf's elements are groups of their own, or the leaf one group.
    split, budget = [], TANGENT_GROUPS - len(theta)
    for n in sizes:
        each = 1 < n <= budget + 1
        split.append(each)
        budget -= n - 1 if each else 0
    first, g = [], 0
    for n, each in zip(sizes, split):
        first.append(g)
        g += n if each else 1
    groups = g
    directions = []
    for x, e, n, each, g in zip(theta, entries, sizes, split, first):
        # (Built from iotas: the rule's closed jaxpr captures no constants.)
        total = max(int(np.prod(jnp.shape(x))), 1)
        element = lax.iota(jnp.int32, total) % n if each else jnp.zeros(total, jnp.int32)
        group = element + g
        mine = group[None, :] == lax.iota(jnp.int32, groups)[:, None]
        directions.append(jnp.where(mine.reshape((groups, *jnp.shape(x))), e[None],
                                    jnp.zeros_like(e)[None]))
    return directions


def _tangent_change(tan, excess):
    """The measured tangent's last change above its rounding floor
    (``excess``, per element), relative to each element's size: the largest
    ``excess_i / |t_i|``, in the tangent's own precision (a tiny tangent,
    1e-18, has no square to underflow)."""
    change = [jnp.max(e / jnp.maximum(jnp.abs(t), jnp.finfo(jnp.result_type(t)).tiny),
                      initial=0.0).astype(jnp.float32) for e, t in zip(excess, tan)]
    return functools.reduce(jnp.maximum, change, jnp.float32(0.0))


def _path_bound(path, rate):
    """``log`` of the bound on the loop's tangent gap, relative (before
    ``PATH_MARGIN``), from ``_probing_loop``'s ``path`` and J's rate ``s`` at
    ``x*``; +inf when the settled iterates drifted.

    The probed steps give ``G_K (1 + W / scale)``, with ``G_K`` their growth
    times ``s`` per settled step (``m`` of them).  A settled step is at most
    ``sigma`` (the settling size, relative), which adds ``m sigma G_K H`` to
    ``W G_K / scale`` (``H`` the probed ``sum 1 / G_(k+1)``): the distance of
    the probed iterates from ``x*`` includes the steps after them.  The
    settled iterates' own terms are not counted: they sit at ``x*`` to the
    rounding floor, whose jitter the loop's own forward-mode tangent carries
    as rounding noise of the same size (``eps / (1 - s)^2``)."""
    log_g, log_h, log_w, _, m, sigma, drift = (path[i] for i in range(7))
    log_big_g = log_g + m * jnp.log(jnp.maximum(rate, 1e-30))
    later_steps = jnp.where(m > 0, jnp.log(sigma) + jnp.log(jnp.maximum(m, 1.0))
                            + log_big_g + log_h, -jnp.inf)
    bound = functools.reduce(jnp.logaddexp, [log_big_g, log_big_g + log_w, later_steps])
    drifted = (m > 0) & (drift > sigma / jnp.maximum(1.0 - rate, 1e-30))
    return jnp.where(jnp.isnan(bound) | drifted | (rate >= 1.0), jnp.inf, bound)


def _probe_start(xs, seed: int = 0) -> list:
    """A fixed pseudo-random unit vector shaped like ``xs``: a structured one
    (``sin(1.7 i + 0.3)``) can be an eigenvector of a fast mode and never see a
    slow one.  Its entries are uniform in [-1, 1) from an integer hash of the
    element's index and leaf (PCG's output permutation), a few integer
    operations where a ``jax.random`` key costs a threefry loop per call."""
    v = []
    for leaf, x in enumerate(xs):
        h = lax.iota(jnp.uint32, max(int(np.prod(jnp.shape(x))), 1))
        h = h * jnp.uint32(747796405) + jnp.uint32(
            2891336453 + 2654435769 * (leaf + 7919 * seed) & 0xFFFFFFFF)
        h = ((h >> ((h >> 28) + jnp.uint32(4))) ^ h) * jnp.uint32(277803737)
        h = (h >> 22) ^ h
        u = (h >> 8).astype(jnp.float32) * np.float32(2.0 ** -23) - 1.0
        v.append(u[:int(np.prod(jnp.shape(x)))].reshape(jnp.shape(x)))
    n = jnp.maximum(_size(v), 1e-30)
    return [(u / n).astype(jnp.result_type(x)) for u, x in zip(v, xs)]


def _largest(xs):
    return functools.reduce(jnp.maximum, [jnp.max(jnp.abs(x), initial=0.0).astype(jnp.float32)
                                          for x in xs])


def _size(xs):
    return jnp.sqrt(sum(jnp.sum(jnp.abs(x).astype(jnp.float32) ** 2) for x in xs))


def _custom_jvp_params(eqn: Equation, loop: FixedPointLoop, options: ImplicitDiff,
                       where: str, start_may_move: bool, original=None) -> dict:
    """First-order ``custom_jvp_call`` params: the primal is the loop (counting its
    iterations); the jvp rule computes the fixed point with the rule one level down
    (the innermost level runs the loop) and its tangent by the implicit function
    theorem."""
    op_avals = [a.aval for a in eqn.inputs]
    name = _function_name(eqn) or "while"
    info = RuleInfo(name=f"{RULE_PREFIX}{name}", source=_short_source(where), const_names=())
    call = _counting_loop(loop, op_avals, f"{info.name}_loop")
    call_region = region_from_closed_jaxpr(call)
    state_size = sum(int(np.prod(eqn.outputs[i].aval.shape)) for i in loop.state)
    out_avals = [v.aval for v in eqn.outputs]
    # (``original``: the loop before the loops it holds were rewritten.)
    loop_fn = functools.partial(
        jx.eval_jaxpr, original if original is not None else
        region_to_closed_jaxpr(_loop_region(eqn)).jaxpr, ())
    t_avals = [jx.to_cotangent_aval(a) for a in op_avals if _inexact(a)]
    # Each level's loop: the outermost is the loop itself; each level below gives
    # the derivatives of the one above's iterates, which JAX forms from the loop's
    # jvp -- the update with its custom_jvp calls replaced by their rules, whose
    # primal code JAX differentiates as written (``_rules_inlined``).
    levels = [loop]
    for _ in range(options.depth - 1):
        levels.append(_rules_inlined(levels[-1], op_avals, info.name))
    made: dict = {}  # id(level loop) -> (tangent map, probing loop): one per loop

    def pieces(level_loop):
        if id(level_loop) not in made:
            level_fn = loop_fn if level_loop is loop else _results_of(level_loop, op_avals,
                                                                      info.name)
            # The derivative path runs the loop with a probe of its tangent map (see
            # _probing_loop); plain evaluation runs the counting loop.  Levels
            # below the outermost hand the probe's bound up as an extra result.
            made[id(level_loop)] = (
                _tangent_map(level_loop, _Solver(options, state_size), op_avals, out_avals,
                             level_fn, options, start_may_move),
                _probing_loop(level_loop, op_avals, f"{info.name}_probe"))
        return made[id(level_loop)]

    rule = None
    primal = None
    for level in range(options.depth):
        outermost = level == options.depth - 1
        tangent, probing = pieces(levels[options.depth - 1 - level])
        if primal is None:
            primal = functools.partial(jx.eval_jaxpr, probing.jaxpr, ())

        def jvp(*args, primal=primal, outermost=outermost, tangent=tangent):
            ops, t_ops = list(args[:len(op_avals)]), list(args[len(op_avals):])
            outs = list(primal(*ops))
            n = loop.n_carry
            results, count = outs[:n], outs[n]
            read_at, read_count, path = outs[n + 1:2 * n + 1], outs[2 * n + 1], outs[-1]
            # The derivative is read where the probing loop certified it, never at
            # the results: a program using only derivatives does not run the
            # loop's later steps.
            # (The dense adjoint's start term J^K t_0 takes the loop's own count K
            # when the program's inputs may move the start: a start the parameter
            # moves steeply keeps that part exactly.  A fixed start's term is
            # within the certificate's bound at either count.)
            tangents = tangent(ops, read_at, read_count, path, t_ops,
                               count if start_may_move else read_count)
            if outermost:
                return [*results, count, *tangents]
            # The carries the derivative is read at have the results' tangents
            # (both are x* to rounding); the bound is not differentiated: a zero
            # tangent, linear in the inputs'.
            link = functools.reduce(jnp.add, [0.0 * jnp.sum(t).astype(jnp.float32)
                                              for t in t_ops], jnp.float32(0.0))
            return [*results, count, *read_at, read_count, path, *tangents, *tangents,
                    jnp.zeros_like(path) + link]

        jvp_closed = _closed(jvp, [*op_avals, *t_avals], f"{info.name}_jvp")
        rule = JVPRule(info=info, call=call if outermost else probing, jvp=jvp_closed,
                       num_consts=0)
        # Level k+1 computes the fixed point with level k's rule, so that its
        # derivatives (a Hessian, a jvp of a gradient) are implicit as well.
        primal = build_custom_jvp(rule)
    return dict(call_jaxpr=call_region, jvp_jaxpr=region_from_closed_jaxpr(rule.jvp),
                num_consts=0, symbolic_zeros=False, name=info.name,
                source=info.source, const_names=(), closed_over="auto", max_forward_size=4096,
                reverse_ok=True)


def _rules_inlined(loop: FixedPointLoop, op_avals, name: str) -> FixedPointLoop:
    """``loop`` with the body (and its state update) that JAX's jvp of the loop
    iterates: each custom_jvp call replaced by its rule, whose primal results are
    plain code -- a rule that is not the derivative of its primal gives the
    loop's second derivative from that code's derivative.  The primal part of a
    jvp along ones (integer operands unperturbed); ``loop`` itself when its
    update calls no custom_jvp."""
    if not jx.calls_primitive(loop.body_jaxpr, "custom_jvp_call"):
        return loop
    body_avals = [*op_avals[loop.cond_n:loop.cond_n + loop.body_n],
                  *op_avals[loop.cond_n + loop.body_n:]]
    f_avals = [v.aval for v in loop.f_jaxpr.invars]
    try:
        body = _closed(_through_rules(loop.body_jaxpr), body_avals, f"{name}_inlined_body")
        f = _closed(_through_rules(loop.f_jaxpr), f_avals, f"{name}_inlined_update")
    except RuntimeError:  # a rule capturing constants: its own derivative stays
        return loop
    return replace(loop, body_jaxpr=body.jaxpr, f_jaxpr=f.jaxpr)


def _through_rules(jaxpr):
    def run(*ins):
        hot = [i for i, x in enumerate(ins) if _inexact(jax.typeof(x))]

        def at(*hot_values):
            full = list(ins)
            for i, v in zip(hot, hot_values):
                full[i] = v
            return list(jx.eval_jaxpr(jaxpr, (), *full))
        primals = tuple(ins[i] for i in hot)
        outs, _ = jax.jvp(at, primals, tuple(jnp.ones_like(x) for x in primals))
        return outs
    return run


def _results_of(loop: FixedPointLoop, op_avals, name: str):
    """The loop's results as a function of its operands (its counting loop)."""
    counting = _counting_loop(loop, op_avals, f"{name}_inlined_loop")
    return lambda *ops: list(jx.eval_jaxpr(counting.jaxpr, (), *ops))[:loop.n_carry]


def _theta_operands(loop: FixedPointLoop) -> list[int]:
    """The loop equation's operand positions of the update's parameters."""
    return [loop.const_operand(k) if kind == "const" else loop.carry_operand(k)
            for kind, k in loop.theta]


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


def _tangent_map(loop: FixedPointLoop, solver: "_Solver", op_avals, out_avals, loop_fn,
                 options: "ImplicitDiff", start_may_move: bool):
    """``tangent(operands, results, count, operand tangents) -> result tangents``
    (inexact ones).

    The loop ran ``K`` steps of ``x <- f(theta, x)``; its derivative is the
    tangent recurrence ``t <- J t + b`` (``J = df/dx``, ``b = df/dtheta .
    t_theta``) run ``K`` times from the start's tangent ``t_0``.  Where ``J`` and
    ``b`` are those at the final iterate, that is exactly
    ``t_K = t* + J^K (t_0 - t*)`` with ``t* = (I - J)^-1 b``, the implicit function
    theorem's tangent.

    When the certificate holds (``_certified``: the loop stopped at a fixed point
    and ``J^K`` is negligible, so ``t_K`` is ``t*`` to ``TANGENT_RTOL``), the
    tangent is ``t*``, solved by ``lax.custom_linear_solve``, which JAX
    transposes (reverse mode solves ``(I - J)^T w = ct``) and differentiates (the
    solve's own derivative is another solve, never a differentiation of solver
    iterations); with the dense adjoint the start's term ``J^K (t_0 - t*)`` is
    added exactly (a loop started far away, at a scale the parameter sets, keeps
    that part of its derivative).

    Otherwise: the derivative of the loop as it ran, ``J . t`` with ``J`` the
    loop's Jacobian from primals (``_fallback``), or NaN when the operands are too
    large for it -- never a different number."""
    theta_ops = _theta_operands(loop)
    f_eval = _state_update(loop, loop.theta)
    state_pos = {c: i for i, c in enumerate(loop.state)}
    hot = [k for k, j in enumerate(theta_ops) if _inexact(op_avals[j])]
    op_inexact = [_inexact(a) for a in op_avals]
    certified = _certificate(loop, f_eval, theta_ops, op_avals)
    fallback = _fallback(loop_fn, op_avals, out_avals, options)
    state_init = [loop.carry_operand(i) for i in loop.state]
    # (A loop the program vmaps counts per element, and its flattened J mixes the
    # elements: its start term is left to the certificate's bound.)
    start_term = (solver.method == "dense" and any(op_inexact[j] for j in state_init)
                  and loop.cond_jaxpr.outvars[0].aval.shape == ())
    # A start the program's inputs may move, whose term J^K t_0 is not formed (an
    # iterative adjoint, a vmapped loop): the certificate cannot bound that term
    # (t_0 may be any size), so the derivative is the loop's own.
    if start_may_move and not start_term:
        certified = _never(certified)
    # A start the program's inputs may move, with the dense adjoint: its part of
    # the derivative is the loop's own along t_0, the product of the Jacobians
    # the loop met on its path (J^K t_0, with J at x*, is that product only for
    # an affine update, and t_0 may be large: a start 1e12 theta).  Formed by
    # forward mode through the loop along the start's elements (at most
    # ``dense-max-size`` columns).
    start_ops = sorted({j for j in state_init if op_inexact[j]})
    start_jacobian = (_fallback(loop_fn, op_avals, out_avals, options, wrt=start_ops)
                      if start_term and start_may_move else None)
    state_out = [[i for i, a in enumerate(out_avals) if _inexact(a)].index(i)
                 for i in loop.state]

    def implicit(ops, outs, count, t_ops, ok, rate):
        # (``count``: the loop's own step count K, which the start's term J^K t_0
        # needs exactly.)
        it = iter(t_ops)
        t_of = {j: next(it) for j, inexact in enumerate(op_inexact) if inexact}
        theta_vals = [ops[j] for j in theta_ops]
        x_star = [outs[i] for i in loop.state]
        t_x = None
        if hot or start_term:
            tangents = [t_of[theta_ops[k]] for k in hot] + \
                [t_of[j] for j in state_init if j in t_of]
            # Every part of b must be linear in the tangents for JAX to transpose the
            # solve: a state update that reads no parameter gives a constant zero,
            # made linear by adding 0 * (a linear function of the tangents) -- of
            # all of them (one may be a constant's zero in reverse mode).
            link = functools.reduce(jnp.add, [0.0 * jnp.sum(t).astype(jnp.float32)
                                              for t in tangents])
            if hot:
                def through_theta(*hv):
                    full = list(theta_vals)
                    for k, v in zip(hot, hv):
                        full[k] = v
                    return f_eval(full, x_star)

                _, b = jax.jvp(through_theta, tuple(theta_vals[k] for k in hot),
                               tuple(t_of[theta_ops[k]] for k in hot))
            else:
                b = [jnp.zeros(jnp.shape(x), jnp.result_type(x)) for x in x_star]
            b = [jnp.where(ok, bi, jnp.zeros_like(bi)) + link.astype(bi.dtype) for bi in b]
            _, f_x = jax.linearize(lambda *xs: f_eval(theta_vals, list(xs)), *x_star)

            def matvec(t):
                # I - J where certified, I elsewhere (J masked on both sides, so
                # neither its primal NaNs nor its transpose reach the solve).
                inner = f_x(*[jnp.where(ok, ti, jnp.zeros_like(ti)) for ti in t])
                return [ti - jnp.where(ok, ji, jnp.zeros_like(ji)) for ti, ji in zip(t, inner)]

            solve = solver.at_rate(rate)
            t_x = lax.custom_linear_solve(matvec, list(b), solve, solve)
            if start_term:
                t_0 = [t_of[j] if j in t_of else jnp.zeros_like(x)
                       for j, x in zip(state_init, x_star)]
                if start_jacobian is None:
                    t_x = _add_start_term(f_x, x_star, count, t_x, t_0, ok)
                else:
                    t_x = _add_start_term(f_x, x_star, count, t_x,
                                          [jnp.zeros_like(t) for t in t_0], ok)
                    along = start_jacobian(ops, [t_of[j] for j in start_ops], ~ok)
                    t_x = [t + along[k].astype(t.dtype) for t, k in zip(t_x, state_out)]
        result = []
        for i, aval in enumerate(out_avals):
            if not _inexact(aval):
                continue
            kind = loop.kinds[i]
            source = loop.copies.get(i, i)
            if source in state_pos and t_x is not None:
                result.append(t_x[state_pos[source]])
            elif kind == INVARIANT:
                result.append(t_of[loop.carry_operand(i)])
            else:  # no parameter moves the fixed point; an unused gap
                result.append(jnp.zeros(aval.shape, aval.dtype))
        return result

    def tangent(ops, outs, count, path, t_ops, loop_count):
        if not t_ops:
            return implicit(ops, outs, loop_count, t_ops, jnp.bool_(True), jnp.float32(1.0))
        ok, rate = certified(ops, outs, count, path)
        # Each derivative gets the tangents only where it is chosen (and masks its
        # output): no tangent passes through a lax.cond, whose batched form (a
        # vmapped program's differing predicates) JAX cannot transpose; and a
        # derivative not chosen sees zero tangents in both modes, so its NaNs (a
        # loop that did not converge) never reach the other.
        t_imp = [jnp.where(ok, t, jnp.zeros_like(t)) for t in t_ops]
        t_fb = [jnp.where(ok, jnp.zeros_like(t), t) for t in t_ops]
        near = implicit(ops, outs, loop_count, t_imp, ok, rate)
        loop_own = fallback(ops, t_fb, ok)
        return [jnp.where(ok, a, b) for a, b in zip(near, loop_own)]

    return tangent


def _never(certified):
    def never(ops, outs, count, path):
        ok, rate = certified(ops, outs, count, path)
        return jnp.bool_(False) & ok, rate
    return never


def _add_start_term(f_x, x_star, count, t_x, t_0, ok):
    """``t* + J^K (t_0 - t*)``: the dense ``J`` raised to the loop's count by
    squaring (a scan over the count's bits, so JAX differentiates and transposes
    it; bits above the count's highest skip their products)."""
    from jax.flatten_util import ravel_pytree
    flat_x, unravel = ravel_pytree(list(x_star))
    n = flat_x.shape[0]

    def column(e):
        return ravel_pytree(list(f_x(*unravel(e))))[0]

    j_mat = jax.vmap(column, out_axes=1)(jnp.eye(n, dtype=flat_x.dtype))
    count = jnp.asarray(count, jnp.int32)

    def bit(carry, k):
        power, square = carry
        on = (count >> k) & 1
        power = lax.cond(on == 1, lambda p, q: p @ q, lambda p, q: p, power, square)
        square = lax.cond((count >> (k + 1)) > 0, lambda q: q @ q, lambda q: q, square)
        return (power, square), None

    (power, _), _ = lax.scan(bit, (jnp.eye(n, dtype=j_mat.dtype), j_mat), jnp.arange(31))
    power = jnp.where(ok, power, jnp.zeros_like(power))
    gap = ravel_pytree([a - b for a, b in zip(t_0, t_x)])[0]
    flat_t = ravel_pytree(list(t_x))[0] + power @ gap.astype(power.dtype)
    return [v.astype(jnp.result_type(x)) for v, x in zip(unravel(flat_t), t_x)]


#: The certificate's bound on how far the loop's derivative can be from the
#: implicit one, relative.  The loop's tangent follows ``t <- J_k t + b_k`` with
#: ``J_k``, ``b_k`` at its iterates; its gap to ``t*`` is the start's part
#: ``P_(0,K) (t_0 - t*)`` plus the iterates' distance to ``x*`` carried into
#: ``J_k`` and ``b_k`` (``_probing_loop`` bounds both with the Jacobians met
#: along the path, times ``PATH_MARGIN``); the start's part is also bounded by
#: ``s^K max(1, |x_0 - x_K| / scale)`` with ``s`` J's rate at ``x*``
#: (``_rate_estimate``), for a slow mode the path's probe barely meets.  A loop stopped
#: earlier -- a fast component converged while a slow one started at its own
#: fixed point, a tolerance loose for its rate -- keeps its own derivative.
#: Higher derivatives of the loop approach the fixed point's more slowly (about
#: ``K^(k-1) s^K`` at order ``k``); 1e-5 keeps the second and third
#: within about 1e-3 for loops of a few hundred steps.
TANGENT_RTOL = 1e-5

#: The largest distance from the final iterate to the fixed point, relative to
#: the iterate's scale, at which the implicit derivative is used, estimated as
#: ``|f(x) - x| / (1 - s)`` (the last step over one minus the rate).
FIXED_POINT_RTOL = 1e-3

#: The factor on the probe's measured growth in the certificate's bound: the
#: constants in ``delta_k`` (second derivatives of the update against the
#: tangent's size, which a cancellation in ``t*`` makes large) are unknown.
PATH_MARGIN = 10.0

#: The margin on a measured rate (a power iteration's mean growth approaches the
#: spectral radius from below).
RATE_MARGIN = 1.05

#: A step of at most this many ulps of the iterate's scale is at rounding level:
#: the iterate has settled, and the probe stops (``_probing_loop``).
SETTLED_ULPS = 1.0

#: A change of the loop's own tangent of at most this many ulps of its size is
#: its rounding floor (``_bounds_met``): the tangent recurrence's rounding, and
#: the Jacobians' jitter with the iterate's, move it that much at ``t*``.
TANGENT_ULPS = 64.0

#: The most groups of parameters whose parts of the loop's tangent are
#: measured apart by splitting small parameters into their elements
#: (``_tangent_directions``; every parameter is a group of its own): a jvp of
#: the update each per step.
TANGENT_GROUPS = 8

#: The largest measured contraction rate at which ``adjoint=auto`` iterates the
#: map to solve (20 products reach 1e-6); above it, BiCGStab.
ITERATE_MAX_RATE = 0.5

#: Power-iteration steps for the estimate of J's contraction rate (``_rate_estimate``).
RATE_STEPS = 20


def _certificate(loop: FixedPointLoop, f_eval, theta_ops, op_avals):
    """``certified(operands, results, count, path) -> (bool, rate)`` from primals (``path``:
    the log bound of ``_probing_loop``): the loop ran,
    its convergence test (the cap left out) passed on the carries it stopped with,
    the final iterate is finite, ``J`` contracts at it (rate below 1: ``I - J``
    is invertible and the fixed point unique nearby), the distance to the fixed point is
    within ``FIXED_POINT_RTOL`` of the iterate's scale, and the bound on the gap
    between the loop's tangent and ``t*`` is within ``TANGENT_RTOL`` (see there).
    A loop the program vmaps has a batched exit test (one per
    element, JAX's while then runs until none holds): every element must pass."""
    cond_n, body_n = loop.cond_n, loop.body_n
    still_moving = convergence_only(loop)

    def certified(ops, outs, count, path):
        cond_consts = ops[:cond_n]
        (ran,) = jx.eval_jaxpr(loop.cond_jaxpr, (), *cond_consts, *ops[cond_n + body_n:])
        ok = jnp.all(jnp.asarray(ran, bool))
        theta_vals = [ops[j] for j in theta_ops]
        x_now = [outs[i] for i in loop.state]
        if not x_now:
            return ok, jnp.float32(1.0)
        residual = _largest([fx - x for fx, x in zip(f_eval(theta_vals, x_now), x_now)])
        scale = 1.0 + _largest(x_now)
        eps = max(float(jnp.finfo(jnp.result_type(x)).eps) for x in x_now)
        if not loop.forced:
            # The loop's own test without its cap, on the carries it stopped with
            # (the last change): false when the cap, not the convergence test,
            # ended the loop -- unless the residual is at rounding level (a
            # tolerance below the rounding floor is never met).
            passed = jnp.all(~jnp.asarray(still_moving(cond_consts, outs), bool))
            ok = ok & (passed | (residual <= 64.0 * eps * scale))
        for x in x_now:
            ok = ok & jnp.all(jnp.isfinite(x))
        # J's rate at x*: the probe's last RATE_STEPS growths when the loop ran
        # that many (the same power iteration, along the final iterates), else a
        # power iteration at x*.
        probe_log_rate = path[3]
        rate = lax.cond(jnp.isnan(probe_log_rate),
                        lambda: _rate_estimate(lambda xs: f_eval(theta_vals, xs), x_now),
                        lambda: RATE_MARGIN * jnp.exp(probe_log_rate))
        ok = ok & (rate < 1.0)
        distance = residual / jnp.maximum(1.0 - rate, 1e-30)
        ok = ok & (distance <= jnp.maximum(FIXED_POINT_RTOL, 64.0 * eps) * scale)
        # The gap between the loop's tangent and t* (see TANGENT_RTOL), bounded
        # with the Jacobians at the iterates the loop visited (the probe of
        # _probing_loop), not extrapolated from J at x*: a path through regions
        # where |df/dx| is far above its final rate keeps the loop's own
        # derivative.  And the start's part with every J_k taken as J at x*, at
        # the rate the power iteration measured there: a slow mode the path's
        # random probe barely meets (its component there is about 1/sqrt(n))
        # still counts.
        x_init = [ops[loop.carry_operand(i)] for i in loop.state]
        return ok & _bounds_met(path, rate, count, _travelled(x_init, x_now)), rate

    return certified


def _travelled(x_init, x_now):
    """How far the iterate moved from its start, relative to its scale."""
    scale = 1.0 + _largest(x_now)
    return _largest([a.astype(jnp.float32) - b.astype(jnp.float32)
                     for a, b in zip(x_init, x_now)]) / scale


def _start_bound(count, rate, travelled):
    """``log`` of the start's part of the tangent's gap, ``s^K max(1,
    travelled)``, every ``J_k`` taken as J at ``x*`` (``count``: K, per element
    of a vmapped loop)."""
    steps = jnp.maximum(jnp.min(jnp.asarray(count)), 1).astype(jnp.float32)
    return steps * jnp.log(jnp.maximum(rate, 1e-30)) + jnp.log(jnp.maximum(travelled, 1.0))


def _bounds_met(path, rate, count, travelled):
    """Whether the certificate's bounds on the tangent's gap are within
    ``TANGENT_RTOL``: the path's (``_path_bound``), the start's
    (``_start_bound``), and the measured one: the loop's own tangents along
    fixed directions of the parameters have settled (their last change ``(I - J)
    (t - t*)``, over ``1 - s``, within ``TANGENT_RTOL`` of each element, or
    within ``TANGENT_ULPS`` ulps: its rounding floor; ``_tangent_change``).
    False while ``rate`` is NaN or at least 1."""
    limit = float(np.log(TANGENT_RTOL))
    ulp = path[5] / SETTLED_ULPS
    change = jnp.maximum(TANGENT_RTOL * (1.0 - rate), TANGENT_ULPS * ulp)
    return ((_path_bound(path, rate) + float(np.log(PATH_MARGIN)) <= limit)
            & (_start_bound(count, rate, travelled) <= limit)
            & (path[7] <= change))


def _rate_estimate(f, x_star) -> jax.Array:
    """The rate ``s`` at which ``J = df/dx`` at ``x_star`` contracts: the mean
    growth per step of ``|J^m v|`` over the second half of ``RATE_STEPS`` steps
    from a fixed random vector (the first half lets the slowest mode it holds
    take over: a slow mode weighing 0.07 in it read 0.83 for 0.9 over all 20),
    with a 5% margin.  It tends to the spectral radius
    (which the tangent's gap follows, ``|J^K| ~ s^K``) and counts part of a
    non-normal ``J``'s transient growth."""
    _, f_x = jax.linearize(lambda *xs: f(list(xs)), *x_star)

    half = RATE_STEPS // 2

    def step(k, carry):
        v, log_growth = carry
        w = list(f_x(*v))
        n = _size(w)
        unit = [wi / jnp.maximum(n, 1e-30).astype(wi.dtype) for wi in w]
        # The second half's growth: the first lets the slowest mode take over.
        return unit, log_growth + jnp.where(k >= half, jnp.log(jnp.maximum(n, 1e-30)), 0.0)

    v = _probe_start(x_star)
    _, log_growth = lax.fori_loop(0, RATE_STEPS, step, (v, jnp.float32(0.0)))
    return RATE_MARGIN * jnp.exp(log_growth / (RATE_STEPS - half))


def _fallback(loop_fn, op_avals, out_avals, options: "ImplicitDiff", wrt=None):
    """``tangent(operands, operand tangents, certified)``: the derivative of the loop as it
    ran, ``J . t`` with ``J`` its Jacobian computed from primals by forward mode
    (vmapped over a basis of the operands: the inexact ones, or those ``wrt``
    lists, whose tangents ``t`` then are), so the result is linear in ``t`` and
    transposes.  ``J`` is a custom_jvp whose derivative is again a dense
    contraction, ``depth`` levels deep, so reverse mode over it never meets the
    while_loop.  Operands larger than ``fallback_max_size`` elements: forward
    mode through the iterations along ``t`` (a ``linear_call``), whose
    transpose is NaN.  ``certified`` (a primal bool) zeroes the result where the
    implicit derivative is used, and skips the Jacobian there."""
    hot = [j for j, a in enumerate(op_avals) if _inexact(a) and (wrt is None or j in wrt)]
    sizes = [int(np.prod(op_avals[j].shape)) for j in hot]
    p = sum(sizes)
    out_idx = [i for i, a in enumerate(out_avals) if _inexact(a)]
    out_size = sum(int(np.prod(out_avals[i].shape)) for i in out_idx)
    budget = 1 << 22

    def loop_outs(*ops):
        outs = loop_fn(*ops)
        return [outs[i] for i in out_idx]

    # The basis and the contraction in the operands' widest precision (float64
    # under x64: a float32 basis would round the derivative).
    work = functools.reduce(jnp.promote_types, [op_avals[j].dtype for j in hot],
                            jnp.dtype(jnp.float32))

    def contract(jacs, t_ops):
        flat = jnp.concatenate([jnp.ravel(t).astype(work) for t in t_ops]) \
            if t_ops else jnp.zeros((0,), work)
        return [jnp.tensordot(jk.astype(jnp.promote_types(jk.dtype, work)),
                              flat.astype(jnp.promote_types(jk.dtype, work)),
                              axes=1).astype(jk.dtype) for jk in jacs]

    def nan_like(shapes_dtypes, t_ops):
        link = functools.reduce(jnp.add, [jnp.sum(t).astype(jnp.float32) for t in t_ops],
                                jnp.float32(0.0))
        return [jnp.full(sh, jnp.nan, jnp.float32).astype(dt) * link.astype(dt)
                for sh, dt in shapes_dtypes]

    def jacobian_of(g):
        def jac(*ops):
            def one(e):
                pieces, start = [], 0
                for j, n in zip(hot, sizes):
                    pieces.append(e[start:start + n].reshape(op_avals[j].shape)
                                  .astype(op_avals[j].dtype))
                    start += n

                def g_hot(*hv):
                    full = list(ops)
                    for j, v in zip(hot, hv):
                        full[j] = v
                    return g(*full)

                return jax.jvp(g_hot, tuple(ops[j] for j in hot), tuple(pieces))[1]

            cols = jax.vmap(one)(jnp.eye(p, dtype=work))
            return [jnp.moveaxis(c, 0, -1) for c in cols]
        return jac

    def dense(g, levels, n_elems):
        """``g`` made differentiable by a dense Jacobian contraction, ``levels`` deep."""
        if levels == 0:
            return g
        wrapped = jax.custom_jvp(g)
        inner = dense(jacobian_of(g), levels - 1, n_elems * p)

        @wrapped.defjvp
        def _jvp(primals, tangents):
            out = wrapped(*primals)
            t_hot = [tangents[j] for j in hot]
            if n_elems * p > budget:
                return out, nan_like([(o.shape, o.dtype) for o in out], t_hot)
            return out, contract(inner(*primals), t_hot)

        return wrapped

    if p == 0:
        return lambda ops, t_ops, certified: [jnp.zeros(out_avals[i].shape, out_avals[i].dtype)
                                              for i in out_idx]
    if p > options.fallback_max_size or out_size * p > budget:
        def along(residuals, t_ops):
            # Forward mode through the loop's iterations along these tangents: the
            # loop's own derivative, as JAX computes it -- run only where the
            # implicit derivative is not used (JAX never transposes a
            # linear_call's callee, so the cond costs reverse mode nothing).
            *ops, certified = residuals

            def g_hot(*hv):
                full = list(ops)
                for j, v in zip(hot, hv):
                    full[j] = v
                return loop_outs(*full)

            def loop_own(t_ops):
                return list(jax.jvp(g_hot, tuple(ops[j] for j in hot), tuple(t_ops))[1])

            return lax.cond(certified, lambda t: [jnp.zeros(o.shape, o.dtype)
                                                  for o in jax.eval_shape(loop_own, t)],
                            loop_own, list(t_ops))

        def refused_transpose(residuals, cts):
            # Reverse mode would need the loop's Jacobian (too large) or its
            # iterates (not stored): NaN, never a different number.
            ops = residuals[:-1]
            return [jnp.full(jnp.shape(ops[j]), jnp.nan, op_avals[j].dtype) for j in hot]

        def too_large(ops, t_ops, certified):
            outs = jax.custom_derivatives.linear_call(along, refused_transpose,
                                                      [*ops, certified], list(t_ops))
            return [jnp.where(certified, jnp.zeros_like(v), v) for v in outs]
        return too_large
    jac = dense(jacobian_of(loop_outs), options.depth - 1, out_size * p)

    def tangent(ops, t_ops, certified):
        # The Jacobian only where the implicit derivative is not used (a cond on
        # primals; the contraction with the tangents is outside it).
        shapes = [jax.ShapeDtypeStruct(out_avals[i].shape + (p,), out_avals[i].dtype)
                  for i in out_idx]
        jacs = lax.cond(certified,
                        lambda *o: [jnp.zeros(s.shape, s.dtype) for s in shapes],
                        lambda *o: [j.astype(s.dtype) for j, s in zip(jac(*o), shapes)],
                        *ops)
        return contract(jacs, t_ops)
    return tangent


class _Solver:
    """``solve(matvec, b)``: ``w`` with ``matvec(w) = b`` on lists of arrays, for
    ``matvec = I - A`` with ``A`` a contraction (the solve and transpose-solve of
    ``lax.custom_linear_solve``).

    ``adjoint=auto`` solves a state of up to ``dense-max-size`` elements densely;
    a larger one by iterating ``w <- b + A w`` when the certificate measured a
    rate of at most ``ITERATE_MAX_RATE`` (each step costs one product with ``A``
    and gains a factor ``1 / rate``), else by BiCGStab (a Krylov method needs
    far fewer products when the rate is near 1)."""

    def __init__(self, options: ImplicitDiff, size: int):
        method = options.adjoint
        if method == "auto":
            method = "dense" if size <= options.dense_max_size else "by-rate"
        self.method = method
        self.max_iter = options.max_iter
        self.tol = options.tol
        self.restart = options.restart

    def at_rate(self, rate):
        """The solve for a map whose measured contraction rate is ``rate``."""
        return functools.partial(self, rate=rate)

    def __call__(self, matvec, b, rate=None):
        b = list(b)
        # Solve in one dtype, at least float32 (half precision has no LU and
        # loses the solve's accuracy; the Krylov solvers mix leaf dtypes), and
        # cast each carry back.
        dtypes = [jnp.result_type(x) for x in b]
        work = functools.reduce(jnp.promote_types, dtypes, jnp.dtype(jnp.float32))
        if any(d != work for d in dtypes):
            inner = matvec

            def matvec(w):
                return [m.astype(work) for m in inner([wi.astype(d) for wi, d in zip(w, dtypes)])]

            b = [x.astype(work) for x in b]
        if self.method == "by-rate":
            fast = jnp.asarray(rate if rate is not None else 1.0) <= ITERATE_MAX_RATE
            w = lax.cond(fast, lambda b: self._fixed_point(matvec, b),
                         lambda b: self._bicgstab(matvec, b), b)
        else:
            w = getattr(self, self.METHODS[self.method])(matvec, b)
        return [wi.astype(d) for wi, d in zip(w, dtypes)]

    METHODS = {"fixed-point": "_fixed_point", "gmres": "_gmres", "bicgstab": "_bicgstab",
               "dense": "_dense"}

    def _bicgstab(self, matvec, b):
        from jax.scipy.sparse.linalg import bicgstab
        w, _ = bicgstab(lambda w: list(matvec(w)), b, x0=b, tol=self.tol, atol=0.0,
                        maxiter=self.max_iter)
        return list(w)

    def _fixed_point(self, matvec, b):
        """Iterate ``w <- b + A w = w + (b - matvec(w))`` until it stops changing:
        a change within ``tol`` of the iterate's size on two steps running (one
        small step proves little for a non-normal ``A``: a chain
        ``x0 <- 1e-7 x1 <- 1e4 x2`` moves ``w`` by 1e-7, then by 1e-3)."""
        tol, max_iter = self.tol, self.max_iter

        def keep_going(carry):
            k, _, gaps = carry
            return (k < max_iter) & (jnp.max(gaps) > tol)

        def step(carry):
            k, w, gaps = carry
            new = [wi + bi - mi for wi, bi, mi in zip(w, b, matvec(w))]
            # Relative to the iterate's size (a cotangent of 1e-9 is solved to
            # the same digits as one of 1); 0 / 0 (b = 0) has converged.
            change = _largest([n - o for n, o in zip(new, w)])
            gap = jnp.where(change == 0, 0.0, change / _largest(new))
            return k + 1, new, jnp.stack([gaps[1], gap])

        inf = jnp.float32(jnp.inf)
        _, w, _ = lax.while_loop(keep_going, step, (0, b, jnp.stack([inf, inf])))
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
