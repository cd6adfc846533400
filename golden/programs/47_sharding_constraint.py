"""Row/column sharded dense layer on a 4x2 CPU mesh using NamedSharding with_sharding_constraint."""
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

TAGS = ("sharding", "multi_device", "matmul", "float32")
SUPPORTS = ("grad", "jvp", "vmap", "jit")
DEVICES = 8


def _mesh():
    return Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("x", "y"))


def fun(x, w):
    mesh = _mesh()
    xs = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P("x", None)))
    h = jnp.tanh(xs @ w)
    h = jax.lax.with_sharding_constraint(h, NamedSharding(mesh, P("x", "y")))
    return jnp.sum(h, axis=0), h


def example_args():
    x = jnp.linspace(-1.0, 1.0, 8 * 6, dtype=jnp.float32).reshape(8, 6)
    w = jnp.cos(jnp.arange(6 * 4, dtype=jnp.float32)).reshape(6, 4)
    return (x, w)
