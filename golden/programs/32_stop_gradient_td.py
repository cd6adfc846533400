"""TD(0) loss with a stop_gradient target and a straight-through rounding via lax.stop_gradient."""
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

TAGS = ("stop_gradient", "gather", "reduction", "int32", "float32")
SUPPORTS = ("grad", "jvp", "vmap", "jit")


def fun(weights, obs, next_obs, actions, rewards):
    q = obs @ weights
    q_taken = q[jnp.arange(q.shape[0]), actions]
    target = rewards + 0.9 * lax.stop_gradient(jnp.max(next_obs @ weights, axis=-1))
    td_loss = jnp.mean((q_taken - target) ** 2)
    # straight-through estimator: rounded forward value, identity gradient
    coarse = q + lax.stop_gradient(jnp.round(q * 2.0) / 2.0 - q)
    return td_loss, coarse


def example_args():
    rng = np.random.RandomState(32)
    weights = jnp.asarray(rng.randn(3, 2).astype(np.float32))
    obs = jnp.asarray(rng.randn(4, 3).astype(np.float32))
    next_obs = jnp.asarray(rng.randn(4, 3).astype(np.float32))
    actions = jnp.array([0, 1, 1, 0], jnp.int32)
    rewards = jnp.array([1.0, 0.0, -1.0, 0.5], jnp.float32)
    return (weights, obs, next_obs, actions, rewards)
