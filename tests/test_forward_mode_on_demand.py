"""Forward mode through a custom_vjp is built when JAX first differentiates it.

``jaxpr_cc.jit`` and a Program differentiated as called give every custom_vjp a
forward mode (vjp-to-jvp).  Building it stages the transposed bwd, and for a rule
whose closed-over values get forward-mode columns a vmapped jvp of its primal (a
diffrax adjoint's whole backward solve): a primal call must not pay for it.
Numbers are checked against JAX and analytic derivatives.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_cc
from jaxpr_cc.passes import vjp_to_jvp


@pytest.fixture
def builds(monkeypatch):
    made = []
    real = vjp_to_jvp.build_jvp_params

    def counting(p, **options):
        made.append(p["name"])
        return real(p, **options)
    monkeypatch.setattr(vjp_to_jvp, "build_jvp_params", counting)
    return made


@jax.custom_vjp
def cube(x):
    return x ** 3


def _cube_fwd(x):
    return x ** 3, x


def _cube_bwd(x, ct):
    return (3 * x ** 2 * ct,)


cube.defvjp(_cube_fwd, _cube_bwd)


@jax.custom_vjp
def sine(x):
    return jnp.sin(x)


sine.defvjp(lambda x: (jnp.sin(x), x), lambda x, ct: (jnp.cos(x) * ct,))


def f(x, y):
    return cube(x) + sine(y)


X, Y = jnp.float32(1.5), jnp.float32(0.3)


def test_a_primal_call_builds_no_forward_mode(builds):
    jf = jaxpr_cc.jit(f)
    np.testing.assert_allclose(jf(X, Y), f(X, Y), rtol=1e-6)
    assert builds == []


def test_only_the_rules_jax_differentiates_are_built(builds):
    jf = jaxpr_cc.jit(f)
    _, t = jax.jvp(lambda x: jf(x, Y), (X,), (jnp.float32(1.0),))
    np.testing.assert_allclose(t, 3 * X ** 2, rtol=1e-6)  # JAX refuses jvp here
    assert builds == ["cube"]
    _, t = jax.jvp(lambda y: jf(X, y), (Y,), (jnp.float32(1.0),))
    np.testing.assert_allclose(t, jnp.cos(Y), rtol=1e-6)
    assert sorted(builds) == ["cube", "sine"]


@pytest.mark.parametrize("entry", ["jit", "program"])
def test_reverse_and_forward_orders_through_rules_built_on_demand(entry):
    fn = jaxpr_cc.jit(f) if entry == "jit" else jaxpr_cc.trace(f, X, Y)
    np.testing.assert_allclose(jax.grad(fn, argnums=(0, 1))(X, Y),
                               jax.grad(f, argnums=(0, 1))(X, Y), rtol=1e-6)
    h = jax.hessian(fn, argnums=(0, 1))(X, Y)
    np.testing.assert_allclose(np.array(h, dtype=np.float64),
                               [[6 * X, 0.0], [0.0, -np.sin(Y)]], rtol=1e-5, atol=1e-6)
    xs = jnp.linspace(0.5, 1.5, 4, dtype=jnp.float32)
    np.testing.assert_allclose(jax.vmap(jax.jacfwd(fn), (0, None))(xs, Y), 3 * xs ** 2,
                               rtol=1e-6)
