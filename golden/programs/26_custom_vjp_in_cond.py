"""A custom_vjp guarded log used inside both branches of a lax.cond."""
import jax
import jax.numpy as jnp
from jax import lax

TAGS = ("custom_vjp", "custom_vjp_in_cond", "cond", "float32")
SUPPORTS = ("grad", "vmap", "jit")


@jax.custom_vjp
def guarded_log(x):
    return jnp.log(x)


def _glog_fwd(x):
    return jnp.log(x), x


def _glog_bwd(x, g):
    return (g / jnp.maximum(x, 1e-3),)


guarded_log.defvjp(_glog_fwd, _glog_bwd)


def fun(x, bias):
    y = lax.cond(
        jnp.mean(x) > 0.5,
        lambda v, b: guarded_log(v) * 2.0 + b,
        lambda v, b: guarded_log(v + 1.0) - b,
        x, bias)
    return y * x


def example_args():
    return (jnp.linspace(0.1, 1.5, 5, dtype=jnp.float32), jnp.float32(0.3))
