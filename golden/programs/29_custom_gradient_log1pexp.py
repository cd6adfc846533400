"""jax.custom_gradient log(1+exp(x)) with a stable sigmoid gradient in a logistic loss."""
import jax
import jax.numpy as jnp

TAGS = ("custom_gradient", "float32")
SUPPORTS = ("grad", "vmap", "jit")


@jax.custom_gradient
def log1pexp(x):
    y = jnp.maximum(x, 0.0) + jnp.log1p(jnp.exp(-jnp.abs(x)))
    return y, lambda g: (g * jax.nn.sigmoid(x),)


def fun(w, features, labels):
    margins = (features @ w) * (2.0 * labels - 1.0)
    return jnp.mean(log1pexp(-margins))


def example_args():
    features = jnp.linspace(-3.0, 3.0, 12, dtype=jnp.float32).reshape(4, 3)
    labels = jnp.array([1.0, 0.0, 1.0, 1.0], jnp.float32)
    return (jnp.array([0.5, -0.2, 0.1], jnp.float32), features, labels)
