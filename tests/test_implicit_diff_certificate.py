"""implicit-diff keeps the loop's derivative (issue 16, second adversary).

The implicit derivative is used only when the run-time certificate bounds its gap
to the loop's own derivative (the tangent recurrence run K times) by
TANGENT_RTOL; otherwise the loop's own derivative is formed.  Each program below
once got the fixed point's derivative where the loop's differs; the reference is
always JAX's forward mode through the original loop's iterations.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxpr_cc


def rewritten(fun, *args, pipeline="implicit-diff"):
    return jaxpr_cc.run_passes(jaxpr_cc.trace(fun, *args), pipeline)


def assert_loop_derivative(fun, theta, tangent, rtol=1e-5):
    new = rewritten(fun, theta)
    want_value, want = jax.jvp(fun, (theta,), (tangent,))
    got_value, got = jax.jvp(new, (theta,), (tangent,))
    np.testing.assert_array_equal(np.asarray(got_value), np.asarray(want_value))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=rtol)
    if jnp.ndim(want_value) == 0:
        grad = jax.grad(new)(theta)
        np.testing.assert_allclose(np.vdot(np.asarray(grad), np.asarray(tangent)),
                                   np.asarray(want), rtol=rtol)


def slow_component_at_its_fixed_point(theta):
    # b starts at its fixed point (theta = 1) and moves at rate 0.99; a converges
    # fast, so the loop stops after ~25 steps: db/dtheta = 0.22, not 1.
    def cond(c):
        a, b, ap, bp = c
        return jnp.maximum(jnp.abs(a - ap), jnp.abs(b - bp)) > 1e-6

    def body(c):
        a, b, _, _ = c
        return 0.5 * a + 10.0 * theta, 0.99 * b + 0.01 * theta, a, b

    a, b, _, _ = lax.while_loop(cond, body, (jnp.float32(0.0), jnp.float32(1.0),
                                             jnp.float32(1e9), jnp.float32(1e9)))
    return b + 0.0 * a


def components_of_different_scales(theta):
    # One absolute tolerance for a component of scale 1e4 and one of scale 1: the
    # small one stops 10% short of its fixed point.
    def cond(c):
        x, xp = c
        return jnp.max(jnp.abs(x - xp)) > 1e-2

    def body(c):
        x, _ = c
        return jnp.stack([0.5 * x[0] + 5000.0 * theta, 0.9 * x[1] + 0.1 * theta ** 2]), x

    x, _ = lax.while_loop(cond, body, (jnp.zeros(2), jnp.full(2, 1e9)))
    return x[1]


def start_set_by_the_parameter(theta):
    # x0 = 1000 theta: the start's part J^K t0 of the derivative is 80x the
    # fixed point's.
    def cond(c):
        x, xp = c
        return jnp.abs(x - xp) > 4e-4

    def body(c):
        x, _ = c
        return 0.5 * x + 0.5e-5 * theta, x

    x, _ = lax.while_loop(cond, body, (1000.0 * theta, jnp.float32(1e9)))
    return x


N_HALF = 100


def many_slow_components_at_their_fixed_point(theta):
    n = 2 * N_HALF

    def cond(c):
        x, xp = c
        return jnp.max(jnp.abs(x - xp)) > 1e-6

    def body(c):
        x, _ = c
        rate = jnp.where(jnp.arange(n) % 2 == 0, 0.5, 0.99)
        return rate * x + (1 - rate) * theta, x

    x0 = jnp.where(jnp.arange(n) % 2 == 0, 0.0, 1.0)
    x, _ = lax.while_loop(cond, body, (x0, x0 + 1e9))
    return jnp.sum(x[1::2]) / N_HALF


@pytest.mark.parametrize("fun", [slow_component_at_its_fixed_point,
                                 components_of_different_scales,
                                 start_set_by_the_parameter])
def test_scalar_loops_keep_their_derivative(fun):
    assert_loop_derivative(fun, jnp.float32(1.0), jnp.float32(1.0))


@pytest.mark.heavy
def test_a_large_state_with_slow_components_keeps_its_derivative():
    theta = jnp.ones(2 * N_HALF, jnp.float32)
    tangent = jnp.asarray(np.random.default_rng(0).normal(size=2 * N_HALF), jnp.float32)
    assert_loop_derivative(many_slow_components_at_their_fixed_point, theta, tangent)


@pytest.mark.heavy
def test_higher_derivatives_of_a_loop_that_stopped_early_are_the_loops():
    # Ten steps of x <- cos(theta x): the first derivative is the fixed point's to
    # 5e-5, the second and third differ by 2% and 4.5%.  float64 references.
    with jax.enable_x64(True):
        def f(theta):
            def cond(c):
                x, xp = c
                return jnp.abs(x - xp) > 2e-6

            def body(c):
                x, _ = c
                return jnp.cos(theta * x), x

            x0 = jnp.float64(0.83)
            return lax.while_loop(cond, body, (x0, x0 + 1.0))[0]

        th = jnp.float64(0.7)
        new = rewritten(f, th)
        want, got = f, new
        for _ in range(3):
            want, got = jax.jacfwd(want), jax.grad(got)
            np.testing.assert_allclose(float(got(th)), float(want(th)), rtol=1e-10)


def test_a_deeply_converged_loop_uses_the_implicit_derivative():
    # x <- 0.5 x + theta to the rounding floor: certified, so reverse mode is the
    # solve (no dense Jacobian of the loop), and equals the loop's derivative.
    def f(theta):
        def cond(c):
            x, xp = c
            return jnp.max(jnp.abs(x - xp)) > 0.0

        def body(c):
            x, _ = c
            return 0.5 * x + theta, x

        return lax.while_loop(cond, body, (jnp.zeros_like(theta), jnp.full_like(theta, 1e9)))[0]

    theta = jnp.linspace(0.1, 1.0, 5, dtype=jnp.float32)
    # fallback-max-size=0: the loop's own derivative would be NaN, so a finite
    # answer is the implicit one.
    new = rewritten(f, theta, pipeline="implicit-diff{fallback-max-size=0}")
    np.testing.assert_allclose(np.asarray(jax.jacrev(new)(theta)), 2.0 * np.eye(5), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(jax.jacrev(new)(theta)),
                               np.asarray(jax.jacfwd(f)(theta)), rtol=1e-6)
    stopped_early = rewritten(slow_component_at_its_fixed_point, jnp.float32(1.0),
                              pipeline="implicit-diff{fallback-max-size=0}")
    assert np.isnan(float(jax.grad(stopped_early)(jnp.float32(1.0))))


def start_moved_by_the_parameter(theta):
    def cond(c):
        x, xp = c
        return jnp.max(jnp.abs(x - xp)) > 1e-9

    def body(c):
        x, _ = c
        return 0.5 * x + 0.5 * theta, x

    x0 = 1e9 * (theta - 1.0)
    return lax.while_loop(cond, body, (x0, x0 + 1.0))[0]


@pytest.mark.parametrize("adjoint", ["dense", "gmres", "bicgstab", "fixed-point"])
def test_a_start_the_parameter_moves_keeps_its_term_with_every_adjoint(adjoint):
    # x0 = 1e9 (theta - 1): the start's part J^K t0 is 93% of the derivative.  The
    # dense adjoint adds it; the iterative ones (and vmapped loops) cannot bound
    # it, so they keep the loop's own derivative.
    with jax.enable_x64(True):
        theta = jnp.float64(1.0)
        new = rewritten(start_moved_by_the_parameter, theta,
                        pipeline=f"implicit-diff{{adjoint={adjoint}}}")
        want = jax.jvp(start_moved_by_the_parameter, (theta,), (1.0,))[1]
        np.testing.assert_allclose(float(jax.jvp(new, (theta,), (1.0,))[1]), float(want),
                                   rtol=1e-8)
        np.testing.assert_allclose(float(jax.grad(new)(theta)), float(want), rtol=1e-8)


def test_a_vmapped_loop_with_a_moving_start_keeps_its_derivative():
    with jax.enable_x64(True):
        fun = jax.vmap(start_moved_by_the_parameter)
        theta, t = jnp.array([1.0, 1.0 + 1e-12]), jnp.ones(2)
        new = rewritten(fun, theta)
        np.testing.assert_allclose(np.asarray(jax.jvp(new, (theta,), (t,))[1]),
                                   np.asarray(jax.jvp(fun, (theta,), (t,))[1]), rtol=1e-8)


def test_the_rate_estimate_sees_a_slow_mode_a_structured_vector_misses():
    # The fast mode's eigenvector is sin(1.7 i + 0.3), the old power-iteration start.
    v = np.sin(1.7 * np.arange(2, dtype=np.float32) + np.float32(0.3))
    vh = jnp.asarray(v / np.linalg.norm(v), jnp.float32)
    uh = jnp.asarray([-vh[1], vh[0]], jnp.float32)

    def f(theta):
        def cond(c):
            x, xp = c
            return jnp.max(jnp.abs(x - xp)) > 1e-6

        def body(c):
            x, _ = c
            p, q = vh @ x, uh @ x
            q2 = 0.999 * q + 0.001 * theta + 0.1 * (q - theta) ** 2
            return (0.01 * p + theta) * vh + q2 * uh, x

        x0 = jnp.zeros(2)
        return uh @ lax.while_loop(cond, body, (x0, x0 + 1.0))[0]

    assert_loop_derivative(f, jnp.float32(1.0), jnp.float32(1.0), rtol=1e-4)
