"""LSTM cell scanned over time with a dict (h, c) carry and a tuple of per-step outputs."""
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

TAGS = ("scan", "scan_pytree_carry", "rnn", "dict", "tuple", "pytree_in", "pytree_out", "float32")
SUPPORTS = ("grad", "jvp", "vmap", "jit")


def fun(weights, xs, state):
    w_x, w_h, bias = weights

    def cell(carry, x):
        gates = x @ w_x + carry["h"] @ w_h + bias
        i, f, g, o = jnp.split(gates, 4)
        c = jax.nn.sigmoid(f + 1.0) * carry["c"] + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return {"h": h, "c": c}, (h, jnp.sum(c ** 2))

    final, (hs, c_energy) = lax.scan(cell, state, xs)
    return final, hs, c_energy


def example_args():
    rng = np.random.RandomState(17)
    hidden, inp = 3, 2
    weights = (
        jnp.asarray(rng.randn(inp, 4 * hidden).astype(np.float32) * 0.5),
        jnp.asarray(rng.randn(hidden, 4 * hidden).astype(np.float32) * 0.5),
        jnp.zeros((4 * hidden,), jnp.float32),
    )
    xs = jnp.asarray(rng.randn(5, inp).astype(np.float32))
    state = {"h": jnp.zeros((hidden,), jnp.float32), "c": jnp.full((hidden,), 0.1, jnp.float32)}
    return (weights, xs, state)
