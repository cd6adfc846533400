"""``implicit-diff`` rewrites only convergence loops, and keeps every derivative.

Loops that are not fixed-point solves (time stepping, growth loops) must be left
alone, with their derivatives equal to JAX's; convergent fixed points must give
jvp, grad, jacfwd and Hessians equal to float64 references written out here in
numpy (the implicit function theorem, and central differences of it for second
derivatives) -- never to the pass's own output.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxpr_cc
from jaxpr_cc.passes.manager import PassManager, run_passes
from implicit_diff_helpers import reasons, rewrite_with_stats




# ------------------------------------------- loops that are not fixed points
def euler_decay(k):
    """Explicit time stepping ``while t < T``: y' = -k y^2 from y(0) = 1 to T = 1."""
    def keep_going(s):
        t, _ = s
        return t < 1.0

    def step(s):
        t, y = s
        return t + 0.1, y - 0.1 * k * y * y

    return lax.while_loop(keep_going, step, (jnp.float32(0.0), jnp.float32(1.0)))[1]


def growth(a):
    """``while x < 10: x *= a``."""
    return lax.while_loop(lambda x: x < 10.0, lambda x: x * a, jnp.float32(1.0))


@pytest.mark.parametrize("fun,arg", [(euler_decay, 0.7), (growth, 1.5)])
def test_time_stepping_and_growth_loops_are_left_alone(fun, arg):
    arg = jnp.float32(arg)
    program, new, stats = rewrite_with_stats(fun, arg)
    assert str(new) == str(program)
    assert stats["loops-skipped"] == 1 and "loops-rewritten" not in stats
    why = reasons(stats)
    assert "not a convergence test" in why and "not its change between iterations" in why
    assert fun.__name__ in why
    # JAX's derivative (forward mode: JAX cannot reverse-differentiate a while_loop).
    want = jax.jacfwd(fun)(arg)
    assert float(jax.jit(jax.jacfwd(new))(arg)) == float(want)
    _, t = jax.jvp(new, (arg,), (jnp.float32(1.0),))
    assert float(t) == float(want)


def test_growth_loop_derivative_is_the_iterates_derivative():
    # 1.5^6 = 11.4 >= 10 after 6 steps: x = a^6, dx/da = 6 a^5 (not an implicit
    # derivative of any fixed point: x = a x has none but 0).
    a = jnp.float32(1.5)
    _, new, _ = rewrite_with_stats(growth, a)
    np.testing.assert_allclose(float(jax.jacfwd(new)(a)), 6 * 1.5 ** 5, rtol=1e-6)


def running_sum_until_converged(theta):
    """The exit test checks x but the loop also accumulates a running sum."""
    def keep_going(s):
        x, prev, _ = s
        return jnp.max(jnp.abs(x - prev)) > 1e-6

    def step(s):
        x, _, total = s
        return 0.5 * jnp.cos(x) + theta, x, total + x

    x, _, total = lax.while_loop(keep_going, step, (theta, theta + 1.0, jnp.zeros_like(theta)))
    return x, total


def converged_or_value_test(theta):
    """Stops on convergence or when the iterate passes a value: not only a cap."""
    def keep_going(s):
        x, prev = s
        return (jnp.max(jnp.abs(x - prev)) > 1e-6) & (jnp.max(x) < 0.9)

    def step(s):
        x, _ = s
        return 0.5 * jnp.cos(x) + theta, x

    return lax.while_loop(keep_going, step, (theta, theta + 1.0))[0]


def runs_while_close(theta):
    """The opposite of a convergence test."""
    def keep_going(s):
        x, prev = s
        return jnp.max(jnp.abs(x - prev)) < 1e-6

    def step(s):
        x, _ = s
        return 0.5 * jnp.cos(x) + theta, x

    return lax.while_loop(keep_going, step, (theta, theta))[0]


def some_element_converged(theta):
    """Stops as soon as one element has converged (reduce_and of the 'big' test)."""
    def keep_going(s):
        x, prev = s
        return jnp.all(jnp.abs(x - prev) > 1e-6)

    def step(s):
        x, _ = s
        return 0.5 * jnp.cos(x) + theta, x

    return lax.while_loop(keep_going, step, (theta, theta + 1.0))[0]


