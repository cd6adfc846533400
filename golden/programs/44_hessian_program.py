"""The program is jax.hessian of a Rosenbrock-plus-coupling energy (forward-over-reverse)."""
import jax
import jax.numpy as jnp

TAGS = ("transformed_hessian", "transformed_grad", "float32")
SUPPORTS = ("grad", "jvp", "vmap", "jit")


def _energy(x, coupling):
    rosen = jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)
    return rosen + coupling * jnp.sum(jnp.sin(x) * jnp.roll(x, 1))


fun = jax.hessian(_energy)


def example_args():
    return (jnp.array([0.5, -0.2, 1.1, 0.8], jnp.float32), jnp.float32(0.3))
