"""custom_vjp with nondiff_argnums: a function-valued arg plus a float gradient scale."""
from functools import partial

import jax
import jax.numpy as jnp

TAGS = ("custom_vjp", "custom_vjp_nondiff", "custom_vjp_fn_nondiff", "float32")
SUPPORTS = ("grad", "vmap", "jit")


@partial(jax.custom_vjp, nondiff_argnums=(0, 2))
def apply_scaled(f, x, grad_scale):
    return f(x)


def _apply_scaled_fwd(f, x, grad_scale):
    return f(x), x


def _apply_scaled_bwd(f, grad_scale, x, g):
    _, pullback = jax.vjp(f, x)
    (gx,) = pullback(g)
    return (grad_scale * gx,)


apply_scaled.defvjp(_apply_scaled_fwd, _apply_scaled_bwd)


def _wobble(v):
    return jnp.sin(v) * v


def fun(x, y):
    a = apply_scaled(_wobble, x, 0.5)
    b = apply_scaled(jnp.tanh, a * y, 2.0)
    return a + b


def example_args():
    return (jnp.linspace(-1.0, 1.0, 6, dtype=jnp.float32), jnp.linspace(1.0, 2.0, 6, dtype=jnp.float32))
