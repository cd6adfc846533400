"""implicit-diff's probe stops where the iterate settles (issue 16's benchmark).

A loop run to a tolerance at the rounding floor, or to a cap long after it
converged, spends most of its steps repeating its fixed point.  The derivative
path probes the tangent map only until every state leaf's step is at rounding
level; the rest of the loop runs as written.  The derivative must stay the
loop's own: the reference is JAX's forward mode through the original loop (or
reverse mode through the same iterations written as a ``fori_loop``).
"""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxpr_cc
from jaxpr_cc.passes import implicit_diff

N = 64


def _problem(dtype):
    rng = np.random.default_rng(0)
    a = rng.normal(size=(N, N))
    a = 0.9 * a / np.linalg.norm(a, 2)
    return (jnp.asarray(a, dtype), jnp.asarray(rng.normal(size=N), dtype),
            jnp.asarray(np.cos(np.arange(N)), dtype))


def _floor_loop(cap, c, scale=1.0):
    """``x <- tanh(A x + theta)`` until the step is exactly 0 or ``cap`` steps:
    jaxopt's ``FixedPointIteration(tol=0)`` loop."""
    def loss(a, theta):
        def keep_going(s):
            return (s[1] > 0.0) & (s[2] < cap)

        def advance(s):
            x, _, k = s
            new = jnp.tanh(a @ x + theta)
            return new, jnp.sqrt(jnp.sum((new - x) ** 2)), k + 1

        init = (jnp.zeros_like(theta), jnp.asarray(jnp.inf, theta.dtype), 0)
        x, _, _ = lax.while_loop(keep_going, advance, init)
        return scale * jnp.dot(c, x)
    return loss


def _unrolled(steps, c, scale=1.0):
    def loss(a, theta):
        x = lax.fori_loop(0, steps, lambda _, x: jnp.tanh(a @ x + theta), jnp.zeros_like(theta))
        return scale * jnp.dot(c, x)
    return loss


@pytest.mark.parametrize("x64", [False, True], ids=["float32", "float64"])
def test_a_loop_run_at_the_rounding_floor_keeps_its_gradient(x64):
    with jax.enable_x64(x64):
        dtype = jnp.float64 if x64 else jnp.float32
        a, theta, c = _problem(dtype)
        cap = 400
        program = jaxpr_cc.trace(_floor_loop(cap, c), a, theta)
        new = jaxpr_cc.run_passes(program, "implicit-diff")
        want = jax.jit(jax.grad(_unrolled(cap, c), argnums=(0, 1)))(a, theta)
        got = jax.jit(jax.grad(new, argnums=(0, 1)))(a, theta)
        rtol = 1e-10 if x64 else 2e-5
        for g, w in zip(got, want):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=rtol,
                                       atol=rtol * float(jnp.max(jnp.abs(w))))
        t = jnp.asarray(np.sin(np.arange(N)), dtype)
        _, jvp_want = jax.jit(lambda th: jax.jvp(lambda th: _floor_loop(cap, c)(a, th),
                                                 (th,), (t,)))(theta)
        _, jvp_got = jax.jit(lambda th: jax.jvp(lambda th: new(a, th), (th,), (t,)))(theta)
        np.testing.assert_allclose(np.asarray(jvp_got), np.asarray(jvp_want), rtol=rtol)


def _probing_outputs(cap):
    a, theta, c = _problem(jnp.float32)
    program = jaxpr_cc.trace(_floor_loop(cap, c), a, theta)
    (region, eqn), = implicit_diff._while_loops(program.body)
    loop = implicit_diff.match_fixed_point(eqn, result_used=[region.has_users(v)
                                                              for v in eqn.outputs])
    probing = implicit_diff._probing_loop(loop, [v.aval for v in eqn.inputs], "probe")
    operands = [a, theta, jnp.zeros_like(theta), jnp.float32(jnp.inf), 0]
    outs = jax.jit(lambda *o: jax.core.eval_jaxpr(probing.jaxpr, (), *o))(*operands)
    n = loop.n_carry
    return outs[:n], outs[n], outs[n + 1:2 * n + 1], outs[2 * n + 1]


def test_the_probe_stops_once_the_iterate_settles():
    """The probing loop reports the loop's results and count, and the iterate
    and count where the probe stopped: at the rounding floor, after a few dozen
    steps (at least the steps that measure the rate)."""
    cap = 400
    results, count, settled, settled_count = _probing_outputs(cap)
    assert int(count) == cap
    assert implicit_diff.RATE_STEPS <= int(settled_count) < 100, int(settled_count)
    # The settled iterate is the final one to rounding.
    np.testing.assert_allclose(np.asarray(settled[0]), np.asarray(results[0]), rtol=0, atol=1e-6)


def _whiles(compiled_text: str) -> int:
    return len(re.findall(r"\swhile\(", compiled_text))


