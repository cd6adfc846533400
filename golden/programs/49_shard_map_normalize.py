"""jax.shard_map over a 4x2 mesh: per-shard moments combined with psum to standardize rows."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

TAGS = ("shard_map", "multi_device", "reduction", "float32")
SUPPORTS = ("grad", "jvp", "vmap", "jit")
DEVICES = 8


def _local_standardize(block, scale):
    # block: (rows/4, cols/2) shard; statistics over the full column axis "y".
    n = jax.lax.psum(block.shape[1], "y")
    mean = jax.lax.psum(jnp.sum(block, axis=1, keepdims=True), "y") / n
    sq = jax.lax.psum(jnp.sum((block - mean) ** 2, axis=1, keepdims=True), "y") / n
    return (block - mean) * jax.lax.rsqrt(sq + 1e-5) * scale


def fun(x, scale):
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("x", "y"))
    f = jax.shard_map(_local_standardize, mesh=mesh,
                      in_specs=(P("x", "y"), P()), out_specs=P("x", "y"))
    return f(x, scale)


def example_args():
    x = jnp.sin(jnp.arange(8 * 6, dtype=jnp.float32)).reshape(8, 6) * 3.0 + 1.0
    return (x, jnp.float32(2.0))
