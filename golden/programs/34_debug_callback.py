"""Activation statistics recorded with jax.debug.callback (appends to a module-level list)."""
import jax
import jax.numpy as jnp
import numpy as np

TAGS = ("debug_callback", "reduction", "float32")
SUPPORTS = ("grad", "jvp", "vmap", "jit")

# Filled by the callback; only grows, never read by `fun`.
RECORDED = []


def _record(mean, peak):
    RECORDED.append((np.asarray(mean).copy(), np.asarray(peak).copy()))


def fun(x, w):
    h = jnp.tanh(x @ w)
    jax.debug.callback(_record, jnp.mean(h), jnp.max(jnp.abs(h)))
    return jnp.sum(h ** 2, axis=-1)


def example_args():
    x = jnp.linspace(-1.0, 1.0, 8, dtype=jnp.float32).reshape(2, 4)
    w = jnp.cos(jnp.arange(12, dtype=jnp.float32)).reshape(4, 3)
    return (x, w)
