"""A bwd's loop to convergence that never runs: its previous iterate starts equal
to the iterate through ordinary operations (``flip(flip(g))``, ``roll(g, n)``,
``eye @ g``, ``g + zeros``, a concatenation of a split) or
through a residual that is 1 at run time.  Its test is met before the first
step, so the bwd is ``g -> g``; transposing it as the limit of its iteration was
a wrong number (adversary, stop 33).  The transposition reads each loop's test
at its start on a probe of the cotangent (closure/transpose.py, _StartProbe).
Reference: JAX's reverse mode through the user's bwd."""
import functools

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
    # first runs, so the bwd is (I - W^T)^-1.
    def bwd(c, g):
        u = _adjoint_loop(g, g, 2.0 * g)
        return _adjoint_loop(g, u, jnp.flip(jnp.flip(u)))

    fun = _rule(bwd)
    want = np.diag(np.asarray(WEIGHTS)) @ np.linalg.inv(np.eye(3) - W)
    np.testing.assert_allclose(np.asarray(jax.jacrev(fun)(X)), want, rtol=1e-4)
    np.testing.assert_allclose(np.asarray(jax.jacfwd(jaxpr_cc.jit(fun))(X)), want, rtol=1e-4)


def _one(c):
    return 1.0 + 0.0 * c[0]


def _scan_of_loops(c, g, length=2):
    return jax.lax.scan(lambda u, _: (_adjoint_loop(u, u * _one(c), u), None), g, None,
                        length=length)[0]


# Loops that start converged at run time (u * s, s == 1) where the probe used not
# to read them: in a branch, in a scan body, after another loop (adversary, stop
# 40: the transpose was the limit's, jacfwd 2 I against jacrev I).  Each case
# also holds a loop that runs, so that reading too much is seen as well.
NESTED = {
    "in_a_branch": lambda c, g: jax.lax.cond(
        c[0] > 0, lambda g: _adjoint_loop(g, g * _one(c), g), lambda g: 2.0 * g, g),
    "in_a_scan_body": _scan_of_loops,
    "in_a_scan_body_running_at_some_steps": lambda c, g: jax.lax.scan(
        lambda u, k: (_adjoint_loop(u, u * _one(c), u * (1.0 + k)), None), g,
        jnp.arange(3.0))[0],
    "in_a_reversed_scan": lambda c, g: jax.lax.scan(
        lambda u, k: (_adjoint_loop(u, u * _one(c), u * (1.0 + k)), None), g,
        jnp.arange(3.0), reverse=True)[0],
    "in_a_fori_loop": lambda c, g: jax.lax.fori_loop(
        0, 2, lambda i, u: _adjoint_loop(u, u * _one(c), u), g),
    "after_a_loop_that_runs": lambda c, g: (
        lambda u: _adjoint_loop(u, u * _one(c), u))(_adjoint_loop(g, g, 2.0 * g)),
    "in_a_scan_in_a_branch": lambda c, g: jax.lax.cond(
        c[0] > 0, lambda g: _scan_of_loops(c, g), lambda g: g, g),
    "in_the_branch_not_taken": lambda c, g: jax.lax.cond(
        c[0] < -5, lambda g: _adjoint_loop(g, g * _one(c), g),
        lambda g: _adjoint_loop(g, g, 2.0 * g), g),
}


@pytest.mark.parametrize("bwd", list(NESTED.values()), ids=list(NESTED))
def test_a_nested_loop_that_starts_converged_returns_its_start(bwd):
    fun = _rule(bwd)
    want = np.asarray(jax.jacrev(fun)(X))
    np.testing.assert_allclose(np.asarray(jax.jacfwd(jaxpr_cc.jit(fun))(X)), want,
                               rtol=1e-4, atol=1e-6)


def test_a_start_gap_met_at_one_scale_only_gives_nan():
    # prev = diff(cumsum(g)) equals g to float32 rounding: within the absolute
    # tolerance for a unit cotangent, beyond it for a large one.  The loop runs
    # for some cotangents and not for others: the bwd is not linear, and its
    # transpose is NaN, never another number (adversary, stop 34: it was the
    # identity, while a cotangent 100 times larger runs the loop).
    fun = _rule(lambda c, g: _adjoint_loop(g, g, jnp.diff(jnp.cumsum(g), prepend=0.0)))
    got = np.asarray(jax.jacfwd(jaxpr_cc.jit(fun))(X))
    assert np.isnan(got).all()


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _solve(update, a, guess):
    """Iterate ``x <- update(a, x)`` until a step is within 1e-6 (no cap)."""
    def moving(carry):
        previous, x = carry
        return jnp.abs(previous - x) > 1e-6

    def step(carry):
        _, x = carry
        return x, update(a, x)

    return jax.lax.while_loop(moving, step, (guess, update(a, guess)))[1]


def _solve_fwd(update, a, guess):
    x = _solve(update, a, guess)
    return x, (a, x)


