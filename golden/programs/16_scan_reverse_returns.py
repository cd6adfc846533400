"""Discounted returns and GAE advantages with a reverse=True lax.scan over time."""
import jax
import jax.numpy as jnp
from jax import lax

TAGS = ("scan", "scan_reverse", "float32")
SUPPORTS = ("grad", "jvp", "vmap", "jit")


def fun(rewards, values, dones, gamma):
    # values has one extra bootstrap entry at the end.
    not_done = 1.0 - dones
    deltas = rewards + gamma * values[1:] * not_done - values[:-1]

    def back(carry, inp):
        ret, adv = carry
        r, d, nd = inp
        ret = r + gamma * nd * ret
        adv = d + gamma * 0.95 * nd * adv
        return (ret, adv), (ret, adv)

    init = (values[-1], jnp.zeros((), rewards.dtype))
    _, (returns, advantages) = lax.scan(back, init, (rewards, deltas, not_done), reverse=True)
    return returns, (advantages - advantages.mean()) / (advantages.std() + 1e-6)


def example_args():
    rewards = jnp.array([1.0, 0.0, 0.5, 1.0, 0.0, 2.0], jnp.float32)
    values = jnp.linspace(0.2, 1.2, 7, dtype=jnp.float32)
    dones = jnp.array([0, 0, 1, 0, 0, 0], jnp.float32)
    return (rewards, values, dones, jnp.float32(0.9))
