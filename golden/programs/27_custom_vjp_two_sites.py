"""Straight-through rounding custom_vjp reused at two call sites (weights and activations)."""
import jax
import jax.numpy as jnp
import numpy as np

TAGS = ("custom_vjp", "custom_vjp_reused", "matmul", "float32")
SUPPORTS = ("grad", "vmap", "jit")


@jax.custom_vjp
def ste_round(x):
    return jnp.round(x)


def _ste_fwd(x):
    return jnp.round(x), None


def _ste_bwd(_, g):
    return (g,)


ste_round.defvjp(_ste_fwd, _ste_bwd)


def fun(w, x):
    wq = ste_round(w * 4.0) / 4.0          # call site 1: quantized weights
    h = jnp.tanh(x @ wq)
    hq = ste_round(h * 8.0) / 8.0          # call site 2: quantized activations
    return hq, jnp.sum((hq - h) ** 2)


def example_args():
    rng = np.random.RandomState(27)
    return (jnp.asarray(rng.randn(4, 3).astype(np.float32)), jnp.asarray(rng.randn(2, 4).astype(np.float32)))


# Each call site of ste_round is a custom_vjp_call whose rule is materialized at
# trace time: call_jaxpr, fwd_jaxpr and bwd_jaxpr Regions, no residuals.
# RUN:
# CHECK-LABEL: func @fun(%w:f32[4,3], %x:f32[2,4])
# CHECK:      [[W4:%[0-9]+]]:f32[4,3] = mul[out_dtype=None] %w, 4.0:f32[]
# CHECK-NEXT: custom_vjp_call[{{.*}}name='ste_round', num_consts=0, num_res=0{{.*}}] [[W4]] {
# CHECK-NEXT:   call_jaxpr({{%[0-9]+}}:f32[4,3]) {
# CHECK:        fwd_jaxpr({{%[0-9]+}}:f32[4,3]) {
# CHECK:        bwd_jaxpr([[CT:%[0-9]+]]:f32[4,3]) {
# CHECK-NEXT:     return [[CT]]
# CHECK:      [[H8:%[0-9]+]]:f32[2,3] = mul[out_dtype=None] {{%[0-9]+}}, 8.0:f32[]
# CHECK-NEXT: custom_vjp_call[{{.*}}name='ste_round'{{.*}}] [[H8]] {
# CHECK:        fwd_jaxpr(
# CHECK:        bwd_jaxpr(
