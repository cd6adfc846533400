"""Noisy dropout layer: PRNG key argument split into normal/uniform/bernoulli draws."""
import jax
import jax.numpy as jnp

TAGS = ("prng", "prng_key_arg", "where", "float32")
SUPPORTS = ("grad", "jvp", "vmap", "jit")


def fun(key, x, w):
    k_noise, k_mask, k_jitter = jax.random.split(key, 3)
    h = x @ w
    h = h + 0.1 * jax.random.normal(k_noise, h.shape, h.dtype)
    keep = jax.random.bernoulli(k_mask, 0.75, h.shape)
    h = jnp.where(keep, h / 0.75, 0.0)
    jitter = jax.random.uniform(k_jitter, (h.shape[-1],), minval=0.9, maxval=1.1)
    return jax.nn.relu(h) * jitter, keep


def example_args():
    x = jnp.linspace(-1.0, 1.0, 12, dtype=jnp.float32).reshape(3, 4)
    w = jnp.sin(jnp.arange(20, dtype=jnp.float32)).reshape(4, 5)
    return (jax.random.key(0), x, w)