@pytest.mark.parametrize("fun,fragment", [
    (running_sum_until_converged, "but not of carry 2"),
    (converged_or_value_test, "not only on its convergence or an iteration cap"),
    (runs_while_close, "the opposite of a convergence test"),
    (some_element_converged, "when some elements converge"),
])
def test_loops_whose_exit_test_proves_no_convergence_are_left_alone(fun, fragment):
    theta = jnp.array([0.1, 0.3], jnp.float32)
    program, new, stats = rewrite_with_stats(fun, theta)
    assert str(new) == str(program)
    assert fragment in reasons(stats)
    assert "\n" not in reasons(stats)


# ------------------------------------------------- convergent fixed points
A_SMALL = (np.random.default_rng(1).normal(size=(6, 6)) * 0.25).astype(np.float32)
C_SMALL = np.cos(np.arange(6)).astype(np.float32)


def fixed_point_f64(theta, a=A_SMALL):
    x = np.zeros(len(theta))
    for _ in range(400):
        x = np.tanh(np.asarray(a, np.float64) @ x + theta)
    return x


def jacobian_f64(theta):
    """dx*/dtheta = (I - D A)^-1 D, D = diag(1 - x*^2)."""
    x = fixed_point_f64(np.asarray(theta, np.float64))
    d = 1.0 - x ** 2
    return np.linalg.solve(np.eye(len(x)) - d[:, None] * A_SMALL, np.diag(d))


def loss_grad_f64(theta):
    return jacobian_f64(theta).T @ np.asarray(C_SMALL, np.float64)


def loss_hessian_f64(theta, eps=1e-5):
    theta = np.asarray(theta, np.float64)
    cols = []
    for i in range(len(theta)):
        e = np.zeros_like(theta)
        e[i] = eps
        cols.append((loss_grad_f64(theta + e) - loss_grad_f64(theta - e)) / (2 * eps))
    return np.stack(cols, 1)


def previous_carry(theta):
    def keep_going(s):
        x, prev = s
        return jnp.max(jnp.abs(x - prev)) > 1e-7

    def step(s):
        x, _ = s
        return jnp.tanh(A_SMALL @ x + theta), x

    return lax.while_loop(keep_going, step, (jnp.zeros_like(theta), jnp.ones_like(theta)))[0]


def carried_gap_with_cap(theta):
    def keep_going(s):
        k, _, gap = s
        return (gap > 1e-7) & (k < 500)

    def step(s):
        k, x, _ = s
        new = jnp.tanh(A_SMALL @ x + theta)
        return k + 1, new, jnp.sqrt(jnp.sum((new - x) ** 2))

    return lax.while_loop(keep_going, step, (0, jnp.zeros_like(theta), jnp.float32(jnp.inf)))[1]


def step_size_test(theta):
    """x <- x + s with the test on |s| (Newton-style)."""
    def keep_going(s):
        _, step = s
        return jnp.linalg.norm(step) > 1e-7

    def advance(s):
        x, _ = s
        step = jnp.tanh(A_SMALL @ x + theta) - x
        return x + step, step

    return lax.while_loop(keep_going, advance, (jnp.zeros_like(theta), jnp.ones_like(theta)))[0]


def not_allclose(theta):
    def keep_going(s):
        x, prev = s
        return ~jnp.allclose(x, prev, rtol=0.0, atol=1e-7)

    def step(s):
        x, _ = s
        return jnp.tanh(A_SMALL @ x + theta), x

    return lax.while_loop(keep_going, step, (jnp.zeros_like(theta), jnp.ones_like(theta)))[0]


def exact_fixed_point(theta):
    """Iterate until the float32 iterate stops changing at all."""
    def keep_going(s):
        x, prev = s
        return jnp.any(x != prev)

    def step(s):
        x, _ = s
        return jnp.tanh(A_SMALL @ x + theta), x

    return lax.while_loop(keep_going, step, (jnp.zeros_like(theta), jnp.ones_like(theta)))[0]


FIXED_POINTS = [previous_carry, carried_gap_with_cap, step_size_test, not_allclose,
                exact_fixed_point]
