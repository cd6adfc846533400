"""jax.jit with NamedSharding in_shardings/out_shardings on a 4x2 CPU mesh (data x model parallel)."""
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

TAGS = ("sharding", "multi_device", "nested_jit", "matmul", "float32")
SUPPORTS = ("grad", "jvp", "vmap", "jit")
DEVICES = 8


def _dense(x, w, b):
    return jax.nn.relu(x @ w + b)


def fun(x, w, b):
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("x", "y"))
    sharded = jax.jit(
        _dense,
        in_shardings=(NamedSharding(mesh, P("x", None)),
                      NamedSharding(mesh, P(None, "y")),
                      NamedSharding(mesh, P("y"))),
        out_shardings=NamedSharding(mesh, P("x", "y")),
    )
    return sharded(x, w, b)


def example_args():
    x = jnp.linspace(-1.0, 1.0, 8 * 4, dtype=jnp.float32).reshape(8, 4)
    w = jnp.sin(jnp.arange(4 * 6, dtype=jnp.float32)).reshape(4, 6)
    b = jnp.linspace(-0.2, 0.2, 6, dtype=jnp.float32)
    return (x, w, b)
