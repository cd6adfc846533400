"""Forward mode through a custom_vjp leaves out its unperturbed arguments (issue 17).

``jaxpr_cc.jit`` gives a custom_vjp a forward mode whose tangent map is the
transposed bwd (a ``linear_call``).  JAX passes the rule a symbolic zero for
every argument it does not perturb; the tangent map is then restricted to the
perturbed ones (the transpose of the bwd's cotangents for those arguments), so
the zero terms are never formed -- as plain code's forward mode never forms
them -- and its batched form (``jacfwd``'s ``vmap``) keeps operands and results
where they are batched.  References: ``jax.jacrev`` of the original function,
which runs the user's bwd.
"""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_cc

RNG = np.random.default_rng(3)


@jax.custom_vjp
def affine(w, b, x):
    return jnp.tanh(w @ x + b)


def _affine_fwd(w, b, x):
    y = jnp.tanh(w @ x + b)
    return y, (w, x, y)


def _affine_bwd(res, ct):
    w, x, y = res
    g = ct * (1.0 - y * y)
    return jnp.outer(g, x), g, w.T @ g


affine.defvjp(_affine_fwd, _affine_bwd)

W = jnp.asarray(RNG.normal(size=(4, 3)) * 0.5, jnp.float32)
B = jnp.asarray(RNG.normal(size=(4,)) * 0.1, jnp.float32)
X = jnp.asarray(RNG.normal(size=(3,)), jnp.float32)


def assert_close(got, want, rtol=1e-5, atol=1e-6):
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=rtol, atol=atol)


def test_an_unperturbed_arguments_term_is_never_formed():
    """``x`` holds an infinity: the Jacobian in ``x`` is finite (``jacrev`` runs
    the bwd, ``W.T @ ct``), but a dense zero tangent of ``W`` times ``x`` would
    be NaN everywhere."""
    @jax.custom_vjp
    def matvec(w, x):
        return w @ x

    matvec.defvjp(lambda w, x: (w @ x, (w, x)),
                  lambda r, ct: (jnp.outer(ct, r[1]), r[0].T @ ct))
    x = jnp.asarray([1.0, jnp.inf, 2.0], jnp.float32)
    got = jax.jacfwd(jaxpr_cc.jit(matvec), argnums=1)(W, x)
    want = jax.jacrev(matvec, argnums=1)(W, x)
    assert np.all(np.isfinite(np.asarray(got)))
    assert_close(got, want)


@pytest.mark.parametrize("argnums", [a for n in (1, 2, 3)
                                     for a in itertools.combinations(range(3), n)],
                         ids=str)
def test_every_pattern_of_perturbed_arguments(argnums):
    ours = jaxpr_cc.jit(affine)
    assert_close(jax.jacfwd(ours, argnums=argnums)(W, B, X),
                 jax.jacrev(affine, argnums=argnums)(W, B, X))


def test_a_tangent_batched_on_another_axis_and_its_transpose():
    """``vmap`` over the tangent's last axis, its result on the last axis; and the
    transpose of that batched map (reverse over forward), against the Jacobian
    ``jacrev`` gives."""
    ours = jaxpr_cc.jit(affine)
    basis = jnp.eye(3, dtype=jnp.float32)

    def push(t):
        return jax.jvp(lambda x: ours(W, B, x), (X,), (t,))[1]

    jac = jax.vmap(push, in_axes=1, out_axes=1)(basis)
    want = jax.jacrev(affine, argnums=2)(W, B, X)
    assert_close(jac, want)
    ct = jnp.asarray(RNG.normal(size=(4, 3)), jnp.float32)
    (pulled,) = jax.linear_transpose(lambda ts: jax.vmap(push, in_axes=1, out_axes=1)(ts),
                                     basis)(ct)
    assert_close(pulled, want.T @ ct)


def test_hessian_in_one_argument_through_two_layers():
    """Forward over reverse in ``x`` alone (``W``, ``b`` unperturbed): the
    restricted tangent map is transposed and differentiated."""
    def loss(w, b, x):
        return jnp.sum(affine(w.T, b[:3], affine(w, b, x)) ** 2)

    def plain(w, b, x):
        return jnp.sum(jnp.tanh(w.T @ jnp.tanh(w @ x + b) + b[:3]) ** 2)

    got = jax.hessian(jaxpr_cc.jit(loss), argnums=2)(W, B, X)
    assert_close(got, jax.hessian(plain, argnums=2)(W, B, X), rtol=1e-4, atol=1e-5)
