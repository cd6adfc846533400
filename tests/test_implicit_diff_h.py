"""``implicit-diff`` on loops whose exit test is the residual ``|x - T(x)|``.

The residual of the fixed-point map -- computed in the condition (which then
recomputes the update ``T``), or computed by the body and carried -- proves
convergence like the change ``|x_(k+1) - x_k|`` does: such loops are rewritten,
with every derivative checked against float64 references written out here in
numpy (the implicit function theorem; central differences of it for second
derivatives) and against JAX's own derivative of the unrolled iteration.  Exit
tests that look like a residual but are not one (another map, a change over two
steps) are left alone with a reason saying so; a residual loop stopped by its
cap before converging keeps JAX's derivative.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from implicit_diff_helpers import reasons, rewrite_with_stats

A = (np.random.default_rng(1).normal(size=(6, 6)) * 0.25).astype(np.float32)
C = np.cos(np.arange(6)).astype(np.float32)
THETA = np.array([0.3, -0.2, 0.5, 0.1, -0.4, 0.25], np.float32)
DIRECTION = np.linspace(-1.0, 1.0, 6).astype(np.float32)




def update(x, theta):
    return jnp.tanh(A @ x + theta)


# --------------------------------------------------- float64 references
def fixed_point_f64(theta):
    x = np.zeros(len(theta))
    for _ in range(400):
        x = np.tanh(np.asarray(A, np.float64) @ x + theta)
    return x


def jacobian_f64(theta):
    """dx*/dtheta = (I - D A)^-1 D, D = diag(1 - x*^2)."""
    x = fixed_point_f64(np.asarray(theta, np.float64))
    d = 1.0 - x ** 2
    return np.linalg.solve(np.eye(len(x)) - d[:, None] * A, np.diag(d))


def loss_grad_f64(theta):
    return jacobian_f64(theta).T @ np.asarray(C, np.float64)


def loss_hessian_f64(theta, eps=1e-5):
    theta = np.asarray(theta, np.float64)
    cols = []
    for i in range(len(theta)):
        e = np.zeros_like(theta)
        e[i] = eps
        cols.append((loss_grad_f64(theta + e) - loss_grad_f64(theta - e)) / (2 * eps))
    return np.stack(cols, 1)


# ------------------------------------------------------ residual loops
def residual_norm_in_cond(theta):
    """``while |x - T(x)|_2 > tol: x = T(x)`` (T recomputed by the condition)."""
    return lax.while_loop(lambda x: jnp.linalg.norm(x - update(x, theta)) > 1e-6,
                          lambda x: update(x, theta), jnp.zeros_like(theta))


def residual_max_abs_in_cond_with_cap(theta):
    def keep_going(s):
        k, x = s
        return (jnp.max(jnp.abs(update(x, theta) - x)) > 1e-7) & (k < 300)

    return lax.while_loop(keep_going, lambda s: (s[0] + 1, update(s[1], theta)),
                          (0, jnp.zeros_like(theta)))[1]


def residual_squared_norm_in_cond(theta):
    return lax.while_loop(lambda x: jnp.sum((x - update(x, theta)) ** 2) > 1e-13,
                          lambda x: update(x, theta), jnp.zeros_like(theta))


def residual_at_new_iterate_carried(theta):
    """The body computes the residual at the iterate it returns and carries it."""
    def advance(s):
        x, _ = s
        new = update(x, theta)
        return new, jnp.linalg.norm(new - update(new, theta))

    return lax.while_loop(lambda s: s[1] > 1e-6, advance,
                          (jnp.zeros_like(theta), jnp.float32(jnp.inf)))[0]


def residual_recomputed_carried_with_cap(theta):
    """The body calls T twice (once for the residual, once for the update)."""
    def advance(s):
        k, x, _ = s
        return k + 1, update(x, theta), jnp.max(jnp.abs(x - update(x, theta)))

    def keep_going(s):
        k, _, gap = s
        return (gap > 1e-7) & (k < 500)

    return lax.while_loop(keep_going, advance,
                          (0, jnp.zeros_like(theta), jnp.float32(jnp.inf)))[1]


RESIDUAL_LOOPS = [residual_norm_in_cond, residual_max_abs_in_cond_with_cap,
                  residual_squared_norm_in_cond, residual_at_new_iterate_carried,
                  residual_recomputed_carried_with_cap]


@pytest.mark.parametrize("fun", RESIDUAL_LOOPS, ids=lambda f: f.__name__)
def test_residual_loops_are_rewritten_with_first_order_derivatives(fun):
    theta = jnp.asarray(THETA)
    _, new, stats = rewrite_with_stats(fun, theta)
    assert stats.get("loops-rewritten") == 1, reasons(stats)
    np.testing.assert_allclose(np.asarray(new(theta)), fixed_point_f64(THETA), atol=1e-5)

    def loss(t):
        return jnp.dot(jnp.asarray(C), new(t))

    @jax.jit
    def first_order(t):
        return dict(jvp=jax.jvp(new, (t,), (jnp.asarray(DIRECTION),))[1],
                    jacrev=jax.jacrev(new)(t), grad=jax.grad(loss)(t))

    out = first_order(theta)
    jac = jacobian_f64(THETA)
    np.testing.assert_allclose(np.asarray(out["jvp"]), jac @ DIRECTION, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(out["jacrev"]), jac, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(out["grad"]), loss_grad_f64(THETA), rtol=1e-4,
                               atol=1e-5)


def test_residual_loop_matches_jax_through_the_unrolled_iteration():
    theta = jnp.asarray(THETA)
    _, new, _ = rewrite_with_stats(residual_norm_in_cond, theta)

    def unrolled(t):
        return lax.fori_loop(0, 300, lambda _, x: update(x, t), jnp.zeros_like(t))

    np.testing.assert_allclose(np.asarray(jax.jit(jax.jacrev(new))(theta)),
                               np.asarray(jax.jit(jax.jacrev(unrolled))(theta)), rtol=1e-4,
                               atol=1e-5)


# One form in the default run; the others (about 25 s each) under -m heavy.
@pytest.mark.parametrize("fun", [RESIDUAL_LOOPS[0]] + [
    pytest.param(f, marks=pytest.mark.heavy) for f in RESIDUAL_LOOPS[1:]],
    ids=lambda f: f.__name__)
def test_residual_loops_keep_second_derivatives(fun):
    theta = jnp.asarray(THETA)
    _, new, _ = rewrite_with_stats(fun, theta)

    def loss(t):
        return jnp.dot(jnp.asarray(C), new(t))

    hess = loss_hessian_f64(THETA)
    np.testing.assert_allclose(np.asarray(jax.jit(jax.hessian(loss))(theta)), hess, rtol=1e-3,
                               atol=1e-4)
    np.testing.assert_allclose(np.asarray(jax.jit(jax.jacrev(jax.grad(loss)))(theta)), hess,
                               rtol=1e-3, atol=1e-4)


# ---------------------------------------- exit tests that are not residuals
def residual_of_another_map(theta):
    """|x - 0.5 T(x)| is small at no fixed point of T."""
    return lax.while_loop(lambda x: jnp.linalg.norm(x - 0.5 * update(x, theta)) > 1e-6,
                          lambda x: update(x, theta), jnp.zeros_like(theta))


def residual_with_other_parameters(theta):
    """The condition's T reads a different parameter than the body's."""
    other = theta * 2.0
    return lax.while_loop(lambda x: jnp.linalg.norm(x - update(x, other)) > 1e-6,
                          lambda x: update(x, theta), jnp.zeros_like(theta))


def change_over_two_steps(theta):
    """|x_k - T(x_(k+1))| = |x_k - x_(k+2)|: a period-2 orbit passes it."""
    def advance(s):
        x, _ = s
        new = update(x, theta)
        return new, jnp.linalg.norm(x - update(new, theta))

    return lax.while_loop(lambda s: s[1] > 1e-6, advance,
                          (jnp.zeros_like(theta), jnp.float32(jnp.inf)))[0]


def change_over_two_carried_steps(theta):
    """Carries (x, x_(k-1), x_(k-2)) and tests |x - x_(k-2)| (adversary 2, stop 37:
    the reason said the previous iterate was not updated)."""
    def advance(s):
        x, x1, _ = s
        return update(x, theta), x, x1

    zero = jnp.zeros_like(theta)
    return lax.while_loop(lambda s: jnp.linalg.norm(s[0] - s[2]) > 1e-6, advance,
                          (zero, zero + 1.0, zero + 2.0))[0]


def residual_value_test(theta):
    """|T(x)| > tol: a test of the iterate's value, not of a residual."""
    return lax.while_loop(lambda x: jnp.linalg.norm(update(x, theta)) > 10.0,
                          lambda x: update(x, theta), jnp.zeros_like(theta))


