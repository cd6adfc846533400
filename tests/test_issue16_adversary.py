"""Issue 16 adversary reproducers: passes and backends must not change the answer.

Each test is one reproducer, checked against JAX itself (values, jvp) or, where
JAX refuses (reverse mode through a while_loop), against JAX's own forward-mode
number or an analytic reference.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxpr_cc
from jaxpr_cc.passes.manager import PassManager, run_passes


def _exec_module(source: str) -> dict:
    namespace: dict = {}
    exec(compile(source, "<emitted>", "exec"), namespace)
    return namespace


# ------------------------------------------------------------- implicit-diff
def steps_shrink_without_fixed_point(th):
    """x <- x + th / x: the steps get small (|dx| = th / x < 1e-3), but there is
    no fixed point."""
    def keep_going(s):
        x, xp = s
        return jnp.abs(x - xp) > 1e-3

    def step(s):
        x, _ = s
        return x + th / x, x

    return lax.while_loop(keep_going, step, (jnp.float32(1.0), jnp.float32(1e9)))[0]


def loose_tolerance(th):
    """x <- x/2 + th with tolerance 0.5: stops at 1.5 for th=1, the fixed point is 2."""
    def keep_going(s):
        x, xp = s
        return jnp.abs(x - xp) > 0.5

    def step(s):
        x, _ = s
        return 0.5 * x + th, x

    return lax.while_loop(keep_going, step, (jnp.float32(0.0), jnp.float32(1e9)))[0]


def test_no_fixed_point_keeps_the_loops_derivative():
    th = jnp.float32(1.0)
    new = run_passes(jaxpr_cc.trace(steps_shrink_without_fixed_point, th), "implicit-diff")
    want = jax.jvp(steps_shrink_without_fixed_point, (th,), (jnp.float32(1.0),))[1]
    got = jax.jvp(new, (th,), (jnp.float32(1.0),))[1]
    np.testing.assert_allclose(float(got), float(want), rtol=1e-4)
    # JAX cannot reverse-differentiate the loop; the scalar gradient is the jvp.
    np.testing.assert_allclose(float(jax.grad(new)(th)), float(want), rtol=1e-4)


def test_loose_tolerance_keeps_the_loops_derivative():
    th = jnp.float32(1.0)
    new = run_passes(jaxpr_cc.trace(loose_tolerance, th), "implicit-diff")
    assert float(new(th)) == float(loose_tolerance(th)) == 1.5
    want = jax.jvp(loose_tolerance, (th,), (jnp.float32(1.0),))[1]
    assert float(want) == 1.5  # the loop's derivative, not the fixed point's (2)
    np.testing.assert_allclose(float(jax.jvp(new, (th,), (jnp.float32(1.0),))[1]), 1.5,
                               rtol=1e-6)
    np.testing.assert_allclose(float(jax.grad(new)(th)), 1.5, rtol=1e-6)


def started_near_its_fixed_point(b):
    """x <- 0.9 x + b from 999 (the fixed point is 10 b = 1000), tolerance 1e-2: the
    residual shrinks only ~10x, so the loop's derivative is 9.11, not 10."""
    def keep_going(s):
        x, xp = s
        return jnp.abs(x - xp) > 1e-2

    def step(s):
        x, _ = s
        return 0.9 * x + b, x

    return lax.while_loop(keep_going, step, (jnp.float32(999.0), jnp.float32(0.0)))[0]


def test_a_loop_started_near_its_fixed_point_keeps_its_derivative():
    b = jnp.float32(100.0)
    new = run_passes(jaxpr_cc.trace(started_near_its_fixed_point, b), "implicit-diff")
    want = jax.jvp(started_near_its_fixed_point, (b,), (jnp.float32(1.0),))[1]
    assert abs(float(want) - 10.0) > 0.5  # the loop's derivative is far from the implicit
    np.testing.assert_allclose(float(jax.jvp(new, (b,), (jnp.float32(1.0),))[1]),
                               float(want), rtol=1e-5)
    np.testing.assert_allclose(float(jax.grad(new)(b)), float(want), rtol=1e-5)


