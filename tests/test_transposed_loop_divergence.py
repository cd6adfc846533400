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
