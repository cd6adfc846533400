"""Closure conversion: first-order rules, the user's rules kept, closed-over values."""
import itertools
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_cc
from jaxpr_cc.examples import fixed_point as fp
from jaxpr_cc.frontend.staged_rules import convert_program
from zoo import closures as zc


def first_order(fun, *args, **kw):
    p = jaxpr_cc.trace(fun, *args, **kw)
    assert p.is_first_order(), str(p)
    p.verify()
    return p


# ---------------------------------------------------------------- user rules kept
def test_vjp_rule_is_the_users_not_jax_derivative():
    x = jnp.linspace(-1.0, 1.0, 5)
    p = first_order(lambda v: zc.sin_bwd_times_3(v).sum(), x)
    np.testing.assert_array_equal(jax.grad(p)(x), jnp.full_like(x, 3.0))
    np.testing.assert_array_equal(jax.grad(p)(x), jax.grad(lambda v: zc.sin_bwd_times_3(v).sum())(x))
    np.testing.assert_array_equal(jax.jit(jax.grad(p))(x), jnp.full_like(x, 3.0))


def test_jvp_rule_is_the_users():
    x = jnp.arange(3.0)
    p = first_order(zc.cube_tangent_7, x)
    y, t = jax.jvp(p, (x,), (jnp.ones(3),))
    np.testing.assert_array_equal(y, x ** 3)
    np.testing.assert_array_equal(t, jnp.full(3, 7.0))
    np.testing.assert_array_equal(jax.grad(lambda v: p(v).sum())(x),
                                  jax.grad(lambda v: zc.cube_tangent_7(v).sum())(x))
    ys, ts = jax.vmap(lambda v: jax.jvp(p, (v,), (jnp.ones(3),)))(jnp.stack([x, x + 1]))
    np.testing.assert_array_equal(ts, jnp.full((2, 3), 7.0))


def test_linear_call_transpose_is_the_users():
    x = jnp.arange(4.0)
    p = first_order(zc.scale_transpose_5, x)
    np.testing.assert_array_equal(p(x), x)
    (ct,) = jax.linear_transpose(p, x)(jnp.ones(4))
    np.testing.assert_array_equal(ct, jnp.full(4, 5.0))
    np.testing.assert_array_equal(jax.grad(lambda v: p(v).sum())(x), jnp.full(4, 5.0))
    eqn = next(e for _, e in p.body.walk() if e.prim.name == "linear_call")
    assert "transpose_jaxpr" in eqn.params


def test_custom_gradient_is_the_users():
    p = first_order(zc.square_grad_10x, 1.5)
    assert float(jax.grad(p)(1.5)) == float(jax.grad(zc.square_grad_10x)(1.5)) == 15.0


# ------------------------------------------------------------ closed-over values
def test_fixed_point_closing_over_traced_parameter():
    b = 0.7
    with pytest.raises(Exception):  # JAX cannot differentiate this
        jax.grad(fp.solve_closed_over)(b)
    p = first_order(fp.solve_closed_over, b)
    np.testing.assert_allclose(p(b), fp.solve_closed_over(b), rtol=1e-6)
    np.testing.assert_allclose(jax.grad(p)(b), fp.solve_closed_over_reference_grad(b), rtol=1e-3)


def test_newton_sqrt_with_update_closing_over_a():
    with pytest.raises(Exception):
        jax.grad(zc.newton_sqrt_closed_over)(2.0)
    p = first_order(zc.newton_sqrt_closed_over, 2.0)
    np.testing.assert_allclose(p(2.0), np.sqrt(2.0), rtol=1e-6)
    np.testing.assert_allclose(jax.grad(p)(2.0), 0.5 / np.sqrt(2.0), rtol=1e-4)
    np.testing.assert_allclose(jax.jit(jax.grad(p))(3.0), 0.5 / np.sqrt(3.0), rtol=1e-4)