def test_a_gradient_alone_does_not_run_the_steps_after_the_iterate_settled():
    """The derivative is read at the settled iterate, so a compiled gradient
    has no loop for the steps after it (XLA drops the unused results), while
    value_and_grad still runs them for the value."""
    a, theta, c = _problem(jnp.float32)
    cap = 400
    new = jaxpr_cc.run_passes(jaxpr_cc.trace(_floor_loop(cap, c), a, theta), "implicit-diff")
    grad_only = jax.jit(jax.grad(new, argnums=1)).lower(a, theta).compile().as_text()
    with_value = jax.jit(jax.value_and_grad(new, argnums=1)).lower(a, theta).compile().as_text()
    assert _whiles(with_value) == _whiles(grad_only) + 1
    value, grad = jax.jit(jax.value_and_grad(new, argnums=1))(a, theta)
    np.testing.assert_array_equal(np.asarray(value), np.asarray(jax.jit(_floor_loop(cap, c))(a, theta)))
    np.testing.assert_allclose(np.asarray(grad), np.asarray(jax.jit(jax.grad(new, argnums=1))(a, theta)),
                               rtol=1e-6)


def test_a_small_leaf_still_moving_keeps_the_probe_on():
    """Two state leaves of very different scales: the large one settles at
    once, the small one still moves for hundreds of steps.  The probe stays on
    until both settle, and the derivative is the loop's."""
    def loss(theta):
        def keep_going(s):
            return (s[2] > 0.0) & (s[3] < 3000)

        def advance(s):
            big, small, _, k = s
            new_big = 0.1 * big + 1e6
            new_small = 0.97 * small + 1e-3 * jnp.sin(theta * small + theta)
            gap = jnp.maximum(jnp.abs(new_big - big), jnp.abs(new_small - small))
            return new_big, new_small, gap, k + 1

        big, small, _, _ = lax.while_loop(keep_going, advance,
                                          (jnp.float32(0.0), jnp.float32(0.0), jnp.float32(1.0), 0))
        return small + 1e-9 * big
    theta = jnp.float32(0.7)
    new = jaxpr_cc.run_passes(jaxpr_cc.trace(loss, theta), "implicit-diff")
    _, want = jax.jvp(loss, (theta,), (jnp.float32(1.0),))
    _, got = jax.jvp(new, (theta,), (jnp.float32(1.0),))
    np.testing.assert_allclose(float(got), float(want), rtol=1e-4)
    np.testing.assert_allclose(float(jax.grad(new)(theta)), float(want), rtol=1e-4)


@pytest.mark.parametrize("adjoint", ["auto", "fixed-point"])
def test_an_iterated_adjoint_solves_a_tiny_cotangent_to_the_same_digits(adjoint):
    """The iterated adjoint stopped on a change below ``tol * (1 + |w|)``: a
    cotangent of 1e-9 was 'converged' after one step (relative error ~rate^2)."""
    a, theta, c = _problem(jnp.float32)
    cap = 400
    new = jaxpr_cc.run_passes(jaxpr_cc.trace(_floor_loop(cap, c, scale=1e-9), a, theta),
                              f"implicit-diff{{adjoint={adjoint}}}")
    want = jax.grad(_unrolled(cap, c, scale=1e-9), argnums=1)(a, theta)
    got = jax.grad(new, argnums=1)(a, theta)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5,
                               atol=2e-5 * float(jnp.max(jnp.abs(want))))


def test_a_float64_leaf_beside_a_float32_one_settles_at_its_own_rounding():
    """A float32 leaf settles long before a float64 one stops moving; each leaf
    is held to its own rounding unit, and the derivative is the loop's."""
    with jax.enable_x64(True):
        def loss(theta):
            def keep_going(s):
                return (s[2] > 0.0) & (s[3] < 3000)

            def advance(s):
                x, y, _, k = s
                new_x = jnp.float32(0.5) * x + theta.astype(jnp.float32)
                new_y = 0.95 * y + 0.05 * jnp.sin(theta * y + theta)
                gap = jnp.maximum(jnp.abs(new_x - x).astype(jnp.float64), jnp.abs(new_y - y))
                return new_x, new_y, gap, k + 1

            x, y, _, _ = lax.while_loop(keep_going, advance,
                                        (jnp.float32(0.0), jnp.float64(0.0), jnp.float64(1.0), 0))
            return y + x.astype(jnp.float64)
        theta = jnp.float64(0.7)
        new = jaxpr_cc.run_passes(jaxpr_cc.trace(loss, theta), "implicit-diff")
        _, want = jax.jvp(loss, (theta,), (jnp.float64(1.0),))
        _, got = jax.jvp(new, (theta,), (jnp.float64(1.0),))
        np.testing.assert_allclose(float(got), float(want), rtol=1e-9)
        np.testing.assert_allclose(float(jax.grad(new)(theta)), float(want), rtol=1e-9)