def test_tight_tolerance_still_uses_the_implicit_derivative():
    """The same loop with a tight tolerance is at its fixed point: the derivative
    is the fixed point's, 2 (the loop's own differs from it by ~1e-6)."""
    def tight(th):
        def keep_going(s):
            x, xp = s
            return jnp.abs(x - xp) > 1e-6

        def step(s):
            x, _ = s
            return 0.5 * x + th, x

        return lax.while_loop(keep_going, step, (jnp.float32(0.0), jnp.float32(1e9)))[0]

    th = jnp.float32(1.0)
    new = run_passes(jaxpr_cc.trace(tight, th), "implicit-diff")
    np.testing.assert_allclose(float(jax.grad(new)(th)), 2.0, rtol=1e-6)
    np.testing.assert_allclose(float(jax.jvp(tight, (th,), (jnp.float32(1.0),))[1]), 2.0,
                               rtol=1e-5)


def vmapped_fixed_point(th):
    def one(t):
        def keep_going(s):
            x, xp = s
            return jnp.abs(x - xp) > 1e-6

        def step(s):
            x, _ = s
            return jnp.cos(x) * t, x

        return lax.while_loop(keep_going, step, (jnp.float32(0.5), jnp.float32(1e9)))[0]
    return jax.vmap(one)(th)


@pytest.mark.heavy
def test_vmapped_fixed_point_loop():
    """The vmapped loop has a batched exit test; each element is its own fixed
    point x = t cos x, dx/dt = cos x / (1 + t sin x)."""
    th = jnp.array([0.3, 0.7, 0.9], jnp.float32)
    pm = PassManager("implicit-diff")
    new = pm.run(jaxpr_cc.trace(vmapped_fixed_point, th))
    assert dict(pm.statistics)["implicit-diff"] == {"loops-rewritten": 1}
    np.testing.assert_array_equal(np.asarray(new(th)), np.asarray(vmapped_fixed_point(th)))
    x = np.asarray(vmapped_fixed_point(th), np.float64)
    t = np.asarray(th, np.float64)
    exact = np.cos(x) / (1.0 + t * np.sin(x))
    got_fwd = jax.jvp(new, (th,), (jnp.ones(3),))[1]
    got_rev = jax.grad(lambda t: jnp.sum(new(t)))(th)
    np.testing.assert_allclose(np.asarray(got_fwd), exact, rtol=1e-4)
    np.testing.assert_allclose(np.asarray(got_rev), exact, rtol=1e-4)
    want = jax.jvp(vmapped_fixed_point, (th,), (jnp.ones(3),))[1]  # JAX, through iterations
    np.testing.assert_allclose(np.asarray(got_fwd), np.asarray(want), rtol=2e-6)
    np.testing.assert_allclose(np.asarray(got_rev), np.asarray(want), rtol=2e-6)


def complex_iterate(t):
    def keep_going(s):
        x, xp = s
        return jnp.abs(x - xp) > 1e-6

    def step(s):
        x, _ = s
        return 0.5 * x * (0.3 + 0.4j) + t, x

    return jnp.real(lax.while_loop(keep_going, step,
                                   (jnp.complex64(0), jnp.complex64(1e9)))[0])


def test_complex_iterate_is_left_alone_with_a_reason():
    t = jnp.float32(0.7)
    pm = PassManager("implicit-diff")
    new = pm.run(jaxpr_cc.trace(complex_iterate, t))
    stats = dict(pm.statistics)["implicit-diff"]
    assert stats.get("loops-skipped") == 1
    assert any("complex" in key for key in stats), stats
    want = jax.jvp(complex_iterate, (t,), (jnp.float32(1.0),))[1]
    np.testing.assert_allclose(float(jax.jvp(new, (t,), (jnp.float32(1.0),))[1]), float(want),
                               rtol=1e-6)


