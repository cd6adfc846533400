"""Semi-implicit Euler for a damped oscillator via lax.fori_loop with a static trip count (-> scan)."""
import jax
import jax.numpy as jnp
from jax import lax

TAGS = ("fori_loop", "float32")
SUPPORTS = ("grad", "jvp", "vmap", "jit")


def fun(pos0, vel0, stiffness):
    dt = 0.05

    def body(i, state):
        pos, vel = state
        force = -stiffness * pos - 0.3 * vel + 0.1 * jnp.sin(0.2 * i)
        vel = vel + dt * force
        pos = pos + dt * vel
        return pos, vel

    pos, vel = lax.fori_loop(0, 12, body, (pos0, vel0))
    energy = 0.5 * jnp.sum(vel ** 2) + 0.5 * stiffness * jnp.sum(pos ** 2)
    return pos, energy


def example_args():
    return (jnp.array([1.0, -0.5, 0.25], jnp.float32), jnp.zeros((3,), jnp.float32), jnp.float32(2.0))
