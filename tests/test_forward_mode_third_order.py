"""Third-order forward mode through the JAX tutorial's fixed_point, under jaxpr_cc.jit.

A rule rebuilt from a program's params used to be exported and re-imported at every
order; the re-imported bodies held the custom_vjp calls JAX's way, so the third
forward-mode order raised JAX's "can't apply forward-mode autodiff (jvp) to a
custom_vjp function" (adversary, stop 30).  References: closed forms.
"""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxpr_cc


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def fixed_point(f, a, x_guess):
    def keep_going(c):
        prev, x = c
        return jnp.max(jnp.abs(prev - x)) > 1e-10 * (1.0 + jnp.max(jnp.abs(x)))
    return lax.while_loop(keep_going, lambda c: (c[1], f(a, c[1])), (x_guess, f(a, x_guess)))[1]


def _fwd(f, a, x_guess):
    x = fixed_point(f, a, x_guess)
    return x, (a, x)


def _adjoint_step(f, packed, u):
    a, x, x_bar = packed
    _, vjp_x = jax.vjp(lambda x: f(a, x), x)
    return x_bar + vjp_x(u)[0]


def _bwd(f, res, x_bar):
    a, x = res
    _, vjp_a = jax.vjp(lambda a: f(a, x), a)
    u = fixed_point(partial(_adjoint_step, f), (a, x, x_bar), x_bar)
    return vjp_a(u)[0], jnp.zeros_like(x)


fixed_point.defvjp(_fwd, _bwd)


def newton_sqrt(a):
    return fixed_point(lambda a, x: 0.5 * (x + a / x), a, a)


def closed_over(c, a):
    # x = a / (1 + c x): the update closes over c
    return fixed_point(lambda a, x: a / (1.0 + c * x), a, a * 0.5)


def closed_over_exact(c, a):
    return (-1.0 + jnp.sqrt(1.0 + 4.0 * a * c)) / (2.0 * c)


THIRD_ORDER = {
    "jacfwd3": lambda f: jax.jacfwd(jax.jacfwd(jax.jacfwd(f))),
    "jacfwd2_jacrev": lambda f: jax.jacfwd(jax.jacfwd(jax.jacrev(f))),
    "jacfwd_jacrev_jacfwd": lambda f: jax.jacfwd(jax.jacrev(jax.jacfwd(f))),
}


# forward-over-forward-over-reverse (the slowest) runs with -m heavy
ORDERS = [pytest.param(o, marks=pytest.mark.heavy) if o == "jacfwd2_jacrev" else o
          for o in sorted(THIRD_ORDER)]


@pytest.mark.parametrize("order", ORDERS)
def test_third_order_through_the_explicit_argument(order):
    with jax.enable_x64(True):
        got = THIRD_ORDER[order](jaxpr_cc.jit(newton_sqrt))(jnp.float64(2.0))
        np.testing.assert_allclose(float(got), 3.0 / 8.0 * 2.0 ** -2.5, rtol=1e-6)


@pytest.mark.parametrize("order", ORDERS)
def test_third_order_through_a_closed_over_parameter(order):
    with jax.enable_x64(True):
        c, a = jnp.float64(0.3), jnp.float64(0.7)
        got = THIRD_ORDER[order](jaxpr_cc.jit(closed_over))(c, a)
        want = THIRD_ORDER["jacfwd3"](closed_over_exact)(c, a)
        np.testing.assert_allclose(float(got), float(want), rtol=1e-3)


def sqrt_solver(a):
    return fixed_point(lambda a, x: 0.5 * (x + a / x), a, a)


def nested_closed_over(c, a):
    # x = c * sqrt(x + a), the square root itself a fixed point: the outer update
    # closes over c and calls the inner solver
    return fixed_point(lambda a, x: c * sqrt_solver(x + a), a, a)


def nested_closed_over_exact(c, a):
    return (c ** 2 + jnp.sqrt(c ** 4 + 4.0 * c ** 2 * a)) / 2.0


SECOND_ORDER = {
    "jacrev_grad": lambda f: jax.jacrev(jax.grad(f, 1), 1),
    "jacfwd_grad": lambda f: jax.jacfwd(jax.grad(f, 1), 1),
}


@pytest.mark.parametrize("order", [pytest.param(o, marks=pytest.mark.heavy)  # ~20 s
                                   if o == "jacfwd_grad" else o for o in sorted(SECOND_ORDER)])
def test_second_order_through_a_solver_whose_update_calls_a_solver(order):
    """The outer bwd's own jax.vjp of the update stages the inner solver's rule
    JAX's way; the closed-over derivative's forward columns differentiate it, so it
    is made first-order and given forward mode (it raised JAX's custom_vjp error
    after minutes, adversary stop 30)."""
    c, a = jnp.float32(0.5), jnp.float32(1.3)
    got = SECOND_ORDER[order](jaxpr_cc.jit(nested_closed_over))(c, a)
    want = SECOND_ORDER[order](nested_closed_over_exact)(c, a)
    np.testing.assert_allclose(float(got), float(want), rtol=1e-4)


def test_nested_fixed_points_whose_inner_update_closes_over_the_parameter():
    """JAX leaks a tracer here: the outer bwd's ``jax.vjp`` of its update stages the
    inner solver, unperturbed, as a rule whose bwd closes over ``b``.  It was
    refused (adversary stop 30); ``jaxpr_cc.trace`` now materializes that call at
    once, as outside AD.  Reference: the same iterations unrolled, in float64."""
    def outer(b):
        inner = lambda a, z: 0.4 * jnp.tanh(0.3 * z + a * b)  # noqa: E731
        def update(a, x):
            return 0.3 * jnp.sin(b * x) + 0.2 * fixed_point(inner, a + 0.5 * x,
                                                              jnp.zeros(2)) + 0.1
        return jnp.sum(fixed_point(update, jnp.array([0.2, 0.1]) * b, jnp.zeros(2)) ** 2)

    def unrolled(b):
        def inner_solve(a):
            return lax.fori_loop(0, 200, lambda _, z: 0.4 * jnp.tanh(0.3 * z + a * b),
                                 jnp.zeros(2))
        a = jnp.array([0.2, 0.1]) * b
        x = lax.fori_loop(0, 200, lambda _, x: 0.3 * jnp.sin(b * x)
                          + 0.2 * inner_solve(a + 0.5 * x) + 0.1, jnp.zeros(2))
        return jnp.sum(x ** 2)

    with jax.enable_x64(True):
        b = jnp.float64(0.8)
        with pytest.raises(jax.errors.UnexpectedTracerError):
            jax.grad(outer)(b)
        program = jaxpr_cc.trace(outer, b)
        np.testing.assert_allclose(jax.grad(program)(b), jax.grad(unrolled)(b), rtol=1e-7)