@pytest.mark.parametrize("adjoint", ["auto", "fixed-point", "bicgstab"])
def test_a_probe_mode_annihilated_at_the_start_is_measured_again(adjoint):
    """``y <- a + 0.9 (x/a)(y - a) + c (x - a)`` from ``x = 0``, ``y = a``,
    ``c = 0``: the first step's Jacobian has ``J_yy = 0`` and ``J_yx = 0``, so a
    probe carried through the loop lost its y component for good, measured
    x's rate (0.5) as J's rate at x* (0.9) and certified a loop that stopped
    before y's tangent converged (adversary, stop 32).  Reference: JAX's
    forward mode through the original loop."""
    def f(a, c):
        def body(s):
            x, y, _ = s
            nx = 0.5 * x + 0.5 * a
            ny = a + 0.9 * (x / a) * (y - a) + c * (x - a)
            return nx, ny, jnp.maximum(jnp.abs(nx - x), jnp.abs(ny - y))
        _, y, _ = lax.while_loop(lambda s: s[2] > 0.0, body,
                                 (jnp.float32(0.0), jnp.float32(1.0), jnp.float32(jnp.inf)))
        return y

    a, c = jnp.float32(1.0), jnp.float32(0.0)
    new = jaxpr_cc.run_passes(jaxpr_cc.trace(f, a, c), f"implicit-diff{{adjoint={adjoint}}}")
    want = jax.jacfwd(f, argnums=(0, 1))(a, c)
    for got in (jax.jacfwd(new, argnums=(0, 1))(a, c), jax.grad(new, argnums=(0, 1))(a, c)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


def test_the_iterated_adjoint_is_not_stopped_by_one_small_step():
    """A non-normal chain ``x0 <- 1e-7 x1``, ``x1 <- 0.2 x1 + 1e4 x2``,
    ``x2 <- 0.2 x2`` (rate 0.2, so adjoint=auto iterates the transposed map):
    its first step moves the adjoint by 1e-7, its second by 1e-3.  Stopping on
    one small step returned 0 for d x0*/d theta2 (1.5625e-3; adversary, stop 32).
    Reference: JAX's forward mode through the original loop."""
    n = 65

    def f(theta):
        def body(s):
            x, _ = s
            new = 0.2 * x + theta
            new = new.at[0].set(1e-7 * x[1] + theta[0])
            new = new.at[1].set(0.2 * x[1] + 1e4 * x[2] + theta[1])
            return new, jnp.max(jnp.abs(new - x))
        x, _ = lax.while_loop(lambda s: s[1] > 0.0, body, (jnp.zeros(n), jnp.float32(1.0)))
        return x[0]

    theta = jnp.zeros(n).at[2].set(1e-3)
    new = jaxpr_cc.run_passes(jaxpr_cc.trace(f, theta), "implicit-diff")
    want = jax.jacfwd(f)(theta)
    np.testing.assert_allclose(np.asarray(want[:3]), [1.0, 1.25e-7, 1.5625e-3], rtol=1e-4)
    np.testing.assert_allclose(np.asarray(jax.grad(new)(theta)), np.asarray(want), rtol=1e-4,
                               atol=1e-9)


def _gated_slow_mode(p):
    """y's slow mode (0.9) is gated shut until x is within GATE of a, which
    happens at step 21: a probe restarted at step 20 loses y at once."""
    start = 0.125
    gate = 0.95 * start * 0.7 ** 20
    a, c = p[0], p[1]

    def body(s):
        x, y, w, _, k = s
        d = x - a
        nx = a + 0.7 * d
        ny = a + jnp.where(jnp.abs(d) < gate, 0.9 * (y - a), 0.0) + c * d / gate
        nw = 0.5 * jnp.cos(w) + 0.3
        gap = jnp.maximum(jnp.maximum(jnp.abs(nx - x), jnp.abs(ny - y)), jnp.abs(nw - w))
        return nx, ny, nw, gap, k + 1

    _, y, _, _, _ = lax.while_loop(lambda s: (s[3] > 0.0) & (s[4] < 80), body,
                                   (jnp.float32(1.0 + start), jnp.float32(1.0),
                                    jnp.float32(0.5), jnp.float32(jnp.inf), 0))
    return y


def _one_slow_mode_of_300(theta):
    """299 modes at 0.5, one at 0.9 that starts at its fixed point, to a cap of
    75 steps: a start vector weighs the slow mode ~0.07, and the mean growth of
    20 power steps read 0.83 for 0.9."""
    rate = jnp.where(jnp.arange(300) == 299, 0.9, 0.5).astype(jnp.float32)

    def body(c):
        x, _, k = c
        new = rate * x + (1 - rate) * theta
        return new, jnp.max(jnp.abs(new - x)), k + 1

    x, _, _ = lax.while_loop(lambda c: (c[1] > 0.0) & (c[2] < 75), body,
                             (jnp.zeros(300, jnp.float32), jnp.float32(jnp.inf), 0))
    return jnp.sum(x)


def _leaf_reading_no_parameter(theta):
    """A scalar leaf that reads no parameter beside one that does: its part of
    the solve's right-hand side is a constant zero (grad raised in JAX's
    custom_linear_solve transpose)."""
    def body(c):
        x, w, _ = c
        new, nw = 0.5 * x + 0.5 * theta, 0.5 * w + 0.3
        return new, nw, jnp.maximum(jnp.max(jnp.abs(new - x)), jnp.abs(nw - w))

    x, _, _ = lax.while_loop(lambda c: c[2] > 1e-6, body,
                             (jnp.zeros_like(theta), jnp.float32(0.5), jnp.float32(jnp.inf)))
    return jnp.sum(x)


@pytest.mark.parametrize("f, arg", [
    (_gated_slow_mode, jnp.array([1.0, 0.0], jnp.float32)),
    (_one_slow_mode_of_300, jnp.where(jnp.arange(300) == 299, 0.0, 1.0).astype(jnp.float32)),
    (_leaf_reading_no_parameter, jnp.ones(2, jnp.float32)),
], ids=["gated_slow_mode", "one_slow_mode_of_300", "leaf_reading_no_parameter"])
def test_the_rate_at_the_fixed_point_is_measured_there(f, arg):
    """J's rate comes from a power iteration restarted at the settled iterate
    (its second half), not from a probe carried along the path (adversary,
    stop 32).  Reference: JAX's forward mode through the original loop."""
    new = jaxpr_cc.run_passes(jaxpr_cc.trace(f, arg), "implicit-diff")
    want = np.asarray(jax.jacfwd(f)(arg))
    for got in (jax.jacfwd(new)(arg), jax.grad(new)(arg)):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4,
                                   atol=1e-4 * float(np.max(np.abs(want))))


