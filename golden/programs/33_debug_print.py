"""Gradient-descent steps in a fori_loop that report progress with jax.debug.print."""
import jax
import jax.numpy as jnp
from jax import lax

TAGS = ("debug_print", "fori_loop", "float32")
SUPPORTS = ("grad", "jvp", "vmap", "jit")


def fun(x, target):
    def step(i, v):
        resid = v - target
        jax.debug.print("step {i}: loss={loss:.4f}", i=i, loss=jnp.sum(resid ** 2))
        return v - 0.25 * resid

    out = lax.fori_loop(0, 3, step, x)
    jax.debug.print("final={out}", out=out)
    return out * out


def example_args():
    return (jnp.array([2.0, -1.0, 0.5], jnp.float32), jnp.array([0.0, 1.0, 1.0], jnp.float32))


# The loss inside the loop feeds only jax.debug.print; printing is an effect, so
# DCE keeps the print, the loss and the effect on the loop.
# RUN: dce
# CHECK-LABEL: func @fun(%x:f32[3], %target:f32[3])
# CHECK:      scan[{{.*}}] %target, 0:i32[], %x effects={Debug} {
# CHECK:        [[LOSS:%[0-9]+]]:f32[] = reduce_sum[axes=(0,)
# CHECK-NEXT:   debug_print[fmt='step {i}: loss={loss:.4f}'{{.*}}] {{%[0-9]+}}, [[LOSS]] effects={Debug}
# CHECK:      debug_print[fmt='final={out}'{{.*}}] {{%[0-9]+}} effects={Debug}
