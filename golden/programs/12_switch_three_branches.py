"""Activation selector: lax.switch over three branches with a runtime int index and a computed one."""
import jax
import jax.numpy as jnp
from jax import lax

TAGS = ("switch", "int32", "float32")
SUPPORTS = ("grad", "jvp", "vmap", "jit")

_BRANCHES = (
    lambda v: jnp.tanh(v),
    lambda v: jax.nn.relu(v) * 0.5 + 0.1,
    lambda v: v ** 2 - 1.0,
)


def fun(x, mode):
    y = lax.switch(mode, _BRANCHES, x)
    second = jnp.argmax(x) % 3
    return y + lax.switch(second, _BRANCHES, y * 0.5)


def example_args():
    return (jnp.linspace(-1.0, 1.0, 7, dtype=jnp.float32), jnp.int32(1))
