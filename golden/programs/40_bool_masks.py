"""Masked statistics with bool array arguments: &, |, ^, ~, any/all and bool->float casts."""
import jax
import jax.numpy as jnp

TAGS = ("bool", "where", "bitwise", "reduction", "cast", "float32")
SUPPORTS = ("grad", "jvp", "vmap", "jit")


def fun(x, mask, valid):
    m = mask & valid[None, :]
    count = jnp.maximum(jnp.sum(m), 1)
    masked_mean = jnp.sum(jnp.where(m, x, 0.0)) / count
    flipped = jnp.logical_xor(mask, x > masked_mean)
    either = (~m) | flipped
    return masked_mean, x * either.astype(x.dtype), jnp.any(m, axis=1), jnp.all(either, axis=0)


def example_args():
    x = jnp.linspace(-1.0, 1.0, 12, dtype=jnp.float32).reshape(3, 4)
    mask = jnp.array([[True, False, True, True], [False, False, True, False], [True, True, False, True]])
    valid = jnp.array([True, True, False, True])
    return (x, mask, valid)
