"""A bwd whose linear map goes through a call that also returns a value nothing
reads -- lineax's ``linear_solve`` returns its status code beside the solution --
is linear in its cotangent: forward mode transposes it (issue 17; adversary,
stop 32: it was refused, "'linear_solve' to int32[] is not a linear operation").
A discrete result that *is* read still makes the bwd reverse-only."""
import os

os.environ.setdefault("EQX_ON_ERROR", "nan")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import lineax as lx  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import jaxpr_cc  # noqa: E402

A = np.array([[3.0, 1.0, 0.0], [1.0, 4.0, 0.5], [0.2, 0.0, 2.0]], np.float32)
X = jnp.array([0.3, -0.7, 1.1], jnp.float32)


@jax.custom_vjp
def solved_sine(x):
    return jnp.sin(x)


def _solved_sine_bwd(c, g):
    return (c * lx.linear_solve(lx.MatrixLinearOperator(jnp.asarray(A)), g).value,)


solved_sine.defvjp(lambda x: (jnp.sin(x), jnp.cos(x)), _solved_sine_bwd)


def test_a_bwd_solving_with_lineax_keeps_forward_mode():
    # The bwd maps g to cos(x) * A^-1 g, so the rule's Jacobian is A^-T diag(cos x).
    want = np.linalg.inv(A).T @ np.diag(np.cos(np.asarray(X)))
    np.testing.assert_allclose(np.asarray(jax.jacrev(solved_sine)(X)), want, rtol=1e-5, atol=1e-6)
    ours = jaxpr_cc.jit(solved_sine)
    np.testing.assert_allclose(np.asarray(jax.jacfwd(ours)(X)), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(jax.jacrev(ours)(X)), want, rtol=1e-5, atol=1e-6)


@jax.jit
def _doubled_and_floor(g):
    return 2.0 * g, jnp.floor(g).astype(jnp.int32)


@jax.custom_vjp
def doubled(x):
    return 2.0 * x


doubled.defvjp(lambda x: (2.0 * x, None), lambda _, g: (_doubled_and_floor(g)[0],))


@jax.custom_vjp
def floor_weighted(x):
    return 2.0 * x


def _floor_weighted_bwd(_, g):
    twice, floor = _doubled_and_floor(g)
    return (twice + floor.astype(g.dtype),)


floor_weighted.defvjp(lambda x: (2.0 * x, None), _floor_weighted_bwd)


def test_an_unread_integer_result_of_a_call_leaves_the_bwd_linear():
    np.testing.assert_allclose(np.asarray(jax.jacfwd(jaxpr_cc.jit(doubled))(X)),
                               2.0 * np.eye(3), rtol=1e-6)


def test_a_read_integer_result_keeps_the_bwd_reverse_only():
    ours = jaxpr_cc.jit(floor_weighted)
    g = jnp.array([0.5, 1.5, -2.5], jnp.float32)
    _, vjp = jax.vjp(ours, X)
    np.testing.assert_allclose(np.asarray(vjp(g)[0]), 2.0 * np.asarray(g) + np.floor(g))
    with pytest.raises(TypeError, match="floor_weighted"):
        jax.jacfwd(ours)(X)