@pytest.mark.parametrize("fun,fragment", [
    (residual_of_another_map, "with g not the loop's update T"),
    (residual_with_other_parameters, "with g not the loop's update T"),
    (change_over_two_steps, "a change over two iterations"),
    (change_over_two_carried_steps, "a change over two iterations"),
    (residual_value_test, "not its change between iterations"),
])
def test_exit_tests_that_are_not_residuals_are_left_alone(fun, fragment):
    theta = jnp.asarray(THETA)
    program, new, stats = rewrite_with_stats(fun, theta)
    assert str(new) == str(program)
    assert stats["loops-skipped"] == 1 and "loops-rewritten" not in stats
    why = reasons(stats)
    assert fragment in why, why
    assert fun.__name__ in why and "\n" not in why


def period_two(theta):
    """x <- -x + theta oscillates between x0 and theta - x0: its change over two
    steps is zero at once, yet the fixed point theta / 2 is never reached."""
    def advance(s):
        x, _ = s
        new = -x + theta
        return new, jnp.abs(x - (-new + theta))

    return lax.while_loop(lambda s: s[1] > 1e-6, advance, (jnp.float32(0.0), jnp.float32(1.0)))[0]


def test_period_two_orbit_keeps_jax_derivative():
    theta = jnp.float32(0.8)
    program, new, stats = rewrite_with_stats(period_two, theta)
    assert "loops-rewritten" not in stats, reasons(stats)
    want = jax.jacfwd(period_two)(theta)   # 1.0: x_1 = theta (the fixed point's is 0.5)
    assert float(jax.jacfwd(new)(theta)) == float(want) == 1.0


