"""Safe division num/den as a two-argument custom_jvp defined with defjvps (one rule per input)."""
import jax
import jax.numpy as jnp

TAGS = ("custom_jvp", "custom_jvp_defjvps", "where", "float32")
SUPPORTS = ("grad", "jvp", "vmap", "jit")


@jax.custom_jvp
def safe_div(num, den):
    ok = jnp.abs(den) > 1e-3
    return jnp.where(ok, num / jnp.where(ok, den, 1.0), 0.0)


safe_div.defjvps(
    lambda num_dot, out, num, den: safe_div(num_dot, den),
    lambda den_dot, out, num, den: -safe_div(out * den_dot, den),
)


def fun(num, den):
    ratio = safe_div(num, den)
    return ratio, safe_div(jnp.sum(ratio * num), jnp.sum(den * den))


def example_args():
    return (
        jnp.linspace(-1.0, 2.0, 6, dtype=jnp.float32),
        jnp.array([0.5, -2.0, 0.0, 1.5, 3.0, -0.25], jnp.float32),
    )
