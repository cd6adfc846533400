"""Symmetric int8 weight / int16 activation quantization with int32 accumulation and dequantization."""
import jax
import jax.numpy as jnp
import numpy as np

TAGS = ("int8", "int16", "int32", "cast", "matmul", "float32")
SUPPORTS = ("grad", "jvp", "vmap", "jit")


def fun(w, x, zero_point):
    scale = jnp.max(jnp.abs(w)) / 127.0
    wq = jnp.clip(jnp.round(w / scale), -127, 127).astype(jnp.int8)
    xq = jnp.clip(jnp.round(x * 64.0), -32768, 32767).astype(jnp.int16)
    shifted = (xq - zero_point.astype(jnp.int16)).astype(jnp.int32)
    acc = jnp.matmul(shifted, wq.astype(jnp.int32))             # int32 accumulation
    col_sums = jnp.sum(wq.astype(jnp.int16), axis=0, dtype=jnp.int16)
    y = acc.astype(jnp.float32) * (scale / 64.0)
    return y, wq, col_sums


def example_args():
    rng = np.random.RandomState(37)
    w = jnp.asarray(rng.randn(4, 3).astype(np.float32))
    x = jnp.asarray(rng.randn(2, 4).astype(np.float32))
    return (w, x, jnp.int8(-3))
