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


# The traced custom_jvp_call carries its rule as Regions: call_jaxpr and jvp_jaxpr.
# The rule calls softplus again, so it is materialized three levels deep; the
# fourth level keeps depth_limit=3 instead of a jvp_jaxpr.
# RUN:
# CHECK-LABEL: func @fun(%x:f32[9], %w:f32[])
# CHECK:      [[Z:%[0-9]+]]:f32[9] = sub {{%[0-9]+}}, 1.0:f32[]
# CHECK-NEXT: custom_jvp_call[{{.*}}depth_limit=None{{.*}}name='softplus', num_consts=0{{.*}}] [[Z]] {
# CHECK-NEXT:   call_jaxpr({{%[0-9]+}}:f32[9]) {
# CHECK:        jvp_jaxpr({{%[0-9]+}}:f32[9], {{%[0-9]+}}:f32[9]) {
# CHECK:      custom_jvp_call[{{.*}}depth_limit=3{{.*}}name='softplus'
# CHECK-NEXT:   call_jaxpr(