def _solve_bwd(update, residuals, x_bar):
    a, x = residuals
    _, along_a = jax.vjp(lambda a_: update(a_, x), a)

    def adjoint_step(packed, u):
        a_, x_, x_bar_ = packed
        _, along_x = jax.vjp(lambda y: update(a_, y), x_)
        return x_bar_ + along_x(u)[0]

    u = _solve(adjoint_step, (a, x, x_bar), x_bar)
    return along_a(u)[0], jnp.zeros_like(x)


_solve.defvjp(_solve_fwd, _solve_bwd)


def test_a_newton_adjoint_whose_start_gap_is_rounding_keeps_its_hessian():
    # The adjoint of a Newton step iterates a map that is ~0: its start gap is
    # rounding, within the absolute tolerance at one probe scale and beyond it at
    # the other, and running it changes nothing -- so either transpose is the
    # answer, not NaN (adversary, stop 34: NaN).  Reference: the analytic f''.
    def f(a):
        return _solve(lambda a, x: 0.5 * (x + a / x), a, a) * jnp.sin(a)

    a = 2.0
    analytic = -np.sin(a) / (4 * a ** 1.5) + np.cos(a) / np.sqrt(a) - np.sqrt(a) * np.sin(a)
    np.testing.assert_allclose(float(jax.hessian(jaxpr_cc.jit(f))(jnp.float32(a))), analytic,
                               rtol=1e-4)


def test_a_small_component_packed_beside_a_large_one_is_compared_on_its_own_scale():
    # One carry [u, v] with u ~ g nearly fixed and v ~ 1e-9 g moving by half of
    # itself per step, stopped by an absolute tolerance: at a unit cotangent the
    # loop exits at once, at a large one it runs and v changes.  That is NaN,
    # not the limit (adversary, stop 34: v's change hid under u's size).
    @jax.custom_vjp
    def f(x):
        return jnp.sin(x)

    def bwd(x, g):
        def step(w):
            return jnp.stack([g + 1e-10 * jnp.cos(x) * w[0], 1e-9 * g + 0.5 * w[1]])

        start = jnp.stack([g, 1e-9 * g])
        _, w = jax.lax.while_loop(lambda c: jnp.max(jnp.abs(c[1] - c[0])) > 1e-7,
                                  lambda c: (c[1], step(c[1])), (start, step(start)))
        return (w[0] + 1e9 * w[1],)

    f.defvjp(lambda x: (jnp.sin(x), x), bwd)
    assert np.isnan(float(jax.jacfwd(jaxpr_cc.jit(f))(jnp.float32(0.7))))


def test_the_larger_probe_scale_stays_within_float16():
    # The probe read the test at 2**20 times the start: beyond float16's range,
    # the gap inf - inf read "met" at that scale only, and the transpose was NaN
    # (adversary, stop 41).  Reference: the analytic transpose of the limit,
    # diag(weights) (I - W)^-1 -- in float16, JAX's reverse mode stops its loop
    # at the tolerance, a few per cent from the limit.
    dt = jnp.float16
    w = jnp.asarray(W, dt)

    def loop(g, start, prev):
        return jax.lax.while_loop(lambda s: jnp.max(jnp.abs(s[0] - s[1])) > 1e-2,
                                  lambda s: (g + w.T @ s[0], s[0]), (start, prev))[0]

    @jax.custom_vjp
    def f(x):
        return jnp.sin(x)

    f.defvjp(lambda x: (jnp.sin(x), jnp.cos(x)), lambda c, g: (loop(g, g * dt(1.3), g),))
    weights = jnp.asarray(WEIGHTS, dt)
    got = np.asarray(jax.jacfwd(jaxpr_cc.jit(lambda x: f(x) * weights))(X.astype(dt)),
                     np.float64)
    want = np.diag(np.asarray(WEIGHTS, np.float64)) @ np.linalg.inv(np.eye(3) - W)
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=1e-2)


def test_the_larger_probe_scale_stays_within_float32_for_huge_iterates():
    # An iterate near 1e33 (a relative test): 2**20 times it overflows float32.
    big = 1e33

    def bwd(c, g):
        h = g * big
        u = jax.lax.while_loop(
            lambda s: jnp.max(jnp.abs(s[0] - s[1])) > 1e-6 * jnp.max(jnp.abs(s[0])),
            lambda s: (h + jnp.asarray(W).T @ s[0], s[0]), (h * 1.3, h))[0]
        return u / big

    fun = _rule(bwd)
    got = np.asarray(jax.jacfwd(jaxpr_cc.jit(fun))(X))
    assert np.isfinite(got).all()  # it was NaN
    # (The transposed iteration runs on cotangent / 1e33, where the terms of its
    # sum soon fall below float32's normal range: a few 1e-4 from the limit.)
    np.testing.assert_allclose(got, np.asarray(jax.jacrev(fun)(X)), rtol=3e-3)


