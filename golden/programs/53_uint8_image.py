"""uint8 image pipeline: normalize to float, gamma/contrast, histogram via scatter-add, requantize."""
import jax
import jax.numpy as jnp

TAGS = ("uint8", "int32", "cast", "scatter", "clip", "float32")
SUPPORTS = ("grad", "jvp", "vmap", "jit")


def fun(image, gain):
    x = image.astype(jnp.float32) / 255.0
    x = jnp.clip(gain * (x ** 0.8 - 0.5) + 0.5, 0.0, 1.0)
    bins = (image >> 5).astype(jnp.int32)                      # 8 intensity bins
    hist = jnp.zeros((8,), jnp.int32).at[bins.reshape(-1)].add(1)
    out = jnp.round(x * 255.0).astype(jnp.uint8)
    luminance = jnp.tensordot(x, jnp.array([0.299, 0.587, 0.114], jnp.float32), axes=1)
    return out, hist, luminance


def example_args():
    image = (jnp.arange(4 * 4 * 3, dtype=jnp.int32).reshape(4, 4, 3) * 5 + 3).astype(jnp.uint8)
    return (image, jnp.float32(1.2))