def tanh_fixed_point(th):
    def keep_going(s):
        x, xp = s
        return jnp.max(jnp.abs(x - xp)) > 1e-6

    def step(s):
        x, _ = s
        return jnp.tanh(0.5 * x[::-1] + th), x

    return lax.while_loop(keep_going, step, (jnp.zeros(3), jnp.full(3, 1e9)))[0]


@pytest.mark.heavy
def test_implicit_diff_output_saves_and_emits(tmp_path):
    """The rules implicit-diff builds are first-order: save/load and emit_python
    work without a later closure-convert, and give the same gradient."""
    th = jnp.array([0.1, 0.2, -0.3], jnp.float32)
    new = run_passes(jaxpr_cc.trace(tanh_fixed_point, th), "implicit-diff")
    want = jax.jacfwd(lambda t: jnp.sum(tanh_fixed_point(t)))(th)  # JAX, forward mode
    got = jax.grad(lambda t: jnp.sum(new(t)))(th)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4)
    path = tmp_path / "implicit.jaxprcc"
    jaxpr_cc.save(new, str(path))
    loaded = jaxpr_cc.load(str(path))
    np.testing.assert_allclose(np.asarray(jax.grad(lambda t: jnp.sum(loaded(t)))(th)),
                               np.asarray(got), rtol=1e-6)
    emitted = _exec_module(jaxpr_cc.emit_python(new))[new.name]
    np.testing.assert_allclose(np.asarray(jax.grad(lambda t: jnp.sum(emitted(t)))(th)),
                               np.asarray(got), rtol=1e-6)


# ------------------------------------------------------------------ donation
def _donated_flags(program) -> list[tuple]:
    return [eqn.params["donated_invars"] for region in program.body.regions()
            for eqn in region.equations if "donated_invars" in eqn.params]


def donate_a_copy_of_the_input(x):
    return jax.jit(lambda a: a * 2, donate_argnums=0)(x * 1.0) + x


def donate_then_recompute(x):
    a = x * 2.0
    b = jax.jit(lambda v: v + 1.0, donate_argnums=0)(a)
    c = x * 2.0  # the same expression as `a`, computed after `a` was donated
    return b + c


def donate_only_use_of_a_copy(x):
    return jax.jit(lambda a: a * 2, donate_argnums=0)(x * 1.0)


def donate_fresh_value(x):
    return jax.jit(lambda a: a * 2, donate_argnums=0)(jnp.sin(x)) + x



@pytest.mark.parametrize("fun", [donate_a_copy_of_the_input, donate_then_recompute,
                                 donate_only_use_of_a_copy])
@pytest.mark.parametrize("pipeline", ["simplify", "canonicalize", "copy-propagation", "cse",
                                      "closure-convert,hoist-consts,cse,dce",
                                      jaxpr_cc.DEFAULT_PIPELINE])
def test_passes_never_donate_a_value_still_read(fun, pipeline):
    x = jnp.array([0.1, 1.0, -2.0], jnp.float32)
    want = fun(jnp.array(x))  # JAX, eagerly (the inner jit donates for real)
    new = run_passes(jaxpr_cc.trace(fun, x), pipeline)
    arg = jnp.array(x)
    np.testing.assert_array_equal(np.asarray(new(arg)), np.asarray(want))
    assert not arg.is_deleted()  # the caller's array is not donated
    np.testing.assert_array_equal(np.asarray(arg), np.asarray(x))
    np.testing.assert_array_equal(np.asarray(new(arg)), np.asarray(want))  # callable twice


def test_a_safe_donation_is_kept():
    x = jnp.array([0.1, 1.0, -2.0], jnp.float32)
    pm = PassManager("canonicalize,cse")
    new = pm.run(jaxpr_cc.trace(donate_fresh_value, x))
    assert _donated_flags(new) == [(True,)]
    assert all("donations-dropped" not in k for _, s in pm.statistics for k in s)
    np.testing.assert_array_equal(np.asarray(new(x)), np.asarray(donate_fresh_value(x)))


