"""Data-dependent piecewise map using two lax.cond calls (one with multiple operands)."""
import jax
import jax.numpy as jnp
from jax import lax

TAGS = ("cond", "float32")
SUPPORTS = ("grad", "jvp", "vmap", "jit")


def _small(v):
    return jnp.sin(v) * 2.0


def _large(v):
    return jnp.log1p(v * v)


def fun(x, threshold):
    norm = jnp.sqrt(jnp.sum(x * x))
    y = lax.cond(norm < threshold, _small, _large, x)
    z = lax.cond(jnp.sum(y) > 0.0,
                 lambda a, b: a * b + 1.0,
                 lambda a, b: a - jnp.exp(b),
                 y, x)
    return y + z


def example_args():
    return (jnp.linspace(-0.6, 0.9, 5, dtype=jnp.float32), jnp.float32(1.5))
