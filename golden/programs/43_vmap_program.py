"""The program is jax.vmap of a per-example squared error and gradient norm (in_axes=(None, 0, 0))."""
import jax
import jax.numpy as jnp
import numpy as np

TAGS = ("transformed_vmap", "transformed_grad", "pytree_out", "float32")
SUPPORTS = ("grad", "jvp", "vmap", "jit")


def _example_loss(w, x, y):
    pred = jnp.tanh(x @ w)
    return jnp.sum((pred - y) ** 2)


def _per_example(w, x, y):
    loss, g = jax.value_and_grad(_example_loss)(w, x, y)
    return loss, jnp.sqrt(jnp.sum(g * g))


fun = jax.vmap(_per_example, in_axes=(None, 0, 0))


def example_args():
    rng = np.random.RandomState(43)
    w = jnp.asarray(rng.randn(3, 2).astype(np.float32))
    xs = jnp.asarray(rng.randn(5, 3).astype(np.float32))
    ys = jnp.asarray(rng.randn(5, 2).astype(np.float32))
    return (w, xs, ys)
