"""A bwd loop that stops on a convergence flag it carries, with an iteration cap.

``while ~done & (k < N)`` with ``done = all(|y_new - y| <= tol)`` computed by the
body is a convergence test with a cap.  Forward mode runs the transposed iteration
until its own change is small, or for exactly as many steps as the cap allowed in
reverse mode.  That step count was read from the condition with the flag's value
in the transposed run (zero cotangent: "converged" after one step), so jacfwd came
from one or two transposed steps, with no error (adversary, stop 31).
References: ``jax.jacrev`` of the same function (JAX runs the user's bwd), and of
a rule whose bwd is the fixed number of Jacobi steps the cap allows.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxpr_cc

A = np.array([[4.0, 1.0, 0.0, 0.2], [1.0, 3.0, 0.5, 0.0],
              [0.0, 0.5, 2.0, 0.3], [0.1, 0.0, 0.3, 3.0]])
X = np.array([0.3, -0.5, 1.2, 0.7])


def _jacobi_step(y, g):
    """One Jacobi step for A^T y = g."""
    a = jnp.asarray(A)
    d = jnp.diag(a)
    return (g - (a.T - jnp.diag(d)) @ y) / d


def _done_flag(cap, tol):
    def adjoint(g):
        def body(c):
            y, _, k = c
            new = _jacobi_step(y, g)
            return new, jnp.all(jnp.abs(new - y) <= tol), k + 1
        return lax.while_loop(lambda c: (~c[1]) & (c[2] < cap), body,
                              (_jacobi_step(jnp.zeros_like(g), g), False, 0))[0]
    return adjoint


def _not_converged_flag(cap, tol):
    def adjoint(g):
        def body(c):
            y, _, k = c
            new = _jacobi_step(y, g)
            return new, jnp.any(jnp.abs(new - y) > tol), k + 1
        return lax.while_loop(lambda c: c[1] & (c[2] < cap), body,
                              (_jacobi_step(jnp.zeros_like(g), g), True, 0))[0]
    return adjoint


def _steps(n):
    def adjoint(g):
        y = _jacobi_step(jnp.zeros_like(g), g)
        for _ in range(n):
            y = _jacobi_step(y, g)
        return y
    return adjoint


def _solver(adjoint):
    @jax.custom_vjp
    def solve(b):
        return jnp.linalg.solve(jnp.asarray(A), b)
    solve.defvjp(lambda b: (solve(b), None), lambda _, g: (adjoint(g),))
    return lambda b: jnp.sin(solve(b * b))


@pytest.mark.parametrize("flag", [_done_flag, _not_converged_flag],
                         ids=["done", "not_converged"])
@pytest.mark.parametrize("cap, reference", [(1000, None), (5, _steps(5))],
                         ids=["converges", "capped_at_5"])
def test_a_carried_convergence_flag_with_a_cap(flag, cap, reference):
    with jax.enable_x64(True):
        f = _solver(flag(cap, 1e-13))
        x = jnp.asarray(X)
        want = jax.jacrev(f)(x)
        if reference is not None:  # the cap stops the loop before it converges
            np.testing.assert_allclose(want, jax.jacrev(_solver(reference))(x), rtol=1e-12)
        else:  # the limit: the solve's own Jacobian
            exact = jax.jacfwd(lambda b: jnp.sin(jnp.linalg.solve(jnp.asarray(A), b * b)))(x)
            np.testing.assert_allclose(want, exact, rtol=1e-9, atol=1e-12)
        for ours in (jaxpr_cc.jit(f), jaxpr_cc.trace(f, x)):
            np.testing.assert_allclose(jax.jacfwd(ours)(x), want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("size", ["dot", "vdot", "sum_of_squares"])
def test_a_squared_norm_test_that_computes_the_change_twice(size):
    """``jnp.dot(y - p, y - p)`` computes the change twice; the reading of the test
    knew a square only by its two operands being one value, so ``jaxpr_cc.trace``
    (whose jaxpr keeps both) refused the loop where ``jaxpr_cc.jit`` accepted it
    (adversary, stop 31)."""
    measure = {"dot": lambda d, e: jnp.dot(d, e), "vdot": lambda d, e: jnp.vdot(d, e),
               "sum_of_squares": lambda d, e: jnp.sum(d * e)}[size]

    def adjoint(g):
        def body(c):
            y, _, k = c
            return _jacobi_step(y, g), y, k + 1
        return lax.while_loop(lambda c: (measure(c[0] - c[1], c[0] - c[1]) > 1e-24)
                              & (c[2] < 500), body,
                              (_jacobi_step(jnp.zeros_like(g), g), jnp.zeros_like(g), 0))[0]
    with jax.enable_x64(True):
        f = _solver(adjoint)
        x = jnp.asarray(X)
        want = jax.jacrev(f)(x)
        np.testing.assert_allclose(jax.jacfwd(jaxpr_cc.trace(f, x))(x), want, rtol=1e-9,
                                   atol=1e-12)


HALF = 0.5


def _flag_rule(bwd):
    @jax.custom_vjp
    def f(x):
        return jnp.sin(x)

    f.defvjp(lambda x: (jnp.sin(x), x), bwd)
    return f


def _sine_with_adjoint(adjoint):
    """``sin`` whose bwd is ``adjoint(cos(x) * g)``: a loop in ``u = c g``."""
    @jax.custom_vjp
    def f(x):
        return jnp.sin(x)

    f.defvjp(lambda x: (jnp.sin(x), jnp.cos(x)), lambda c, g: (adjoint(c * g),))
    return f


def _cap_in_the_flag(r, g):
    # flag = converging & under the cap, computed in the body (adversary, stop 32)
    def body(c):
        k, u, _ = c
        new = g + HALF * u
        return k + 1, new, (jnp.abs(new - u) > 1e-6) & (k + 1 < 3)
    return (lax.while_loop(lambda c: c[2], body, (0, g, True))[1],)


def _residual_in_the_flag(r, g):
    def body(c):
        k, u, _ = c
        new = g + HALF * u
        return k + 1, new, (jnp.abs(new - u) > 1e-6) & (r > 1.0)
    return (lax.while_loop(lambda c: c[2], body, (0, g, True))[1],)


def _flag_starts_stopped(r, g):
    def body(c):
        k, u, _ = c
        new = g + HALF * u
        return k + 1, new, jnp.abs(new - u) > 1e-6
    return (lax.while_loop(lambda c: c[2], body, (0, g, r > 1.0))[1],)


def _gap_starts_converged(r, g):
    def body(c):
        u, _ = c
        new = g + HALF * u
        return new, jnp.abs(new - u)
    return (lax.while_loop(lambda c: c[1] > 1e-6, body,
                           (g, jnp.where(r > 1.0, jnp.inf, 0.0)))[0],)


@pytest.mark.parametrize("bwd, steps", [(_cap_in_the_flag, 3), (_residual_in_the_flag, 1),
                                        (_flag_starts_stopped, 0), (_gap_starts_converged, 0)],
                         ids=["cap_in_the_flag", "residual_in_the_flag", "flag_starts_stopped",
                              "gap_starts_converged"])
def test_a_flag_or_gap_that_stops_the_loop_before_its_limit(bwd, steps):
    """The loop's carried flag holds a cap or a condition on a residual, or the
    flag (a gap) starts "converged": the loop runs ``steps`` steps, not to its
    limit; forward mode transposes those steps (it gave the limit, 2.0)."""
    f = _flag_rule(bwd)
    x = jnp.float32(0.3)   # the residual r = x: r > 1 is false
    want = sum(HALF ** j for j in range(steps + 1))
    np.testing.assert_allclose(float(jax.grad(f)(x)), want, rtol=1e-6)
    for ours in (jaxpr_cc.jit(f), jaxpr_cc.trace(f, x)):
        np.testing.assert_allclose(float(jax.jacfwd(ours)(x)), want, rtol=1e-6)


def test_a_neumann_series_that_computes_its_term_twice():
    """A Neumann-series bwd ``(t, s) -> (A @ t, s + A @ t)`` stopping on ``|t|``:
    ``jaxpr_cc.trace`` keeps both products, and the reading of the loop took the
    carried term for a new iterate rather than the step added to the sum, so the
    Program (and vjp-to-jvp) refused a loop ``jaxpr_cc.jit`` accepted (adversary,
    stop 32).  Reference: ``jax.jacrev`` (JAX runs the user's bwd) and the exact
    ``(I - A)^{-1} g`` series limit."""
    @jax.custom_vjp
    def f(r):
        return jnp.sin(r)

    def bwd(r, g):
        a = 0.3 * jnp.diag(jnp.cos(r))
        (_, total) = lax.while_loop(lambda c: jnp.linalg.norm(c[0]) > 1e-13,
                                    lambda c: (a @ c[0], c[1] + a @ c[0]), (g, g))
        return (total,)

    f.defvjp(lambda r: (jnp.sin(r), r), bwd)

    def program(x):
        return f(x * x)

    with jax.enable_x64(True):
        x = jnp.asarray(X)
        want = jax.jacrev(program)(x)
        exact = np.diag(2 * np.asarray(X) / (1 - 0.3 * np.cos(np.asarray(X) ** 2)))
        np.testing.assert_allclose(want, exact, rtol=1e-10, atol=1e-12)
        traced = jaxpr_cc.trace(program, x)
        for ours in (traced, jaxpr_cc.run_passes(traced, "vjp-to-jvp"), jaxpr_cc.jit(program)):
            np.testing.assert_allclose(jax.jacfwd(ours)(x), want, rtol=1e-9, atol=1e-12)


def test_a_gap_that_starts_at_a_zero_product_never_runs_the_loop():
    """A carried gap started at ``0.0 * sum(u)``: zero at run time, so the loop
    never runs and bwd is ``c g``.  Only a literal zero start was recognised; this
    one was transposed as the loop's limit, a wrong forward-mode derivative
    (adversary, stop 33).  Reference: ``jax.jacrev`` (JAX runs the user's bwd)."""
    b = jnp.array([[0.2, 0.1, 0.0], [0.0, 0.1, 0.4], [0.1, 0.0, 0.2]])

    def adjoint(u):
        def body(s):
            v, _ = s
            new = b @ v + u
            return new, jnp.max(jnp.abs(new - v))
        return lax.while_loop(lambda s: s[1] > 1e-12, body, (u, 0.0 * jnp.sum(u)))[0]

    f = _sine_with_adjoint(adjoint)
    with jax.enable_x64(True):
        x = jnp.asarray(X[:3])
        want = np.asarray(jax.jacrev(f)(x))
        np.testing.assert_allclose(want, np.diag(np.cos(np.asarray(x))), rtol=1e-12)
        # The loop's map (its start) is not the limit of its iteration: refused,
        # as a literal zero start is, never transposed as the limit.
        with pytest.raises(Exception, match="the loop never runs"):
            jax.jacfwd(jaxpr_cc.trace(f, x))(x)
        with pytest.raises(Exception, match="forward-mode"):
            jax.jacfwd(jaxpr_cc.jit(f))(x)
        np.testing.assert_allclose(jax.jacrev(jaxpr_cc.jit(f))(x), want, rtol=1e-12)


@pytest.mark.parametrize("previous", ["neg_neg", "half_plus_half", "plus_zero_times_g"])
def test_a_previous_iterate_that_starts_as_the_iterate_by_arithmetic(previous):
    """``(u, -(-u))``, ``(u, 0.5 u + 0.5 u)``, ``(u, u + 0 g)``: the previous
    iterate starts equal to the iterate, so the loop never runs and bwd is
    ``c g``.  Only syntactic copies were recognised; these were transposed as
    the loop's limit (adversary, stop 33).  Reference: ``jax.jacrev``."""
    b = jnp.array([[0.2, 0.1, 0.0], [0.0, 0.1, 0.4], [0.1, 0.0, 0.2]])
    spelled = {"neg_neg": lambda u, g: -(-u), "half_plus_half": lambda u, g: 0.5 * u + 0.5 * u,
               "plus_zero_times_g": lambda u, g: u + 0 * g}[previous]

    @jax.custom_vjp
    def f(x):
        return jnp.sin(x)

    def bwd(c, g):
        u = c * g
        return (lax.while_loop(lambda s: jnp.max(jnp.abs(s[0] - s[1])) > 1e-12,
                               lambda s: (b @ s[0] + u, s[0]), (u, spelled(u, g)))[0],)

    f.defvjp(lambda x: (jnp.sin(x), jnp.cos(x)), bwd)
    with jax.enable_x64(True):
        x = jnp.asarray(X[:3])
        want = np.asarray(jax.jacrev(f)(x))
        np.testing.assert_allclose(want, np.diag(np.cos(np.asarray(x))), rtol=1e-12)
        for ours in (jaxpr_cc.trace(f, x), jaxpr_cc.jit(f)):
            with pytest.raises(Exception, match="starts equal to carry"):
                jax.jacfwd(ours)(x)


def test_a_carried_change_relative_to_the_iterate():
    """``err = |v_new - v| / |v_new|`` carried and tested against a tolerance:
    the multiplied form ``|dv| > tol |v|`` was accepted and this one refused
    (adversary, stop 33).  References: ``jax.jacrev`` and the exact solve."""
    b = jnp.array([[0.2, 0.1, 0.0, 0.3], [0.0, 0.1, 0.4, 0.0],
                   [0.1, 0.0, 0.2, 0.1], [0.3, 0.2, 0.0, 0.1]])

    def adjoint(u):
        def body(s):
            v, _ = s
            new = b @ v + u
            return new, jnp.linalg.norm(new - v) / jnp.linalg.norm(new)
        return lax.while_loop(lambda s: s[1] > 1e-13, body, (u, jnp.inf))[0]

    f = _sine_with_adjoint(adjoint)
    with jax.enable_x64(True):
        x = jnp.asarray(X)
        want = jax.jacrev(f)(x)
        exact = np.linalg.solve(np.eye(4) - np.asarray(b), np.diag(np.cos(np.asarray(x)))).T
        np.testing.assert_allclose(want, exact, rtol=1e-10)
        for ours in (jaxpr_cc.trace(f, x), jaxpr_cc.jit(f)):
            np.testing.assert_allclose(jax.jacfwd(ours)(x), want, rtol=1e-9, atol=1e-12)
