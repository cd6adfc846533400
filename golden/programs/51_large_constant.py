"""Random-feature projection closing over a 64x64 float32 numpy matrix built at module level."""
import jax
import jax.numpy as jnp
import numpy as np

TAGS = ("large_constant", "matmul", "float32")
SUPPORTS = ("grad", "jvp", "vmap", "jit")

_RNG = np.random.RandomState(1234)
PROJECTION = (_RNG.randn(64, 64) / 8.0).astype(np.float32)
OFFSETS = np.linspace(0.0, 2.0 * np.pi, 64, endpoint=False).astype(np.float32)


def fun(x):
    # x: (batch, 64)
    features = jnp.cos(x @ PROJECTION + OFFSETS) * np.float32(np.sqrt(2.0 / 64.0))
    recon = features @ PROJECTION.T
    return recon, jnp.sum(features * features, axis=-1)


def example_args():
    return (jnp.linspace(-1.0, 1.0, 3 * 64, dtype=jnp.float32).reshape(3, 64),)
