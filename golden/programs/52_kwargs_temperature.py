"""Temperature softmax / entropy whose configuration (temperature, axis, flag) comes as kwargs."""
import jax
import jax.numpy as jnp

TAGS = ("kwargs", "softmax", "logsumexp", "python_scalar", "float32")
SUPPORTS = ("grad", "jvp", "vmap", "jit")


def fun(logits, bias, *, temperature=1.0, axis=-1, center=False):
    z = (logits + bias) / temperature
    if center:                                 # static Python flag
        z = z - jnp.mean(z, axis=axis, keepdims=True)
    log_p = z - jax.nn.logsumexp(z, axis=axis, keepdims=True)
    p = jnp.exp(log_p)
    entropy = -jnp.sum(p * log_p, axis=axis)
    return p, entropy


def example_args():
    logits = jnp.sin(jnp.arange(12, dtype=jnp.float32)).reshape(3, 4) * 2.0
    return (logits, jnp.linspace(-0.5, 0.5, 4, dtype=jnp.float32))


def example_kwargs():
    return {"temperature": 0.5, "axis": -1, "center": True}
