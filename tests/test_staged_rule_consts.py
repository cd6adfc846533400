"""custom_vjp rules JAX staged with the values their primal closes over.

JAX stages a custom_vjp that closes over a constant array with that array as one of
the equation's own consts, and its bwd gives cotangents for the arguments only.  When
a transformation re-binds such an equation (``jax.vjp`` of an update function inside
a solver's bwd), the consts become the re-bound call's leading arguments, and its fwd
refuses to perturb them (CustomVJPException).  Both forms used to fail: the first
lost the argument's cotangent ("takes 1 cotangents and returns 0"), the second raised
JAX's "closed-over value" error from ``jaxpr_cc.trace`` and ``jaxpr_cc.jit`` (stop-30
adversary), where plain ``jax.grad`` works.  References: JAX's own grad, and float64
unrolled iterations where JAX refuses forward mode.
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
        return jnp.max(jnp.abs(prev - x)) > 1e-13
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
    (a_bar,) = vjp_a(fixed_point(partial(_adjoint_step, f), (a, x, x_bar), x_bar))
    return a_bar, jnp.zeros_like(x)


fixed_point.defvjp(_fwd, _bwd)

A = np.array([0.7, -0.3])
W = np.array([[0.3, -0.2], [0.1, 0.25]])


def _matvec(scale: float):
    """``W @ z`` as a custom_vjp closing over a constant array; its bwd is scaled by
    ``scale`` so the numbers show which rule ran."""
    w = jnp.asarray(W)

    @jax.custom_vjp
    def lin(z):
        return w @ z
    lin.defvjp(lambda z: (lin(z), None), lambda _, g: (scale * (w.T @ g),))
    return lin


def _matvec_symbolic_zeros():
    """``W @ z + b`` with symbolic zeros: the bwd skips the term of an unperturbed
    input, as a rule that avoids work does."""
    w = jnp.asarray(W)

    @jax.custom_vjp
    def affine(z, b):
        return w @ z + b

    def fwd(z, b):
        return affine(z.value, b.value), None

    def bwd(_, g):
        return w.T @ g, g
    affine.defvjp(fwd, bwd, symbolic_zeros=True)
    return affine


def test_a_jaxpr_whose_custom_vjp_closes_over_a_constant_keeps_the_users_bwd():
    with jax.enable_x64(True):
        lin = _matvec(2.0)  # not the derivative of the primal: the user's bwd must run

        def f(z):
            return jnp.sum(jnp.sin(lin(z)))
        z = jnp.array([0.4, -1.1])
        program = jaxpr_cc.Program.from_jaxpr(jax.make_jaxpr(f)(z))
        converted = jaxpr_cc.run_passes(program, "closure-convert")
        want = jax.grad(f)(z)
        np.testing.assert_allclose(jax.grad(lambda z: converted(z)[0])(z), want, rtol=1e-12)
        # Forward mode (JAX refuses it) follows the same bwd.
        np.testing.assert_allclose(jax.jacfwd(lambda z: converted(z)[0])(z), want, rtol=1e-12)


def _update_calling(rule):
    def update(a, x):
        return 0.5 * jnp.tanh(rule(x) + a)
    return update


@pytest.mark.parametrize("entry", ["trace", "jit"])
def test_a_fixed_point_whose_update_calls_a_rule_closing_over_a_constant(entry):
    with jax.enable_x64(True):
        lin = _matvec(1.0)

        def f(a):
            return jnp.sum(fixed_point(_update_calling(lin), a, jnp.zeros(2)) ** 2)

        def unrolled(a):
            x = lax.fori_loop(0, 300, lambda _, x: 0.5 * jnp.tanh(jnp.asarray(W) @ x + a),
                              jnp.zeros(2))
            return jnp.sum(x ** 2)
        a = jnp.asarray(A)
        ours = jaxpr_cc.trace(f, a) if entry == "trace" else jaxpr_cc.jit(f)
        want = jax.grad(f)(a)
        np.testing.assert_allclose(want, jax.grad(unrolled)(a), rtol=1e-9)
        np.testing.assert_allclose(jax.grad(ours)(a), want, rtol=1e-9)


def test_a_symbolic_zeros_rule_closing_over_a_constant_inside_a_fixed_point():
    with jax.enable_x64(True):
        affine = _matvec_symbolic_zeros()
        b = jnp.array([0.05, -0.1])

        def f(a):
            return jnp.sum(fixed_point(lambda a, x: 0.5 * jnp.tanh(affine(x, b) + a),
                                       a, jnp.zeros(2)) ** 2)
        a = jnp.asarray(A)
        want = jax.grad(f)(a)
        np.testing.assert_allclose(jax.grad(jaxpr_cc.jit(f))(a), want, rtol=1e-9)
        np.testing.assert_allclose(jax.grad(jaxpr_cc.trace(f, a))(a), want, rtol=1e-9)
