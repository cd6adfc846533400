"""A bwd that gathers its cotangent with ``mode='fill'`` (adversary, stop 33).

An out-of-bounds index gets the fill value, a constant beside the cotangent: the
bwd is affine there.  Forward mode dropped it and gave 0 where ``jax.jacrev``
(which runs the user's bwd) has the fill value.  Now it is NaN, never a different
number; a fill gather with indices in bounds (``jnp.take``'s default mode) stays
exact.  References: ``jax.jacrev`` of the same function.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxpr_cc

X = np.array([0.3, -0.7, 1.1])
B = np.array([[0.2, 0.1, 0.0], [0.0, 0.1, 0.4], [0.1, 0.0, 0.2]])


def _rule(bwd_of_scaled):
    @jax.custom_vjp
    def f(x):
        return jnp.sin(x)

    f.defvjp(lambda x: (jnp.sin(x), jnp.cos(x)), lambda c, g: (bwd_of_scaled(c * g),))
    return f


IN_BOUNDS = {
    "take": lambda v: jnp.take(v, jnp.array([2, 0, 1])),
    "at_get": lambda v: v.at[jnp.array([1, 1, 0])].get(mode="fill", fill_value=3.0),
    "loop": lambda v: lax.fori_loop(0, 2, lambda i, w: jnp.asarray(B) @ jnp.take(w, jnp.array([2, 0, 1])), v),
}
OUT_OF_BOUNDS = {
    "fill_7": lambda v: v.at[jnp.array([0, 5, 2])].get(mode="fill", fill_value=7.0),
    "fill_nan": lambda v: v.at[jnp.array([0, 5, 2])].get(mode="fill"),
    "take_along_axis": lambda v: jnp.take_along_axis(v, jnp.array([0, 9, 1]), axis=0,
                                                     mode="fill", fill_value=-2.0),
    "loop": lambda v: lax.fori_loop(
        0, 2, lambda i, w: jnp.asarray(B) @ w.at[jnp.array([0, 5, 2])].get(mode="fill",
                                                                          fill_value=1.0), v),
}


@pytest.mark.parametrize("name", sorted(IN_BOUNDS))
def test_a_fill_gather_in_bounds_is_exact(name):
    with jax.enable_x64(True):
        f = _rule(IN_BOUNDS[name])
        x = jnp.asarray(X)
        np.testing.assert_allclose(jax.jacfwd(jaxpr_cc.jit(f))(x), jax.jacrev(f)(x),
                                   rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", sorted(OUT_OF_BOUNDS))
def test_a_filled_out_of_bounds_entry_is_nan_not_a_number(name):
    with jax.enable_x64(True):
        f = _rule(OUT_OF_BOUNDS[name])
        x = jnp.asarray(X)
        want = np.asarray(jax.jacrev(f)(x))
        for ours in (jaxpr_cc.jit(f), jaxpr_cc.trace(f, x)):
            got = np.asarray(jax.jacfwd(ours)(x))
            differs = ~np.isclose(got, want, equal_nan=True)
            assert not np.any(differs & ~np.isnan(got)), (got, want)
        # Reverse mode runs the user's bwd: JAX's numbers.
        np.testing.assert_allclose(jax.jacrev(jaxpr_cc.jit(f))(x), want)