def test_newton_sqrt_second_derivative_through_nested_rules():
    p = first_order(fp.newton_sqrt, 2.0)
    np.testing.assert_allclose(jax.grad(p)(2.0), jax.grad(fp.newton_sqrt)(2.0), rtol=1e-6)
    np.testing.assert_allclose(jax.grad(jax.grad(p))(2.0), -0.25 * 2.0 ** -1.5, rtol=1e-4)


def test_ode_adjoint_with_closed_over_decay_rate():
    k, y0 = 0.8, 2.0
    with pytest.raises(Exception):
        jax.grad(zc.decay_final_state)(k)
    p = first_order(zc.decay_final_state, k)
    np.testing.assert_allclose(p(k), y0 * np.exp(-k), rtol=1e-6)
    np.testing.assert_allclose(jax.grad(p)(k), -y0 * np.exp(-k), rtol=1e-5)


def test_closed_over_error_names_the_value_and_rule():
    p = first_order(zc.decay_final_state, 0.8, closed_over="error")
    np.testing.assert_allclose(p(0.8), 2.0 * np.exp(-0.8), rtol=1e-6)  # evaluation is fine
    with pytest.raises(jaxpr_cc.ClosedOverError) as info:
        jax.grad(p)(0.8)
    msg = str(info.value)
    assert "\n" not in msg
    assert "'odeint'" in msg and "'k'" in msg and "closures.py" in msg


def _affine_closure(w, x):
    @jax.custom_vjp
    def f(v):
        return jnp.tanh(w * v)
    f.defvjp(lambda v: (jnp.tanh(w * v), v), lambda v, ct: (ct * w * (1 - jnp.tanh(w * v) ** 2),))
    return f(x).sum()


def _affine_plain(w, x):
    return jnp.tanh(w * x).sum()


@pytest.mark.parametrize("mode", ["auto", "reverse", "forward"])
def test_closed_over_modes_give_the_derivative(mode):
    w, x = jnp.float32(0.3), jnp.linspace(-0.5, 1.0, 4)
    p = first_order(_affine_closure, w, x, closed_over=mode)
    gw, gx = jax.grad(p, argnums=(0, 1))(w, x)
    rw, rx = jax.grad(_affine_plain, argnums=(0, 1))(w, x)
    np.testing.assert_allclose(gw, rw, rtol=1e-5)
    np.testing.assert_allclose(gx, rx, rtol=1e-6)


def test_forward_mode_size_limit_is_reported():
    w, x = jnp.ones(8), jnp.ones(8)
    p = first_order(_affine_closure, w, x, closed_over="forward", max_forward_size=4)
    with pytest.raises(jaxpr_cc.ClosedOverError, match="max_forward_size"):
        jax.grad(p)(w, x)


def _loop_rule_closing_over(w, x0):
    """A custom_vjp whose primal runs a while_loop (no reverse mode through it)
    and whose rule closes over ``w``: x_i = 0.5 tanh(w_i x_i) + 1, elementwise."""
    def update(x):
        return 0.5 * jnp.tanh(w * x) + 1.0

    @jax.custom_vjp
    def solve(x0):
        return jax.lax.while_loop(lambda x: jnp.max(jnp.abs(update(x) - x)) > 1e-7, update, x0)

    def solve_bwd(x, ct):
        slope = 0.5 * w / jnp.cosh(w * x) ** 2
        return (jnp.zeros_like(x) * ct / (1.0 - slope),)

    solve.defvjp(lambda x0: (solve(x0), solve(x0)), solve_bwd)
    return jnp.sum(solve(x0))


