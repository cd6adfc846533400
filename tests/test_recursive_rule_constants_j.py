"""A custom rule that calls its own custom function (the JAX tutorial's form)
and builds constant arrays in its rules: every trace of the rules builds new
array objects with the same contents, which are the same closed-over values
(they used to read as "different values at every level of the recursion")."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_cc



@pytest.fixture(autouse=True)
def _x64():
    with jax.enable_x64(True):
        yield

X = np.array([0.3, -0.7])


def _recursive(bwd):
    @jax.custom_vjp
    def f(x):
        return 2.0 * jnp.sin(x)

    f.defvjp(lambda x: (f(x), jnp.cos(x)), bwd)
    return f


def test_a_recursive_rule_whose_bwd_builds_a_constant_array():
    f = _recursive(lambda c, g: (c * g * jnp.array([1.0, 2.0]),))
    np.testing.assert_allclose(jaxpr_cc.jit(f)(X), f(X), rtol=1e-15)
    want = jax.jacrev(f)(X)
    np.testing.assert_allclose(want, np.diag(np.cos(np.asarray(X)) * [1.0, 2.0]), rtol=1e-15)
    np.testing.assert_allclose(jax.jacrev(jaxpr_cc.jit(f))(X), want, rtol=1e-15)
    np.testing.assert_allclose(jax.jacfwd(jaxpr_cc.jit(f))(X), want, rtol=1e-15)


def test_two_equal_constants_in_one_rule_and_one_that_differs():
    f = _recursive(lambda c, g: (c * g * jnp.array([1.0, 2.0]) + g * jnp.array([1.0, 2.0])
                                 - g * jnp.array([0.0, 1.0]),))
    want = jax.jacrev(f)(X)
    np.testing.assert_allclose(
        want, np.diag(np.cos(np.asarray(X)) * [1.0, 2.0] + [1.0, 2.0] - [0.0, 1.0]), rtol=1e-15)
    np.testing.assert_allclose(jax.jacrev(jaxpr_cc.jit(f))(X), want, rtol=1e-15)
    np.testing.assert_allclose(jax.jacfwd(jaxpr_cc.jit(f))(X), want, rtol=1e-15)
    p = jaxpr_cc.trace(f, X)
    np.testing.assert_allclose(jax.jacrev(p)(X), want, rtol=1e-15)