def test_dropped_donations_are_counted():
    x = jnp.array([0.1, 1.0, -2.0], jnp.float32)
    pm = PassManager("canonicalize")
    new = pm.run(jaxpr_cc.trace(donate_a_copy_of_the_input, x))
    assert _donated_flags(new) == [(False,)]
    stats = dict(pm.statistics)["canonicalize"]
    assert stats["donations-dropped (the donated value is read elsewhere)"] == 1


# ------------------------------------------------------ device_put emission
_DEVICE = jax.devices()[0]
DEVICE_PUTS = {
    "device": lambda x: jax.device_put(x, _DEVICE) * 2.0,
    "single_device_sharding":
        lambda x: jax.device_put(x, jax.sharding.SingleDeviceSharding(_DEVICE)) * 2.0,
    "several_operands": lambda x: sum(jax.device_put((x, x + 1), _DEVICE)),
    "with_src": lambda x: jax.device_put(x, _DEVICE, src=_DEVICE) * 3.0,
    "donated_copy": lambda x: jax.device_put(x * 1.0, _DEVICE, donate=True),
}


def _device_put_params(fun, x):
    return [e.params for e in jax.make_jaxpr(fun)(x).eqns if e.primitive.name == "device_put"]


@pytest.mark.parametrize("key", sorted(DEVICE_PUTS))
def test_device_put_with_a_device_emits(key):
    fun = DEVICE_PUTS[key]
    x = jnp.arange(3.0, dtype=jnp.float32)
    program = jaxpr_cc.trace(fun, x)
    source = jaxpr_cc.emit_python(program)
    namespace = _exec_module(source)
    emitted = namespace[program.name]
    np.testing.assert_array_equal(np.asarray(emitted(x)), np.asarray(fun(x)))
    # The emitted call stages the same device_put as the original function.
    assert _device_put_params(emitted, x) == _device_put_params(fun, x)


def test_emitted_device_lookup_fails_clearly_without_the_device():
    program = jaxpr_cc.trace(DEVICE_PUTS["device"], jnp.arange(3.0, dtype=jnp.float32))
    namespace = _exec_module(jaxpr_cc.emit_python(program))
    with pytest.raises(RuntimeError, match="places a value on cpu device 9999, which this "
                                           "process does not have"):
        namespace["_device"]("cpu", 9999)


# ------------------------------------------------------------- constant-fold
def kernel_rounded_constants(x):
    # expm1(1e-7): XLA's compile-time evaluator and its CPU kernel differ by an ulp
    return x + jnp.log1p(jnp.float32(1e-7)) * 1e7 + jnp.expm1(jnp.float32(1e-7)) * 1e7


def test_constant_fold_changes_neither_a_jitted_nor_an_op_by_op_run():
    x = jnp.array([0.3, -1.2, 2.0], jnp.float32)
    program = jaxpr_cc.trace(kernel_rounded_constants, x)
    pm = PassManager("constant-fold")
    out = pm.run(program)
    stats = dict(pm.statistics)["constant-fold"]
    assert stats["not-folded (jitted and op-by-op runs differ)"] >= 1
    assert stats["literals-created"] >= 1  # log1p(1e-7) * 1e7 agrees and is folded
    np.testing.assert_array_equal(np.asarray(out(x)), np.asarray(program(x)))
    np.testing.assert_array_equal(np.asarray(out(x)), np.asarray(kernel_rounded_constants(x)))
    np.testing.assert_array_equal(np.asarray(jax.jit(out)(x)),
                                  np.asarray(jax.jit(kernel_rounded_constants)(x)))


# ------------------------------------------------------------- hoist-consts
@jax.custom_jvp
def _self_calling(x):
    return jnp.sin(x)


_self_calling.defjvp(lambda p, t: (_self_calling(p[0]), 3.0 * t[0]))


