"""Elman RNN over a sequence with lax.scan; parameters passed as a dict pytree."""
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

TAGS = ("scan", "rnn", "dict", "pytree_in", "float32")
SUPPORTS = ("grad", "jvp", "vmap", "jit")


def fun(params, xs, h0):
    def cell(h, x):
        h_new = jnp.tanh(x @ params["w_in"] + h @ params["w_rec"] + params["b"])
        y = h_new @ params["w_out"]
        return h_new, y

    h_last, ys = lax.scan(cell, h0, xs)
    return ys, h_last


def example_args():
    rng = np.random.RandomState(15)
    params = {
        "w_in": jnp.asarray(rng.randn(3, 5).astype(np.float32) * 0.5),
        "w_rec": jnp.asarray(rng.randn(5, 5).astype(np.float32) * 0.3),
        "b": jnp.zeros((5,), jnp.float32),
        "w_out": jnp.asarray(rng.randn(5, 2).astype(np.float32) * 0.5),
    }
    xs = jnp.asarray(rng.randn(6, 3).astype(np.float32))
    return (params, xs, jnp.zeros((5,), jnp.float32))
