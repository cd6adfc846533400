"""Sparse accumulation with x.at[idx].set/add/multiply/max, duplicate indices and segment_sum."""
import jax
import jax.numpy as jnp

TAGS = ("scatter", "int32", "float32")
SUPPORTS = ("grad", "jvp", "vmap", "jit")


def fun(x, idx, vals):
    acc = x.at[idx].add(vals)                  # duplicate indices accumulate
    acc = acc.at[0].set(vals[0] * 2.0)
    acc = acc.at[idx[:2]].multiply(1.5)
    peak = jnp.zeros((4,), x.dtype).at[idx % 4].max(vals)
    seg = jax.ops.segment_sum(vals * vals, idx % 3, num_segments=3)
    return acc, peak, seg


def example_args():
    x = jnp.linspace(0.0, 1.0, 8, dtype=jnp.float32)
    idx = jnp.array([1, 5, 1, 7, 2], dtype=jnp.int32)
    vals = jnp.array([0.5, -1.0, 2.0, 0.25, 3.0], dtype=jnp.float32)
    return (x, idx, vals)
