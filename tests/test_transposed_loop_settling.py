"""When the transposed iteration of a bwd's adjoint loop has settled (adversary,
stop 32).

* Each element is held to its own precision: a component in small units beside
  one in large units converges as slowly as it does (the settle test compared
  every change with the largest value, so the small component stopped after two
  steps: 3.9 where JAX gives 100).
* A sum whose terms do not shrink has no limit: a bwd that solves a singular
  system on the projected cotangent transposes to a sum that keeps the null
  space's part for ever; it "settled" when its terms fell below its rounding and
  gave a finite wrong tangent.  It is NaN, as a diverging iteration is.

References: ``jax.jacrev`` (JAX runs the user's bwd) and closed forms.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_cc

SLOW = jnp.array([[0.0, 0.0], [0.0, 0.99]])


def _adjoint_fixed_point(scales):
    @jax.custom_vjp
    def f(y):
        return y

    def bwd(_, g):
        step = lambda c: (c[1], g + SLOW.T @ c[1])  # noqa: E731
        return (jax.lax.while_loop(lambda c: jnp.max(jnp.abs(c[1] - c[0])) > 1e-5, step,
                                   (g, g + SLOW.T @ g))[1],)

    f.defvjp(lambda y: (y, None), bwd)
    return lambda x: f(jnp.asarray(scales, jnp.float32) * x)


@pytest.mark.parametrize("large", [1e3, 1e7])
def test_a_small_component_beside_a_large_one_converges_as_slowly_as_it_does(large):
    f = _adjoint_fixed_point([large, 1.0])
    x = jnp.float32(0.5)
    want = np.array([large, 100.0])      # (I - SLOW)^-1 [large, 1]
    np.testing.assert_allclose(np.asarray(jax.jacrev(f)(x)), want, rtol=1e-4)
    for ours in (jaxpr_cc.jit(f), jaxpr_cc.trace(f, x)):
        np.testing.assert_allclose(np.asarray(jax.jacfwd(ours)(x)), want, rtol=1e-4)


def test_a_sum_that_keeps_a_mode_for_ever_is_nan():
    laplacian = jnp.array([[1.0, -1.0], [-1.0, 1.0]])

    @jax.custom_vjp
    def f(x):
        return jnp.sin(x)

    def bwd(_, g):
        g0 = g - jnp.mean(g)  # the range of the singular Laplacian
        step = lambda c: (c[1], c[1] + 0.3 * (g0 - laplacian @ c[1]))  # noqa: E731
        return (jax.lax.while_loop(lambda c: jnp.max(jnp.abs(c[1] - c[0])) > 1e-6, step,
                                   (jnp.zeros(2), 0.3 * g0))[1],)

    f.defvjp(lambda x: (jnp.sin(x), None), bwd)
    x, t = jnp.array([0.3, -1.2]), jnp.array([1.0, 0.0])
    np.testing.assert_allclose(np.asarray(jax.jacrev(f)(x) @ t), [0.25, -0.25], rtol=1e-5)
    got = np.asarray(jax.jvp(jaxpr_cc.jit(f), (x,), (t,))[1])
    assert np.isnan(got).all(), got


def test_a_slowly_contracting_sum_has_a_limit():
    """Rate 0.999995 in float32: the sum reaches 2e5 times its first term, its
    terms shrinking slowly.  A test of the sum's size against its largest term
    took that for a sum that only grows (NaN); the terms' decay is what tells."""
    rho = 0.999995

    @jax.custom_vjp
    def f(y):
        return y

    def bwd(_, g):
        step = lambda c: (c[1], g + rho * c[1])  # noqa: E731
        return (jax.lax.while_loop(lambda c: jnp.abs(c[1] - c[0]) > 1e-7 * jnp.abs(c[1]), step,
                                   (g, g + rho * g))[1],)

    f.defvjp(lambda y: (y, None), bwd)
    x = jnp.float32(0.5)
    exact = 1.0 / (1.0 - rho)
    assert abs(float(jax.grad(f)(x)) - exact) < 0.05 * exact   # JAX's float32 loop
    np.testing.assert_allclose(float(jax.jacfwd(jaxpr_cc.jit(f))(x)), exact, rtol=0.05)


def test_an_affine_bwd_with_a_relative_test_is_nan_without_hanging():
    """The affine check evaluates the bwd at a zero cotangent, where a relative
    test (``~(|du| < rtol |u|)``: ``0 < 0`` is false) never stops the loop; it
    hung.  Its loops run a few steps there: the bwd's constant part
    (``where(r > 0, u, 1.0)``) is found and forward mode is NaN, as the README
    says of an affine bwd."""
    @jax.custom_vjp
    def f(x):
        return jnp.sin(x)

    def bwd(r, g):
        step = lambda c: (c[1], g + 0.5 * c[1])  # noqa: E731
        going = lambda c: ~(jnp.max(jnp.abs(c[1] - c[0])) < 1e-6 * jnp.max(jnp.abs(c[1])))  # noqa: E731
        u = jax.lax.while_loop(going, step, (g, g + 0.5 * g))[1]
        return (jnp.where(r > 0, u, 1.0),)

    f.defvjp(lambda x: (jnp.sin(x), x), bwd)
    got = np.asarray(jax.jacfwd(jaxpr_cc.jit(f))(jnp.array([0.3, -1.2])))
    assert np.isnan(got).all(), got


def test_a_bwd_affine_only_after_64_counted_steps_is_nan():
    """The affine check ran every loop of the bwd at most 64 steps at a zero
    cotangent; it now caps only loops whose test reads the cotangent.  A counted
    loop (its test reads its counter alone) that writes a constant at step 80 is
    affine: forward mode is NaN, not the transpose of its linear part.  (The cap
    also cut diffrax's backward solves short: test_forward_mode_realworld_corpus.)"""
    @jax.custom_vjp
    def f(x):
        return jnp.sin(x)

    def bwd(r, g):
        def step(c):
            i, v = c
            return i + 1, jnp.where(i == 80, jnp.full_like(v, 3.0), 0.5 * v)
        _, v = jax.lax.while_loop(lambda c: c[0] < 100, step, (jnp.int32(0), g))
        return (jnp.cos(r) * v,)

    f.defvjp(lambda x: (jnp.sin(x), x), bwd)
    x = jnp.array([0.3, -1.2])
    assert np.isfinite(np.asarray(jax.jacrev(f)(x))).all()  # JAX runs the bwd
    got = np.asarray(jax.jacfwd(jaxpr_cc.jit(f))(x))
    assert np.isnan(got).all(), got
