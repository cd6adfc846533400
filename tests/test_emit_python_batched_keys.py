"""``emit_python`` of random primitives on a batch of keys (adv29a).

``jax.vmap`` over per-example keys stages ``random_bits`` / ``random_split`` /
``random_fold_in`` on a key array; ``jax.random``'s functions take one key, so
the emitted module maps them over the batch.  Checked against ``jax.jit``, bit
for bit.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_cc
from emitted import emitted_function

CASES = {
    "normal": lambda ks, x: x * jax.vmap(lambda k: jax.random.normal(k, ()))(ks),
    "bits_2d": lambda ks, x: jax.vmap(jax.vmap(lambda k: jax.random.bits(k, (2,))))(
        ks.reshape(2, 3)).sum() + x,
    "split": lambda ks, x: jax.random.key_data(jax.vmap(lambda k: jax.random.split(k, 2))(ks)),
    "fold_in": lambda ks, x: jax.random.key_data(
        jax.vmap(jax.random.fold_in)(ks, jnp.arange(6, dtype=jnp.uint32))),
    "fold_in_one_message": lambda ks, x: jax.random.key_data(
        jax.vmap(lambda k: jax.random.fold_in(k, 7))(ks)),
    "uniform_rbg": None,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_per_example_keys_emit_and_match_jax(name, tmp_path):
    if name == "uniform_rbg":
        ks = jax.random.split(jax.random.key(5, impl="rbg"), 6)
        f = lambda ks, x: x + jax.vmap(lambda k: jax.random.uniform(k, (2,)))(ks).sum(1)  # noqa: E731
    else:
        ks = jax.random.split(jax.random.key(5), 6)
        f = CASES[name]
    x = jnp.ones(6, jnp.float32)
    want = jax.jit(f)(ks, x)
    got = emitted_function(jaxpr_cc.trace(f, ks, x), tmp_path)(ks, x)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
