"""Leaky ReLU with shift and repeat count given as Python float/int scalars (weak types)."""
import jax
import jax.numpy as jnp

TAGS = ("python_scalar", "weak_type", "elementwise", "where", "float32")
SUPPORTS = ("grad", "jvp", "vmap", "jit")


def fun(x, slope, shift, repeats):
    y = jnp.where(x >= 0.0, x, slope * x)      # weak-typed float scalar keeps float32
    y = y + shift
    total = y * repeats                          # weak-typed int scalar
    center = jnp.mean(y) * slope - shift ** 2
    return total, center


def example_args():
    return (jnp.linspace(-2.0, 2.0, 6, dtype=jnp.float32), 0.1, 0.25, 3)
