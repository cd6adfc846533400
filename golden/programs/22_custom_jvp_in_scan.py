"""Projected particle dynamics: a custom_jvp safe norm used inside a lax.scan body."""
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

TAGS = ("custom_jvp", "custom_jvp_in_scan", "scan", "float32")
SUPPORTS = ("grad", "jvp", "vmap", "jit")


@jax.custom_jvp
def safe_norm(v):
    return jnp.sqrt(jnp.sum(v * v))


@safe_norm.defjvp
def _safe_norm_jvp(primals, tangents):
    (v,), (dv,) = primals, tangents
    n = safe_norm(v)
    denom = jnp.where(n > 0.0, n, 1.0)
    return n, jnp.where(n > 0.0, jnp.vdot(v, dv) / denom, 0.0)


def fun(x0, forces):
    def step(x, f):
        x = x + 0.5 * f
        n = safe_norm(x)
        x = x / jnp.maximum(n, 1.0)          # project back into the unit ball
        return x, n

    x_final, norms = lax.scan(step, x0, forces)
    return x_final, norms


def example_args():
    rng = np.random.RandomState(22)
    return (jnp.zeros((3,), jnp.float32), jnp.asarray(rng.randn(5, 3).astype(np.float32)))
