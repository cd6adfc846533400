"""Soft clipping custom_jvp with nondiff_argnums (a Python float limit) applied per layer."""
from functools import partial

import jax
import jax.numpy as jnp

TAGS = ("custom_jvp", "custom_jvp_nondiff", "float32")
SUPPORTS = ("grad", "jvp", "vmap", "jit")


@partial(jax.custom_jvp, nondiff_argnums=(1,))
def soft_clip(x, limit):
    return limit * jnp.tanh(x / limit)


@soft_clip.defjvp
def _soft_clip_jvp(limit, primals, tangents):
    (x,), (t,) = primals, tangents
    y = soft_clip(x, limit)
    return y, t * (1.0 - (y / limit) ** 2)


def fun(x, gain):
    h = soft_clip(x * gain, 2.0)
    h = soft_clip(h * gain + 0.5, 1.0)
    return h, jnp.sum(h * x)


def example_args():
    return (jnp.linspace(-4.0, 4.0, 9, dtype=jnp.float32), jnp.float32(1.3))