def test_closed_over_value_too_large_for_forward_mode_says_why():
    """A rule whose primal loops, closing over a value being differentiated:
    reverse mode cannot run through the loop and forward mode is over its size
    limit.  The error says so (not 'trace with closed_over=auto', which it is);
    a larger limit gives the derivative, checked against the analytic one."""
    w, x0 = jnp.linspace(0.2, 0.9, 8), jnp.ones(8)
    small = jaxpr_cc.trace(_loop_rule_closing_over, w, x0, max_forward_size=4)
    with pytest.raises(jaxpr_cc.ClosedOverError) as info:
        jax.grad(small)(w, x0)
    msg = str(info.value)
    assert "\n" not in msg and "'solve'" in msg and "while_loop" in msg
    assert "8 jvp columns > max_forward_size=4" in msg and "closed_over='auto'" not in msg
    large = jaxpr_cc.trace(_loop_rule_closing_over, w, x0, max_forward_size=8)
    x = np.asarray(large(w, x0))  # the loop's fixed points sum; each x_i solved to 1e-7
    wn = np.asarray(w, np.float64)
    xs = np.ones(8)
    for _ in range(200):
        xs = 0.5 * np.tanh(wn * xs) + 1.0
    sech2 = 1.0 / np.cosh(wn * xs) ** 2
    want = 0.5 * sech2 * xs / (1.0 - 0.5 * sech2 * wn)
    np.testing.assert_allclose(float(x), xs.sum(), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(jax.grad(large)(w, x0)), want, rtol=1e-4)


# ------------------------------------------------------------------ coverage
@partial(jax.custom_vjp, nondiff_argnums=(1,))
def _power(x, n):
    return x ** n


_power.defvjp(lambda x, n: (x ** n, x), lambda n, x, ct: (n * x ** (n - 1) * ct,))


def test_nondiff_static_int_argument():
    f = lambda x: _power(x, 3).sum()  # noqa: E731
    x = jnp.arange(1.0, 4.0)
    p = first_order(f, x)
    np.testing.assert_array_equal(jax.grad(p)(x), jax.grad(f)(x))


@partial(jax.custom_vjp, nondiff_argnums=(1,))
def _scale_by(x, s):
    return x * s


_scale_by.defvjp(lambda x, s: (x * s, None), lambda s, _, ct: (ct * s,))


def test_tracer_in_nondiff_position():
    f = lambda x, s: _scale_by(x, s).sum()  # noqa: E731
    with pytest.raises(Exception):  # JAX refuses tracers in nondiff positions
        jax.make_jaxpr(f)(jnp.ones(3), 2.0)
    p = first_order(f, jnp.ones(3), 2.0)
    np.testing.assert_allclose(p(jnp.ones(3), 2.0), 6.0)
    np.testing.assert_allclose(jax.grad(p)(jnp.ones(3), 2.0), jnp.full(3, 2.0))
    # the nondiff value is a closed-over operand: its derivative follows `closed_over`
    np.testing.assert_allclose(jax.grad(p, argnums=1)(jnp.ones(3), 2.0), 3.0)


@jax.custom_vjp
def _dict_res(x, y):
    return x * y


_dict_res.defvjp(lambda x, y: (x * y, {"x": x, "y": (y, 2.0 * y)}),
                 lambda r, ct: (ct * r["y"][0], ct * r["y"][1] / 2.0 * r["x"] / r["y"][0]))


def test_pytree_residuals():
    f = lambda x, y: _dict_res(x, y).sum()  # noqa: E731
    x, y = jnp.arange(1.0, 4.0), jnp.arange(2.0, 5.0)
    p = first_order(f, x, y)
    for a, b in zip(jax.grad(p, (0, 1))(x, y), jax.grad(f, (0, 1))(x, y)):
        np.testing.assert_allclose(a, b, rtol=1e-6)


@jax.custom_vjp
def _sz(x, y):
    return x * y


def _sz_fwd(x, y):
    # perturbation flags are Python bools at fwd time: use them there, not in bwd
    y_saved = y.value if x.perturbed else jnp.zeros_like(y.value)
    x_saved = x.value if y.perturbed else jnp.zeros_like(x.value)
    return x.value * y.value, (x_saved, y_saved)


def _sz_bwd(res, ct):
    x, y = res
    return (ct * y, ct * x)


_sz.defvjp(_sz_fwd, _sz_bwd, symbolic_zeros=True)


@jax.custom_jvp
def _szj(x):
    return jnp.sin(x)


@_szj.defjvp
def _szj_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    tt = jnp.zeros_like(x) if type(t) is jax.custom_derivatives.SymbolicZero else t
    return jnp.sin(x), 2.0 * tt


_szj.defjvp(_szj_jvp, symbolic_zeros=True)