@pytest.mark.heavy
def test_residual_loop_stopped_by_its_cap_keeps_jax_derivative():
    """Five steps do not converge: the certificate refuses the implicit tangent."""
    def capped(theta):
        def keep_going(s):
            k, x = s
            return (jnp.max(jnp.abs(update(x, theta) - x)) > 1e-7) & (k < 5)

        return lax.while_loop(keep_going, lambda s: (s[0] + 1, update(s[1], theta)),
                              (0, jnp.zeros_like(theta)))[1]

    theta = jnp.asarray(THETA)
    _, new, stats = rewrite_with_stats(capped, theta)
    assert stats.get("loops-rewritten") == 1, reasons(stats)
    want = np.asarray(jax.jacfwd(capped)(theta))
    np.testing.assert_allclose(np.asarray(jax.jacfwd(new)(theta)), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(jax.jacrev(new)(theta)), want, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------- nested fixed points
def fixed_point(update_fn, x0, tol=1e-6):
    def keep_going(s):
        x, prev = s
        return jnp.max(jnp.abs(x - prev)) > tol

    return lax.while_loop(keep_going, lambda s: (update_fn(s[0]), s[0]), (x0, x0 + 1.0))[0]


def nested(b):
    """y = sin(y)/2 + 0.3 z(y) + b/10 with z(y) the fixed point of z = cos(b z)/2 + y/5."""
    def inner(y):
        return fixed_point(lambda z: 0.5 * jnp.cos(b * z) + 0.2 * y, y)
    return fixed_point(lambda y: 0.5 * jnp.sin(y) + 0.3 * inner(y) + 0.1 * b, jnp.zeros_like(b))


def nested_unrolled(b):
    def inner(y):
        return lax.fori_loop(0, 100, lambda _, z: 0.5 * jnp.cos(b * z) + 0.2 * y, y)
    return lax.fori_loop(0, 100, lambda _, y: 0.5 * jnp.sin(y) + 0.3 * inner(y) + 0.1 * b,
                         jnp.zeros_like(b))


def test_nested_fixed_points_are_both_rewritten_and_keep_the_gradient():
    # The outer loop's fallback derivative runs through the original inner loop
    # (snapshot before the inner one is rewritten); before, building it traced
    # the inner rule's levels once per outer level (about a minute for this).
    b = jnp.asarray(np.array([0.6, 0.3, -0.2], np.float32))
    _, new, stats = rewrite_with_stats(nested, b)
    assert stats.get("loops-rewritten") == 2, reasons(stats)
    np.testing.assert_allclose(np.asarray(new(b)), np.asarray(nested_unrolled(b)), atol=1e-6)

    def loss(fn):
        return lambda t: jnp.sum(fn(t) * jnp.asarray([1.0, -0.5, 2.0]))

    np.testing.assert_allclose(np.asarray(jax.jit(jax.grad(loss(new)))(b)),
                               np.asarray(jax.grad(loss(nested_unrolled))(b)), rtol=1e-4,
                               atol=1e-6)


@pytest.mark.heavy  # about a minute: XLA compiles two levels of two nested rules
def test_nested_fixed_points_keep_the_hessian():
    b = jnp.asarray(np.array([0.6, 0.3, -0.2], np.float32))
    _, new, _ = rewrite_with_stats(nested, b)
    np.testing.assert_allclose(
        np.asarray(jax.jit(jax.hessian(lambda t: jnp.sum(new(t))))(b)),
        np.asarray(jax.hessian(lambda t: jnp.sum(nested_unrolled(t)))(b)), rtol=1e-3, atol=1e-5)
