"""custom_vjp rules JAX staged with the values their primal closes over.

JAX stages a custom_vjp that closes over a constant array with that array as one of
the equation's own consts, and its bwd gives cotangents for the arguments only.  When
a transformation re-binds such an equation (``jax.vjp`` of an update function inside
a solver's bwd), the consts become the re-bound call's leading arguments, and its fwd
refuses to perturb them (CustomVJPException).  Both forms used to fail: the first
lost the argument's cotangent ("takes 1 cotangents and returns 0"), the second raised
JAX's "closed-over value" error from ``jaxpr_cc.trace`` and ``jaxpr_cc.jit`` (stop-30
adversary), where plain ``jax.grad`` works.  The array the staged bwd closes over
must reach the rule as an operand (rule regions are constant-free), or forward mode
and second order cannot rebuild the rule.  References: JAX's own grad, and float64
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


def test_a_rule_jax_re_bound_with_its_consts_as_leading_arguments():
    """The gradient of a jitted function staged by JAX: partial evaluation re-binds
    the custom_vjp (input unperturbed) with its closed-over array as a leading
    argument.  Differentiating that program again perturbs the input."""
    with jax.enable_x64(True):
        lin = _matvec(2.0)

        def f(z, a):
            return jnp.sum(jnp.sin(jax.jit(lambda z, a: lin(z) * a)(z, a)))
        grad_a = jax.grad(f, argnums=1)
        z, a = jnp.array([0.4, -1.1]), jnp.array([0.3, 0.8])
        program = jaxpr_cc.run_passes(
            jaxpr_cc.Program.from_jaxpr(jax.make_jaxpr(grad_a)(z, a)), "closure-convert")
        want = jax.grad(lambda z: jnp.sum(grad_a(z, a) ** 2))(z)

        def ours(z):
            return jnp.sum(program(z, a)[0] ** 2)
        np.testing.assert_allclose(jax.grad(ours)(z), want, rtol=1e-12)
        np.testing.assert_allclose(jax.jacfwd(ours)(z), want, rtol=1e-12)


def _update_calling(rule):
    def update(a, x):
        return 0.5 * jnp.tanh(rule(x) + a)
    return update


def _solve_with_constant_rule(a):
    lin = _matvec(1.0)
    return jnp.sum(fixed_point(_update_calling(lin), a, jnp.zeros(2)) ** 2)


def _unrolled(a):
    x = lax.fori_loop(0, 300, lambda _, x: 0.5 * jnp.tanh(jnp.asarray(W) @ x + a),
                      jnp.zeros(2))
    return jnp.sum(x ** 2)


@pytest.mark.parametrize("entry", ["trace", "jit"])
def test_a_fixed_point_whose_update_calls_a_rule_closing_over_a_constant(entry):
    with jax.enable_x64(True):
        f = _solve_with_constant_rule
        a = jnp.asarray(A)
        ours = jaxpr_cc.trace(f, a) if entry == "trace" else jaxpr_cc.jit(f)
        want = jax.grad(f)(a)
        np.testing.assert_allclose(want, jax.grad(_unrolled)(a), rtol=1e-9)
        np.testing.assert_allclose(jax.grad(ours)(a), want, rtol=1e-9)
        # Forward mode rebuilds the rule JAX staged inside the solver's bwd: the
        # array its bwd closes over is one of its operands.
        np.testing.assert_allclose(jax.jacfwd(ours)(a), want, rtol=1e-9)


@pytest.mark.parametrize("order", ["hessian", "jacrev_of_grad"])
def test_second_order_through_a_rule_closing_over_a_constant_inside_a_solver(order):
    with jax.enable_x64(True):
        a = jnp.asarray(A)
        ours = jaxpr_cc.jit(_solve_with_constant_rule)
        got = (jax.hessian(ours) if order == "hessian" else jax.jacrev(jax.grad(ours)))(a)
        np.testing.assert_allclose(got, jax.hessian(_unrolled)(a), rtol=1e-7)


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


def _from_jaxpr(f, *args):
    program = jaxpr_cc.Program.from_jaxpr(jax.make_jaxpr(f)(*args))
    converted = jaxpr_cc.run_passes(program, "closure-convert")
    return lambda *xs: converted(*xs)[0]


def test_a_rule_whose_fwd_forwards_its_input_as_a_residual():
    """JAX counts a forwarded input's position among the primal's consts too: read
    as an argument's position, the residual was the wrong value (wrong gradient)."""
    with jax.enable_x64(True):
        w = jnp.asarray(W)

        @jax.custom_vjp
        def layer(a):
            return jnp.tanh(w @ a)
        # The residual is the input itself; the bwd is scaled so the rule shows.
        layer.defvjp(lambda a: (layer(a), a),
                     lambda a, ct: (3.0 * ((ct * (1 - jnp.tanh(w @ a) ** 2)) @ w),))

        def f(a):
            return jnp.sum(layer(a) ** 2)
        a = jnp.asarray(A)
        ours = _from_jaxpr(f, a)
        want = jax.grad(f)(a)
        np.testing.assert_allclose(jax.grad(ours)(a), want, rtol=1e-12)
        np.testing.assert_allclose(jax.jacfwd(ours)(a), want, rtol=1e-12)


@pytest.mark.parametrize("order", [
    "grad", "jacfwd", pytest.param("hessian", marks=pytest.mark.heavy)])  # hessian: 20 s
def test_a_jaxpr_of_a_solver_whose_update_calls_a_rule_closing_over_a_constant(order):
    """``jax.make_jaxpr`` stages the solver and, inside its primal, the rule closing
    over ``W``: converting the inner rule puts ``W`` in a rule body, which must take
    it as an operand (rule regions are constant-free) for forward mode to rebuild
    the solver's rule."""
    with jax.enable_x64(True):
        lin = _matvec(1.0)  # made outside the traced function: W is concrete

        def f(a):
            return jnp.sum(fixed_point(_update_calling(lin), a, jnp.zeros(2)) ** 2)
        a = jnp.asarray(A)
        ours = _from_jaxpr(f, a)
        if order == "hessian":
            np.testing.assert_allclose(jax.hessian(ours)(a), jax.hessian(_unrolled)(a),
                                       rtol=1e-7)
            return
        want = jax.grad(f)(a)
        np.testing.assert_allclose(want, jax.grad(_unrolled)(a), rtol=1e-9)
        np.testing.assert_allclose((jax.grad if order == "grad" else jax.jacfwd)(ours)(a),
                                   want, rtol=1e-9)
