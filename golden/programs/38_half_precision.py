"""Mixed float16/bfloat16 activation math with up/down casts through float32."""
import jax
import jax.numpy as jnp

TAGS = ("float16", "bfloat16", "float32", "cast", "elementwise")
SUPPORTS = ("grad", "jvp", "vmap", "jit")


def fun(x16, xb, w):
    h = jnp.tanh(x16 * jnp.float16(0.5)) + jnp.exp(-x16 * x16)
    g = jax.nn.gelu(xb) * w.astype(jnp.bfloat16)
    wide = h.astype(jnp.float32) + g.astype(jnp.float32)
    narrow = (wide * 1.5).astype(jnp.bfloat16)
    return narrow, jnp.sum(h, dtype=jnp.float32), (g * g).astype(jnp.float16)


def example_args():
    return (
        jnp.linspace(-2.0, 2.0, 8, dtype=jnp.float16),
        jnp.linspace(-1.0, 3.0, 8, dtype=jnp.bfloat16),
        jnp.linspace(0.5, 1.0, 8, dtype=jnp.float32),
    )