def test_a_vmapped_loop_returns_its_start_in_the_lanes_that_start_converged():
    # Lane 0 starts converged (s == 1), lane 1 runs: the batched loop runs while
    # any lane does, keeping lane 0 at its start.  The transpose read "ran" for
    # all lanes (adversary, stop 41: lane 0 got lane 1's limit).
    def bwd(c, g):
        s = jnp.where(c[0] > 0.5, 1.0, 1.5)
        return _adjoint_loop(g, g * s, g)

    fun = jax.vmap(_rule(bwd))
    xs = jnp.stack([X, X.at[0].set(2.0)])
    np.testing.assert_allclose(np.asarray(jax.jacfwd(jaxpr_cc.jit(fun))(xs)),
                               np.asarray(jax.jacrev(fun)(xs)), rtol=1e-4, atol=1e-6)


def test_a_rule_called_twice_in_a_bwd_has_its_loop_read_at_each_call():
    # One inner custom_vjp, called with a start converged at run time and then
    # with one that runs: both calls share its primal, and the loop was read
    # once, so both were transposed as the limit (adversary, stop 41).
    @jax.custom_vjp
    def inner(h, s):
        return _adjoint_loop(h, h * s, h)

    inner.defvjp(lambda h, s: (inner(h, s), None), lambda r, ct: (ct, jnp.zeros(())))

    def bwd(c, g):
        one = 1.0 + 0.0 * c[0]
        return inner(g, one) + inner(2.0 * g, 1.3 * one)

    fun = _rule(bwd)
    np.testing.assert_allclose(np.asarray(jax.jacfwd(jaxpr_cc.jit(fun))(X)),
                               np.asarray(jax.jacrev(fun)(X)), rtol=1e-4)


def test_a_loop_vmapped_twice_is_read_lane_by_lane():
    # Two vmaps batch the loop (its test is bool[2, 2]); lanes [converged, runs]
    # in each row.  The lanes were read as one (adversary, stop 41).
    def bwd(c, g):
        one = _one(c)
        starts = jnp.stack([jnp.stack([g * one, 0.5 * g])] * 2)
        previous = jnp.stack([jnp.stack([g, g])] * 2)
        loops = jax.vmap(jax.vmap(_adjoint_loop, in_axes=(None, 0, 0)), in_axes=(None, 0, 0))
        return loops(g, starts, previous).sum((0, 1))

    fun = _rule(bwd)
    np.testing.assert_allclose(np.asarray(jax.jacfwd(jaxpr_cc.jit(fun))(X)),
                               np.asarray(jax.jacrev(fun)(X)), rtol=1e-4)


def test_the_larger_probe_scale_keeps_a_relative_residual_test_finite():
    # sum((u - up)^2) > tol^2 sum(u^2) over 16 float16 elements: the larger probe
    # scale kept one element's square in range, not the sum's, which read inf at
    # that scale only: NaN (adversary, stop 41).  Reference: the analytic limit,
    # diag(weights) (I - M)^-1 (JAX's float16 loop stops at the 1e-2 tolerance).
    n = 16
    m = (0.5 * np.eye(n) + 0.01 * np.ones((n, n))).astype(np.float32)

    def loop(g, start, prev):
        def keep_going(s):
            d = s[0] - s[1]
            return jnp.sum(d * d) > 1e-4 * jnp.sum(s[0] * s[0])
        return jax.lax.while_loop(keep_going,
                                  lambda s: (g + jnp.asarray(m, g.dtype).T @ s[0], s[0]),
                                  (start, prev))[0]

    @jax.custom_vjp
    def f(x):
        return jnp.sin(x)

    def bwd(c, g):
        g16 = g.astype(jnp.float16)
        return (loop(g16, g16, g16 * jnp.float16(0.5)).astype(jnp.float32),)

    f.defvjp(lambda x: (jnp.sin(x), jnp.cos(x)), bwd)
    weights = np.arange(1.0, n + 1)
    fun = lambda x: f(x) * jnp.asarray(weights, jnp.float32)  # noqa: E731
    got = np.asarray(jax.jacfwd(jaxpr_cc.jit(fun))(jnp.linspace(-0.5, 0.5, n)))
    want = np.diag(weights) @ np.linalg.inv(np.eye(n) - m.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)


def test_a_vmapped_loop_whose_test_reads_an_unbatched_linear_value():
    # A relative tolerance against an unbatched right-hand side g (vmap
    # in_axes=(None, 0, 0)): the test's linear constant became a carry beside a
    # batched test without lanes of its own, and XLA's lowering asserted
    # (adversary, stop 41).  It is now carried broadcast to the lanes.
    def loop(g, start, previous):
        return jax.lax.while_loop(
            lambda s: jnp.max(jnp.abs(s[0] - s[1])) > 1e-6 * jnp.max(jnp.abs(g)),
            lambda s: (g + jnp.asarray(W).T @ s[0], s[0]), (start, previous))[0]

    def bwd(c, g):
        starts = jnp.stack([g * _one(c), 0.5 * g])
        out = jax.vmap(loop, in_axes=(None, 0, 0))(g, starts, jnp.stack([g, g]))
        return out[0] + 3.0 * out[1]

    fun = _rule(bwd)
    np.testing.assert_allclose(np.asarray(jax.jacfwd(jaxpr_cc.jit(fun))(X)),
                               np.asarray(jax.jacrev(fun)(X)), rtol=1e-4)
