"""Forward mode through bwd rules that run while_loops on the cotangent (issue 17).

A loop whose stopping test reads its linear carries is a linear map only as the
limit of its iteration, and only when that test is a convergence test.  Each
case is checked against JAX's own reverse mode (the user's bwd, run by
``jax.jacrev`` of the original function) or refused in one line:

- a Neumann series summed until its term is small: the accumulator's start
  matters (its cotangent is the transposed iterate at the limit, not zero);
- a test that is not a convergence test (a scale-invariant ``|s| > 0.3 |g|``,
  a threshold ``|s| > 1``) makes the trip count depend on the cotangent: refused;
- ``jax.scipy.sparse.linalg.cg`` in a bwd: its ``device_put`` of ``(b, x0)``
  moves each operand separately, so the solve's start is not linear;
- a relative tolerance ``|dx| > rtol (1 + |x|)`` is a convergence test here
  (the transposed iteration checks that a limit exists: none gives NaN);
- an iteration cap that stops the loop makes it a counted loop: the exact
  transpose of the steps it ran, not the limit;
- a loop whose previous-iterate carry starts equal to its iterate never runs:
  refused rather than transposed as a limit.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxpr_cc
from jaxpr_cc.jax_adapter import ForwardModeRefusedError



@pytest.fixture(autouse=True)
def _x64():
    with jax.enable_x64(True):
        yield


X = np.array([0.3, -0.7])
A = np.array([[0.3, 0.1], [-0.2, 0.4]])


def _sin_with_bwd(bwd):
    @jax.custom_vjp
    def f(x):
        return jnp.sin(x)

    f.defvjp(lambda x: (jnp.sin(x), jnp.cos(x)), bwd)
    return f


def _neumann_bwd(c, g):
    def body(t):
        term, acc = t
        term = A @ term
        return term, acc + term
    _, acc = lax.while_loop(lambda t: jnp.linalg.norm(t[0]) > 1e-12, body, (c * g, c * g))
    return (acc,)


def test_neumann_series_bwd_keeps_the_start_of_its_accumulator():
    f = _sin_with_bwd(_neumann_bwd)
    want = jax.jacrev(f)(X)  # JAX runs the user's bwd
    np.testing.assert_allclose(jax.jacfwd(jaxpr_cc.jit(f))(X), want, rtol=1e-9)
    np.testing.assert_allclose(jax.jacrev(jaxpr_cc.jit(f))(X), want, rtol=1e-12)
    # Closed form: the bwd is g -> (I - A)^-1 diag(cos x) g; the Jacobian is its transpose.
    direct = (np.linalg.inv(np.eye(2) - np.asarray(A)) @ np.diag(np.cos(np.asarray(X)))).T
    np.testing.assert_allclose(want, direct, rtol=1e-9)


@pytest.mark.parametrize("stop, what", [
    (lambda t: jnp.abs(t[0]) > 0.3 * jnp.abs(t[1]), "scale-invariant test of the value"),
    (lambda t: jnp.abs(t[0]) > 1.0, "threshold on the value"),
], ids=["relative-value", "threshold"])
def test_a_loop_stopping_on_the_value_of_the_cotangent_is_refused(stop, what):
    def bwd(c, g):
        s, _ = lax.while_loop(stop, lambda t: (0.5 * t[0], t[1]), (c * g, c * g))
        return (s,)
    f = _sin_with_bwd(bwd)
    x = 0.3
    with pytest.raises(ForwardModeRefusedError, match="not a convergence test") as info:
        jax.jacfwd(jaxpr_cc.jit(f))(x)
    assert "\n" not in str(info.value).split("--------------------")[0].strip()
    # Reverse mode keeps the user's bwd: JAX's numbers.
    np.testing.assert_allclose(jax.jacrev(jaxpr_cc.jit(f))(x), jax.jacrev(f)(x), rtol=1e-12)


def test_conjugate_gradients_in_a_bwd_is_transposed():
    def bwd(c, g):
        m = 2.0 * jnp.eye(2) + jnp.outer(c, c)
        return (jax.scipy.sparse.linalg.cg(lambda v: m @ v, g, tol=1e-14)[0],)
    f = _sin_with_bwd(bwd)
    want = jax.jacrev(f)(X)
    np.testing.assert_allclose(jax.jacfwd(jaxpr_cc.jit(f))(X), want, rtol=1e-9)
    c = np.cos(np.asarray(X))
    np.testing.assert_allclose(want, np.linalg.inv(2 * np.eye(2) + np.outer(c, c)), rtol=1e-9)


def _relative_fixed_point_bwd(rtol, contraction):
    def bwd(c, g):
        def body(t):
            _, x = t
            return x, contraction * x + c * g
        def cond(t):
            prev, x = t
            return jnp.max(jnp.abs(x - prev)) > rtol * (1.0 + jnp.max(jnp.abs(x)))
        _, x = lax.while_loop(cond, body, (jnp.zeros_like(g), c * g))
        return (x,)
    return bwd


def test_a_relative_tolerance_is_a_convergence_test():
    f = _sin_with_bwd(_relative_fixed_point_bwd(1e-13, 0.5))
    want = jax.jacrev(f)(X)
    np.testing.assert_allclose(want, np.diag(2 * np.cos(np.asarray(X))), rtol=1e-10)
    np.testing.assert_allclose(jax.jacfwd(jaxpr_cc.jit(f))(X), want, rtol=1e-10)


def test_an_oscillation_stopped_by_its_cap_is_the_exact_transpose():
    # x <- -x + c g never converges, and its relative test is never met: the
    # cap (k < 50) stops it after 50 steps, at x = c g.  Exactly linear.
    def bwd(c, g):
        def body(t):
            k, _, x = t
            return k + 1, x, -x + c * g
        def cond(t):
            k, prev, x = t
            return (jnp.max(jnp.abs(x - prev)) > 1e-9 * (1.0 + jnp.max(jnp.abs(x)))) & (k < 50)
        _, _, x = lax.while_loop(cond, body, (0, jnp.zeros_like(g), c * g))
        return (x,)
    f = _sin_with_bwd(bwd)
    want = jax.jacrev(f)(X)
    np.testing.assert_allclose(want, np.diag(np.cos(np.asarray(X))), rtol=1e-12)
    np.testing.assert_allclose(jax.jacfwd(jaxpr_cc.jit(f))(X), want, rtol=1e-12)


def test_an_iteration_without_a_limit_gives_nan():
    # x <- x + c g grows until |dx| < 1e-3 (1 + |x|) stops it (about 1000
    # steps); the iteration has no limit, so forward mode has nothing to
    # transpose: NaN after the transposed iteration's step budget, not a number.
    def bwd(c, g):
        def body(t):
            _, x = t
            return x, x + c * g
        def cond(t):
            prev, x = t
            return jnp.max(jnp.abs(x - prev)) > 1e-3 * (1.0 + jnp.max(jnp.abs(x)))
        _, x = lax.while_loop(cond, body, (jnp.zeros_like(g), c * g))
        return (x,)
    f = _sin_with_bwd(bwd)
    assert np.all(np.isfinite(np.asarray(jax.jacrev(f)(X))))
    assert np.all(np.isnan(np.asarray(jax.jacfwd(jaxpr_cc.jit(f))(X))))


def _capped_contraction_bwd(cap, tol=1e-12):
    def bwd(c, g):
        def body(t):
            k, _, x = t
            return k + 1, x, 0.9 * x + c * g
        def cond(t):
            k, prev, x = t
            return (jnp.max(jnp.abs(x - prev)) > tol) & (k < cap)
        _, _, x = lax.while_loop(cond, body, (0, jnp.zeros_like(g), c * g))
        return (x,)
    return bwd


@pytest.mark.parametrize("cap", [0, 1, 5, 40])
def test_an_iteration_cap_that_stops_the_loop_is_the_exact_transpose(cap):
    # x_k = 0.9^k c g + sum_{j<k} 0.9^j c g stops at the cap long before the
    # change reaches 1e-12: the bwd is exactly the k-step map, whose Jacobian
    # jacfwd must give (not the limit 10 c).
    f = _sin_with_bwd(_capped_contraction_bwd(cap))
    want = jax.jacrev(f)(X)
    factor = 0.9 ** cap + sum(0.9 ** j for j in range(cap))
    np.testing.assert_allclose(want, np.diag(factor * np.cos(np.asarray(X))), rtol=1e-12)
    np.testing.assert_allclose(jax.jacfwd(jaxpr_cc.jit(f))(X), want, rtol=1e-12)
    np.testing.assert_allclose(jax.jvp(jaxpr_cc.jit(f), (X,), (jnp.ones(2),))[1],
                               want @ np.ones(2), rtol=1e-12)


def test_a_cap_that_convergence_beats_gives_the_limit():
    f = _sin_with_bwd(_capped_contraction_bwd(10_000, tol=1e-14))
    want = jax.jacrev(f)(X)
    np.testing.assert_allclose(want, np.diag(10 * np.cos(np.asarray(X))), rtol=1e-12)
    np.testing.assert_allclose(jax.jacfwd(jaxpr_cc.jit(f))(X), want, rtol=1e-12)


def _starts(same):
    """(prev, x) starting equal: one variable, or equal values built apart."""
    return {"one variable": lambda c, g: (c * g, c * g),
            "commuted product": lambda c, g: (g * c, c * g),
            "plus zero": lambda c, g: (c * g + 0.0, c * g),
            "times one": lambda c, g: (1.0 * (c * g), c * g)}[same]


@pytest.mark.parametrize("same", ["one variable", "commuted product", "plus zero", "times one"])
def test_a_loop_whose_previous_iterate_starts_equal_is_refused(same):
    # (prev, x) = (c g, c g): the change test is met at once, the bwd returns
    # its start c g; the limit would be 2 c g.  Refused, not the limit, also
    # when the two starts are equal values built by different equations.
    def bwd(c, g):
        def body(t):
            _, x = t
            return x, 0.5 * x + c * g
        _, x = lax.while_loop(lambda t: jnp.max(jnp.abs(t[1] - t[0])) > 1e-12, body,
                              _starts(same)(c, g))
        return (x,)
    f = _sin_with_bwd(bwd)
    with pytest.raises(ForwardModeRefusedError, match="starts equal to carry"):
        jax.jacfwd(jaxpr_cc.jit(f))(X)
    np.testing.assert_allclose(jax.jacrev(jaxpr_cc.jit(f))(X), jax.jacrev(f)(X), rtol=1e-15)


def test_a_slow_contraction_reaches_its_limit():
    # Rate 1 - 1e-4: about 4e5 transposed steps to settle in float64.
    def bwd(c, g):
        def body(t):
            _, x = t
            return x, (1 - 1e-4) * x + c * g
        _, x = lax.while_loop(lambda t: jnp.max(jnp.abs(t[1] - t[0])) > 1e-9, body,
                              (jnp.zeros_like(g), c * g))
        return (x,)
    f = _sin_with_bwd(bwd)
    limit = np.diag(1e4 * np.cos(np.asarray(X)))  # c / (1 - rate)
    np.testing.assert_allclose(jax.jacrev(f)(X), limit, rtol=1e-4)  # the user's tolerance
    np.testing.assert_allclose(jax.jacfwd(jaxpr_cc.jit(f))(X), limit, rtol=1e-10)


@pytest.mark.parametrize("carried", ["gap", "flag"])
def test_a_convergence_gap_the_body_carries_is_read_as_the_test(carried):
    # The body carries max|x_new - x| (or the flag "it is still > tol"): a
    # nonlinear function of the cotangent that only the stopping test reads.
    def bwd(c, g):
        b = c * g
        def body(t):
            _, x = t
            xn = 0.5 * x + b
            gap = jnp.max(jnp.abs(xn - x))
            return (gap if carried == "gap" else gap > 1e-13), xn
        start = jnp.inf if carried == "gap" else True
        cond = (lambda t: t[0] > 1e-13) if carried == "gap" else (lambda t: t[0])
        _, x = lax.while_loop(cond, body, (start, b))
        return (x,)
    f = _sin_with_bwd(bwd)
    want = jax.jacrev(f)(X)
    np.testing.assert_allclose(want, np.diag(2 * np.cos(np.asarray(X))), rtol=1e-12)
    np.testing.assert_allclose(jax.jacfwd(jaxpr_cc.jit(f))(X), want, rtol=1e-12)


def test_a_carried_value_of_the_cotangent_tested_by_the_loop_is_refused():
    # The body carries |x| itself (not a change) and the loop runs while it is
    # above 1: the trip count depends on the cotangent's size.
    def bwd(c, g):
        def body(t):
            _, x = t
            x = 0.5 * x
            return jnp.max(jnp.abs(x)), x
        _, x = lax.while_loop(lambda t: t[0] > 1.0, body, (jnp.inf, c * g))
        return (x,)
    f = _sin_with_bwd(bwd)
    with pytest.raises(ForwardModeRefusedError, match="not a convergence test"):
        jax.jacfwd(jaxpr_cc.jit(f))(X)


def test_a_residual_test_whose_map_reads_the_cotangent():
    # while |x - T(x)| > tol: x = T(x), with T(x) = 0.5 x + c g: the stopping
    # test reads the cotangent through T's constant c g, as a residual.
    def bwd(c, g):
        b = c * g
        def T(x):
            return 0.5 * x + b
        return (lax.while_loop(lambda x: jnp.max(jnp.abs(x - T(x))) > 1e-13, T, b),)
    f = _sin_with_bwd(bwd)
    want = jax.jacrev(f)(X)
    np.testing.assert_allclose(want, np.diag(2 * np.cos(np.asarray(X))), rtol=1e-12)
    np.testing.assert_allclose(jax.jacfwd(jaxpr_cc.jit(f))(X), want, rtol=1e-12)


def test_a_threshold_on_a_value_read_through_the_tests_constants_is_refused():
    # while |x| > |c g| / 8: x = x / 2 -- a scale-invariant value test, not
    # a residual: refused.
    def bwd(c, g):
        b = c * g
        return (lax.while_loop(lambda x: jnp.max(jnp.abs(x)) > jnp.max(jnp.abs(b)) / 8,
                               lambda x: 0.5 * x, b),)
    f = _sin_with_bwd(bwd)
    with pytest.raises(ForwardModeRefusedError, match="linear input"):
        jax.jacfwd(jaxpr_cc.jit(f))(X)


@pytest.mark.parametrize("counter", ["moves", "patience"])
def test_a_counter_computed_from_the_cotangent_is_not_a_cap(counter):
    # k counts steps that moved (or small steps): it is not the iteration count,
    # and the loop stops where its limit does not.  Refused.
    def bwd(c, g):
        def body(t):
            k, _, x = t
            xn = 0.5 * x + c * g
            step = jnp.max(jnp.abs(xn - x))
            k = k + (step > 0 if counter == "moves" else step < 1e-3).astype(k.dtype)
            return k, x, xn
        def cond(t):
            k, prev, x = t
            return (jnp.max(jnp.abs(x - prev)) > 1e-14) & (k < 3)
        _, _, x = lax.while_loop(cond, body, (0, jnp.zeros_like(g), c * g))
        return (x,)
    f = _sin_with_bwd(bwd)
    with pytest.raises(ForwardModeRefusedError, match="as an iteration count, is computed"):
        jax.jacfwd(jaxpr_cc.jit(f))(X)
    np.testing.assert_allclose(jax.jacrev(jaxpr_cc.jit(f))(X), jax.jacrev(f)(X), rtol=1e-15)


def test_a_tolerance_that_changes_with_the_count_is_refused():
    # |dx| > where(k < 3, 1e-14, inf): a cap written through the tolerance.
    def bwd(c, g):
        def body(t):
            k, _, x = t
            return k + 1, x, 0.5 * x + c * g
        def cond(t):
            k, prev, x = t
            return jnp.max(jnp.abs(x - prev)) > jnp.where(k < 3, 1e-14, jnp.inf)
        _, _, x = lax.while_loop(cond, body, (0, jnp.zeros_like(g), c * g))
        return (x,)
    f = _sin_with_bwd(bwd)
    with pytest.raises(ForwardModeRefusedError, match="tolerance changes with the iteration"):
        jax.jacfwd(jaxpr_cc.jit(f))(X)


def test_caps_that_differ_between_lanes_of_a_vmapped_loop_give_nan():
    # The bwd loop is batched by jax.vmap inside the program, with a cap per
    # lane (2 and 7 steps): its lanes share one transposed iteration, which
    # cannot stop each lane at its own cap, so forward mode gives NaN rather
    # than another map's transpose.  One call per lane is exact.
    rot = np.array([[0.0, -0.9], [0.9, 0.0]])

    @jax.custom_vjp
    def f(x, n):
        return jnp.sin(x)

    def bwd(res, g):
        c, n = res
        def cond(s):
            xp, x, k = s
            return (jnp.max(jnp.abs(x - xp)) > 1e-14) & (k < n)
        def body(s):
            xp, x, k = s
            return x, rot @ x + c * g, k + 1
        _, x, _ = lax.while_loop(cond, body, (jnp.zeros_like(g), c * g, jnp.int32(0)))
        return x, None
    f.defvjp(lambda x, n: (jnp.sin(x), (jnp.cos(x), n)), bwd)
    xs = np.array([[0.3, -0.7], [0.1, 0.2]])
    caps = jnp.array([2, 7], dtype=jnp.int32)
    want = jax.jacrev(lambda xs: jax.vmap(f)(xs, caps))(xs)
    got = jax.jacfwd(jaxpr_cc.jit(lambda xs: jax.vmap(f)(xs, caps)))(xs)
    assert np.all(np.isnan(np.asarray(got)))
    per_lane = jax.jacfwd(jaxpr_cc.jit(lambda xs: jnp.stack([f(xs[0], 2), f(xs[1], 7)])))(xs)
    np.testing.assert_allclose(per_lane, want, rtol=1e-10)


@pytest.mark.parametrize("carried", ["gap", "flag"])
def test_a_gap_or_flag_that_starts_converged_is_refused(carried):
    # The carried gap starts at 0 (or the flag at False): the loop never runs
    # and returns its start c g, not its limit.  Refused.
    def bwd(c, g):
        def body(t):
            x, _ = t
            xn = 0.5 * x + c * g
            gap = jnp.max(jnp.abs(xn - x))
            return xn, (gap if carried == "gap" else gap > 1e-13)
        cond = (lambda t: t[1] > 1e-13) if carried == "gap" else (lambda t: t[1])
        x, _ = lax.while_loop(cond, body, (c * g, 0.0 if carried == "gap" else False))
        return (x,)
    f = _sin_with_bwd(bwd)
    np.testing.assert_allclose(jax.jacrev(f)(X), np.diag(np.cos(X)), rtol=1e-15)
    with pytest.raises(ForwardModeRefusedError, match="already met at the start"):
        jax.jacfwd(jaxpr_cc.jit(f))(X)


def test_stop_gradient_of_the_cotangent_is_the_identity_map():
    # (adv17l) lax.stop_gradient(g) has no transpose rule, but as a map of the
    # cotangent's values it is the identity: jacfwd equals JAX's jacrev.
    f = _sin_with_bwd(lambda c, g: (lax.stop_gradient(g) * c,))
    np.testing.assert_allclose(jax.jacfwd(jaxpr_cc.jit(f))(X), jax.jacrev(f)(X), rtol=1e-15)


_A3 = jnp.array([[0.3, 0.1, 0.0], [0.05, 0.2, 0.1], [0.0, 0.1, 0.25]], jnp.float32)
_K3 = jnp.eye(3) - _A3
_X3 = jnp.array([0.3, 1.7, -2.2], jnp.float32)


def _solve_with_adjoint_loop(start):
    """``K^-1 sin(b)`` whose bwd solves ``K^T u = g`` by ``u <- g + A^T u`` from
    ``start(g) = (u0, previous iterate)``."""
    def adjoint(g):
        return lax.while_loop(lambda s: jnp.max(jnp.abs(s[0] - s[1])) > 1e-7,
                              lambda s: (g + _A3.T @ s[0], s[0]), start(g))[0]

    @jax.custom_vjp
    def f(b):
        return jnp.linalg.solve(_K3, jnp.sin(b))
    f.defvjp(lambda b: (f(b), b), lambda b, g: (jnp.cos(b) * adjoint(g),))
    return f


@pytest.mark.parametrize("start", [
    lambda g: (jnp.zeros_like(g), g),
    lambda g: (jnp.zeros_like(g), jnp.full_like(g, jnp.inf)),
    lambda g: (g, jnp.zeros_like(g)),
], ids=["zero-start-prev-g", "zero-start-prev-inf", "start-g"])
def test_reverse_over_forward_through_an_adjoint_loop_started_at_zero(start):
    # Reverse mode over the transposed loop runs the loop itself on the linear part
    # of its start; at a zero input its test stopped it at once (u0 = 0 beside a
    # previous iterate of g): the gradient was 0, or that of u = g.
    # d/db sum_ij (K^-1 diag(cos b))_ij = -sin(b) * (column sums of K^-1).
    f = _solve_with_adjoint_loop(start)
    want = -np.sin(_X3) * np.linalg.inv(np.asarray(_K3, np.float64)).sum(0)
    got = jax.grad(lambda b: jnp.sum(jax.jacfwd(jaxpr_cc.jit(f))(b)))(_X3)
    np.testing.assert_allclose(got, want, rtol=1e-4)


def test_a_loop_to_convergence_placing_a_constant_beside_the_cotangent_is_refused():
    # where(m, 0.5 u + g, 1.0): affine, yet zero at a zero cotangent (where the
    # loop stops at once), so the check at zero passed it and jacfwd dropped the
    # constant (JAX's jacrev has -0.589 in the last column).
    m = jnp.array([True, True, False])

    @jax.custom_vjp
    def f(x):
        return jnp.sin(x)

    def bwd(c, g):
        def body(s):
            return jnp.where(m, 0.5 * s[0] + g, 1.0), s[0]
        return (lax.while_loop(lambda s: jnp.max(jnp.abs(s[0] - s[1])) > 1e-6, body,
                               (g, 2.0 * g))[0] * c,)
    f.defvjp(lambda x: (jnp.sin(x), jnp.cos(x)), bwd)
    with pytest.raises(ForwardModeRefusedError, match="places a constant beside"):
        jax.jacfwd(jaxpr_cc.jit(f))(_X3)
    np.testing.assert_allclose(jax.jacrev(jaxpr_cc.jit(f))(_X3), jax.jacrev(f)(_X3))


@pytest.mark.parametrize("ord", [jnp.inf, 1, 2])
def test_an_infinity_norm_convergence_test_is_transposed(ord):
    # jnp.linalg.norm(d, ord=inf) is max(0, max|d|): still a size of the change.
    def bwd(c, g):
        def body(t):
            _, u = t
            return u, c * g + A.T @ u
        start = (jnp.full_like(g, jnp.inf), c * g)
        u = lax.while_loop(lambda t: jnp.linalg.norm(t[1] - t[0], ord=ord) > 1e-13, body,
                           start)[1]
        return (u,)

    f = _sin_with_bwd(bwd)
    want = jax.jacrev(f)(X)  # JAX runs the user's bwd
    np.testing.assert_allclose(jax.jacfwd(jaxpr_cc.jit(f))(X), want, rtol=1e-9)
    # Closed form: u = (I - A^T)^-1 diag(cos x) g; the Jacobian is its transpose.
    direct = (np.linalg.inv(np.eye(2) - np.asarray(A).T) @ np.diag(np.cos(np.asarray(X)))).T
    np.testing.assert_allclose(want, direct, rtol=1e-9)
