"""Batched bilinear forms via matmul, lax.dot_general and einsum with batch dimensions."""
import jax
import jax.numpy as jnp
from jax import lax

TAGS = ("dot_general", "matmul", "einsum", "batch_dims", "float32")
SUPPORTS = ("grad", "jvp", "vmap", "jit")


def fun(a, b, v):
    # a: (B, M, K), b: (B, K, N), v: (B, N)
    c = jnp.matmul(a, b)                                             # (B, M, N)
    cv = lax.dot_general(c, v, (((2,), (1,)), ((0,), (0,))))         # (B, M)
    gram = jnp.einsum("bmk,bnk->bmn", a, a)                          # (B, M, M)
    quad = jnp.einsum("bm,bmn,bn->b", cv, gram, cv)
    return cv / (1.0 + jnp.abs(quad)[:, None]), jnp.trace(gram, axis1=1, axis2=2)


def example_args():
    a = jnp.arange(2 * 3 * 4, dtype=jnp.float32).reshape(2, 3, 4) / 10.0
    b = jnp.cos(jnp.arange(2 * 4 * 5, dtype=jnp.float32)).reshape(2, 4, 5)
    v = jnp.linspace(-1.0, 1.0, 10, dtype=jnp.float32).reshape(2, 5)
    return (a, b, v)
