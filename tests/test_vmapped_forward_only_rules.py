"""jaxpr_cc.jit of jax.vmap of the tutorial's fixed_point whose update closes over
an array (issue 17).  The closed-over value's cotangent is formed by forward mode
(closure.rules.forward_only); JAX batches that rule when the vmap is outside the
traced function, and closure-convert made it first-order only unbatched: batched,
it traced every level of its Jacobians in JAX's form (over 15 minutes).  It now
makes the rule of the batched function, its axes read from the types the rule
was called at.  References: JAX's own values and jax.jacrev (float64)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_cc
from jaxpr_cc.examples.fixed_point import fixed_point


@pytest.mark.heavy  # ~30 s: the nested rules' Jacobian levels are traced
def test_vmap_of_a_fixed_point_closing_over_an_array():
    with jax.enable_x64(True):
        w = jnp.array([[0.2, -0.1], [0.3, 0.1]])

        def solve(a):
            return fixed_point(lambda a, x: jnp.tanh(w @ x + a) * 0.9, a, jnp.zeros(2))
        v = jnp.array([[0.4, 0.1], [-0.2, 0.5], [0.2, -0.3]])
        batched = jaxpr_cc.jit(jax.vmap(solve))
        np.testing.assert_allclose(batched(v), jax.vmap(solve)(v), rtol=1e-12)
        want = jax.jacrev(jax.vmap(solve))(v)
        np.testing.assert_allclose(jax.jacrev(batched)(v), want, rtol=1e-8, atol=1e-12)
        # Forward mode transposes the adjoint iteration as its limit; JAX's reverse
        # mode stops it at the solver's tolerance (1e-6): issue 17's rtol 1e-4.
        np.testing.assert_allclose(jax.jacfwd(batched)(v), want, rtol=1e-4, atol=1e-8)
