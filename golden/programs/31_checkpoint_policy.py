"""Residual MLP blocks under jax.checkpoint with nothing_saveable and dots_saveable policies."""
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

TAGS = ("checkpoint", "checkpoint_policy", "mlp", "dict", "pytree_in", "float32")
SUPPORTS = ("grad", "jvp", "vmap", "jit")


@partial(jax.checkpoint, policy=jax.checkpoint_policies.nothing_saveable)
def block(p, x):
    h = jnp.tanh(x @ p["w1"] + p["b1"])
    return x + jnp.sin(h @ p["w2"])


@partial(jax.checkpoint, policy=jax.checkpoint_policies.dots_saveable)
def head(p, x):
    return jax.nn.gelu(x @ p["w2"].T) @ p["w1"].T


def fun(params, x):
    for _ in range(3):
        x = block(params, x)
    return head(params, x)


def example_args():
    rng = np.random.RandomState(31)
    params = {
        "w1": jnp.asarray(rng.randn(4, 6).astype(np.float32) * 0.4),
        "b1": jnp.zeros((6,), jnp.float32),
        "w2": jnp.asarray(rng.randn(6, 4).astype(np.float32) * 0.4),
    }
    return (params, jnp.asarray(rng.randn(2, 4).astype(np.float32)))


# The dots_saveable head never reads params['b1']: DCE drops that operand of its
# remat2 (and the body's matching input); the blocks before it still use it.
# RUN: --check-prefix=TRACE
# TRACE: remat2[{{.*}}policy=DotsSaveable{{.*}}] %params.b1, %params.w1, %params.w2, {{%[0-9]+}} {
# RUN: dce
# CHECK-LABEL: func @fun(%params.b1:f32[6], %params.w1:f32[4,6], %params.w2:f32[6,4], %x:f32[2,4])
# CHECK:      remat2[{{.*}}policy=<fn nothing_saveable>{{.*}}] %params.b1, %params.w1, %params.w2, %x
# CHECK:      remat2[{{.*}}policy=DotsSaveable{{.*}}] %params.w1, %params.w2, {{%[0-9]+}} {
# CHECK-NEXT:   jaxpr({{%[0-9]+}}:f32[4,6], {{%[0-9]+}}:f32[6,4], {{%[0-9]+}}:f32[2,4]) {
