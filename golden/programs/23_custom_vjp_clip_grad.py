"""Gradient clipping identity as a basic custom_vjp used in a squared-error objective."""
import jax
import jax.numpy as jnp

TAGS = ("custom_vjp", "clip", "float32")
SUPPORTS = ("grad", "vmap", "jit")


@jax.custom_vjp
def clip_gradient(x):
    return x


def _clip_fwd(x):
    return x, None


def _clip_bwd(_, g):
    return (jnp.clip(g, -0.5, 0.5),)


clip_gradient.defvjp(_clip_fwd, _clip_bwd)


def fun(w, x):
    y = clip_gradient(jnp.tanh(w * x)) * 3.0
    return jnp.sum((y - 1.0) ** 2)


def example_args():
    return (jnp.float32(0.8), jnp.linspace(-1.0, 1.0, 5, dtype=jnp.float32))
