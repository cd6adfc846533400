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
# Both call sites share one rule, so each region is a named function of the module,
# and the jvp calls softplus again: the jvp function refers to itself (recursion is
# a cycle, not a tower of copies).
# RUN:
# CHECK-LABEL: func @softplus(
# CHECK:      func @softplus_jvp([[P:%[0-9]+]]:f32[9], {{%[0-9]+}}:f32[9])
# CHECK-NEXT:   custom_jvp_call[call_jaxpr=@softplus, {{.*}}jvp_jaxpr=@softplus_jvp, {{.*}}name='softplus', num_consts=0{{.*}}] [[P]]
# CHECK-LABEL: func @fun(%x:f32[9], %w:f32[])
# CHECK:      [[Z:%[0-9]+]]:f32[9] = sub {{%[0-9]+}}, 1.0:f32[]
# CHECK-NEXT: custom_jvp_call[call_jaxpr=@softplus, {{.*}}jvp_jaxpr=@softplus_jvp, {{.*}}] [[Z]]
# CHECK:      custom_jvp_call[call_jaxpr=@softplus, {{.*}}] %x