def test_the_start_term_takes_the_loops_own_count():
    """Adversary (stop 35): a start the parameter moves steeply (``x0 = 1 +
    1e12 theta``) keeps its part ``J^K t_0`` of the loop's derivative, K the
    loop's own step count -- not the count where the derivative is read (0.5^43
    1e12 = 0.11 was added)."""
    def loss(theta):
        def keep_going(c):
            return jnp.max(jnp.abs(c[0] - c[1])) > 0.0

        def advance(c):
            return 0.5 * c[0] + theta, c[0]

        x0 = 1.0 + 1e12 * theta
        x, _ = lax.while_loop(keep_going, advance, (x0, x0 + 1.0))
        return jnp.sum(x)

    theta = jnp.zeros(3, jnp.float32)
    new = jaxpr_cc.run_passes(jaxpr_cc.trace(loss, theta), "implicit-diff")
    want = jax.jacfwd(loss)(theta)       # JAX's forward mode through the loop
    for got in (jax.grad(new)(theta), jax.jit(jax.grad(new))(theta),
                jax.value_and_grad(new)(theta)[1], jax.jacfwd(new)(theta)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4)


@pytest.mark.parametrize("x64", [False, True], ids=["float32", "float64"])
def test_an_iterate_that_moves_again_after_settling_has_its_rate_measured_at_x_star(x64):
    """Adversary (stop 35): a non-normal ``x <- J x + theta`` started so its
    first step is at rounding level, after which J's transient makes the steps
    grow for about 100 steps.  The rate segment began at that first step and
    summed every growth until the iterate settled again, read as J's rate: 0.5
    for 0.95, which certified the derivative early.  The segment now restarts
    when the iterate moves; the derivative is the loop's."""
    with jax.enable_x64(x64):
        dtype = jnp.float64 if x64 else jnp.float32
        j = np.array([[0.95, 300.0], [0.0, 0.95]])
        start = jnp.asarray(np.linalg.solve(j - np.eye(2), np.array([0.0, 1e-7])), dtype)
        jj = jnp.asarray(j, dtype)

        def loss(theta):
            def keep_going(s):
                x, y, xp, yp, k = s
                change = jnp.maximum(jnp.max(jnp.abs(x - xp)), jnp.abs(y - yp))
                return (change > 0.0) & (k < 400)

            def advance(s):
                x, y, _, _, k = s
                # y: a large leaf at its fixed point, which sets the iterate's scale.
                return jj @ x + theta, 0.5 * y + 500.0, x, y, k + 1

            x0 = start + 1000.0 * theta
            init = (x0, jnp.asarray(1000.0, dtype), x0 + 1.0, jnp.asarray(0.0, dtype), 0)
            return lax.while_loop(keep_going, advance, init)[0]

        theta = jnp.zeros(2, dtype)
        new = jaxpr_cc.run_passes(jaxpr_cc.trace(loss, theta), "implicit-diff")
        want = np.asarray(jax.jacfwd(loss)(theta))
        rtol = 1e-8 if x64 else 1e-4
        for got in (jax.jacfwd(new)(theta), jax.jacrev(new)(theta)):
            np.testing.assert_allclose(np.asarray(got), want, rtol=rtol,
                                       atol=rtol * np.abs(want).max())


