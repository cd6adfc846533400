"""linear_call of a weighted prefix-sum operator with its hand-written transpose (reverse cumsum)."""
import jax
import jax.numpy as jnp
from jax.custom_derivatives import linear_call

TAGS = ("linear_call", "cumsum", "float32")
SUPPORTS = ("grad", "jvp", "vmap", "jit")  # vmap: the linear_call batching rule jaxpr-cc registers

_WEIGHTS = jnp.array([1.0, 0.5, 0.25, 2.0, 1.5, 0.75], jnp.float32)


def _weighted_prefix(weights, v):
    return weights * jnp.cumsum(v, axis=-1)


def _weighted_prefix_t(weights, ct):
    return jnp.flip(jnp.cumsum(jnp.flip(weights * ct, axis=-1), axis=-1), axis=-1)


def fun(x, w):
    u = jnp.sin(x) * w
    y = linear_call(_weighted_prefix, _weighted_prefix_t, _WEIGHTS, u)
    return y * y + x


def example_args():
    return (jnp.linspace(-1.0, 1.0, 6, dtype=jnp.float32), jnp.float32(1.5))


# linear_call keeps the callee and its transpose as Regions (cumsum and flip are
# jitted helpers both call, so they are named functions); the closed-over weight
# vector is the residual operand (num_res=1) ahead of the linear input.
# RUN:
# CHECK-LABEL: func @fun(%x:f32[6], %w:f32[])
# CHECK:      const [[R:%c[0-9]+]]:f32[6] = array<f32[6]:
# CHECK:      [[LIN:%[0-9]+]]:f32[6] = mul[out_dtype=None] {{%[0-9]+}}, %w
# CHECK-NEXT: linear_call[num_callee_consts=0, num_res=1] [[R]], [[LIN]] {
# CHECK-NEXT:   callee(
# CHECK:          jit[jaxpr=@cumsum, name='cumsum']
# CHECK:        transpose_jaxpr(
# CHECK:          jit[jaxpr=@_flip, name='_flip']
