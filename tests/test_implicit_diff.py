"""``implicit-diff``: fixed-point loops differentiated by the implicit function theorem.

References are independent of the pass: analytic derivatives, an implicit-function
solve written out in float64 numpy, JAX's gradient through an unrolled loop of
enough iterations, and finite differences.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxpr_cc
from jaxpr_cc.golden.corpus import load_corpus
from jaxpr_cc.passes.manager import PassManager, run_passes

from jaxref import assert_trees_equal


# ------------------------------------------------------------ the programs
def fixed_point(f, a, x_guess):
    """The custom_vjp tutorial's solver, without its custom_vjp."""
    def cond_fun(carry):
        x_prev, x = carry
        return jnp.max(jnp.abs(x_prev - x)) > 1e-6

    def body_fun(carry):
        _, x = carry
        return x, f(a, x)

    _, x_star = lax.while_loop(cond_fun, body_fun, (x_guess, f(a, x_guess)))
    return x_star


def newton_sqrt(a):
    return fixed_point(lambda a, x: 0.5 * (x + a / x), a, a)


def newton_sqrt_counted(a):
    """Newton's square root with an iteration counter and an absolute test (a
    relative one is not a convergence test: see test_implicit_diff_i)."""
    def keep_going(state):
        k, prev, cur = state
        gap = jnp.max(jnp.abs(cur - prev))
        return (gap > 1e-5) & (k < 100)

    def step(state):
        k, _, cur = state
        return k + 1, cur, 0.5 * (cur + a / cur)

    _, _, root = lax.while_loop(keep_going, step, (0, a, 0.5 * (a + 1.0)))
    return root


def closed_over(b):
    """x = cos(b x) + b / 2, the update closing over the traced ``b``."""
    return fixed_point(lambda _, x: jnp.cos(b * x) + 0.5 * b, 0.0, jnp.zeros_like(b))


def closed_over_grad(b):
    x = closed_over(b)
    s = jnp.sin(b * x)
    return (-s * x + 0.5) / (1.0 + s * b)


N_BIG = 1000
RNG = np.random.default_rng(0)
A_BIG = RNG.normal(size=(N_BIG, N_BIG)) / np.sqrt(N_BIG)
A_BIG = (0.6 * A_BIG / np.linalg.norm(A_BIG, 2)).astype(np.float32)  # contraction 0.6


def contraction(a_mat, theta, iters=1000, tol=1e-7):
    """x <- tanh(A x + theta) on a 1,000-dimensional state."""
    def keep_going(state):
        k, x, gap = state
        return (k < iters) & (gap > tol)

    def step(state):
        k, x, _ = state
        new = jnp.tanh(a_mat @ x + theta)
        return k + 1, new, jnp.max(jnp.abs(new - x))

    _, x, _ = lax.while_loop(keep_going, step, (0, jnp.zeros_like(theta), jnp.float32(jnp.inf)))
    return x


def contraction_loss(a_mat, theta):
    x = contraction(a_mat, theta)
    return jnp.sum(x * jnp.cos(jnp.arange(x.shape[0], dtype=x.dtype)))


def contraction_reference_grads(a_mat, theta):
    """dL/dtheta and dL/dA by the implicit function theorem in float64 numpy:
    x = tanh(A x + theta) => (I - D A) dx = D (dA x + dtheta), D = diag(1 - x^2)."""
    a_mat, theta = np.asarray(a_mat, np.float64), np.asarray(theta, np.float64)
    x = np.zeros_like(theta)
    for _ in range(200):
        x = np.tanh(a_mat @ x + theta)
    c = np.cos(np.arange(x.shape[0], dtype=np.float64))
    d = 1.0 - x ** 2
    w = np.linalg.solve((np.eye(len(x)) - d[:, None] * a_mat).T, c)
    g_theta = d * w
    return g_theta, np.outer(g_theta, x)


def rewrite(fun, *args, pipeline="implicit-diff"):
    return run_passes(jaxpr_cc.trace(fun, *args), pipeline)


# ------------------------------------------------------------------- tests
# The dense adjoint in the default run; the iterative ones (slower) under -m heavy.
@pytest.mark.parametrize("adjoint", [pytest.param(a, marks=pytest.mark.heavy)
                                     for a in ("fixed-point", "gmres", "bicgstab")] + ["dense"])