def test_a_movable_start_of_a_nonlinear_loop_keeps_the_loops_own_start_derivative():
    """Adversary (stop 35): ``x <- theta + 0.7 x + 0.2 sin x`` from ``x0 = 20 +
    1e12 (theta - 1)``.  Its Jacobian along the path (0.5 to 0.9) is not J at
    x*, so ``J^K t_0`` was not the loop's product of Jacobians: 2.26 for 7.87.
    The start's part is now the loop's own derivative along the start."""
    with jax.enable_x64(True):
        def loss(theta):
            def advance(s):
                x, _ = s
                new = theta + 0.7 * x + 0.2 * jnp.sin(x)
                return new, jnp.abs(new - x)

            x0 = 20.0 + 1e12 * (theta - 1.0)
            return lax.while_loop(lambda s: s[1] > 1e-10, advance, (x0, jnp.float64(1.0)))[0]

        theta = jnp.float64(1.0)
        new = jaxpr_cc.run_passes(jaxpr_cc.trace(loss, theta), "implicit-diff")
        want = float(jax.jacfwd(loss)(theta))   # forward mode through the original loop
        for got in (jax.grad(new)(theta), jax.jit(jax.grad(new))(theta),
                    jax.jvp(new, (theta,), (1.0,))[1], jax.jacrev(new)(theta)):
            np.testing.assert_allclose(float(got), want, rtol=1e-8)
        # A Hessian through it as well (the start's Jacobian is differentiable).
        np.testing.assert_allclose(float(jax.hessian(new)(theta)),
                                   float(jax.jacfwd(jax.jacfwd(loss))(theta)), rtol=1e-6)


def _curved_loop(sharpness, dtype, tol):
    def loss(theta):
        def advance(s):
            x, _ = s
            new = theta + 0.6 * x + 0.3 * jnp.sin(sharpness * x) / sharpness
            return new, jnp.abs(new - x)

        return lax.while_loop(lambda s: s[1] > tol, advance, (dtype(5.0), dtype(1.0)))[0]
    return loss


@pytest.mark.parametrize("x64, sharpness, tol", [(True, 1e5, 3e-8), (False, 1e4, 1e-7)])
def test_a_sharply_curved_update_keeps_the_loops_derivative(x64, sharpness, tol):
    """Adversary (stop 35): ``x <- theta + 0.6 x + 0.3 sin(A x) / A`` stopped on
    ``|dx| <= tol``.  Its second derivative (``0.3 A``) is far above what the
    path bound assumes: the loop's own tangent was still 1.5% (float64) or
    2.6e-4 (float32) from the implicit one when the certificate accepted the
    implicit one.  The measured tangent (``_bounds_met``) has not settled
    there: the loop's own derivative is kept."""
    with jax.enable_x64(x64):
        dtype = jnp.float64 if x64 else jnp.float32
        loss = _curved_loop(sharpness, dtype, tol)
        theta = dtype(0.37)
        new = jaxpr_cc.run_passes(jaxpr_cc.trace(loss, theta), "implicit-diff")
        want = float(jax.jacfwd(loss)(theta))   # forward mode through the original loop
        for got in (jax.grad(new)(theta), jax.jit(jax.grad(new))(theta),
                    jax.jvp(new, (theta,), (dtype(1.0),))[1]):
            np.testing.assert_allclose(float(got), want, rtol=2e-5)


def test_a_sharply_curved_update_run_to_rounding_is_implicit():
    """The same update run until its step is at rounding level (float64): the
    loop's tangent settles at t* as well, and the implicit derivative is the
    loop's own to the certificate's tolerance."""
    with jax.enable_x64(True):
        loss = _curved_loop(1e5, jnp.float64, 1e-15)
        theta = jnp.float64(0.37)
        new = jaxpr_cc.run_passes(jaxpr_cc.trace(loss, theta), "implicit-diff")
        x_star = float(loss(theta))
        implicit = 1.0 / (1.0 - 0.6 - 0.3 * np.cos(1e5 * x_star))   # 1 / (1 - df/dx)
        np.testing.assert_allclose(float(jax.grad(new)(theta)), implicit, rtol=1e-12)
        np.testing.assert_allclose(float(jax.grad(new)(theta)), float(jax.jacfwd(loss)(theta)),
                                   rtol=2e-5)


