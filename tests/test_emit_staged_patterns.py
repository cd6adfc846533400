"""An emitted module's custom_vjp functions staged once (``jax.make_jaxpr``) and
then differentiated with several perturbation patterns: JAX memoizes the
staged fwd per pattern but hands bwd the residual tree of the pattern traced
last, so which fwd ran travels in a residual's shape, not in pytree static data
(as equinox's nested checkpointed loops stage and differentiate them).
References: analytic derivatives."""
import jax
import jax.numpy as jnp
import numpy as np
from emitted import emitted_function

import jaxpr_cc


def _a_b_a(fn, x, w):
    staged = jax.make_jaxpr(fn)(x, w)

    def h(a, b):
        return jax.core.eval_jaxpr(staged.jaxpr, staged.consts, a, b)[0]
    both = jax.grad(h, argnums=(0, 1))(x, w)
    first = jax.grad(h, argnums=0)(x, w)
    again = jax.grad(h, argnums=(0, 1))(x, w)
    return np.array([both[0], both[1], first, again[0], again[1]])


def test_closed_over_operands_staged_then_differentiated_a_b_a(tmp_path):
    def sine(x, w):
        @jax.custom_vjp
        def g(y):
            return jnp.sin(w * y)
        g.defvjp(lambda y: (g(y), y), lambda y, ct: (ct * w * jnp.cos(w * y),))
        return g(x)
    x, w = jnp.float32(0.7), jnp.float32(1.3)
    emitted = emitted_function(jaxpr_cc.trace(sine, x, w), tmp_path)
    d_x, d_w = w * np.cos(w * x), x * np.cos(w * x)
    np.testing.assert_allclose(_a_b_a(emitted, x, w), [d_x, d_w, d_x, d_x, d_w], rtol=1e-6)


def test_symbolic_zero_variants_staged_then_differentiated_a_b_a(tmp_path):
    def product(x, w):
        @jax.custom_vjp
        def mul(a, b):
            return a * b
        mul.defvjp(lambda a, b: (mul(a.value, b.value), (a.value, b.value)),
                   lambda res, ct: (ct * res[1], ct * res[0]), symbolic_zeros=True)
        return mul(x, w)
    x, w = jnp.float32(2.0), jnp.float32(3.0)
    emitted = emitted_function(jaxpr_cc.trace(product, x, w), tmp_path)
    np.testing.assert_allclose(_a_b_a(emitted, x, w), [3.0, 2.0, 3.0, 3.0, 2.0])