def test_symbolic_zeros_rules():
    f = lambda x, y: (_sz(x, y) + _szj(x)).sum()  # noqa: E731
    x, y = jnp.arange(1.0, 4.0), jnp.arange(2.0, 5.0)
    p = first_order(f, x, y)
    for argnums in (0, 1, (0, 1)):
        got, ref = jax.grad(p, argnums)(x, y), jax.grad(f, argnums)(x, y)
        jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), got, ref)


@jax.custom_vjp
def _with_int(x, n):
    return x * n


_with_int.defvjp(lambda x, n: (x * n, n), lambda n, ct: (ct * n, None))


def test_integer_inputs_get_float0_cotangents():
    f = lambda x, n: _with_int(x, n).sum()  # noqa: E731
    x, n = jnp.arange(3.0), jnp.int32(4)
    p = first_order(f, x, n)
    gx, gn = jax.grad(p, (0, 1), allow_int=True)(x, n)
    rx, rn = jax.grad(f, (0, 1), allow_int=True)(x, n)
    np.testing.assert_array_equal(gx, rx)
    assert gn.dtype == rn.dtype == jax.dtypes.float0


@jax.custom_vjp
def _outer_rule(x):
    return jnp.exp(x)


def _outer_bwd(e, ct):
    return (zc.sin_bwd_times_3(ct) * 0 + ct * e,)  # a rule whose rule calls a custom function


_outer_rule.defvjp(lambda x: (jnp.exp(x), jnp.exp(x)), _outer_bwd)


def test_rules_inside_while_loops_and_nested_rules():
    def f(x):
        c = jax.lax.while_loop(lambda s: s[0] < 3,
                               lambda s: (s[0] + 1, s[1] + zc.cube_tangent_7(s[1])), (0, x))[1]
        return c + _outer_rule(x)

    x = jnp.linspace(0.1, 0.5, 3)
    p = first_order(f, x)
    np.testing.assert_array_equal(p(x), f(x))
    # forward mode through the loop uses the user's jvp rule; reverse through _outer_rule
    g = lambda v: jax.lax.while_loop(  # noqa: E731
        lambda s: s[0] < 3, lambda s: (s[0] + 1, s[1] + zc.cube_tangent_7(s[1])), (0, v))[1]
    pg = first_order(g, x)
    for a, b in zip(jax.jvp(pg, (x,), (jnp.ones(3),)), jax.jvp(g, (x,), (jnp.ones(3),))):
        np.testing.assert_array_equal(a, b)
    h = lambda v: _outer_rule(v).sum()  # noqa: E731
    np.testing.assert_array_equal(jax.grad(first_order(h, x))(x), jax.grad(h)(x))


def test_rules_in_control_flow_gradients_match_jax():
    def f(x):
        a = jax.lax.cond(x.sum() > 0, lambda v: zc.sin_bwd_times_3(v), lambda v: v, x)
        b, _ = jax.lax.scan(lambda c, v: (c + _outer_rule(v), None), 0.0, x)
        d = jax.jit(lambda v: _power(v, 2))(x)
        return a.sum() + b + d.sum()

    x = jnp.linspace(0.1, 0.5, 3)
    p = first_order(f, x)
    np.testing.assert_allclose(jax.grad(p)(x), jax.grad(f)(x), rtol=1e-6)
    np.testing.assert_allclose(jax.vmap(jax.grad(p))(jnp.stack([x, -x])),
                               jax.vmap(jax.grad(f))(jnp.stack([x, -x])), rtol=1e-6)


def test_identical_rules_are_traced_once():
    # The trace counter is opaque to the rule fingerprint (an object without
    # attributes), so nothing the rules read changes between the 50 calls.
    traces = itertools.count()

    @jax.custom_vjp
    def f(x):
        return jnp.sin(x)

    def f_fwd(x):
        next(traces)
        return jnp.sin(x), jnp.cos(x)

    f.defvjp(f_fwd, lambda c, ct: (c * ct,))

    def many(x):
        for _ in range(50):
            x = f(x)
        return x

    p = first_order(many, jnp.ones(3))
    assert next(traces) == 1
    ours = jax.grad(lambda v: p(v).sum())(jnp.ones(3))
    assert next(traces) == 2  # gradients use the materialized rule
    np.testing.assert_allclose(ours, jax.grad(lambda v: many(v).sum())(jnp.ones(3)), rtol=1e-6)
    assert sum(1 for _, e in p.body.walk() if e.prim.name == "custom_vjp_call") >= 50