def test_a_sharply_curved_leaf_beside_a_large_one_keeps_the_loops_derivative():
    """The curved update of the test above in one state leaf, beside a smooth
    leaf whose tangent is 1e6 times larger: the measured tangent's change is
    taken relative to each leaf's own size, so the curved leaf's unsettled
    tangent is not hidden by the large one."""
    with jax.enable_x64(True):
        def loss(theta):
            def advance(s):
                x, y, _ = s
                new_x = theta[0] + 0.6 * x + 0.3 * jnp.sin(1e5 * x) / 1e5
                new_y = 1e6 * theta[1] + 0.5 * y
                return new_x, new_y, jnp.maximum(jnp.abs(new_x - x), jnp.abs(new_y - y) / 1e6)

            x, y, _ = lax.while_loop(lambda s: s[2] > 3e-8, advance,
                                     (jnp.float64(5.0), jnp.float64(0.0), jnp.float64(1.0)))
            return jnp.stack([x, y])

        theta = jnp.array([0.37, 0.2])
        new = jaxpr_cc.run_passes(jaxpr_cc.trace(loss, theta), "implicit-diff")
        want = np.asarray(jax.jacfwd(loss)(theta))   # forward mode through the original loop
        np.testing.assert_allclose(np.asarray(jax.jacrev(new)(theta)), want, rtol=2e-5, atol=1e-12)
        np.testing.assert_allclose(np.asarray(jax.jacfwd(new)(theta)), want, rtol=2e-5, atol=1e-12)


def test_a_sharply_curved_update_with_a_tiny_tangent_keeps_the_loops_derivative():
    """Adversary (stop 36): the curved update driven by ``1e-18 theta``.  The
    measured tangent (~1e-18) was compared through a float32 2-norm whose
    squares underflow: its change read 0 op by op, and the implicit derivative,
    1.5% off, was used (jitted runs were right)."""
    with jax.enable_x64(True):
        def loss(theta):
            def advance(s):
                x, _ = s
                new = 0.37 + 1e-18 * theta + 0.6 * x + 0.3 * jnp.sin(1e5 * x) / 1e5
                return new, jnp.abs(new - x)

            return lax.while_loop(lambda s: s[1] > 3e-8, advance,
                                  (jnp.float64(5.0), jnp.float64(1.0)))[0]

        theta = jnp.float64(0.37)
        new = jaxpr_cc.run_passes(jaxpr_cc.trace(loss, theta), "implicit-diff")
        want = float(jax.jacfwd(loss)(theta))   # forward mode through the original loop
        for got in (jax.grad(new)(theta), jax.jit(jax.grad(new))(theta),
                    jax.jvp(new, (theta,), (1.0,))[1]):
            np.testing.assert_allclose(float(got), want, rtol=2e-5)


@pytest.mark.parametrize("layout", ["large element beside it", "one element of 256"])
def test_a_sharply_curved_element_of_a_state_keeps_the_loops_derivative(layout):
    """Adversary (stop 36): the curved update in one element of a vector state,
    beside an element whose tangent is 1e6 times larger, or as one of 256
    elements (its entry in the fixed direction was 1e-4 of the others').  The
    measured tangent's change was a norm over the whole state: the curved
    element's unsettled tangent (3.7e-3 off) was hidden.  It is now checked
    against each element's own size, along a direction whose entries are
    all of one size."""
    n, j = (2, 1) if layout == "large element beside it" else (256, 30)
    with jax.enable_x64(True):
        curved = jnp.zeros(n, bool).at[j].set(True)
        factor = jnp.array([1e6, 1.0]) if n == 2 else 1.0
        def loss(theta):
            def advance(s):
                x, _ = s
                smooth = 0.37 + factor * theta + 0.5 * x
                sharp = 0.37 + theta + 0.6 * x + 0.3 * jnp.sin(1e5 * x) / 1e5
                new = jnp.where(curved, sharp, smooth)
                return new, jnp.max(jnp.abs(new - x))

            x0 = jnp.where(curved, 5.0, 2 * (0.37 + factor * 0.37))
            # (the smooth elements start at their fixed point)
            return lax.while_loop(lambda s: s[1] > 3e-8, advance, (x0, jnp.float64(1.0)))[0][j]

        theta = jnp.full(n, 0.37)
        new = jaxpr_cc.run_passes(jaxpr_cc.trace(loss, theta), "implicit-diff")
        want = jax.jacfwd(loss)(theta)[j]   # forward mode through the original loop
        np.testing.assert_allclose(float(jax.grad(new)(theta)[j]), float(want), rtol=2e-5)
        np.testing.assert_allclose(float(jax.jvp(new, (theta,), (jnp.zeros(n).at[j].set(1.0),))[1]),
                                   float(want), rtol=2e-5)


