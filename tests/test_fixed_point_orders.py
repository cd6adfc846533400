"""The tutorial fixed-point solver to third order, and the size of its printed IR.

References are float64 and never our own output: the fixed-point iteration unrolled
(``lax.fori_loop`` with a static count, well past convergence) and differentiated by
JAX, or JAX's own printed jaxpr for the size.
"""
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_cc
from jaxpr_cc.examples import fixed_point as fp

# ---------------------------------------------------------------- a float64 solver
# The tutorial's solver, iterated until a step is below float64 resolution: its
# derivatives (the user's implicit rule, or forward mode through the loop for a
# closed-over parameter) then agree with the unrolled iteration's to ~1e-10.
TOL = 1e-13
MAX_STEPS = 500


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def solve(f, a, x0):
    def keep_going(carry):
        k, prev, x = carry
        return (k < MAX_STEPS) & (jnp.abs(prev - x) > TOL)

    def step(carry):
        k, _, x = carry
        return k + 1, x, f(a, x)

    return jax.lax.while_loop(keep_going, step, (0, x0, f(a, x0)))[2]


def _solve_fwd(f, a, x0):
    x_star = solve(f, a, x0)  # the fwd calls the solver itself, as the tutorial's does
    return x_star, (a, x_star)


def _solve_bwd(f, residuals, x_star_bar):
    a, x_star = residuals
    _, vjp_a = jax.vjp(lambda a_: f(a_, x_star), a)
    _, vjp_x = jax.vjp(lambda x_: f(a, x_), x_star)
    w = solve(lambda _, u: x_star_bar + vjp_x(u)[0], a, x_star_bar)
    (a_bar,) = vjp_a(w)
    return a_bar, jnp.zeros_like(x_star)


solve.defvjp(_solve_fwd, _solve_bwd)


def unrolled(f, a, x0, steps=120):
    return jax.lax.fori_loop(0, steps, lambda _, x: f(a, x), x0)


# x = cos(b x) + b/2: the update closes over b (b is not an argument of the solver).
def closed_over(b):
    return solve(lambda _, x: jnp.cos(b * x) + 0.5 * b, jnp.zeros_like(b), jnp.zeros_like(b))


def closed_over_unrolled(b):
    return unrolled(lambda _, x: jnp.cos(b * x) + 0.5 * b, None, jnp.zeros_like(b))


# x = (x + a/x) / 2: a is the solver's explicit argument.
def newton(a):
    return solve(lambda a_, x: 0.5 * (x + a_ / x), a, a)


def newton_unrolled(a):
    return unrolled(lambda a_, x: 0.5 * (x + a_ / x), a, a)


# A fixed point whose update calls the same solver: y = sin(y)/2 + 0.3 z(y) + b/10,
# with z(y) the fixed point of z = cos(b z)/2 + y/5.  Both updates close over b.
def nested(b):
    def inner(y):
        return solve(lambda _, z: 0.5 * jnp.cos(b * z) + 0.2 * y, jnp.zeros_like(b), y)
    return solve(lambda _, y: 0.5 * jnp.sin(y) + 0.3 * inner(y) + 0.1 * b,
                 jnp.zeros_like(b), jnp.zeros_like(b))


def nested_unrolled(b):
    def inner(y):
        return unrolled(lambda _, z: 0.5 * jnp.cos(b * z) + 0.2 * y, None, y, steps=80)
    return unrolled(lambda _, y: 0.5 * jnp.sin(y) + 0.3 * inner(y) + 0.1 * b, None,
                    jnp.zeros_like(b), steps=80)


CASES = {"explicit_argument": (newton, newton_unrolled, 2.0),
         "closed_over_parameter": (closed_over, closed_over_unrolled, 0.7),
         "nested_same_solver": (nested, nested_unrolled, 0.6)}
COMPOSITIONS = {"grad3": (jax.grad,) * 3,
                "jacfwd3": (jax.jacfwd,) * 3,
                "grad_jacfwd_grad": (jax.grad, jax.jacfwd, jax.grad)}


def _derivative(f, ops):
    for op in ops:
        f = op(f)
    return f


def _wrap(kind, fn, x):
    return jaxpr_cc.trace(fn, x) if kind == "trace" else jaxpr_cc.jit(fn)


# The highest order checked by the sweep (the nested solver's third derivative has
# its own test below: it is the slowest).
MAX_ORDER = {"explicit_argument": 3, "closed_over_parameter": 3, "nested_same_solver": 2}
KINDS = ["trace", pytest.param("jit", marks=pytest.mark.heavy)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.heavy)  # ~30 s
                                  if c == "nested_same_solver" else c for c in sorted(CASES)])
