"""A custom function called inside a region (a cond branch, a loop body, a
checkpoint, an inner jit) on a value the region reads from outside is perturbed as
that value is.  Inside the region the value is a constant of the region's trace,
whose value is a tracer of the enclosing trace: the perturbation analysis follows
it there (it took such constants for concrete ones, so the rule was traced with
no tangent for them and every derivative through them was zero).  Checked against
JAX itself."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.custom_derivatives import SymbolicZero

import jaxpr_cc


@jax.custom_jvp
def prod(a, b):
    return a * b


prod.defjvp(lambda p, t: (prod(*p), t[0] * p[1] + p[0] * t[1]))


@jax.custom_jvp
def prod_sz(a, b):
    return a * b


@functools.partial(prod_sz.defjvp, symbolic_zeros=True)
def _prod_sz_jvp(p, t):
    a, b = p
    ta, tb = (jnp.zeros_like(v) if type(d) is SymbolicZero else d for v, d in zip(p, t))
    return prod_sz(a, b), ta * b + a * tb


@jax.custom_vjp
def prod_vjp(a, b):
    return a * b


prod_vjp.defvjp(lambda a, b: (prod_vjp(a, b), (a, b)), lambda r, g: (g * r[1], g * r[0]))

RULES = {"custom_jvp": prod, "custom_jvp_symbolic": prod_sz, "custom_vjp": prod_vjp}


def _regions(h):
    """Programs calling ``h(ones, 2 x)`` inside a region that reads ``x`` from outside."""
    ones = jnp.ones(3)
    return {
        "cond": lambda x: lax.cond(x[0] > 0, lambda: h(ones, 2 * x), lambda: x),
        "switch": lambda x: lax.switch(1, [lambda: x, lambda: h(ones, 2 * x)]),
        "while": lambda x: lax.while_loop(lambda c: c[0] < 2, lambda c: (c[0] + 1, c[1] + h(ones, 2 * x)),
                                          (0, x))[1],
        "scan": lambda x: lax.scan(lambda c, _: (c + h(ones, 2 * x), None), x, None, length=2)[0],
        "fori": lambda x: lax.fori_loop(0, 2, lambda i, c: c + h(ones, 2 * x), x),
        "checkpoint": lambda x: jax.checkpoint(lambda: h(ones, 2 * x))(),
        "jit": lambda x: jax.jit(lambda: h(ones, 2 * x))(),
        "cond_in_scan": lambda x: lax.scan(
            lambda c, _: (lax.cond(c[0] > -100, lambda: c + h(ones, 2 * x), lambda: c), None),
            x, None, length=2)[0],
    }


CASES = [(rule, region) for rule in sorted(RULES) for region in sorted(_regions(prod))]
X = jnp.arange(3.0) + 0.5


@pytest.mark.parametrize("rule, region", CASES)
def test_a_value_a_region_closes_over_is_perturbed(rule, region):
    regions = _regions(RULES[rule])

    def program_of(name):
        return lambda x: jnp.sum(regions[name](x) * jnp.array([1.0, -2.0, 0.5]))

    f = program_of(region)
    # JAX cannot reverse a while_loop: its reference is the same two steps counted.
    want_grad = jax.grad(program_of("fori" if region == "while" else region))(X)
    program = jaxpr_cc.trace(f, X)
    if region != "while":
        np.testing.assert_allclose(jax.grad(program)(X), want_grad, rtol=1e-6)
        np.testing.assert_allclose(jax.grad(jaxpr_cc.jit(f))(X), want_grad, rtol=1e-6)
    t = jnp.array([1.0, 0.5, -1.0])
    want_jvp = jnp.vdot(want_grad, t)  # JAX has no forward mode through a custom_vjp
    if rule != "custom_vjp":
        want_jvp = jax.jvp(f, (X,), (t,))[1]
    np.testing.assert_allclose(jax.jvp(program, (X,), (t,))[1], want_jvp, rtol=1e-6)
    np.testing.assert_allclose(jax.jvp(jaxpr_cc.jit(f), (X,), (t,))[1], want_jvp, rtol=1e-6)