def test_a_sharply_curved_update_of_a_sum_of_parameters_keeps_the_loops_derivative():
    """Adversary (stop 36): the curved update reading ``a + b``.  The fixed
    direction had entries of one size with signs (-1, +1), so the measured
    tangent was exactly 0 ("settled") and the implicit derivative, 0.6% off,
    was used.  Its entries are now positive and of distinct sizes."""
    with jax.enable_x64(True):
        def loss(a, b):
            def advance(s):
                x, previous, k = s
                return a + b + 0.6 * x + 0.3 * jnp.sin(1e5 * x) / 1e5, x, k + 1

            return lax.while_loop(lambda s: (jnp.abs(s[0] - s[1]) > 3e-8) & (s[2] < 10000),
                                  advance, (jnp.float64(0.0), jnp.float64(1.0), 0))[0]

        a, b = jnp.float64(0.3), jnp.float64(0.2)
        new = jaxpr_cc.run_passes(jaxpr_cc.trace(loss, a, b), "implicit-diff")
        want = jax.jacfwd(loss, argnums=(0, 1))(a, b)   # forward mode through the original loop
        for got in (jax.grad(new, argnums=(0, 1))(a, b), jax.jacfwd(new, argnums=(0, 1))(a, b)):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5)


def test_a_sharply_curved_leaf_with_a_tangent_1e13_below_another_keeps_the_loops_derivative():
    """Adversary (stop 36): a curved state leaf whose tangent (2.5e-10) is 1e13
    below another leaf's (2e3).  The measured tangent's rounding floor was 64
    ulps of the largest element, 11% of the small one: its unsettled tangent
    passed.  The floor is now each element's own: 64 ulps of the terms it sums."""
    with jax.enable_x64(True):
        def loss(th0, th1):
            def advance(s):
                a, b, _, _, k = s
                return (1e3 * th0 + 0.5 * a,
                        0.1 + 1e-10 * th1 + 0.6 * b + 0.3 * jnp.sin(1e5 * b) / 1e5, a, b, k + 1)

            z = jnp.float64(0.0)
            return lax.while_loop(
                lambda s: (jnp.maximum(jnp.abs(s[0] - s[2]), jnp.abs(s[1] - s[3])) > 1e-6)
                & (s[4] < 10000), advance, (z, z, z + 1, z + 1, 0))[1]

        th0, th1 = jnp.float64(0.7), jnp.float64(0.3)
        new = jaxpr_cc.run_passes(jaxpr_cc.trace(loss, th0, th1), "implicit-diff")
        want = float(jax.jacfwd(loss, argnums=1)(th0, th1))   # forward mode through the original
        for got in (jax.grad(new, argnums=1)(th0, th1), jax.jacfwd(new, argnums=1)(th0, th1)):
            np.testing.assert_allclose(float(got), want, rtol=2e-5)


@pytest.mark.parametrize("sensitivity, sharpness", [(1e-6, 1e3), (1e-9, 1e5)])
@pytest.mark.parametrize("layout", ["one leaf", "two leaves"])
def test_a_parameter_with_a_small_effect_keeps_the_loops_derivative(sensitivity, sharpness,
                                                                    layout):
    """Adversary (stop 36): ``x <- 0.37 + p + 0.6 x + c q sin(A x)`` stopped on
    ``|dx| <= 3e-8``.  Along one measured direction the tangent was almost all
    ``p``'s part, which settles; ``q``'s, whose sensitivity varies along the
    path relative to its own size, had not, and the implicit ``d x / d q`` was
    6.6e-4 (9%) from the loop's own.  Each parameter (an element of a small
    leaf, or a leaf) now has its own measured tangent."""
    with jax.enable_x64(True):
        def update(p, q, x):
            return 0.37 + p + 0.6 * x + sensitivity * q * jnp.sin(sharpness * x)

        def loop(p, q):
            def advance(s):
                x, _ = s
                new = update(p, q, x)
                return new, jnp.abs(new - x)

            return lax.while_loop(lambda s: s[1] > 3e-8, advance,
                                  (jnp.float64(5.0), jnp.float64(1.0)))[0]

        if layout == "one leaf":
            args, loss = (jnp.array([0.3, 0.7]),), lambda theta: loop(theta[0], theta[1])
        else:
            args, loss = (jnp.float64(0.3), jnp.float64(0.7)), loop
        argnums = tuple(range(len(args)))
        new = jaxpr_cc.run_passes(jaxpr_cc.trace(loss, *args), "implicit-diff")
        want = jax.jacfwd(loss, argnums)(*args)   # forward mode through the original loop
        for got in (jax.grad(new, argnums)(*args), jax.jit(jax.grad(new, argnums))(*args)):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5)


def _small_effect_loop(p, q, *others):
    def advance(s):
        x, _ = s
        new = 0.37 + p + sum(1e-12 * o for o in others) + 0.6 * x \
            + 1e-9 * q * jnp.sin(1e5 * x)
        return new, jnp.abs(new - x)

    return lax.while_loop(lambda s: s[1] > 3e-8, advance,
                          (jnp.float64(5.0), jnp.float64(1.0)))[0]


