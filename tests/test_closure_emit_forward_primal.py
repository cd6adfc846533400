"""The emitted module of a rule whose closed-over values get forward-mode columns
(its primal has a while_loop) and whose primal calls a custom_vjp: the emitted
``_custom_vjp_with_consts`` needs forward mode through that inner custom_vjp, as
the Program's evaluation under autodiff has (a diffrax BacksolveAdjoint solve whose
vector field closes over the parameter is this shape).  Reference: float64 central
differences of the original function (JAX itself refuses: the closed-over value is
perturbed)."""
from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxpr_cc
from emitted import emitted_function


def _inner_rule(nonlinear_bwd: bool):
    @jax.custom_vjp
    def inner(y):
        return jnp.sin(y)

    def inner_fwd(y):
        return jnp.sin(y), jnp.cos(y)

    def inner_bwd(c, g):
        # Not linear in g (affine): vjp-to-jvp cannot transpose it.
        return (c * g + 0.0 * jnp.maximum(g, 0.0),) if nonlinear_bwd else (c * g,)

    inner.defvjp(inner_fwd, inner_bwd)
    return inner


def make(nonlinear_bwd: bool):
    inner = _inner_rule(nonlinear_bwd)

    def f(k):
        @jax.custom_vjp
        def solve(y0):
            def body(carry):
                i, y = carry
                return i + 1, y - 0.1 * k * inner(y)
            return lax.while_loop(lambda c: c[0] < 5, body, (0, y0))[1]

        def fwd(y0):
            y = solve(y0)
            return y, y

        def bwd(y, g):
            return (g * jnp.cos(y),)

        solve.defvjp(fwd, bwd)
        return jnp.sum(solve(jnp.linspace(0.5, 1.5, 3, dtype=k.dtype)) ** 2)
    return f


def _fd(f, k, h=1e-6):
    with jax.enable_x64(True):
        k64 = jnp.float64(k)
        return float((f(k64 + h) - f(k64 - h)) / (2 * h))


@pytest.mark.parametrize("nonlinear_bwd", [False, True], ids=["linear-bwd", "nonlinear-bwd"])
@pytest.mark.parametrize("pipeline", [None, jaxpr_cc.DEFAULT_PIPELINE], ids=["traced", "default"])
def test_emitted_grad_through_inner_custom_vjp(tmp_path, nonlinear_bwd, pipeline):
    f = make(nonlinear_bwd)
    k = jnp.float32(0.7)
    program = jaxpr_cc.trace(f, k)
    if pipeline is not None:
        program = jaxpr_cc.run_passes(program, pipeline)
    emitted = emitted_function(program, tmp_path)
    reference = _fd(f, 0.7)
    np.testing.assert_allclose(float(emitted(k)), float(f(k)), rtol=1e-6)
    np.testing.assert_allclose(float(jax.grad(program)(k)), reference, rtol=2e-4)
    np.testing.assert_allclose(float(jax.grad(emitted)(k)), reference, rtol=2e-4)
    np.testing.assert_allclose(float(jax.grad(jax.jit(emitted))(k)), reference, rtol=2e-4)