def test_derivatives_match_the_unrolled_iteration(case, kind):
    fn, reference, x = CASES[case]
    with jax.enable_x64(True):
        x = jnp.float64(x)
        program = _wrap(kind, fn, x)
        got, want = program, reference
        for order in range(MAX_ORDER[case] + 1):
            np.testing.assert_allclose(float(got(x)), float(want(x)), rtol=1e-6, atol=1e-12,
                                       err_msg=f"order {order}")
            got, want = jax.grad(got), jax.grad(want)


@pytest.mark.heavy  # about 90 s: three reverse orders through two nested solvers
def test_nested_same_solver_third_derivative():
    with jax.enable_x64(True):
        x = jnp.float64(0.6)
        program = jaxpr_cc.trace(nested, x)
        got = jax.grad(jax.grad(jax.grad(program)))(x)
        want = jax.grad(jax.grad(jax.grad(nested_unrolled)))(x)
        np.testing.assert_allclose(float(got), float(want), rtol=1e-6)


@pytest.mark.parametrize("composition", ["jacfwd3", "grad_jacfwd_grad"])
def test_third_derivative_wrt_a_closed_over_parameter_in_forward_mode_too(composition):
    ops = COMPOSITIONS[composition]
    with jax.enable_x64(True):
        x = jnp.float64(0.7)
        program = jaxpr_cc.trace(closed_over, x)
        np.testing.assert_allclose(float(_derivative(program, ops)(x)),
                                   float(_derivative(closed_over_unrolled, ops)(x)), rtol=1e-6)


@pytest.mark.heavy  # third order through float32 loops (~15 s); orders one and two stay default
def test_the_float32_example_solver_to_third_order():
    # jaxpr_cc.examples.fixed_point: float32, stops at steps below 1e-6.  With the
    # explicit argument the derivatives are the user's implicit rule at every order.
    program = jaxpr_cc.trace(fp.newton_sqrt, 2.0)
    with jax.enable_x64(True):
        a = jnp.float64(2.0)
        want = [newton_unrolled(a), jax.grad(newton_unrolled)(a),
                jax.grad(jax.grad(newton_unrolled))(a),
                jax.grad(jax.grad(jax.grad(newton_unrolled)))(a)]
    got, g = [], program
    for _ in range(4):
        got.append(g(2.0))
        g = jax.grad(g)
    np.testing.assert_allclose(np.array(got, np.float64), np.array(want), rtol=1e-5)


# ---------------------------------------------------------------- printed size
@jax.custom_vjp
def sin_times(x):
    return jnp.sin(x) * x


def _sin_times_fwd(x):
    return sin_times(x), x  # the usual custom_vjp whose fwd calls the function


def _sin_times_bwd(x, ct):
    return ((jnp.cos(x) * x + jnp.sin(x)) * ct,)


sin_times.defvjp(_sin_times_fwd, _sin_times_bwd)

# name: (function, argument, float64 reference for its second derivative, rtol).  The
# float32 example stops at steps below 1e-6: its loop derivative w.r.t. the
# closed-over b is that close to the converged one.
PRINTED = {"tutorial_newton_sqrt": (fp.newton_sqrt, 2.0, newton_unrolled, 1e-5),
           "closed_over_fixed_point": (fp.solve_closed_over, 0.7, closed_over_unrolled, 1e-2),
           "fwd_calls_f": (sin_times, 0.7, sin_times, 1e-5)}


@pytest.mark.parametrize("name", sorted(PRINTED))
def test_printed_ir_is_at_most_four_times_jaxs_printed_jaxpr(name, tmp_path):
    fn, x, reference, rtol = PRINTED[name]
    x = np.float32(x)
    program = jaxpr_cc.trace(fn, x)
    ours, theirs = len(str(program)), len(str(jax.make_jaxpr(fn)(x)))
    assert ours <= 4 * theirs, (name, ours, theirs, ours / theirs)
    # Nothing the round trip needs went with the dead rule code.
    path = tmp_path / "p.jcc"
    jaxpr_cc.save(program, path)
    with jax.enable_x64(True):
        want = float(jax.grad(jax.grad(reference))(jnp.float64(x)))
    for candidate in (program, jaxpr_cc.load(path)):
        np.testing.assert_allclose(float(jax.grad(jax.grad(candidate))(x)), want, rtol=rtol)
