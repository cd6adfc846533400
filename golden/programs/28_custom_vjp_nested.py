"""Soft-threshold custom_vjp whose fwd rule calls another custom_vjp (a safe abs)."""
import jax
import jax.numpy as jnp

TAGS = ("custom_vjp", "custom_vjp_nested", "float32")
SUPPORTS = ("grad", "vmap", "jit")


@jax.custom_vjp
def safe_abs(x):
    return jnp.abs(x)


def _safe_abs_fwd(x):
    return jnp.abs(x), jnp.sign(x)


def _safe_abs_bwd(sign, g):
    return (g * sign,)


safe_abs.defvjp(_safe_abs_fwd, _safe_abs_bwd)


@jax.custom_vjp
def shrink(x, lam):
    return jnp.sign(x) * jax.nn.relu(safe_abs(x) - lam)


def _shrink_fwd(x, lam):
    mag = safe_abs(x)                      # inner custom_vjp called from fwd
    active = (mag > lam).astype(x.dtype)
    return jnp.sign(x) * jax.nn.relu(mag - lam), (active, jnp.sign(x))


def _shrink_bwd(res, g):
    active, sign = res
    return g * active, -jnp.sum(g * active * sign)


shrink.defvjp(_shrink_fwd, _shrink_bwd)


def fun(x, lam):
    y = shrink(x * 2.0, lam)
    return y + 0.1 * safe_abs(x)


def example_args():
    return (jnp.linspace(-1.0, 1.0, 7, dtype=jnp.float32), jnp.float32(0.4))
