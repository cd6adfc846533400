"""A custom_vjp whose function closes over a large constant (a weight matrix
above ``max_forward_size`` elements) that nothing differentiates.  The rule's
policy refuses derivatives along its closed-over values only when JAX perturbs
them: reverse mode raised "closes over 'W' ... which is being differentiated"
(every tangent was made dense on the way to the kept custom_vjp), and forward
mode raised JAX's custom_vjp error (the rule was kept whatever the call
perturbed).  Reference: JAX's reverse mode of the same function."""
import jax
import jax.numpy as jnp
import numpy as np

import jaxpr_cc
from jaxpr_cc.examples.fixed_point import fixed_point

N = 65  # W has 4225 elements > max_forward_size = 4096
W = jnp.asarray(np.random.default_rng(0).normal(size=(N, N)) / (4 * N ** 0.5), jnp.float32)
B = jnp.asarray(np.random.default_rng(1).normal(size=N) * 0.1, jnp.float32)


def solve(b):
    return fixed_point(lambda a, x: jnp.tanh(W @ x + a), b, jnp.zeros(N))


def test_reverse_mode_along_the_arguments_only_is_jaxs():
    want = np.asarray(jax.jacrev(solve)(B))
    for ours in (jaxpr_cc.jit(solve), jaxpr_cc.trace(solve, B)):
        np.testing.assert_allclose(np.asarray(jax.jacrev(ours)(B)), want, rtol=1e-5, atol=1e-6)


def test_forward_mode_along_the_arguments_only_equals_reverse_mode():
    want = np.asarray(jax.jacrev(solve)(B))
    for ours in (jaxpr_cc.jit(solve), jaxpr_cc.trace(solve, B)):
        np.testing.assert_allclose(np.asarray(jax.jacfwd(ours)(B)), want, rtol=1e-4, atol=1e-5)
