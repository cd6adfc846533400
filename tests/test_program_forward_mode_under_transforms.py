"""Forward mode reaches a traced Program's custom_vjp rules through the
transformations and control flow it is called under (adversary, stop 32).

``jax.jacfwd(P)`` worked, but a Program called under ``jax.jit``,
``jax.checkpoint``, ``jax.vmap``, ``lax.scan``, ``lax.cond`` or a ``fori_loop``
before forward mode reached it was staged with JAX's custom_vjp, which forward
mode refuses.  Reference: ``jax.jacrev`` of the same composition (JAX runs the
user's bwd), and a saved and loaded Program behaves the same.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxpr_cc


@jax.custom_vjp
def wavy(x):
    return jnp.sin(x) * x


wavy.defvjp(lambda x: (wavy(x), x), lambda x, g: (g * (jnp.cos(x) * x + jnp.sin(x)),))

X = jnp.array([0.3, -1.2])

WRAPPERS = {
    "jit": lambda p: jax.jit(p),
    "checkpoint": lambda p: jax.checkpoint(p),
    "vmap": lambda p: lambda x: jax.vmap(p)(jnp.stack([x, 2.0 * x]))[1],
    "scan": lambda p: lambda x: lax.scan(lambda c, _: (p(c), None), x, None, length=2)[0],
    "cond": lambda p: lambda x: lax.cond(x[0] > 0, p, lambda y: -y, x),
    "fori_loop": lambda p: lambda x: lax.fori_loop(0, 2, lambda _, y: p(y), x),
}


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    traced = jaxpr_cc.trace(wavy, X)
    path = tmp_path_factory.mktemp("saved") / "wavy.jaxprcc"
    jaxpr_cc.save(traced, path)
    return {"traced": traced, "loaded": jaxpr_cc.load(path)}


@pytest.mark.parametrize("which", ["traced", "loaded"])
@pytest.mark.parametrize("wrap", list(WRAPPERS.values()), ids=list(WRAPPERS))
def test_jacfwd_of_a_program_called_under_a_transformation(programs, which, wrap):
    want = jax.jacrev(wrap(wavy))(X)
    got = jax.jacfwd(wrap(programs[which]))(X)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-7)