# ------------------------------------------------------------ the pass on thunks
def test_closure_convert_pass_materializes_thunks():
    f = lambda x: (zc.sin_bwd_times_3(x) + zc.cube_tangent_7(x) + zc.scale_transpose_5(x)).sum()  # noqa: E731
    x = jnp.linspace(-1.0, 1.0, 3)
    prog = jaxpr_cc.Program.from_jaxpr(jax.make_jaxpr(f)(x))
    assert not prog.is_first_order()
    convert_program(prog)
    assert prog.is_first_order()
    prog.verify()
    np.testing.assert_array_equal(prog(x)[0], f(x))
    np.testing.assert_allclose(jax.grad(lambda v: prog(v)[0])(x), jax.grad(f)(x), rtol=1e-6)


def test_closure_convert_pass_reports_dead_tracers_in_one_line():
    def outer(x, b):
        @jax.custom_vjp
        def f(v):
            return v * 2.0
        f.defvjp(lambda v: (v * 2.0, None), lambda _, g: (g * b,))  # bwd closes over tracer b
        return f(x)

    prog = jaxpr_cc.Program.from_jaxpr(jax.make_jaxpr(outer)(1.0, 2.0))
    with pytest.raises(jaxpr_cc.ClosureConversionError) as info:
        convert_program(prog)
    msg = str(info.value)
    assert "\n" not in msg and "jaxpr_cc.trace" in msg and "test_closure.py" in msg
    # the same function traced with jaxpr_cc.trace works
    p = first_order(outer, 1.0, 2.0)
    assert float(jax.grad(p)(1.0, 2.0)) == 2.0


# ------------------------------------------------------------- closure_convert
def test_closure_convert_matches_jax():
    def objective(x, c=jnp.arange(3.0)):
        return jnp.sum((x - c) ** 2)

    def check(w):
        f = lambda x: objective(x) * w  # noqa: E731
        ours, ours_h = jaxpr_cc.closure_convert(f, jnp.ones(3))
        ref, ref_h = jax.closure_convert(f, jnp.ones(3))
        assert len(ours_h) == len(ref_h)
        return ours(jnp.ones(3), *ours_h), ref(jnp.ones(3), *ref_h)

    a, b = check(2.0)
    np.testing.assert_array_equal(a, b)
    ga = jax.grad(lambda w: check(w)[0])(2.0)
    gb = jax.grad(lambda w: check(w)[1])(2.0)
    np.testing.assert_array_equal(ga, gb)


def test_closure_convert_hoist_arrays_and_caching():
    table = jnp.arange(4)
    f = lambda x: x * table.sum() + jnp.float32(1.0)  # noqa: E731
    conv, hoisted = jaxpr_cc.closure_convert(f, jnp.ones(2), hoist="arrays")
    assert any(h is table for h in hoisted)
    np.testing.assert_array_equal(conv(jnp.ones(2), *hoisted), f(jnp.ones(2)))
    conv2, _ = jaxpr_cc.closure_convert(f, jnp.ones(2), hoist="arrays")
    assert conv2 is conv
    _, none_hoisted = jaxpr_cc.closure_convert(f, jnp.ones(2))
    assert none_hoisted == []
    with pytest.raises(TypeError, match="same Pytree structure"):
        conv((jnp.ones(2),), *hoisted)


def test_closure_convert_wrong_structure_raises_jax_words():
    # jax.closure_convert's error text (JAX's own tests match it), for the same misuse.
    _, vjp = jax.vjp(lambda x, z: z * x, 2.0, 3.0)
    for convert in (jax.closure_convert, jaxpr_cc.closure_convert):
        pure, aux = convert(vjp, 2.0)
        pure(2.0, *aux)
        with pytest.raises(TypeError, match="The inputs to the closure produced by "
                                            "closure_convert must have the same Pytree"):
            pure(2.0, aux)