THETA = np.array([0.3, -0.2, 0.5, 0.1, -0.4, 0.25], np.float32)


# One exit-test form in the default run (about 25 s each); the others under -m heavy.
@pytest.mark.parametrize("fun", [FIXED_POINTS[0]] + [
    pytest.param(f, marks=pytest.mark.heavy) for f in FIXED_POINTS[1:]], ids=lambda f: f.__name__)
def test_convergent_fixed_points_keep_every_derivative(fun):
    theta = jnp.asarray(THETA)
    program, new, stats = rewrite_with_stats(fun, theta)
    assert stats.get("loops-rewritten") == 1, reasons(stats)
    np.testing.assert_allclose(np.asarray(new(theta)), fixed_point_f64(THETA), atol=1e-5)
    direction = jnp.asarray(np.linspace(-1.0, 1.0, 6), jnp.float32)

    def loss(t):
        return jnp.dot(jnp.asarray(C_SMALL), new(t))

    @jax.jit
    def everything(t):
        return dict(jvp=jax.jvp(new, (t,), (direction,))[1], jacfwd=jax.jacfwd(new)(t),
                    jacrev=jax.jacrev(new)(t), grad=jax.grad(loss)(t),
                    hessian=jax.hessian(loss)(t),
                    hessian_rr=jax.jacrev(jax.grad(loss))(t))

    out = everything(theta)
    jac = jacobian_f64(THETA)
    np.testing.assert_allclose(np.asarray(out["jvp"]), jac @ np.asarray(direction), rtol=1e-4,
                               atol=1e-5)
    np.testing.assert_allclose(np.asarray(out["jacfwd"]), jac, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(out["jacrev"]), jac, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(out["grad"]), loss_grad_f64(THETA), rtol=1e-4,
                               atol=1e-5)
    hess = loss_hessian_f64(THETA)
    np.testing.assert_allclose(np.asarray(out["hessian"]), hess, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(np.asarray(out["hessian_rr"]), hess, rtol=1e-3, atol=1e-4)


def test_fixed_point_derivatives_match_jax_through_an_unrolled_float64_iteration():
    # The other reference: JAX's own derivatives of 300 unrolled iterations,
    # evaluated in float64 numpy from JAX's float32 jacobian of the same map.
    theta = jnp.asarray(THETA)
    _, new, _ = rewrite_with_stats(previous_carry, theta)

    def unrolled(t):
        return lax.fori_loop(0, 300, lambda _, x: jnp.tanh(A_SMALL @ x + t), jnp.zeros_like(t))

    np.testing.assert_allclose(np.asarray(jax.jit(jax.jacfwd(new))(theta)),
                               np.asarray(jax.jit(jax.jacrev(unrolled))(theta)), rtol=1e-4,
                               atol=1e-5)


def scalar_fixed_point(b):
    """x = cos(b x) + b / 2, with an iteration cap and an absolute tolerance."""
    def keep_going(s):
        k, x, prev = s
        return (jnp.abs(x - prev) > 2e-7) & (k < 200)

    def step(s):
        k, x, _ = s
        return k + 1, jnp.cos(b * x) + 0.5 * b, x

    return lax.while_loop(keep_going, step, (0, jnp.float32(0.0), jnp.float32(1.0)))[1]


def scalar_reference(b):
    x = 0.0
    for _ in range(500):
        x = np.cos(b * x) + 0.5 * b
    s = np.sin(b * x)
    return x, (-s * x + 0.5) / (1.0 + s * b)


@pytest.mark.parametrize("b", [pytest.param(0.3, marks=pytest.mark.heavy), 0.7])
def test_scalar_fixed_point_to_third_order(b):
    bf = jnp.float32(b)
    _, new, stats = rewrite_with_stats(scalar_fixed_point, bf)
    assert stats.get("loops-rewritten") == 1
    d1 = scalar_reference(b)[1]
    eps = 1e-4
    d2 = (scalar_reference(b + eps)[1] - scalar_reference(b - eps)[1]) / (2 * eps)
    d3 = (scalar_reference(b + eps)[1] - 2 * d1 + scalar_reference(b - eps)[1]) / eps ** 2
    got = jax.jit(lambda b: (jax.grad(new)(b), jax.jvp(new, (b,), (1.0,))[1],
                             jax.grad(jax.grad(new))(b), jax.jacfwd(jax.grad(new))(b),
                             jax.jacfwd(jax.jacfwd(new))(b),
                             jax.grad(jax.grad(jax.grad(new)))(b)))(bf)
    np.testing.assert_allclose([float(got[0]), float(got[1])], [d1, d1], rtol=1e-5)
    np.testing.assert_allclose([float(g) for g in got[2:5]], [d2] * 3, rtol=1e-3)
    np.testing.assert_allclose(float(got[5]), d3, rtol=2e-2)


def test_vmap_of_grad_and_forward_mode_of_the_rewritten_loop():
    bs = jnp.array([0.2, 0.5, 0.7], jnp.float32)
    _, new, _ = rewrite_with_stats(scalar_fixed_point, jnp.float32(0.5))
    want = [scalar_reference(float(b))[1] for b in bs]
    np.testing.assert_allclose(np.asarray(jax.jit(jax.vmap(jax.grad(new)))(bs)), want, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(jax.jit(jax.vmap(jax.jacfwd(new)))(bs)), want,
                               rtol=1e-5)


def test_rewrite_is_idempotent_and_programs_are_first_order():
    theta = jnp.asarray(THETA)
    _, new, _ = rewrite_with_stats(previous_carry, theta)
    again = run_passes(new, "implicit-diff")
    assert str(again) == str(new)
    assert any(e.prim.name == "custom_jvp_call" for _, e in new.body.walk())


# ----------------------------------- adversarial findings (issue 16, round 2)
# References: JAX's forward mode through the original while_loop, or float64
# values written out here.  The rewritten rule checks at run time that the loop
# stopped at a fixed point; when it did not, it must give the loop's own
# derivative (JAX's), never the implicit one.
def capped_divergent(a):
    """x <- 2x + a with an iteration cap: never converges; the cap stops it."""
    def c(s):
        k, xp, x = s
        return (jnp.abs(x - xp) > 1e-6) & (k < 10)

    def b(s):
        k, xp, x = s
        return k + 1, x, 2.0 * x + a

    return lax.while_loop(c, b, (0, a, 3.0 * a))[2]


def capped_divergent_vector(a):
    def c(s):
        k, xp, x = s
        return (jnp.max(jnp.abs(x - xp)) > 1e-6) & (k < 10)

    def b(s):
        k, xp, x = s
        return k + 1, x, 2.0 * x + a

    return lax.while_loop(c, b, (0, a, 3.0 * a))[2]


def relative_no_fixed_point(a):
    """x <- x + a has no fixed point; a relative test stops it (I - df/dx = 0)."""
    def c(s):
        xp, x = s
        return jnp.abs(x - xp) > 0.1 * jnp.abs(x)

    def b(s):
        xp, x = s
        return x, x + a

    return lax.while_loop(c, b, (jnp.float32(0.0), a))[1]


def never_runs(a):
    """The carried gap starts at 0: the loop never runs, the result is the guess."""
    def c(s):
        return s[1] > 1e-6

    def b(s):
        x, _ = s
        n = 0.5 * x + a
        return n, jnp.abs(n - x)

    return lax.while_loop(c, b, (a, jnp.float32(0.0)))[0]


def converged_with_cap(a):
    def c(s):
        k, xp, x = s
        return (jnp.max(jnp.abs(x - xp)) > 1e-6) & (k < 500)

    def b(s):
        k, xp, x = s
        return k + 1, x, 0.5 * x + a

    return lax.while_loop(c, b, (0, jnp.zeros_like(a), a))[2]


def test_a_relative_test_is_not_a_convergence_test():
    # It also stops x <- x + a, which has no fixed point: left alone, with a reason.
    a = jnp.float32(1.0)
    _, new, stats = rewrite_with_stats(relative_no_fixed_point, a)
    assert "loops-rewritten" not in stats
    assert "not a loop-invariant tolerance" in reasons(stats)
    want = float(jax.jvp(relative_no_fixed_point, (a,), (jnp.float32(1.0),))[1])
    assert float(jax.jvp(new, (a,), (jnp.float32(1.0),))[1]) == want


@pytest.mark.parametrize("fun", [capped_divergent, never_runs])
def test_loop_that_did_not_reach_a_fixed_point_keeps_jax_derivative(fun):
    a = jnp.float32(1.0)
    _, new, stats = rewrite_with_stats(fun, a)
    assert stats["loops-rewritten"] == 1
    want = float(jax.jvp(fun, (a,), (jnp.float32(1.0),))[1])
    assert float(jax.jvp(new, (a,), (jnp.float32(1.0),))[1]) == pytest.approx(want, rel=1e-6)
    assert float(jax.jit(jax.grad(new))(a)) == pytest.approx(want, rel=1e-6)
    assert float(jax.jit(jax.jacfwd(new))(a)) == pytest.approx(want, rel=1e-6)


def test_converged_loop_with_cap_is_implicit():
    a = jnp.array([0.3, -0.7], jnp.float32)
    _, new, stats = rewrite_with_stats(converged_with_cap, a)
    assert stats["loops-rewritten"] == 1
    # x* = 2a exactly: d x*/da = 2 I.
    np.testing.assert_allclose(np.asarray(jax.jacrev(new)(a)), 2.0 * np.eye(2), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(jax.jacfwd(new)(a)), 2.0 * np.eye(2), rtol=1e-6)


def test_too_many_parameters_for_the_fallback_give_nan_not_a_wrong_number():
    # Reverse mode would need the loop's Jacobian (too large) or its iterates:
    # NaN.  Forward mode runs through the iterations along the tangent: JAX's.
    a = jnp.full((8,), 1.0, jnp.float32)
    pm = PassManager("implicit-diff{fallback-max-size=4}")
    fun = lambda a: jnp.sum(capped_divergent_vector(a))  # noqa: E731
    new = pm.run(jaxpr_cc.trace(fun, a))
    assert dict(pm.statistics)["implicit-diff{fallback-max-size=4}"]["loops-rewritten"] == 1
    assert np.all(np.isnan(np.asarray(jax.grad(new)(a))))
    t = jnp.ones_like(a)
    assert float(jax.jvp(new, (a,), (t,))[1]) == float(jax.jvp(fun, (a,), (t,))[1])


def _loop_with_test(cond, update, a):
    def c(s):
        xp, x = s
        return cond(x, xp)

    def b(s):
        xp, x = s
        return x, update(x, a)

    return jnp.sum(lax.while_loop(c, b, (jnp.zeros_like(a), a))[1])


_NOT_SIZES = {
    # -|d| > -1 runs while |d| < 1: a growth loop.
    "neg": (lambda x, xp: -jnp.abs(x - xp) > -1.0, lambda x, a: 1.5 * x + a, 0.1, "neg"),
    "pow-1": (lambda x, xp: jnp.abs(x - xp) ** -1.0 > 1.0, lambda x, a: 1.5 * x + a, 0.1, "pow"),
    "mul-neg": (lambda x, xp: jnp.abs(x - xp) * -2.0 > -2.0, lambda x, a: 1.5 * x + a, 0.1,
                "mul"),
    "argmax": (lambda x, xp: jnp.argmax(jnp.abs(x - xp)) != 0, lambda x, a: 0.5 * x + a,
               [1.0, 0.5], "argmax"),
    "int-cast": (lambda x, xp: jnp.any(x.astype(jnp.int32) != xp.astype(jnp.int32)),
                 lambda x, a: 0.5 * x + a, [3.0, 0.5], "not its change"),
    # |d| - 1 > -0.5 runs while |d| > 0.5 only: a shifted size is no bound on it.
    "add-neg": (lambda x, xp: jnp.max(jnp.abs(x - xp)) + -1.0 > -0.5,
                lambda x, a: 1.5 * x + a, 0.1, "add"),
}


@pytest.mark.parametrize("name", sorted(_NOT_SIZES))
def test_exit_tests_that_are_not_sizes_of_the_change_are_left_alone(name):
    cond, update, a, op = _NOT_SIZES[name]
    a = jnp.asarray(a, jnp.float32)

    def fun(a):
        return _loop_with_test(cond, update, a)

    program, new, stats = rewrite_with_stats(fun, a)
    assert "loops-rewritten" not in stats, name
    assert (f"'{op}'" if op[0] != "n" else op) in reasons(stats)
    np.testing.assert_array_equal(np.asarray(jax.jacfwd(new)(a)), np.asarray(jax.jacfwd(fun)(a)))


def test_positive_scaling_and_squared_norm_are_still_sizes():
    def rel(x, xp):
        return jnp.abs(x - xp) / 4.0 * 2.0 > 1e-6

    def norm2(x, xp):
        d = x - xp
        return jnp.dot(d, d) > 1e-12

    a = jnp.array([0.3, -0.7], jnp.float32)
    for cond in (lambda x, xp: jnp.any(rel(x, xp)), norm2):
        def fun(a):
            return _loop_with_test(cond, lambda x, a: 0.5 * x + a, a)

        _, new, stats = rewrite_with_stats(fun, a)
        assert stats["loops-rewritten"] == 1
        np.testing.assert_allclose(np.asarray(jax.grad(new)(a)), [2.0, 2.0], rtol=1e-5)


@pytest.mark.parametrize("size", ["inf_norm", "max_with_floor", "plus_offset"])
def test_a_size_with_a_floor_or_offset_is_still_a_size(size):
    # jnp.linalg.norm(d, ord=inf) is max(0, max|d|): any bound on it bounds |d|.
    cond = {"inf_norm": lambda x, xp: jnp.linalg.norm(x - xp, ord=jnp.inf) > 1e-6,
            "max_with_floor": lambda x, xp: jnp.maximum(jnp.max(jnp.abs(x - xp)), -3.0) > 1e-6,
            "plus_offset": lambda x, xp: jnp.sum(jnp.abs(x - xp)) + 1e-7 > 2e-6}[size]
    a = jnp.array([0.3, -0.7], jnp.float32)

    def fun(a):
        return _loop_with_test(cond, lambda x, a: 0.5 * x + a, a)

    _, new, stats = rewrite_with_stats(fun, a)
    assert stats["loops-rewritten"] == 1
    # x = 0.5 x + a converges to 2 a: d sum(x) / da = [2, 2].
    np.testing.assert_allclose(np.asarray(jax.grad(new)(a)), [2.0, 2.0], rtol=1e-5)


def gap_returned(a):
    def c(s):
        return s[1] > 1e-3

    def b(s):
        x, _ = s
        n = 0.9 * x + a
        return n, jnp.abs(n - x)

    r = lax.while_loop(c, b, (a, jnp.float32(jnp.inf)))
    return r[0] + 1000.0 * r[1]


def previous_returned(a):
    def c(s):
        xp, x = s
        return jnp.abs(x - xp) > 1e-2

    def b(s):
        xp, x = s
        return x, 0.5 * x + a

    r = lax.while_loop(c, b, (jnp.float32(0.0), a))
    return (r[1] - r[0]) * 1000.0


@pytest.mark.parametrize("fun,what", [(gap_returned, "the convergence gap"),
                                      (previous_returned, "the previous iterate")])
def test_loops_whose_gap_or_previous_iterate_is_used_are_left_alone(fun, what):
    a = jnp.float32(0.7)
    _, new, stats = rewrite_with_stats(fun, a)
    assert "loops-rewritten" not in stats and what in reasons(stats)
    assert float(jax.jacfwd(new)(a)) == float(jax.jacfwd(fun)(a))


def coupled(a):
    """x = 0.5 y + a, y = 0.25 x + 1: y's update reads no parameter."""
    def cond(s):
        xp, yp, x, y = s
        return (jnp.abs(x - xp) > 1e-6) | (jnp.abs(y - yp) > 1e-6)

    def body(s):
        xp, yp, x, y = s
        return x, y, 0.5 * y + a, 0.25 * x + 1.0

    r = lax.while_loop(cond, body, (0.0, 0.0, 1.0, 1.0))
    return r[2] + r[3]


@pytest.mark.parametrize("adjoint", ["dense", "bicgstab"] + [
    pytest.param(a, marks=pytest.mark.heavy) for a in ("gmres", "fixed-point")])
def test_grad_when_a_state_update_reads_no_parameter(adjoint):
    a = jnp.float32(0.7)
    new = run_passes(jaxpr_cc.trace(coupled, a), f"implicit-diff{{adjoint={adjoint}}}")
    # x* = (0.5 + a) / 0.875, y* = 0.25 x* + 1: d(x* + y*)/da = 1.25 / 0.875.
    assert float(jax.grad(new)(a)) == pytest.approx(1.25 / 0.875, rel=1e-4)
    assert float(jax.jvp(new, (a,), (jnp.float32(1.0),))[1]) == pytest.approx(1.25 / 0.875,
                                                                                rel=1e-4)


@pytest.mark.parametrize("dtype", [jnp.float16, pytest.param(jnp.bfloat16, marks=pytest.mark.heavy)])
def test_half_precision_fixed_point(dtype):
    def f(a):
        def cond(s):
            xp, x = s
            return jnp.max(jnp.abs(x - xp)) > 1e-2

        def body(s):
            xp, x = s
            return x, 0.5 * x + a

        return jnp.sum(lax.while_loop(cond, body, (a, 1.5 * a))[1]).astype(jnp.float32)

    a = jnp.array([1.0, 2.0], dtype)
    _, new, stats = rewrite_with_stats(f, a)
    assert stats["loops-rewritten"] == 1
    # x* = 2a: the gradient of sum(x*) is 2 per element.
    np.testing.assert_allclose(np.asarray(jax.grad(new)(a), np.float32), [2.0, 2.0], rtol=1e-2)
    assert float(jax.jvp(new, (a,), (jnp.ones_like(a),))[1]) == pytest.approx(4.0, rel=1e-2)


@pytest.mark.parametrize("adjoint", ["bicgstab"] + [
    pytest.param(a, marks=pytest.mark.heavy) for a in ("auto", "gmres", "fixed-point")])
def test_mixed_float32_float64_state(adjoint):
    with jax.enable_x64(True):
        def f(a):
            def cond(s):
                xp, yp, x, y = s
                return (jnp.abs(x - xp) > 1e-6) | (jnp.abs(y - yp) > 1e-6)

            def body(s):
                xp, yp, x, y = s
                return (x, y, (0.5 * y + a).astype(jnp.float32),
                        0.25 * x.astype(jnp.float64) + a)

            init = (jnp.float32(0), jnp.float64(0), jnp.float32(1), jnp.float64(1))
            r = lax.while_loop(cond, body, init)
            return r[2].astype(jnp.float64) + r[3]

        a = jnp.float32(0.7)
        new = run_passes(jaxpr_cc.trace(f, a), f"implicit-diff{{adjoint={adjoint}}}")
        # x = 0.5 y + a, y = 0.25 x + a: d(x + y)/da = 2.75 / 0.875.
        assert float(jax.grad(new)(a)) == pytest.approx(2.75 / 0.875, rel=1e-5)


@pytest.mark.parametrize("rtol, rewritten", [(0.0, True), (1e-5, False)], ids=["absolute", "relative"])
def test_allclose_with_a_zero_rtol_is_an_absolute_test(rtol, rewritten):
    """``~allclose(x, prev, rtol=0, atol=tol)`` compares the change with
    ``tol + 0 * |prev|``: absolute, so a convergence test (the product with the
    zero literal read as reading the iterate, and the loop was refused as
    relative); a nonzero rtol stays relative and refused."""
    def fun(theta):
        def keep_going(s):
            x, prev = s
            return ~jnp.allclose(x, prev, rtol=rtol, atol=1e-6)

        def step(s):
            x, _ = s
            return jnp.tanh(A_SMALL @ x + theta), x

        return lax.while_loop(keep_going, step, (jnp.zeros_like(theta), jnp.ones_like(theta)))[0]

    _, _, stats = rewrite_with_stats(fun, jnp.asarray(THETA))
    assert (stats.get("loops-rewritten") == 1) == rewritten, reasons(stats)
    if not rewritten:
        assert "relative test" in reasons(stats)