def test_tutorial_fixed_point_newton_sqrt(adjoint):
    a = jnp.array([0.5, 2.0, 9.0, 30.0], jnp.float32)
    with pytest.raises(ValueError, match="while_loop"):
        jax.grad(lambda a: jnp.sum(newton_sqrt(a)))(a)  # JAX refuses
    new = rewrite(newton_sqrt, a, pipeline=f"implicit-diff{{adjoint={adjoint}}}")
    assert_trees_equal(jax.jit(new)(a), jax.jit(newton_sqrt)(a))  # the primal is the loop
    jac = jax.jit(jax.jacrev(new))(a)
    np.testing.assert_allclose(np.asarray(jac), np.diag(0.5 / np.sqrt(np.asarray(a))), rtol=1e-5,
                               atol=1e-7)
    g = jax.jit(jax.grad(lambda a: jnp.sum(new(a))))(a)
    np.testing.assert_allclose(np.asarray(g), 0.5 / np.sqrt(np.asarray(a)), rtol=1e-5)


def test_newton_sqrt_with_counter_and_statistics():
    a = jnp.array([0.25, 4.0, 10.0], jnp.float32)
    pm = PassManager("implicit-diff")
    new = pm.run(jaxpr_cc.trace(newton_sqrt_counted, a))
    stats = dict(pm.statistics)["implicit-diff"]
    assert stats == {"loops-rewritten": 1}
    again = PassManager("implicit-diff")
    assert str(again.run(new)) == str(new)  # idempotent: its own rules are not searched
    assert dict(again.statistics)["implicit-diff"] == {}
    g = jax.jit(jax.grad(lambda a: jnp.sum(new(a) ** 2)))(a)
    np.testing.assert_allclose(np.asarray(g), np.ones(3), rtol=1e-5)  # d(sqrt a)^2/da = 1
    hvp = jax.jit(jax.grad(lambda a: jnp.sum(jax.grad(lambda b: jnp.sum(new(b)))(a))))(a)
    np.testing.assert_allclose(np.asarray(hvp), -0.25 * np.asarray(a) ** -1.5, rtol=1e-4)


def test_cotangents_reach_closed_over_values():
    b = jnp.float32(0.7)
    new = rewrite(closed_over, b)
    g = jax.jit(jax.grad(new))(b)
    # The loop's derivative (JAX's, through its iterations), which is the implicit
    # one to the loop's convergence (7.7e-5 here).
    np.testing.assert_allclose(float(g), float(jax.jacfwd(closed_over)(b)), rtol=1e-5)
    np.testing.assert_allclose(float(g), float(closed_over_grad(b)), rtol=2e-4)
    bs = jnp.array([0.2, 0.5, 0.7], jnp.float32)
    per = jax.jit(jax.vmap(jax.grad(new)))(bs)
    np.testing.assert_allclose(np.asarray(per), np.asarray(jax.vmap(jax.jacfwd(closed_over))(bs)),
                               rtol=1e-5)