def test_rule_that_calls_itself_is_one_function_at_every_order():
    # fixed_point's fwd calls fixed_point: recursion, not a tower of copies.
    p = first_order(fp.newton_sqrt, 2.0)
    text = str(p)
    assert text.count("fwd_jaxpr=@") >= 1, text[:2000]
    # sqrt(a): derivatives 1/(2 sqrt a), -1/(4 a^1.5), analytic.
    a = 2.0
    np.testing.assert_allclose(p(a), np.sqrt(a), rtol=1e-6)
    np.testing.assert_allclose(jax.grad(p)(a), 0.5 / np.sqrt(a), rtol=1e-5)
    np.testing.assert_allclose(jax.grad(jax.grad(p))(a), -0.25 * a ** -1.5, rtol=1e-4)


def test_rule_depth_is_gone_with_a_clear_error():
    with pytest.raises(TypeError, match="rule_depth was removed"):
        jaxpr_cc.trace(fp.newton_sqrt, 2.0, rule_depth=2)


def test_trace_leaves_jax_untouched_outside_a_session():
    # after tracing, custom functions behave exactly as JAX's own
    first_order(fp.newton_sqrt, 2.0)
    cj = jax.make_jaxpr(fp.newton_sqrt)(2.0)
    eqn = next(e for e in cj.jaxpr.eqns if e.primitive.name == "custom_vjp_call")
    assert "fwd_jaxpr_thunk" in eqn.params


def test_custom_function_under_ensure_compile_time_eval_runs_eagerly():
    # JAX evaluates a custom function on concrete inputs inside
    # ensure_compile_time_eval (its rules and primal see concrete values).
    @jax.custom_jvp
    def f(x):
        assert x == 0.0  # concrete
        return x + 1.0

    @f.defjvp
    def f_jvp(primals, tangents):
        return f(primals[0]), tangents[0]

    def g():
        with jax.ensure_compile_time_eval():
            return f(0.0)

    assert float(jaxpr_cc.jit(g)()) == float(jax.jit(g)()) == 1.0


def test_jit_inside_a_custom_primal_closing_over_outer_tracers():
    # A jaxpr_cc.jit traced inside a custom function's primal closes over values of
    # the enclosing traces: they stay values of those traces (not bytes).
    def call(f, *args):
        f = jax.custom_jvp(f)
        f.defjvp(lambda primals, tangents: (f(*primals), sum(tangents)))
        return f(*args)

    def program(x, jit):
        def bar(y):
            def baz(w):
                q = call(lambda x: y, x) + call(lambda y: w + y, y)
                return call(lambda w: call(jnp.sin, x) * y, 1.0) + q
            return jit(baz)(x)
        return call(bar, x)

    want = jax.jit(lambda x: program(x, jax.jit))(3.0)
    got = jaxpr_cc.jit(lambda x: program(x, jaxpr_cc.jit))(3.0)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_high_level_custom_vjp_under_nested_jit():
    # JAX's experimental custom_vjp3 stages a high-level primitive, which jit lowers
    # before compiling: emitted jaxprs say they hold one.
    jax.config.update("jax_custom_vjp3", True)
    try:
        @jax.custom_vjp
        def f(x):
            return jnp.sin(x)

        f.defvjp(lambda x: (f(x), jnp.cos(x)), lambda cos_x, g: (2 * cos_x * g,))
        for outer, inner in ((jax.jit, jax.jit), (jaxpr_cc.jit, jaxpr_cc.jit)):
            np.testing.assert_allclose(outer(inner(f))(3.0), np.sin(3.0), rtol=1e-6)
        np.testing.assert_allclose(jax.grad(jaxpr_cc.jit(f))(3.0), 2 * np.cos(3.0), rtol=1e-6)
    finally:
        jax.config.update("jax_custom_vjp3", False)
