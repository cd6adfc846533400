"""A tangent or cotangent a user's rule returns as a symbolic zero (``SymbolicZero``,
or ``None`` from a bwd) stays symbolic, as in JAX: a rule downstream (upstream, in
reverse mode) sees that value unperturbed.  Checked against JAX itself, through the
Program, jaxpr_cc.jit, the default pipeline, save/load, emitted Python and vmap."""
from __future__ import annotations

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.custom_derivatives import SymbolicZero

import jaxpr_cc

from emitted import emitted_function


# -- rules returning symbolic zeros ------------------------------------------
@jax.custom_jvp
def sin_cos(x):
    return jnp.sin(x), jnp.cos(x)


@functools.partial(sin_cos.defjvp, symbolic_zeros=True)
def _sin_cos_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    # The second output is declared constant: a symbolic zero tangent.
    return sin_cos(x), (jnp.cos(x) * t, SymbolicZero(jax.typeof(x).to_tangent_aval()))


@jax.custom_jvp
def doubled(u):
    return 2.0 * u


@functools.partial(doubled.defjvp, symbolic_zeros=True)
def _doubled_jvp(primals, tangents):
    (u,), (t,) = primals, tangents
    if type(t) is SymbolicZero:
        return doubled(u), jnp.zeros_like(u)
    return doubled(u), t * jnp.inf  # NaN unless the tangent is symbolic


@jax.custom_vjp
def product(x, y):
    return x * y


def _product_fwd(x, y):
    return product(x, y), (x, y)


def _product_bwd(res, g):
    _, y = res
    return g * y, None  # no cotangent for y


product.defvjp(_product_fwd, _product_bwd)


@jax.custom_vjp
def split(y):
    return 1.5 * y, jnp.sqrt(y)


def _split_fwd(y):
    return split(y.value), y.value


def _split_bwd(y, g):
    g1, g2 = g
    out = 1.5 * g1 if type(g1) is not SymbolicZero else jnp.zeros_like(y)
    if type(g2) is not SymbolicZero:
        out = out + g2 * jnp.inf  # NaN unless the cotangent is symbolic
    return (out,)


split.defvjp(_split_fwd, _split_bwd, symbolic_zeros=True)


def jvp_into_nondifferentiable(x):
    s, c = sin_cos(x)
    return jnp.sum(s + eqx.internal.nondifferentiable(c))


def jvp_into_symbolic_rule(x):
    s, c = sin_cos(x)
    return jnp.sum(s + doubled(c))


def jvp_into_symbolic_rule_vmapped(x):
    s, c = jax.vmap(sin_cos)(x)
    return jnp.sum(s + jax.vmap(doubled)(c))


def bwd_into_symbolic_rule(x, y):
    y1, y2 = split(y)
    return jnp.sum(product(x, y2)) + jnp.sum(y1)


def bwd_into_symbolic_rule_vmapped(x, y):
    y1, y2 = jax.vmap(split)(y)
    return jnp.sum(jax.vmap(product)(x, y2)) + jnp.sum(y1)


X = jnp.arange(3.0, dtype=jnp.float32) + 0.5
Y = jnp.full(3, 2.0, jnp.float32)


def _jvp(f):
    return lambda x: jax.jvp(f, (x,), (jnp.ones_like(x),))


def _grad2(f):
    return jax.grad(f, argnums=(0, 1))


CASES = {
    "jvp_into_nondifferentiable": (jvp_into_nondifferentiable, (X,), _jvp),
    "jvp_into_symbolic_rule": (jvp_into_symbolic_rule, (X,), _jvp),
    "grad_through_jvp_into_symbolic_rule": (jvp_into_symbolic_rule, (X,), jax.grad),
    "jvp_into_symbolic_rule_vmapped": (jvp_into_symbolic_rule_vmapped, (X,), _jvp),
    "bwd_into_symbolic_rule": (bwd_into_symbolic_rule, (X, Y), _grad2),
    "bwd_into_symbolic_rule_vmapped": (bwd_into_symbolic_rule_vmapped, (X, Y), _grad2),
}


