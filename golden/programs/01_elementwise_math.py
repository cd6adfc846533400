"""Damped-wave activation mixing sin/exp/log/tanh/pow/where/clip/abs/integer_pow on float32."""
import jax
import jax.numpy as jnp

TAGS = ("elementwise", "integer_pow", "where", "clip", "float32")
SUPPORTS = ("grad", "jvp", "vmap", "jit")


def fun(x, y):
    envelope = jnp.exp(-0.5 * x ** 2)                 # integer_pow inside exp
    wave = jnp.sin(3.0 * x) * envelope
    soft = jnp.log(1.0 + jnp.abs(y)) + jnp.tanh(x * y)
    power = jnp.power(jnp.abs(x) + 1.0, y)            # pow with traced exponent
    odd = jnp.where(x > 0.0, x ** 3, -(x ** 2))
    mixed = jnp.clip(wave + soft - power, -2.0, 2.0)
    return mixed + 0.1 * odd + jnp.sqrt(jnp.abs(x) + 1e-3)


def example_args():
    return (
        jnp.linspace(-1.0, 1.0, 8, dtype=jnp.float32),
        jnp.linspace(0.5, 1.5, 8, dtype=jnp.float32),
    )
