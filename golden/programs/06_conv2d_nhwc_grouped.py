"""NHWC/HWIO grouped convolution with rhs (atrous) dilation followed by a 1x1 projection."""
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

TAGS = ("conv", "nhwc", "float32")
SUPPORTS = ("grad", "jvp", "vmap", "jit")


def fun(images, kernel, proj):
    # images: (N, H, W, C=4); kernel: (3, 3, C/groups=2, 4); proj: (1, 1, 4, 3)
    dn = lax.conv_dimension_numbers(images.shape, kernel.shape, ("NHWC", "HWIO", "NHWC"))
    h = lax.conv_general_dilated(
        images, kernel, window_strides=(1, 1), padding="VALID",
        rhs_dilation=(2, 2), dimension_numbers=dn, feature_group_count=2)
    h = jnp.tanh(h)
    out = lax.conv_general_dilated(
        h, proj, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return out


def example_args():
    rng = np.random.RandomState(6)
    images = rng.randn(2, 9, 9, 4).astype(np.float32)
    kernel = (rng.randn(3, 3, 2, 4) * 0.4).astype(np.float32)
    proj = (rng.randn(1, 1, 4, 3) * 0.5).astype(np.float32)
    return (jnp.asarray(images), jnp.asarray(kernel), jnp.asarray(proj))