def _assert_same(got, want):
    got_leaves, want_leaves = jax.tree.leaves(got), jax.tree.leaves(want)
    assert len(got_leaves) == len(want_leaves)
    for g, w in zip(got_leaves, want_leaves):
        assert np.all(np.isfinite(w))  # the reference is a number, not NaN
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_symbolic_zero_a_rule_returns_stays_symbolic(case, tmp_path):
    f, args, derivative = CASES[case]
    want = derivative(f)(*args)
    program = jaxpr_cc.trace(f, *args)
    _assert_same(derivative(program)(*args), want)
    _assert_same(derivative(jaxpr_cc.jit(f))(*args), want)
    optimized = jaxpr_cc.run_passes(program, jaxpr_cc.DEFAULT_PIPELINE)
    _assert_same(derivative(optimized)(*args), want)
    path = tmp_path / "program.jcc"
    jaxpr_cc.save(optimized, path)
    _assert_same(derivative(jaxpr_cc.load(path))(*args), want)
    _assert_same(derivative(emitted_function(program, tmp_path))(*args), want)


def test_a_batched_gradient_keeps_the_symbolic_cotangent():
    xs, ys = jnp.stack([X, 2 * X]), jnp.stack([Y, Y + 1])
    want = jax.vmap(_grad2(bwd_into_symbolic_rule))(xs, ys)
    program = jaxpr_cc.trace(bwd_into_symbolic_rule, X, Y)
    _assert_same(jax.vmap(_grad2(program))(xs, ys), want)


def test_vjp_to_jvp_keeps_the_symbolic_cotangent_in_reverse_mode(tmp_path):
    want = _grad2(bwd_into_symbolic_rule)(X, Y)
    rewritten = jaxpr_cc.run_passes(jaxpr_cc.trace(bwd_into_symbolic_rule, X, Y), "vjp-to-jvp")
    _assert_same(_grad2(rewritten)(X, Y), want)
    _assert_same(_grad2(jax.jit(rewritten))(X, Y), want)
    _assert_same(_grad2(emitted_function(rewritten, tmp_path))(X, Y), want)


def test_the_marks_are_printed_and_saved(tmp_path):
    program = jaxpr_cc.trace(bwd_into_symbolic_rule, X, Y)
    assert "symbolic_zero_outputs=((False, True),)" in str(program)
    path = tmp_path / "program.jcc"
    jaxpr_cc.save(program, path)
    # (A saved program lists more perturbation patterns of `split`: its text differs.)
    assert "symbolic_zero_outputs=((False, True),)" in str(jaxpr_cc.load(path))


@jax.custom_vjp
def no_derivative(x):
    return 1.0 * x


no_derivative.defvjp(lambda x: (no_derivative(x), None), lambda r, g: (None,))


def forward_into_symbolic_rule(x):
    return jnp.sum(doubled(no_derivative(x)) + x)


def test_forward_mode_through_a_bwd_that_declares_no_derivative(tmp_path):
    # JAX has no forward mode through a custom_vjp: the reference is its reverse
    # mode, and JAX's forward mode with stop_gradient in the rule's place.  The bwd
    # returns None for its only argument: the tangent is a symbolic zero, which
    # `doubled` (NaN for a dense zero tangent) must see as such.
    want = jax.jacrev(forward_into_symbolic_rule)(X)
    np.testing.assert_allclose(
        want, jax.jacfwd(lambda x: jnp.sum(doubled(jax.lax.stop_gradient(x)) + x))(X))
    program = jaxpr_cc.trace(forward_into_symbolic_rule, X)
    rewritten = jaxpr_cc.run_passes(program, "vjp-to-jvp")
    path = tmp_path / "program.jcc"
    jaxpr_cc.save(rewritten, path)
    for candidate in (program, jaxpr_cc.jit(forward_into_symbolic_rule), rewritten,
                      jaxpr_cc.load(path), emitted_function(rewritten, tmp_path)):
        _assert_same(jax.jacfwd(candidate)(X), want)
