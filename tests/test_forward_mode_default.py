"""Forward mode through every custom_vjp, by default (issue 17).

``jax.jvp``/``jax.jacfwd``/``jax.hessian``/``jax.linearize`` of ``jaxpr_cc.jit(f)``
and of a traced Program run through custom_vjp rules whose bwd is linear in its
cotangent, with no pipeline string: the bwd is transposed, including the loops,
branches, solves and nested rules real bwd rules are made of.  References are
JAX itself: ``jax.jacrev`` of the original function (which runs the user's bwd)
for Jacobians, float64 central differences of JAX's gradient for Hessians.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxpr_cc
from jaxpr_cc.examples import fixed_point as fp
from jaxpr_cc.passes.manager import run_passes
from jaxpr_cc.closure.transpose import NotTransposableError, transpose_linear

RNG = np.random.default_rng(0)
W = jnp.asarray(RNG.normal(size=(3, 3)) * 0.3, jnp.float32)
SPD = jnp.asarray(np.eye(3) * 3.0 + 0.2, jnp.float32)


def assert_close(a, b, rtol=1e-4, atol=1e-5):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


def with_bwd(bwd_map):
    """``f(x, s) = tanh(s * x)`` whose bwd is ``bwd_map(ct * (1 - y^2) * s, s, x)``
    followed by the derivative in s: rules whose bwd are built from loops etc."""
    @jax.custom_vjp
    def f(x, s):
        return jnp.tanh(s * x)

    def fwd(x, s):
        y = jnp.tanh(s * x)
        return y, (x, s, y)

    def bwd(res, ct):
        x, s, y = res
        g = ct * (1.0 - y * y)
        return bwd_map(g * s, s, x), jnp.sum(g * x)

    f.defvjp(fwd, bwd)
    return f


# bwd maps g -> ct_x built from the constructs the transposer must handle.  Each
# is the true derivative (the identity map on g) written the hard way, or another
# linear map: the reference is jacrev of the original function either way.
def _neumann(g, s, x):
    # w = g + 0.5 w  (to convergence, then halved): w = 2 g, returns g.
    def keep_going(c):
        prev, w = c
        return jnp.max(jnp.abs(prev - w)) > 1e-7

    def step(c):
        _, w = c
        return w, g + 0.5 * w
    _, w = lax.while_loop(keep_going, step, (g, g + 0.5 * g))
    return 0.5 * w


def _counted(g, s, x):
    # W^T applied n times, n an integer residual (fori_loop with a traced bound).
    n = jnp.int32(3) + (s > 100.0).astype(jnp.int32)
    return lax.fori_loop(0, n, lambda i, v: W.T @ v, g)


def _counted_varying(g, s, x):
    # The map changes with the step: v <- (1 + i) W^T v / 4.
    n = jnp.int32(3) + (s > 100.0).astype(jnp.int32)
    return lax.fori_loop(0, n, lambda i, v: (1.0 + i) * (W.T @ v) / 4.0, g)


def _scan(g, s, x):
    def step(v, w):
        return W @ v + w * v, jnp.sum(v)
    v, _ = lax.scan(step, g, jnp.linspace(0.1, 0.3, 4, dtype=jnp.float32))
    return v


def _switch(g, s, x):
    i = (s > 1.0).astype(jnp.int32) + (s > 2.0).astype(jnp.int32)
    return lax.switch(i, [lambda v: 2.0 * v, lambda v: W @ v, lambda v: -v], g)


def _solve(g, s, x):
    return lax.custom_linear_solve(lambda v: SPD @ v, g,
                                   lambda mv, b: jnp.linalg.solve(SPD, b),
                                   lambda mv, b: jnp.linalg.solve(SPD.T, b))


@jax.custom_jvp
def _scale3(v):
    return 3.0 * v


_scale3.defjvp(lambda p, t: (3.0 * p[0], 3.0 * t[0]))


@jax.custom_vjp
def _mat(v):
    return W @ v


_mat.defvjp(lambda v: (W @ v, None), lambda _, ct: (W.T @ ct,))


def _nested_rules(g, s, x):
    return _mat(_scale3(g))


def _linear_call(g, s, x):
    return jax.custom_derivatives.linear_call(lambda r, v: r * v, lambda r, ct: r * ct, s, g)


def _while_in_cond(g, s, x):
    return lax.cond(s > 0.0, _neumann, lambda g, s, x: -g, g, s, x)


def _while_in_scan(g, s, x):
    def step(v, _):
        return _neumann(v, s, x) * 0.5, None
    v, _ = lax.scan(step, g, None, length=3)
    return v


BWD_MAPS = [_neumann, _counted, _counted_varying, _scan, _switch, _solve, _nested_rules,
            _linear_call, _while_in_cond, _while_in_scan]
X = jnp.asarray([0.3, -0.5, 0.8], jnp.float32)
S = jnp.float32(1.3)


@pytest.mark.parametrize("bwd_map", BWD_MAPS, ids=lambda f: f.__name__.strip("_"))
def test_jit_forward_mode_through_bwd_built_from(bwd_map):
    f = with_bwd(bwd_map)
    with pytest.raises(TypeError, match="custom_vjp"):
        jax.jacfwd(f)(X, S)  # plain JAX refuses
    jf = jaxpr_cc.jit(f)
    for i in (0, 1):
        want = jax.jacrev(f, argnums=i)(X, S)
        assert_close(jax.jacfwd(jf, argnums=i)(X, S), want)
        assert_close(jax.jacrev(jf, argnums=i)(X, S), want, rtol=1e-6, atol=1e-7)
    # jvp, linearize, and vmap of jvp agree with the Jacobian.
    t = jnp.asarray([1.0, 2.0, -1.0], jnp.float32)
    _, tan = jax.jvp(lambda v: jf(v, S), (X,), (t,))
    assert_close(tan, jax.jacrev(f)(X, S) @ t)
    _, lin = jax.linearize(lambda v: jf(v, S), X)
    assert_close(lin(t), tan)


@pytest.mark.parametrize("bwd_map", [_neumann, _counted, _switch, _solve, _nested_rules],
                         ids=lambda f: f.__name__.strip("_"))
def test_traced_program_forward_mode(bwd_map):
    f = with_bwd(bwd_map)
    program = jaxpr_cc.trace(f, X, S)
    assert_close(jax.jacfwd(program)(X, S), jax.jacrev(f)(X, S))
    assert "custom_vjp_call" in str(program)  # the program itself is not rewritten


def test_reverse_mode_keeps_the_users_bwd_exactly():
    # bwd that is not the derivative (3x): reverse mode still runs it, bit for bit.
    @jax.custom_vjp
    def f(x):
        return jnp.sin(x)
    f.defvjp(lambda x: (jnp.sin(x), x), lambda x, ct: (3.0 * jnp.cos(x) * ct,))
    jf = jaxpr_cc.jit(f)
    np.testing.assert_array_equal(np.asarray(jax.grad(lambda v: jnp.sum(jf(v)))(X)),
                                  np.asarray(jax.jit(jax.grad(lambda v: jnp.sum(f(v))))(X)))
    assert_close(jax.jacfwd(jf)(X), jnp.diag(3.0 * jnp.cos(X)))


# -- the tutorial's fixed_point ---------------------------------------------------
def _fd_hessian64(grad, x, eps):
    """Central differences of a gradient, in float64."""
    with jax.enable_x64(True):
        x64 = np.float64(x)
        return float((grad(x64 + eps) - grad(x64 - eps)) / (2 * eps))


@pytest.mark.parametrize("fun,x", [(fp.newton_sqrt, 2.0), (fp.solve_closed_over, 0.7)],
                         ids=["explicit_argument", "closed_over_parameter"])
def test_fixed_point_jacfwd_and_hessian(fun, x):
    x32 = jnp.float32(x)
    # Plain JAX refuses (the closed-over case even leaks a tracer first).
    with pytest.raises((TypeError, jax.errors.UnexpectedTracerError)):
        jax.jacfwd(fun)(x32)
    jf = jaxpr_cc.jit(fun)
    assert_close(jax.jacfwd(jf)(x32), jax.jacrev(jf)(x32))
    if fun is fp.newton_sqrt:
        assert_close(jax.jacfwd(jf)(x32), 0.5 / np.sqrt(x), rtol=1e-5)
    else:
        assert_close(jax.jacfwd(jf)(x32), fp.solve_closed_over_reference_grad(x32), rtol=1e-4)
    h = jax.hessian(jf)(x32)                       # forward over reverse
    # The gradient whose differences are the reference: JAX's own (the user's
    # bwd) for the explicit argument; for the closed-over parameter, which
    # plain JAX cannot differentiate, the implicit-function-theorem formula.
    if fun is fp.newton_sqrt:
        ref = _fd_hessian64(jax.grad(fun), x, 1e-4)
    else:
        ref = _fd_hessian64(fp.solve_closed_over_reference_grad, x, 1e-3)
    np.testing.assert_allclose(float(h), ref, rtol=2e-3)
    np.testing.assert_allclose(float(jax.jacfwd(jax.jacfwd(jf))(x32)), ref, rtol=2e-3)


def test_hessian_of_a_program_mixing_rules_and_plain_code():
    f = with_bwd(_solve)

    def mixed(v):
        y = f(jnp.sin(v), S) * v
        return jnp.sum(fp.newton_sqrt(1.0 + y * y)) + jnp.sum(v ** 3)

    jf = jaxpr_cc.jit(mixed)
    h = jax.jit(jax.hessian(jf))(X)
    ref = jax.jacfwd(jax.jacrev(mixed))  # JAX refuses: the reference is float64 FD
    with pytest.raises(TypeError, match="custom_vjp"):
        ref(X)
    with jax.enable_x64(True):
        x64 = np.asarray(X, np.float64)
        g = jax.grad(mixed)
        eps = 1e-5
        cols = [(g(x64 + eps * e) - g(x64 - eps * e)) / (2 * eps) for e in np.eye(3)]
        want = np.stack(cols, axis=1)
    np.testing.assert_allclose(np.asarray(h), want, rtol=2e-3, atol=2e-3)


# -- refusals ---------------------------------------------------------------------
def test_nonlinear_bwd_is_refused_in_one_line():
    @jax.custom_vjp
    def clip_gradient(x):
        return x
    clip_gradient.defvjp(lambda x: (x, None), lambda _, ct: (jnp.clip(ct, -1.0, 1.0),))
    jf = jaxpr_cc.jit(lambda v: clip_gradient(v) * 2.0)
    np.testing.assert_array_equal(np.asarray(jax.grad(lambda v: jnp.sum(jf(v)))(X)),
                                  np.full(3, 1.0, np.float32))
    with pytest.raises(Exception) as info:
        jax.jacfwd(jf)(X)
    message = str(info.value)
    assert "\n" not in message
    assert "clip_gradient" in message and "'max' is not a linear operation" in message


def _stop_on_input(g, s, x):
    # The stopping test reads the cotangent itself, not a carry: not a loop to
    # convergence of its carries.
    def keep_going(c):
        i, w = c
        return (i < 3) & (jnp.sum(g) > -1e9)
    _, w = lax.while_loop(keep_going, lambda c: (c[0] + 1, 0.5 * c[1]), (0, g))
    return w


def _varying_to_convergence(g, s, x):
    def keep_going(c):
        i, prev, w = c
        return (i < 50) & (jnp.max(jnp.abs(prev - w)) > 1e-7)

    def step(c):
        i, _, w = c
        return i + 1, w, g + w / (2.0 + i)
    return lax.while_loop(keep_going, step, (0, g, 2.0 * g))[2]


def _squares(g, s, x):
    return lax.fori_loop(0, jnp.int32(2) + (s > 9.0), lambda i, v: v * v, g)


@pytest.mark.parametrize("bwd_map,reason", [
    (_stop_on_input, "stops on a test of the linear input, so its trip count depends on it"),
    (_varying_to_convergence, "stops on a test of the linear input and whose linear update"),
    (_squares, "'mul' of two values that both depend on the linear input"),
], ids=["stop_on_input", "varying_to_convergence", "squares"])
def test_loops_that_are_not_linear_maps_are_refused(bwd_map, reason):
    f = with_bwd(bwd_map)
    jf = jaxpr_cc.jit(f)
    assert_close(jax.jacrev(jf)(X, S), jax.jacrev(f)(X, S), rtol=1e-6, atol=1e-7)
    with pytest.raises(Exception, match=reason) as info:
        jax.jacfwd(jf)(X, S)
    assert "\n" not in str(info.value) and "'f'" in str(info.value)


def test_transpose_linear_of_a_loop_to_convergence():
    # Directly: x -> the fixed point of w = x + A w is (I - A)^{-1} x; its
    # transpose is (I - A^T)^{-1}.
    A = np.asarray(W) * 0.5

    def solve(x, a):
        def keep_going(c):
            prev, w = c
            return jnp.max(jnp.abs(prev - w)) > 1e-7
        return lax.while_loop(keep_going, lambda c: (c[1], x + a @ c[1]), (x, 2.0 * x))[1]

    closed = jax.make_jaxpr(solve)(X, jnp.asarray(A))
    t = transpose_linear(closed, [True, False])
    ct = jnp.asarray([1.0, 0.0, 2.0], jnp.float32)
    got = jaxpr_cc.jax_adapter.eval_jaxpr(t.jaxpr, (), jnp.asarray(A), ct)[0]
    want = np.linalg.solve(np.eye(3) - A.T, np.asarray(ct))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)


def test_a_loop_reading_the_linear_input_nonlinearly_is_not_transposed():
    def bad(x):
        return lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, jnp.sin(c[1])), (0, x))[1]
    closed = jax.make_jaxpr(bad)(X)
    with pytest.raises(NotTransposableError, match="'sin' is not a linear operation"):
        transpose_linear(closed, [True])


def test_explicit_pipeline_with_vjp_to_jvp_is_not_run_twice():
    f = with_bwd(_neumann)
    jf = jaxpr_cc.jit(f, pipeline="vjp-to-jvp")
    assert "custom_jvp_call" in str(jf.program(X, S))
    assert_close(jax.jacfwd(jf)(X, S), jax.jacrev(f)(X, S))


def test_program_pass_output_is_unchanged_by_the_default():
    f = with_bwd(_counted)
    program = jaxpr_cc.trace(f, X, S)
    new = run_passes(program, "vjp-to-jvp")
    assert_close(jax.jacfwd(new)(X, S), jax.jacfwd(program)(X, S), rtol=1e-6, atol=1e-7)


# -- the corpus and the solver libraries ------------------------------------------
from jaxpr_cc.golden.corpus import load_corpus  # noqa: E402

from test_realworld import PROGRAMS as REALWORLD  # noqa: E402

CORPUS_VJP = [p for p in load_corpus(skip_unavailable=True)
              if {"custom_vjp", "custom_gradient"} & set(p.tags)]
# Corpus rules whose bwd is not linear in the cotangent, and the reason given.
NOT_LINEAR = {"23_custom_vjp_clip_grad": "'max' is not a linear operation"}
CASES = ([(p.name, functools.partial(p.fun, **p.kwargs), tuple(p.args)) for p in CORPUS_VJP]
         + [(f.__name__, f, tuple(args)) for f, args in REALWORLD])


def _inexact_argnums(args):
    return [i for i, a in enumerate(args) if jnp.issubdtype(jnp.result_type(a), jnp.inexact)]


def _loss(fun):
    """Sum of squares of the inexact outputs, in their own precision."""
    def loss(*args):
        leaves = [jnp.asarray(v) for v in jax.tree_util.tree_leaves(fun(*args))]
        return sum(jnp.sum(jnp.real(v) ** 2) for v in leaves
                   if jnp.issubdtype(v.dtype, jnp.inexact))
    return loss


@pytest.mark.parametrize("name,fun,args", CASES, ids=[c[0] for c in CASES])
def test_jacfwd_of_jit_equals_jacrev(name, fun, args):
    jf = jaxpr_cc.jit(fun)
    for i in _inexact_argnums(args):
        if name in NOT_LINEAR:
            with pytest.raises(Exception, match=NOT_LINEAR[name]) as info:
                jax.jacfwd(jf, argnums=i)(*args)
            assert "\n" not in str(info.value)
            continue
        assert_close(jax.jacfwd(jf, argnums=i)(*args), jax.jacrev(jf, argnums=i)(*args))
        assert_close(jax.jacrev(jf, argnums=i)(*args), jax.jacrev(fun, argnums=i)(*args),
                     rtol=1e-5, atol=1e-6)


_LIBRARY = {f.__name__ for f, _ in REALWORLD}
HESSIAN_CASES = [pytest.param(*c, id=c[0], marks=[pytest.mark.heavy] if c[0] in _LIBRARY else [])
                 for c in CASES if c[0] not in NOT_LINEAR]


@pytest.mark.parametrize("name,fun,args", HESSIAN_CASES)
def test_hessian_of_jit_equals_float64_differences_of_the_gradient(name, fun, args):
    loss = _loss(fun)
    jl = jaxpr_cc.jit(loss)
    for i in _inexact_argnums(args):
        h = np.asarray(jax.hessian(jl, argnums=i)(*args))
        with jax.enable_x64(True):
            args64 = [np.asarray(a, np.float64) if jnp.issubdtype(jnp.result_type(a), jnp.inexact)
                      else a for a in args]
            grad = jax.grad(loss, argnums=i)
            eps = 1e-4
            try:
                grad(*args64)
            except ValueError:
                # lineax checks the vector against its float32 matrix constant:
                # differences in float32 (these losses are quadratic in the input,
                # so a large step has no truncation error).
                args64, eps = list(args), 1e-2
            x = args64[i]
            cols = []
            for e in np.eye(x.size):
                def at(d):
                    moved = list(args64)
                    moved[i] = np.asarray(x + d * e.reshape(np.shape(x)), np.asarray(x).dtype)
                    return np.asarray(grad(*moved))
                cols.append(((at(eps) - at(-eps)) / (2 * eps)).reshape(-1))
            want = np.stack(cols, axis=-1).reshape(h.shape)
        np.testing.assert_allclose(h, want, rtol=2e-3, atol=2e-3)


def test_forward_mode_false_keeps_jax_behavior():
    f = with_bwd(_neumann)
    jf = jaxpr_cc.jit(f, forward_mode=False)
    with pytest.raises(TypeError, match="custom_vjp"):
        jax.jacfwd(jf)(X, S)
    assert_close(jax.jacrev(jf)(X, S), jax.jacrev(f)(X, S), rtol=1e-6, atol=1e-7)
    with pytest.raises(TypeError, match="forward_mode must be True or False"):
        jaxpr_cc.jit(f, forward_mode="yes")


@pytest.mark.heavy
def test_diffrax_recursive_checkpoint_adjoint_forward_mode():
    import diffrax

    def f(k):
        sol = diffrax.diffeqsolve(diffrax.ODETerm(lambda t, y, args: -args * y),
                                  diffrax.Tsit5(), 0.0, 1.0, 0.05, jnp.ones(2), args=k,
                                  adjoint=diffrax.RecursiveCheckpointAdjoint(),
                                  stepsize_controller=diffrax.ConstantStepSize())
        return sol.ys[-1]

    k = jnp.float32(0.7)
    with pytest.raises(TypeError, match="custom_vjp"):
        jax.jacfwd(f)(k)
    jf = jaxpr_cc.jit(f)
    got = jax.jacfwd(jf)(k)
    assert_close(got, jax.jacrev(f)(k), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(np.asarray(got), -np.exp(-0.7) * np.ones(2), rtol=1e-4)


def test_transposed_loops_are_saved_and_loaded():
    # The transposed while_loop is a first-order linear_call rule: the rewritten
    # program can be written and read back, and forward mode works after loading.
    from jaxpr_cc.io.api import dumps, loads
    program = jaxpr_cc.trace(fp.newton_sqrt, jnp.float32(2.0))
    new = run_passes(program, "vjp-to-jvp")
    assert new.is_first_order()
    loaded = loads(dumps(new))
    a = jnp.float32(2.0)
    np.testing.assert_allclose(float(jax.jacfwd(loaded)(a)), 0.5 / np.sqrt(2.0), rtol=1e-5)
    np.testing.assert_allclose(float(jax.grad(loaded)(a)), float(jax.grad(fp.newton_sqrt)(a)),
                               rtol=1e-6)
