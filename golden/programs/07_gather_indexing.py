"""Embedding lookup plus top-k selection with x[idx], 2-D fancy indexing and take_along_axis."""
import jax
import jax.numpy as jnp

TAGS = ("gather", "take_along_axis", "int32", "float32")
SUPPORTS = ("grad", "jvp", "vmap", "jit")


def fun(table, ids, scores):
    emb = table[ids]                                     # (N, D) row gather
    corner = table[ids[:, None], jnp.arange(2)[None, :]]  # (N, 2) 2-D gather
    order = jnp.argsort(scores, axis=-1)
    top2 = jnp.take_along_axis(scores, order[:, -2:], axis=-1)
    picked = jnp.take_along_axis(emb, order[:, :1] % emb.shape[1], axis=1)
    return emb * top2.sum(axis=1, keepdims=True), corner + picked, jnp.take(table, ids[::-1], axis=0)


def example_args():
    table = jnp.arange(6 * 4, dtype=jnp.float32).reshape(6, 4) / 7.0
    ids = jnp.array([4, 0, 2], dtype=jnp.int32)
    scores = jnp.sin(jnp.arange(15, dtype=jnp.float32)).reshape(3, 5)
    return (table, ids, scores)
