"""Two-layer CNN (NCHW/OIHW) with lax.conv_general_dilated, stride 2 and explicit padding."""
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

TAGS = ("conv", "nchw", "reduction", "float32")
SUPPORTS = ("grad", "jvp", "vmap", "jit")


def fun(images, k1, b1, k2):
    # images: (N, C, H, W); k1: (O, I, kh, kw)
    h = lax.conv_general_dilated(
        images, k1, window_strides=(1, 1), padding="SAME",
        dimension_numbers=("NCHW", "OIHW", "NCHW"))
    h = jax.nn.relu(h + b1[None, :, None, None])
    h = lax.conv_general_dilated(
        h, k2, window_strides=(2, 2), padding=((1, 1), (1, 1)),
        dimension_numbers=("NCHW", "OIHW", "NCHW"))
    return jnp.mean(h, axis=(2, 3)), h


def example_args():
    rng = np.random.RandomState(5)
    images = rng.randn(2, 3, 8, 8).astype(np.float32)
    k1 = (rng.randn(4, 3, 3, 3) * 0.3).astype(np.float32)
    b1 = np.linspace(-0.1, 0.1, 4).astype(np.float32)
    k2 = (rng.randn(2, 4, 3, 3) * 0.3).astype(np.float32)
    return tuple(jnp.asarray(a) for a in (images, k1, b1, k2))
