"""Sliding-window buffer update with lax.dynamic_slice / dynamic_update_slice at a traced offset."""
import jax
import jax.numpy as jnp
from jax import lax

TAGS = ("dynamic_slice", "dynamic_update_slice", "int32", "float32")
SUPPORTS = ("grad", "jvp", "vmap", "jit")


def fun(buf, patch, start):
    window = lax.dynamic_slice(buf, (start, jnp.int32(0)), (3, 4))
    updated = lax.dynamic_update_slice(buf, patch * 2.0 + window, (start + 1, jnp.int32(2)))
    rows = lax.dynamic_slice_in_dim(updated, start, 2, axis=0)
    return updated, rows.sum(axis=0)


def example_args():
    buf = jnp.arange(8 * 6, dtype=jnp.float32).reshape(8, 6) / 10.0
    patch = jnp.ones((3, 4), jnp.float32) * jnp.float32(-0.5)
    return (buf, patch, jnp.int32(2))
