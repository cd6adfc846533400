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


# x**2 is traced twice (the Gaussian and jnp.where's negative branch); CSE keeps the
# first integer_pow and the negation reads it.
# RUN: --check-prefix=TRACE
# TRACE-LABEL: func @fun(%x:f32[8], %y:f32[8])
# TRACE:      {{%[0-9]+}}:f32[8] = integer_pow[y=2] %x
# TRACE:      [[SQ2:%[0-9]+]]:f32[8] = integer_pow[y=2] %x
# TRACE-NEXT: neg [[SQ2]]
# RUN: cse
# CHECK-LABEL: func @fun(%x:f32[8], %y:f32[8])
# CHECK:      [[SQ:%[0-9]+]]:f32[8] = integer_pow[y=2] %x
# CHECK-NOT:  integer_pow[y=2] %x
# CHECK:      = neg [[SQ]]
# CHECK:      return
