"""Pre-norm transformer block: layernorm, softmax self-attention, GELU MLP and residuals."""
import jax
import jax.numpy as jnp
import numpy as np

TAGS = ("layernorm", "softmax", "einsum", "mlp", "dict", "pytree_in", "float32")
SUPPORTS = ("grad", "jvp", "vmap", "jit")


def _layernorm(x, scale, offset):
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mu) ** 2, axis=-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + 1e-5) * scale + offset


def fun(p, x):
    # x: (seq, d_model)
    h = _layernorm(x, p["ln1_scale"], p["ln1_offset"])
    q, k, v = jnp.split(h @ p["w_qkv"], 3, axis=-1)
    att = jax.nn.softmax(jnp.einsum("qd,kd->qk", q, k) / jnp.sqrt(jnp.float32(q.shape[-1])), axis=-1)
    x = x + jnp.einsum("qk,kd->qd", att, v) @ p["w_o"]
    h = _layernorm(x, p["ln2_scale"], p["ln2_offset"])
    return x + jax.nn.gelu(h @ p["w_up"]) @ p["w_down"]


def example_args():
    rng = np.random.RandomState(46)
    d, f = 8, 16

    def w(*shape):
        return jnp.asarray((rng.randn(*shape) / np.sqrt(shape[0])).astype(np.float32))

    params = {
        "ln1_scale": jnp.ones((d,), jnp.float32), "ln1_offset": jnp.zeros((d,), jnp.float32),
        "w_qkv": w(d, 3 * d), "w_o": w(d, d),
        "ln2_scale": jnp.ones((d,), jnp.float32), "ln2_offset": jnp.zeros((d,), jnp.float32),
        "w_up": w(d, f), "w_down": w(f, d),
    }
    return (params, jnp.asarray(rng.randn(5, d).astype(np.float32)))
