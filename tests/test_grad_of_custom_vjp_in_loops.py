"""jax.grad of a function calling a custom_vjp inside scan, fori_loop or lax.map,
traced by jaxpr-cc (adv18m).  JAX's partial evaluation of the loop body leaves a
custom_vjp call of nothing at the top level (no operands, no results) whose fwd
still takes the original operands; converting its rule failed inside JAX
(safe_zip lengths 2 and 0).  It computes nothing and is dropped.  Reference:
jax.jit of the same gradient."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_cc


@jax.custom_vjp
def scaled(x, w):
    return x * w


scaled.defvjp(lambda x, w: (scaled(x, w), (x, w)), lambda r, g: (g * r[1], g * r[0]))

LOOPS = {
    "scan": lambda x, w: jax.lax.scan(lambda u, _: (scaled(u, w), None), x, None,
                                      length=3)[0].sum(),
    "fori_loop": lambda x, w: jax.lax.fori_loop(0, 3, lambda _, u: scaled(u, w), x).sum(),
    "lax.map": lambda x, w: jax.lax.map(lambda u: scaled(u, w), jnp.stack([x, 2 * x])).sum(),
}


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_grad_of_a_custom_vjp_in_a_loop(loop):
    f = LOOPS[loop]
    x, w = jnp.linspace(0.5, 1.5, 4), jnp.full(4, 2.0)
    want = jax.jit(jax.grad(f, argnums=(0, 1)))(x, w)
    for got in (jaxpr_cc.jit(jax.grad(f, argnums=(0, 1)))(x, w),
                jaxpr_cc.trace(jax.grad(f, argnums=(0, 1)), x, w)(x, w)):
        for g, r in zip(got, want):
            np.testing.assert_allclose(g, r, rtol=1e-6)
