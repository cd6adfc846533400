"""Newton reciprocal refinement: jitted fori_loop with a traced trip count (-> while_loop, no grad)."""
import jax
import jax.numpy as jnp
from jax import lax

TAGS = ("fori_loop", "while_loop", "nested_jit", "int32", "float32")
SUPPORTS = ("jvp", "vmap", "jit")


@jax.jit
def fun(d, x0, steps):
    # Newton iteration for 1/d: x <- x * (2 - d * x).  Under jit `steps` is a
    # tracer, so fori_loop lowers to while_loop and reverse-mode fails.  (Called
    # eagerly with a concrete trip count, fori_loop would become a scan.)
    def body(_, x):
        return x * (2.0 - d * x)

    inv = lax.fori_loop(0, steps, body, x0)
    return inv, d * inv - 1.0


def example_args():
    return (jnp.array([1.5, 3.0, 0.7], jnp.float32), jnp.full((3,), 0.3, jnp.float32), jnp.int32(6))
