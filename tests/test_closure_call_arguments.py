"""How a custom function's call arguments reach its rules: defaults filled,
keywords placed, and wrapped signatures followed, as JAX's custom_vjp does
(``jax_adapter.resolve_kwargs`` skips building the signature only when binding
could not change the arguments).  Reference: JAX's own grad of the same calls."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_cc


def _scaled_sin(with_default: bool):
    def f(x, scale=2.0):
        return jnp.sin(x) * scale

    def g(x, scale):
        return jnp.sin(x) * scale

    fun = jax.custom_vjp(f if with_default else g)
    fun.defvjp(lambda x, scale: (fun(x, scale), (x, scale)),
               lambda res, ct: (jnp.cos(res[0]) * res[1] * ct, jnp.sum(jnp.sin(res[0]) * ct)))
    return fun


def _wrapped():
    def inner(x, scale=3.0):
        return jnp.sin(x) * scale

    @functools.wraps(inner)
    def outer(*args, **kwargs):
        return inner(*args, **kwargs)

    fun = jax.custom_vjp(outer)
    fun.defvjp(lambda x, scale: (fun(x, scale), (x, scale)),
               lambda res, ct: (jnp.cos(res[0]) * res[1] * ct, jnp.sum(jnp.sin(res[0]) * ct)))
    return fun


CALLS = {
    "default_filled": lambda: (lambda x: _scaled_sin(True)(x)),
    "keyword": lambda: (lambda x: _scaled_sin(False)(x, scale=x[0])),
    "all_positional": lambda: (lambda x: _scaled_sin(False)(x, 1.5)),
    "wrapped_signature_default": lambda: (lambda x: _wrapped()(x)),
}


@pytest.mark.parametrize("make", list(CALLS.values()), ids=list(CALLS))
def test_arguments_reach_the_rules_as_jax_places_them(make):
    f = make()
    x = jnp.array([0.3, -0.4, 0.8])
    loss = lambda x: jnp.sum(f(x) ** 2)  # noqa: E731
    want = jax.grad(loss)(x)
    np.testing.assert_allclose(np.asarray(jax.grad(jaxpr_cc.trace(loss, x))(x)),
                               np.asarray(want), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(jax.grad(jaxpr_cc.jit(loss))(x)), np.asarray(want),
                               rtol=1e-6)