def test_a_vmapped_parameter_with_a_small_effect_keeps_the_loops_derivative():
    """Adversary (stop 36): the small-effect loop above under ``jax.vmap`` over
    8 parameter pairs.  The batched (8, 2) parameter had more elements than the
    group budget and became one group, mixing ``p`` and ``q`` again (9% off);
    a vmapped loop's groups now count the elements of one batch element."""
    with jax.enable_x64(True):
        def f(thetas):
            return jnp.sum(jax.vmap(lambda t: _small_effect_loop(t[0], t[1]))(thetas))

        thetas = jnp.stack([jnp.full(8, 0.3), jnp.linspace(0.7, 0.75, 8)], 1)
        new = jaxpr_cc.run_passes(jaxpr_cc.trace(f, thetas), "implicit-diff")
        want = jax.jacfwd(f)(thetas)   # forward mode through the original loop
        np.testing.assert_allclose(np.asarray(jax.grad(new)(thetas)), np.asarray(want),
                                   rtol=2e-5)


@pytest.mark.parametrize("effect", ["sin", "large at the start", "zero at the start"])
def test_a_ninth_parameter_with_a_small_effect_keeps_the_loops_derivative(effect):
    """Adversary (stop 36): a loop with nine scalar parameters, one (``q``)
    with a small effect.  ``q`` shared a measured tangent's group with ``p``
    (round robin past 8 groups), and its implicit derivative, 9% off, was
    used; scaling each shared parameter by its effect at the start was no
    better (an effect large at the start and ~0 near x*, or 0 at the start:
    up to 100% off).  Every parameter is now a group of its own."""
    terms = {"sin": lambda x: 1e-9 * jnp.sin(1e5 * x),
             "large at the start": lambda x: 1e-2 * (x - 0.67 / 0.4) ** 2,
             "zero at the start": lambda x: 1e-9 * jnp.sin(1e5 * x) * (x - 5.0)}
    with jax.enable_x64(True):
        def loop(p, q, *others):
            def advance(s):
                x, _ = s
                new = (0.37 + p + sum(1e-12 * o for o in others) + 0.6 * x
                       + q * terms[effect](x))
                return new, jnp.abs(new - x)

            return lax.while_loop(lambda s: s[1] > 3e-8, advance,
                                  (jnp.float64(5.0), jnp.float64(1.0)))[0]

        args = (jnp.float64(0.3), jnp.float64(0.7)) + (jnp.float64(0.1),) * 7
        new = jaxpr_cc.run_passes(jaxpr_cc.trace(loop, *args), "implicit-diff")
        want = float(jax.jacfwd(loop, 1)(*args))   # forward mode through the original loop
        np.testing.assert_allclose(float(jax.grad(new, 1)(*args)), want, rtol=2e-5)


def _rule_loss(kind):
    """A fixed point whose update calls a custom_jvp.  JAX's derivative of the loop
    at order two and above differentiates each rule's primal code as written (the
    jvp of the loop iterates the rule), so a rule that is not its primal's
    derivative gives a second derivative the update's rule alone does not."""
    if kind == "inaccurate rule":
        @jax.custom_jvp
        def s(x):
            return jnp.sin(x)

        @s.defjvp
        def s_jvp(primals, tangents):
            (x,), (t,) = primals, tangents
            return s(x), 0.8 * jnp.cos(x) * t
    else:  # JAX's own rule
        def s(x):
            return jax.nn.logsumexp(jnp.stack([x, -x, 0.3 * x]), axis=0) - 1.0

    def loss(theta):
        def cond(c):
            x, prev = c
            return jnp.max(jnp.abs(x - prev)) > 1e-13

        def body(c):
            x, _ = c
            return 0.5 * s(x) + theta, x
        return jnp.sum(lax.while_loop(cond, body, (theta, theta + 1.0))[0] ** 2)
    return loss


@pytest.mark.parametrize("kind", ["inaccurate rule",
                                  pytest.param("logsumexp", marks=pytest.mark.heavy)])
def test_an_update_calling_a_custom_jvp_keeps_every_order(kind):
    # (adversary 2, stop 37: a rule 0.8x its primal's derivative; the Hessian after
    # the rewrite was 15% from the loop's own, which plain JAX forms.)
    with jax.enable_x64(True):
        theta = jnp.array([0.2, -0.5, 1.1])
        loss = _rule_loss(kind)
        rewritten = jaxpr_cc.run_passes(jaxpr_cc.trace(loss, theta), "implicit-diff")
        assert "implicit_diff." in str(rewritten)
        want, got = loss, rewritten
        for order in range(2):
            want, got = jax.jacfwd(want), jax.jacfwd(got)
            w = np.asarray(want(theta))
            np.testing.assert_allclose(np.asarray(got(theta)), w, rtol=1e-9,
                                       atol=1e-9 * np.abs(w).max(), err_msg=f"order {order + 1}")
        h = np.asarray(jax.jacfwd(jax.jacfwd(loss))(theta))
        np.testing.assert_allclose(np.asarray(jax.hessian(rewritten)(theta)), h, rtol=1e-9,
                                   atol=1e-9 * np.abs(h).max())
