"""Three-layer MLP classifier (list of dict layers) returning softmax cross-entropy and accuracy."""
import jax
import jax.numpy as jnp
import numpy as np

TAGS = ("mlp", "softmax", "logsumexp", "argmax", "nested_pytree", "pytree_in", "dict", "matmul", "float32")
SUPPORTS = ("grad", "jvp", "vmap", "jit")


def fun(layers, x, labels):
    h = x
    for layer in layers[:-1]:
        h = jax.nn.gelu(h @ layer["w"] + layer["b"])
    logits = h @ layers[-1]["w"] + layers[-1]["b"]
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.mean(jnp.take_along_axis(log_probs, labels[:, None], axis=-1))
    acc = jnp.mean((jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32))
    return nll, acc


def example_args():
    rng = np.random.RandomState(45)
    sizes = [5, 8, 8, 3]
    layers = [
        {"w": jnp.asarray((rng.randn(a, b) / np.sqrt(a)).astype(np.float32)),
         "b": jnp.zeros((b,), jnp.float32)}
        for a, b in zip(sizes[:-1], sizes[1:])
    ]
    x = jnp.asarray(rng.randn(4, 5).astype(np.float32))
    labels = jnp.array([0, 2, 1, 2], jnp.int32)
    return (layers, x, labels)
