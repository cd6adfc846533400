"""Multi-head scaled dot-product attention written with einsum (batch+head dims) and softmax."""
import jax
import jax.numpy as jnp
import numpy as np

TAGS = ("einsum", "batch_dims", "softmax", "float32")
SUPPORTS = ("grad", "jvp", "vmap", "jit")


def fun(q, k, v):
    # q, k, v: (batch, heads, seq, dim)
    scale = 1.0 / jnp.sqrt(jnp.float32(q.shape[-1]))
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) * scale
    causal = jnp.tril(jnp.ones((q.shape[2], k.shape[2]), dtype=bool))
    scores = jnp.where(causal, scores, -1e9)
    weights = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bhqk,bhkd->bhqd", weights, v)
    merged = jnp.einsum("bhqd->bqhd", out).reshape(q.shape[0], q.shape[2], -1)
    return merged


def example_args():
    rng = np.random.RandomState(4)
    shape = (2, 2, 5, 4)
    return tuple(jnp.asarray(rng.randn(*shape).astype(np.float32)) for _ in range(3))
