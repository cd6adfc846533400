"""A bwd's loop to convergence that never runs: its previous iterate starts equal
to the iterate through ordinary operations (``flip(flip(g))``, ``roll(g, n)``,
``eye @ g``, ``g + zeros``, a concatenation of a split) or
through a residual that is 1 at run time.  Its test is met before the first
step, so the bwd is ``g -> g``; transposing it as the limit of its iteration was
a wrong number (adversary, stop 33).  The transposition reads each loop's test
at its start on a probe of the cotangent (closure/transpose.py, _StartProbe).
Reference: JAX's reverse mode through the user's bwd."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_cc

W = np.array([[0.5, 0.1, 0.0], [0.0, 0.3, 0.2], [0.1, 0.0, 0.4]], np.float32)
X = jnp.array([0.3, -0.7, 0.5], jnp.float32)
WEIGHTS = jnp.array([1.0, 2.0, 3.0], jnp.float32)


def _adjoint_loop(g, start, previous):
    """``u <- g + W^T u`` from ``(start, previous)`` until ``u`` stops changing."""
    def keep_going(s):
        u, up = s
        return jnp.max(jnp.abs(u - up)) > 1e-6

    def step(s):
        u, _ = s
        return g + jnp.asarray(W).T @ u, u

    u, _ = jax.lax.while_loop(keep_going, step, (start, previous))
    return u


def _rule(bwd_loop):
    @jax.custom_vjp
    def f(x):
        return jnp.sin(x)

    f.defvjp(lambda x: (jnp.sin(x), jnp.cos(x)), lambda c, g: (bwd_loop(c, g),))
    return lambda x: f(x) * WEIGHTS


IDENTITIES = {
    "flip_flip": lambda g: jnp.flip(jnp.flip(g)),
    "roll_by_length": lambda g: jnp.roll(g, 3),
    "eye_matmul": lambda g: jnp.eye(3, dtype=g.dtype) @ g,
    "plus_zeros": lambda g: g + jnp.zeros(3, g.dtype),
    "concat_of_split": lambda g: jnp.concatenate([g[:1], g[1:]]),
}


@pytest.mark.parametrize("identity", list(IDENTITIES.values()), ids=list(IDENTITIES))
def test_a_loop_whose_previous_iterate_starts_equal_returns_its_start(identity):
    fun = _rule(lambda c, g: _adjoint_loop(g, g, identity(g)))
    want = np.asarray(jax.jacrev(fun)(X))
    np.testing.assert_allclose(want, np.diag(np.asarray(WEIGHTS)), rtol=1e-6)  # g -> g
    np.testing.assert_allclose(np.asarray(jax.jacfwd(jaxpr_cc.jit(fun))(X)), want, rtol=1e-6)


def test_a_start_equal_through_a_residual_at_run_time_returns_its_start():
    # s = 1 + 0 c[0] is 1 at run time: the loop starts with u = g s = up.
    fun = _rule(lambda c, g: _adjoint_loop(g, g * (1.0 + 0.0 * c[0]), g))
    want = np.asarray(jax.jacrev(fun)(X))
    np.testing.assert_allclose(np.asarray(jax.jacfwd(jaxpr_cc.jit(fun))(X)), want, rtol=1e-6)


def test_a_loop_that_runs_is_still_transposed_as_its_limit():
    # The previous iterate starts at 2 g: the loop runs to the fixed point of
    # u = g + W^T u, so the bwd is (I - W^T)^-1 and the rule's Jacobian its
    # transpose (times the weights).
    fun = _rule(lambda c, g: _adjoint_loop(g, g, 2.0 * g))
    want = np.diag(np.asarray(WEIGHTS)) @ np.linalg.inv(np.eye(3) - W)
    np.testing.assert_allclose(np.asarray(jax.jacrev(fun)(X)), want, rtol=1e-4)
    np.testing.assert_allclose(np.asarray(jax.jacfwd(jaxpr_cc.jit(fun))(X)), want, rtol=1e-4)


def test_a_loop_started_from_another_loops_result():
    # The second loop starts where the first stopped (u, u: it never runs); the
    # first runs, so the bwd is (I - W^T)^-1.  The probe does not read a loop
    # whose start comes from another loop: it is transposed as its limit, which
    # here is its start (the first loop ended at the fixed point).
    def bwd(c, g):
        u = _adjoint_loop(g, g, 2.0 * g)
        return _adjoint_loop(g, u, jnp.flip(jnp.flip(u)))

    fun = _rule(bwd)
    want = np.diag(np.asarray(WEIGHTS)) @ np.linalg.inv(np.eye(3) - W)
    np.testing.assert_allclose(np.asarray(jax.jacrev(fun)(X)), want, rtol=1e-4)
    np.testing.assert_allclose(np.asarray(jax.jacfwd(jaxpr_cc.jit(fun))(X)), want, rtol=1e-4)


def test_a_start_gap_met_at_one_scale_only_gives_nan():
    # prev = diff(cumsum(g)) equals g to float32 rounding: within the absolute
    # tolerance for a unit cotangent, beyond it for a large one.  The loop runs
    # for some cotangents and not for others: the bwd is not linear, and its
    # transpose is NaN, never another number (adversary, stop 34: it was the
    # identity, while a cotangent 100 times larger runs the loop).
    fun = _rule(lambda c, g: _adjoint_loop(g, g, jnp.diff(jnp.cumsum(g), prepend=0.0)))
    got = np.asarray(jax.jacfwd(jaxpr_cc.jit(fun))(X))
    assert np.isnan(got).all()
