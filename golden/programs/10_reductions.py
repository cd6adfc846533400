"""Classifier statistics: logsumexp, argmax, max, mean, var and cumsum reductions over axes."""
import jax
import jax.numpy as jnp
from jax.scipy.special import logsumexp

TAGS = ("reduction", "argmax", "logsumexp", "cumsum", "dict", "pytree_out", "float32")
SUPPORTS = ("grad", "jvp", "vmap", "jit")


def fun(logits, x):
    lse = logsumexp(logits, axis=-1)
    log_probs = logits - lse[:, None]
    best = jnp.argmax(logits, axis=-1)
    return {
        "lse": lse,
        "nll": -jnp.mean(jnp.max(log_probs, axis=-1)),
        "best": best,
        "col_max": jnp.max(x, axis=0),
        "running": jnp.cumsum(x, axis=1),
        "spread": jnp.var(x) + jnp.sum(jnp.abs(x)) / x.size,
        "min_row": jnp.min(x, axis=1),
    }


def example_args():
    logits = jnp.cos(jnp.arange(12, dtype=jnp.float32) * 1.3).reshape(3, 4)
    x = jnp.linspace(-2.0, 3.0, 15, dtype=jnp.float32).reshape(3, 5)
    return (logits, x)
