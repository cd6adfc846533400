"""A bwd loop whose convergence test passes in reverse mode but whose transposed
iteration diverges has no limit to transpose: forward mode gives NaN, never a number.

The bwd iterates ``u <- 1.5 u`` with a relative-change test that stops after one step
on the cotangent (reverse mode gives 1.5 g).  The transposed iteration grows without
bound; in float64 its size once passed float32's range, where ``inf > inf`` read as
"settled" and forward mode returned ~1e38 (found by an adversary, stop 30).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxpr_cc


@jax.custom_vjp
def doubled(x):
    return 2.0 * x


def _fwd(x):
    return 2.0 * x, None


def _bwd(_, g):
    def relative_change_is_large(c):
        prev, u = c
        return jnp.max(jnp.abs(u - prev)) > 0.6 * jnp.max(jnp.abs(u))

    _, u = lax.while_loop(relative_change_is_large, lambda c: (c[1], 1.5 * c[1]),
                          (jnp.zeros_like(g), g))
    return (u,)


doubled.defvjp(_fwd, _bwd)


@pytest.mark.parametrize("x64", [False, True], ids=["float32", "float64"])
def test_a_diverging_transposed_iteration_is_nan(x64):
    with jax.enable_x64(x64):
        dtype = jnp.float64 if x64 else jnp.float32
        x = jnp.array([0.3, -0.8], dtype)
        # reverse mode runs the user's bwd: one step
        np.testing.assert_allclose(np.asarray(jax.grad(lambda x: jnp.sum(jaxpr_cc.jit(doubled)(x)))(x)),
                                   [1.5, 1.5])
        _, tangent = jax.jvp(jaxpr_cc.jit(doubled), (x,), (jnp.array([1.0, 0.0], dtype),))
        assert tangent.dtype == dtype
        assert np.all(np.isnan(np.asarray(tangent))), tangent


def _tutorial_fixed_point(f, a, x_guess):
    """The JAX tutorial's fixed_point, its bwd an adjoint fixed-point iteration."""
    @jax.custom_vjp
    def solve(a, x_guess):
        def keep_going(c):
            prev, x = c
            return jnp.max(jnp.abs(prev - x)) > 1e-6 * (1.0 + jnp.max(jnp.abs(x)))
        return lax.while_loop(keep_going, lambda c: (c[1], f(a, c[1])), (x_guess, f(a, x_guess)))[1]

    def solve_fwd(a, x_guess):
        x = solve(a, x_guess)
        return x, (a, x)

    def solve_bwd(res, x_bar):
        a, x = res
        _, vjp_x = jax.vjp(lambda x: f(a, x), x)
        _, vjp_a = jax.vjp(lambda a: f(a, x), a)

        def keep_going(c):
            prev, u = c
            return jnp.max(jnp.abs(prev - u)) > 1e-10 * (1.0 + jnp.max(jnp.abs(u)))
        u = lax.while_loop(keep_going, lambda c: (c[1], x_bar + vjp_x(c[1])[0]),
                           (x_bar, x_bar + vjp_x(x_bar)[0]))[1]
        return vjp_a(u)[0], jnp.zeros_like(x)

    solve.defvjp(solve_fwd, solve_bwd)
    return solve(a, x_guess)


def cube_root(a):
    # the update's derivative at the fixed point is -1/2: the adjoint converges linearly
    return _tutorial_fixed_point(lambda a, x: (x + a / x ** 2) / 2.0, a, a)


@pytest.mark.parametrize("scale", [1e60, 1e300, 1e-100, 1e-250])
def test_a_converging_transposed_iteration_is_exact_beyond_float32s_range(scale):
    """The transposed limit compared sizes in float32: past its range both sides
    were inf (or 0), and the iteration stopped after a step (12% off)."""
    with jax.enable_x64(True):
        a = jnp.float64(3.0)
        _, tangent = jax.jvp(jaxpr_cc.jit(cube_root), (a,), (jnp.float64(scale),))
        np.testing.assert_allclose(float(tangent) / scale, (1 / 3) * 3.0 ** (-2 / 3), rtol=1e-6)
