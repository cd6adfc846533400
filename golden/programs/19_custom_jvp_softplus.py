"""Numerically stable softplus with a custom_jvp (sigmoid tangent) inside a small regression loss."""
import jax
import jax.numpy as jnp

TAGS = ("custom_jvp", "float32")
SUPPORTS = ("grad", "jvp", "vmap", "jit")


@jax.custom_jvp
def softplus(x):
    return jnp.maximum(x, 0.0) + jnp.log1p(jnp.exp(-jnp.abs(x)))


@softplus.defjvp
def _softplus_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return softplus(x), jax.nn.sigmoid(x) * t


def fun(x, w):
    act = softplus(x * w - 1.0)
    return jnp.mean((act - 0.5) ** 2), softplus(x)


def example_args():
    return (jnp.linspace(-30.0, 30.0, 9, dtype=jnp.float32), jnp.float32(0.7))
