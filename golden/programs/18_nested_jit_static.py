"""Truncated exp series under jit(static_argnums) called from an outer jit (jit inside jit)."""
from functools import partial

import jax
import jax.numpy as jnp

TAGS = ("nested_jit", "static_argnums", "float32")
SUPPORTS = ("grad", "jvp", "vmap", "jit")


@partial(jax.jit, static_argnums=(1,))
def exp_series(x, terms):
    out = jnp.zeros_like(x)
    term = jnp.ones_like(x)
    for k in range(terms):            # Python loop over the static arg
        out = out + term
        term = term * x / (k + 1)
    return out


@jax.jit
def normalize(v):
    return v / jnp.sqrt(jnp.sum(v * v) + 1e-6)


@jax.jit
def fun(x, y):
    a = exp_series(x, 5)
    b = exp_series(y * 0.5, 3)
    return normalize(a * b) + exp_series(a - b, 2)


def example_args():
    return (jnp.linspace(-1.0, 1.0, 6, dtype=jnp.float32), jnp.linspace(0.0, 2.0, 6, dtype=jnp.float32))
