"""implicit-diff keeps the loop's derivative and never fails the pipeline (issue 16,
adversary f).

The reference is always JAX's derivative through the original loop (forward
mode through its iterations), or a float64 analytic value where JAX has none.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxpr_cc
from jaxpr_cc.passes.manager import PassManager


def rewritten(fun, *args, pipeline="implicit-diff"):
    return jaxpr_cc.run_passes(jaxpr_cc.trace(fun, *args), pipeline)


# ------------------------------------------------ a custom_vjp inside the loop
@jax.custom_vjp
def sine_with_rule(x):
    return jnp.sin(x)


sine_with_rule.defvjp(lambda x: (jnp.sin(x), jnp.cos(x)), lambda c, g: (c * g,))


def loop_calling_a_custom_vjp(theta):
    def cond(c):
        x, xp = c
        return jnp.abs(x - xp) > 1e-6

    def body(c):
        x, _ = c
        return 0.5 * sine_with_rule(x) + theta, x

    return lax.while_loop(cond, body, (jnp.float32(0.0), jnp.float32(1e3)))[0]


def loop_calling_a_custom_vjp_under_jit(theta):
    inner = jax.jit(lambda x: 0.5 * sine_with_rule(x))

    def cond(c):
        x, xp = c
        return jnp.abs(x - xp) > 1e-6

    def body(c):
        x, _ = c
        return inner(x) + theta, x

    return lax.while_loop(cond, body, (jnp.float32(0.0), jnp.float32(1e3)))[0]


@pytest.mark.parametrize("fun", [loop_calling_a_custom_vjp, loop_calling_a_custom_vjp_under_jit])
def test_a_custom_vjp_in_the_body_leaves_the_loop_alone_with_a_reason(fun):
    theta = jnp.float32(0.7)
    program = jaxpr_cc.trace(fun, theta)
    pm = PassManager("implicit-diff")
    new = pm.run(program)
    stats = dict(pm.statistics)["implicit-diff"]
    assert stats["loops-skipped"] == 1 and "loops-rewritten" not in stats
    reasons = " | ".join(k for k in stats if k.startswith("loop "))
    assert "custom_vjp" in reasons and "vjp-to-jvp" in reasons
    assert float(new(theta)) == float(fun(theta))


def test_vjp_to_jvp_then_implicit_diff_rewrites_it_with_the_loops_derivative():
    # x* = 0.5 sin x* + theta: dx*/dtheta = 1 / (1 - 0.5 cos x*) (float64 analytic).
    theta = jnp.float32(0.7)
    pm = PassManager("vjp-to-jvp,implicit-diff")
    new = pm.run(jaxpr_cc.trace(loop_calling_a_custom_vjp, theta))
    assert dict(pm.statistics)["implicit-diff"]["loops-rewritten"] == 1
    x = float(loop_calling_a_custom_vjp(theta))
    want = 1.0 / (1.0 - 0.5 * np.cos(np.float64(x)))
    np.testing.assert_allclose(float(jax.grad(new)(theta)), want, rtol=1e-4)
    np.testing.assert_allclose(float(jax.jvp(new, (theta,), (jnp.float32(1.0),))[1]), want,
                               rtol=1e-4)


# ------------------------------------------------ reverse mode of a vmapped rule
def cosine_loop(theta):
    def cond(c):
        x, xp = c
        return jnp.abs(x - xp) > 1e-6

    def body(c):
        x, _ = c
        return jnp.cos(theta * x), x

    return lax.while_loop(cond, body, (jnp.float32(0), jnp.float32(1e3)))[0]


def capped_loop(theta):
    # theta < 1 converges (certified); theta = 1.05 is not a contraction and the
    # cap ends it (the loop's own derivative): one vmap holds both.
    def cond(c):
        x, xp, k = c
        return (jnp.abs(x - xp) > 1e-6) & (k < 30)

    def body(c):
        x, _, k = c
        return theta * x + 0.1, x, k + 1

    return lax.while_loop(cond, body, (jnp.float32(0), jnp.float32(1e3), 0))[0]


@pytest.mark.parametrize("adjoint", ["auto", pytest.param("bicgstab", marks=pytest.mark.heavy)])
@pytest.mark.parametrize("fun,thetas", [pytest.param(cosine_loop, [0.7, 0.9],  # ~20 s
                                                     marks=pytest.mark.heavy),
                                        pytest.param(capped_loop, [0.5, 1.05, 0.8],
                                                     marks=pytest.mark.heavy)])
def test_reverse_mode_of_a_vmapped_rule(fun, thetas, adjoint):
    thetas = jnp.asarray(thetas, jnp.float32)
    new = rewritten(fun, thetas[0], pipeline=f"implicit-diff{{adjoint={adjoint}}}")
    want = jax.vmap(lambda t: jax.jvp(fun, (t,), (jnp.float32(1.0),))[1])(thetas)
    for got in (jax.grad(lambda t: jax.vmap(new)(t).sum())(thetas),
                jnp.diag(jax.jacrev(jax.vmap(new))(thetas)),
                jax.vmap(jax.grad(new))(thetas),
                jax.jit(jax.grad(lambda t: jax.vmap(new)(t).sum()))(thetas)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-4)
    np.testing.assert_array_equal(np.asarray(jax.vmap(new)(thetas)),
                                  np.asarray(jax.vmap(fun)(thetas)))


# ------------------------------------------------ a path far from x*'s linearization
def curved_path(theta, tol=1e-10):
    # e <- 0.5 e (1 + 0.9 sin(500 e)), e = x - theta: the distance contracts by at
    # most 0.95 a step, but |df/dx| reaches ~100 along the path while it is 0.5
    # at x*: the loop's derivative (4.44 at theta = 1) is not the fixed point's (1).
    def cond(c):
        x, xp = c
        return jnp.max(jnp.abs(x - xp)) > tol

    def body(c):
        x, _ = c
        e = x - theta
        return theta + 0.5 * e * (1 + 0.9 * jnp.sin(500.0 * e)), x

    x0 = jnp.zeros_like(theta)
    return lax.while_loop(cond, body, (x0, x0 + 1e3))[0]


def curved_in_one_component(theta):
    # A 3-vector: one component takes the curved path, two are linear.
    def cond(c):
        x, xp = c
        return jnp.max(jnp.abs(x - xp)) > 1e-10

    def body(c):
        x, _ = c
        e = x - theta
        bump = jnp.array([1.0, 0.0, 0.0]) * 0.9 * jnp.sin(500.0 * e)
        return theta + 0.5 * e * (1 + bump), x

    x0 = jnp.zeros_like(theta)
    return jnp.sum(lax.while_loop(cond, body, (x0, x0 + 1e3))[0] * jnp.array([1.0, 2.0, 3.0]))


@pytest.mark.parametrize("fun,theta", [(curved_path, 1.0), pytest.param(curved_path, 0.8, marks=pytest.mark.heavy),
                                       pytest.param(curved_in_one_component, [1.0, 0.5, 2.0],
                                                    marks=pytest.mark.heavy)])
def test_a_path_far_from_the_fixed_points_linearization_keeps_its_derivative(fun, theta):
    with jax.enable_x64(True):
        theta = jnp.asarray(theta, jnp.float64)
        tangent = jnp.ones_like(theta)
        new = rewritten(fun, theta)
        want_value, want = jax.jvp(fun, (theta,), (tangent,))
        got_value, got = jax.jvp(new, (theta,), (tangent,))
        np.testing.assert_array_equal(np.asarray(got_value), np.asarray(want_value))
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-8)
        if jnp.ndim(want_value) == 0:
            grad = jax.grad(new)(theta)
            np.testing.assert_allclose(float(jnp.vdot(grad, tangent)), float(want), rtol=1e-8)


# ------------------------------------------------ forward mode above fallback-max-size
N_LARGE = 400


def large_loop(theta):
    # 3 x 400 operand elements (start, previous-iterate start, theta): above the
    # fallback's dense-Jacobian size.  Stopped after 13 steps of a 0.32 rate, it
    # is not certified.
    def cond(c):
        x, xp = c
        return jnp.max(jnp.abs(x - xp)) > 1e-6

    def body(c):
        x, _ = c
        return 0.5 * jnp.cos(x) + theta, x

    x0 = jnp.zeros(N_LARGE)
    return jnp.sum(lax.while_loop(cond, body, (x0, x0 + 1e3))[0])


def large_loop_moving_start(theta):
    def cond(c):
        x, xp = c
        return jnp.max(jnp.abs(x - xp)) > 1e-6

    def body(c):
        x, _ = c
        return 0.5 * jnp.cos(x) + theta, x

    x0 = 2.0 * theta
    return jnp.sum(lax.while_loop(cond, body, (x0, x0 + 1e3))[0])


@pytest.mark.parametrize("fun", [pytest.param(large_loop, marks=pytest.mark.heavy),
                                 pytest.param(large_loop_moving_start, marks=pytest.mark.heavy)])
def test_forward_mode_of_an_uncertified_loop_too_large_for_its_jacobian_is_the_loops(fun):
    theta = jnp.full(N_LARGE, 0.3, jnp.float32)
    t = jnp.asarray(np.random.default_rng(0).normal(size=N_LARGE), jnp.float32)
    new = rewritten(fun, theta, pipeline="implicit-diff{adjoint=bicgstab}")
    want = jax.jvp(fun, (theta,), (t,))[1]
    np.testing.assert_allclose(float(jax.jvp(new, (theta,), (t,))[1]), float(want), rtol=1e-6)
    np.testing.assert_allclose(float(jax.jit(lambda a, b: jax.jvp(new, (a,), (b,))[1])(theta, t)),
                               float(want), rtol=1e-6)

    def second(F):
        return jax.jvp(lambda a: jax.jvp(F, (a,), (t,))[1], (theta,), (t,))[1]

    np.testing.assert_allclose(float(second(new)), float(second(fun)), rtol=1e-5)
    thetas, ts = jnp.stack([theta, 1.1 * theta]), jnp.stack([t, -t])
    np.testing.assert_allclose(
        np.asarray(jax.vmap(lambda a, b: jax.jvp(new, (a,), (b,))[1])(thetas, ts)),
        np.asarray(jax.vmap(lambda a, b: jax.jvp(fun, (a,), (b,))[1])(thetas, ts)), rtol=1e-6)
    # Reverse mode would need the loop's Jacobian or iterates: NaN, never a
    # different number.
    assert np.all(np.isnan(np.asarray(jax.grad(new)(theta))))
