"""Power iteration with a data-dependent lax.while_loop stop (tolerance) -> no reverse-mode grad."""
import jax
import jax.numpy as jnp
from jax import lax

TAGS = ("while_loop", "reduction", "float32", "int32")
SUPPORTS = ("jvp", "vmap", "jit")


def fun(matrix, v0, tol):
    def keep_going(state):
        i, _, delta = state
        return (delta > tol) & (i < 60)

    def step(state):
        i, v, _ = state
        w = matrix @ v
        w = w / jnp.sqrt(jnp.sum(w * w))
        return i + 1, w, jnp.max(jnp.abs(w - v))

    init = (jnp.int32(0), v0 / jnp.sqrt(jnp.sum(v0 * v0)), jnp.float32(jnp.inf))
    iters, v, _ = lax.while_loop(keep_going, step, init)
    return v @ (matrix @ v), v, iters


def example_args():
    base = jnp.arange(16, dtype=jnp.float32).reshape(4, 4) / 16.0
    matrix = base + base.T + jnp.diag(jnp.array([2.0, 0.5, 0.1, 0.0], jnp.float32))
    return (matrix, jnp.ones((4,), jnp.float32), jnp.float32(1e-4))