@pytest.mark.parametrize("adjoint", ["auto", "dense"])
def test_contraction_on_a_1000_dimensional_state(adjoint):
    theta = jnp.asarray(RNG.normal(size=(N_BIG,)) * 0.5, jnp.float32)
    a_mat = jnp.asarray(A_BIG)
    new = rewrite(contraction_loss, a_mat, theta, pipeline=f"implicit-diff{{adjoint={adjoint}}}")
    g_a, g_theta = jax.jit(jax.grad(new, argnums=(0, 1)))(a_mat, theta)
    ref_theta, ref_a = contraction_reference_grads(a_mat, theta)
    np.testing.assert_allclose(np.asarray(g_theta), ref_theta, rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(np.asarray(g_a), ref_a, rtol=2e-4, atol=2e-5)
    # Finite differences along a random direction (float32, so a loose tolerance).
    direction = jnp.asarray(RNG.normal(size=(N_BIG,)), jnp.float32)
    eps = 1e-2
    loss = jax.jit(contraction_loss)
    fd = (loss(a_mat, theta + eps * direction) - loss(a_mat, theta - eps * direction)) / (2 * eps)
    np.testing.assert_allclose(float(jnp.dot(g_theta, direction)), float(fd), rtol=2e-2)


def carried_parameter(theta):
    """The parameter rides along as a loop carry the body passes through."""
    def keep_going(s):
        _, prev, x = s
        return jnp.max(jnp.abs(x - prev)) > 1e-7

    def step(s):
        t, _, x = s
        return t, x, 0.5 * jnp.tanh(x) + t

    t_out, _, x = lax.while_loop(keep_going, step, (theta, jnp.zeros_like(theta), theta))
    return jnp.sum(x) + jnp.sum(t_out ** 2)


def test_cotangents_reach_invariant_carries():
    theta = jnp.array([0.1, -0.4, 0.8], jnp.float32)
    new = rewrite(carried_parameter, theta)
    g = jax.jit(jax.grad(new))(theta)
    # x = 0.5 tanh(x) + t  =>  dx/dt = 1 / (1 - 0.5 (1 - tanh(x)^2)); plus d(t^2)/dt = 2t.
    x = np.zeros(3)
    for _ in range(200):
        x = 0.5 * np.tanh(x) + np.asarray(theta, np.float64)
    want = 1.0 / (1.0 - 0.5 * (1.0 - np.tanh(x) ** 2)) + 2.0 * np.asarray(theta, np.float64)
    np.testing.assert_allclose(np.asarray(g), want, rtol=1e-5)


def test_matches_jax_through_an_unrolled_converged_loop():
    theta = jnp.asarray(RNG.normal(size=(64,)) * 0.5, jnp.float32)
    a_mat = jnp.asarray(A_BIG[:64, :64] * np.sqrt(N_BIG / 64), jnp.float32)

    def unrolled(theta):
        x = lax.fori_loop(0, 200, lambda _, x: jnp.tanh(a_mat @ x + theta), jnp.zeros_like(theta))
        return jnp.sum(x ** 2)

    new = rewrite(lambda t: jnp.sum(contraction(a_mat, t) ** 2), theta)
    assert_trees_equal(jax.jit(jax.grad(new))(theta), jax.jit(jax.grad(unrolled))(theta), exact=False,
                       rtol=1e-4, atol=1e-6)


def compiled_temp_bytes(fn, *args) -> int:
    return jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes


def test_reverse_mode_memory_does_not_grow_with_iterations():
    theta = jnp.asarray(RNG.normal(size=(64,)) * 0.5, jnp.float32)
    a_mat = jnp.asarray(A_BIG[:64, :64], jnp.float32)
    sizes = {}
    for iters in (100, 10_000):
        # tol=0 runs every iteration; the implicit gradient stores none of them.
        fn = functools.partial(contraction, iters=iters, tol=0.0)
        new = rewrite(lambda t: jnp.sum(fn(a_mat, t)), theta)
        sizes[iters] = compiled_temp_bytes(jax.grad(new), theta)
        unrolled = lambda t: jnp.sum(lax.fori_loop(  # noqa: E731
            0, iters, lambda _, x: jnp.tanh(a_mat @ x + t), jnp.zeros_like(t)))
        sizes[("unrolled", iters)] = compiled_temp_bytes(jax.grad(unrolled), theta)
    assert sizes[10_000] == sizes[100]
    assert sizes[("unrolled", 10_000)] > 50 * sizes[10_000]


def counter_in_update(x):
    def step(state):
        k, v = state
        return k + 1, 0.5 * v + k.astype(v.dtype)
    return lax.while_loop(lambda s: jnp.max(jnp.abs(s[1])) < 100.0, step, (0, x))[1]


def counted(x):
    return lax.while_loop(lambda s: s[0] < 50, lambda s: (s[0] + 1, 0.5 * jnp.sin(s[1]) + 0.3),
                          (0, x))[1]


def test_unmatched_loops_are_left_alone_and_listed():
    x = jnp.ones(3, jnp.float32)

    def both(x):
        return counter_in_update(x) + counted(x)

    program = jaxpr_cc.trace(both, x)
    pm = PassManager("implicit-diff")
    new = pm.run(program)
    assert str(new) == str(program)
    stats = dict(pm.statistics)["implicit-diff"]
    assert stats["loops-skipped"] == 2
    reasons = " | ".join(k for k in stats if k.startswith("loop "))
    assert "a counted loop" in reasons and "not its change between iterations" in reasons
    assert "counter_in_update" in reasons and "counted" in reasons


def test_selecting_a_counted_loop_forces_it():
    x = jnp.full((3,), 0.1, jnp.float32)
    for spec in ("0", "counted"):
        pm = PassManager(f"implicit-diff{{loops={spec}}}")
        new = pm.run(jaxpr_cc.trace(counted, x))
        assert dict(pm.statistics)[f"implicit-diff{{loops={spec}}}"]["loops-rewritten"] == 1
        # After 50 iterations of a 0.5-contraction the derivative w.r.t. the guess
        # is 0.5^50-small: JAX's, through the iterations.
        g = jax.jit(jax.grad(lambda v: jnp.sum(new(v))))(x)
        want = jax.jacfwd(lambda v: jnp.sum(counted(v)))(x)
        np.testing.assert_allclose(np.asarray(g), np.asarray(want), atol=1e-12)
    with pytest.raises(Exception, match="no while loop was traced in a function named"):
        run_passes(jaxpr_cc.trace(counted, x), "implicit-diff{loops=nothing_here}")


def test_forward_mode_with_vjp_to_jvp():
    b = jnp.float32(0.7)
    new = rewrite(closed_over, b, pipeline="implicit-diff,vjp-to-jvp")
    _, t = jax.jit(lambda b: jax.jvp(new, (b,), (jnp.float32(1.0),)))(b)
    np.testing.assert_allclose(float(t), float(jax.jacfwd(closed_over)(b)), rtol=1e-5)
    a = jnp.array([0.5, 2.0, 9.0], jnp.float32)
    sq = rewrite(newton_sqrt, a, pipeline="implicit-diff,vjp-to-jvp")
    np.testing.assert_allclose(np.asarray(jax.jit(jax.jacfwd(sq))(a)),
                               np.diag(0.5 / np.sqrt(np.asarray(a))), rtol=1e-5, atol=1e-7)
    h = jax.jit(jax.hessian(lambda a: jnp.sum(sq(a))))(a)
    np.testing.assert_allclose(np.diag(np.asarray(h)), -0.25 * np.asarray(a) ** -1.5, rtol=1e-4)


@pytest.mark.heavy
def test_corpus_power_iteration_eigenvalue_gradient():
    prog = next(p for p in load_corpus(skip_unavailable=True) if p.name == "13_while_power_iteration")
    fun = functools.partial(prog.fun, **prog.kwargs)
    matrix, v0, tol = prog.args
    new = rewrite(fun, *prog.args)
    assert_trees_equal(jax.jit(new)(*prog.args), jax.jit(fun)(*prog.args))
    g = jax.jit(jax.grad(lambda m: new(m, v0, tol)[0]))(matrix)
    _, v, _ = fun(*prog.args)
    # For a symmetric matrix, d(lambda_max)/dM = v v^T (v the unit eigenvector);
    # the loop stops at a 1e-4 change per step.
    np.testing.assert_allclose(np.asarray(g), np.outer(v, v), atol=5e-3)


@pytest.mark.heavy
def test_corpus_while_programs_keep_values_and_gradients():
    for prog in load_corpus(skip_unavailable=True):
        if "while_loop" not in prog.tags and "fori_loop" not in prog.tags:
            continue
        fun = functools.partial(prog.fun, **prog.kwargs)
        program = jaxpr_cc.trace(fun, *prog.args)
        new = run_passes(program, "implicit-diff")
        assert_trees_equal(jax.jit(new)(*prog.args), jax.jit(fun)(*prog.args))
        if "grad" in prog.supports and prog.grad_argnums:
            grad = lambda f: jax.grad(  # noqa: E731
                lambda *a: sum(jnp.sum(jnp.real(x)) for x in jax.tree_util.tree_leaves(f(*a))
                               if jnp.issubdtype(x.dtype, jnp.inexact)),
                argnums=tuple(prog.grad_argnums))
            assert_trees_equal(jax.jit(grad(new))(*prog.args), jax.jit(grad(fun))(*prog.args),
                               exact=False,
                               rtol=1e-5, atol=1e-6)