def test_hoist_literals_on_a_self_calling_custom_jvp():
    x = jnp.array([0.3, -1.2, 2.0], jnp.float32)
    out = run_passes(jaxpr_cc.trace(_self_calling, x), "hoist-consts{literals=true}")
    ones = jnp.ones(3, jnp.float32)
    np.testing.assert_array_equal(np.asarray(out(x)), np.asarray(_self_calling(x)))
    np.testing.assert_array_equal(np.asarray(jax.jvp(out, (x,), (ones,))[1]),
                                  np.asarray(jax.jvp(_self_calling, (x,), (ones,))[1]))
    np.testing.assert_array_equal(np.asarray(jax.grad(lambda v: out(v).sum())(x)),
                                  np.asarray(jax.grad(lambda v: _self_calling(v).sum())(x)))


# ---------------------------------------- rules that re-enter a jitted caller
@jax.custom_jvp
def _log_rule(x):
    return jnp.log(x)


@jax.jit
def _jitted_log(x):
    return _log_rule(x)


@_log_rule.defjvp
def _log_rule_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    y = _jitted_log(x)  # calls the jitted function the rule is called from
    return y, dx / jnp.exp(y)


def test_rule_calling_its_jitted_caller():
    def f(x):
        return jnp.sum(_jitted_log(x) ** 2)

    x = jnp.array([1.5, 2.0], jnp.float32)
    program = jaxpr_cc.trace(f, x)
    assert program.is_first_order()
    np.testing.assert_allclose(np.asarray(jax.grad(program)(x)), np.asarray(jax.grad(f)(x)),
                               rtol=1e-6)
    np.testing.assert_allclose(np.asarray(jax.hessian(program)(x)),
                               np.asarray(jax.hessian(f)(x)), rtol=1e-6)


def test_slogdet_differentiates_after_tracing(tmp_path):
    x = jnp.array([[0.5, -1.0, 2.0], [0.3, 0.2, -0.7], [1.1, 0.4, 0.9]], jnp.float32)

    def f(m):
        return jnp.linalg.slogdet(m)[1]

    program = jaxpr_cc.trace(f, x)
    assert program.is_first_order()
    np.testing.assert_allclose(np.asarray(jax.grad(program)(x)), np.asarray(jax.grad(f)(x)),
                               rtol=1e-5)
    np.testing.assert_allclose(np.asarray(jax.hessian(program)(x)),
                               np.asarray(jax.hessian(f)(x)), rtol=1e-4, atol=1e-6)
    path = tmp_path / "slogdet.jaxprcc"
    jaxpr_cc.save(program, str(path))
    np.testing.assert_allclose(np.asarray(jax.grad(jaxpr_cc.load(str(path)))(x)),
                               np.asarray(jax.grad(f)(x)), rtol=1e-5)


def averaging(x0, a):
    """x <- a mean(x) + (1 - a) x: I - df/dx is singular (the fixed point moves with
    the start); 100 carries take the iterative (bicgstab) adjoint."""
    def keep_going(c):
        x, xp = c
        return jnp.max(jnp.abs(x - xp)) > 1e-6

    def step(c):
        x, _ = c
        return a * jnp.full_like(x, jnp.mean(x)) + (1 - a) * x, x

    x, _ = lax.while_loop(keep_going, step, (x0, x0 + 1.0))
    return jnp.sum(x * jnp.arange(x0.shape[0], dtype=jnp.float32))


@pytest.mark.heavy
def test_a_singular_adjoint_keeps_the_loops_derivative_on_the_iterative_path():
    x0, a = jnp.linspace(0., 1., 100, dtype=jnp.float32), jnp.float32(0.5)
    new = run_passes(jaxpr_cc.trace(averaging, x0, a), "implicit-diff")
    t = jnp.linspace(1., 2., 100, dtype=jnp.float32)
    want = jax.jvp(averaging, (x0, a), (t, jnp.float32(0.)))[1]
    got = jax.jvp(new, (x0, a), (t, jnp.float32(0.)))[1]
    np.testing.assert_allclose(float(got), float(want), rtol=1e-5)
    np.testing.assert_allclose(jax.grad(new)(x0, a), jax.jacfwd(averaging)(x0, a), rtol=1e-4,
                               atol=1e-4)
