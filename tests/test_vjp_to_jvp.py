"""``vjp-to-jvp``: forward mode through functions that only have a VJP rule.

References are JAX on the original functions: ``jax.jacrev`` (which runs the
user's bwd) for the Jacobians the rewritten program computes in forward mode,
``jax.grad`` for gradients, ``jax.jacrev(jax.jacrev(...))`` for Hessians.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxpr_cc
from jaxpr_cc.golden.corpus import load_corpus
from jaxpr_cc.passes.manager import PassError, run_passes
from jaxpr_cc.passes.vjp_to_jvp import VjpToJvp
from jaxpr_cc.closure.transpose import NotTransposableError

from jaxref import assert_trees_equal, batch_args, batch_in_axes, scalarize

RTOL, ATOL = 2e-5, 2e-5
CORPUS = [p for p in load_corpus(skip_unavailable=True)
          if {"custom_vjp", "custom_gradient"} & set(p.tags)]
# Corpus rules whose bwd is not a linear function of the cotangent, and why.
NOT_LINEAR = {
    "23_custom_vjp_clip_grad": "'max' is not a linear operation",        # jnp.clip(ct)
}


def prims(program):
    return [e.prim.name for _, e in program.body.walk()]


def inexact_argnums(args):
    return [i for i, a in enumerate(args) if jnp.issubdtype(jnp.result_type(a), jnp.inexact)]


@functools.lru_cache(maxsize=None)
def rewritten(name: str, pipeline: str = "vjp-to-jvp"):
    prog = next(p for p in CORPUS if p.name == name)
    fun = functools.partial(prog.fun, **prog.kwargs)
    program = jaxpr_cc.trace(fun, *prog.args)
    return prog, fun, program, run_passes(program, pipeline)


def test_corpus_has_custom_vjp_programs():
    assert len(CORPUS) >= 6
    assert set(NOT_LINEAR) <= {p.name for p in CORPUS}


@pytest.mark.parametrize("prog", [p for p in CORPUS if p.name not in NOT_LINEAR], ids=str)
def test_corpus_forward_mode_equals_reverse_mode_of_original(prog):
    _, fun, program, new = rewritten(prog.name)
    assert "custom_vjp_call" in prims(program)
    assert "custom_jvp_call" in prims(new) and "linear_call" in prims(new)
    assert new.is_first_order()
    args = tuple(prog.args)
    argnums = tuple(prog.grad_argnums)
    nums = inexact_argnums(args)
    vmap_ok = "vmap" in prog.supports
    axes = batch_in_axes(args)

    def everything(*args):
        # One compilation for all the transformations of both functions.
        batched = batch_args(args)
        return dict(
            value=(new(*args), fun(*args)),
            jac=[(jax.jacfwd(new, argnums=i)(*args), jax.jacrev(fun, argnums=i)(*args))
                 for i in nums],
            grad=(jax.grad(scalarize(new), argnums=argnums)(*args),
                  jax.grad(scalarize(fun), argnums=argnums)(*args)),
            vmap=((jax.vmap(new, in_axes=axes)(*batched), jax.vmap(fun, in_axes=axes)(*batched))
                  if vmap_ok else None))

    jax.clear_caches()
    out = jax.jit(everything)(*args)
    assert_trees_equal(*out["value"], exact=False, rtol=1e-6, atol=1e-6)
    for jf, jr in out["jac"]:
        assert_trees_equal(jf, jr, exact=False, rtol=RTOL, atol=ATOL)
    assert_trees_equal(*out["grad"], exact=False, rtol=1e-6, atol=1e-6)
    if vmap_ok:
        assert_trees_equal(*out["vmap"], exact=False, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["25_custom_vjp_pytree_residuals", "28_custom_vjp_nested"])
def test_corpus_hessian(name):
    prog, fun, _, new = rewritten(name)
    args = tuple(prog.args)
    for i in inexact_argnums(args):
        h_new = jax.jit(jax.hessian(scalarize(new), argnums=i))(*args)
        h_ref = jax.jit(jax.jacrev(jax.jacrev(scalarize(fun), argnums=i), argnums=i))(*args)
        assert_trees_equal(h_new, h_ref, exact=False, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", sorted(NOT_LINEAR))
def test_corpus_rules_with_nonlinear_bwd_are_rejected(name):
    prog = next(p for p in CORPUS if p.name == name)
    fun = functools.partial(prog.fun, **prog.kwargs)
    program = jaxpr_cc.trace(fun, *prog.args)
    before = str(program)
    with pytest.raises(PassError) as info:
        run_passes(program, "vjp-to-jvp{untransposable=error}")
    message = str(info.value)
    assert NOT_LINEAR[name] in message and "\n" not in message
    rule = next(e for _, e in program.body.walk() if e.prim.name == "custom_vjp_call").params
    assert f"rule '{rule['name']}'" in message and rule["source"] in message
    assert str(program) == before  # the caller's program is unchanged
    skipped = run_passes(program, "vjp-to-jvp{untransposable=skip}")
    assert str(skipped) == before


def test_untransposable_primal_on_the_fixed_point_solver():
    # The solver's bwd iterates the adjoint equation (a while_loop over the
    # cotangent); with untransposable=primal, forward mode differentiates the
    # primal's iterations while reverse mode still runs the implicit bwd.
    prog, fun, program, new = rewritten("50_fixed_point_newton_sqrt",
                                        "vjp-to-jvp{untransposable=primal}")
    args = tuple(prog.args)
    jf = jax.jit(jax.jacfwd(new))(*args)
    jr = jax.jit(jax.jacrev(fun))(*args)
    assert_trees_equal(jf, jr, exact=False, rtol=1e-4, atol=1e-5)
    g_new = jax.jit(jax.grad(scalarize(new)))(*args)
    g_old = jax.jit(jax.grad(scalarize(fun)))(*args)
    assert_trees_equal(g_new, g_old, exact=False, rtol=1e-6, atol=1e-6)
    # sqrt(a) has derivative 1/(2 sqrt(a)): an analytic check of the forward mode.
    a = args[0]
    np.testing.assert_allclose(np.diag(np.asarray(jf[0])), 0.5 / np.sqrt(np.asarray(a)), rtol=1e-4)


# ------------------------------------------------------------------ user rules
M = np.array([[1.0, 2.0, 0.0], [0.0, 3.0, -1.0], [4.0, 0.0, 5.0]], np.float32)


@jax.custom_vjp
def fake_sin(x):
    return jnp.sin(x)


def _fake_sin_fwd(x):
    return jnp.sin(x), x


def _fake_sin_bwd(x, ct):
    # Not the derivative of sin: a fixed non-symmetric matrix times ct, so the
    # output shows that bwd ran.  x / x (exactly 1) makes the residual a
    # coefficient of the linear map, as real rules have.
    return ((jnp.asarray(M) @ ct) * (x / x),)


fake_sin.defvjp(_fake_sin_fwd, _fake_sin_bwd)


def test_nonmathematical_bwd_runs_in_both_modes():
    x = jnp.array([0.1, 0.2, 0.3], jnp.float32)
    with pytest.raises(TypeError, match="custom_vjp"):
        jax.jvp(fake_sin, (x,), (x,))  # JAX refuses forward mode on a custom_vjp
    new = run_passes(jaxpr_cc.trace(fake_sin, x), "vjp-to-jvp")
    # bwd(ct) = M ct is the vjp, so the Jacobian is M transposed.
    np.testing.assert_allclose(np.asarray(jax.jacfwd(new)(x)), M.T, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(jax.jacrev(new)(x)), M.T, rtol=1e-6)
    _, t = jax.jvp(new, (x,), (jnp.ones(3),))
    np.testing.assert_allclose(np.asarray(t), M.T @ np.ones(3), rtol=1e-6)
    g = jax.grad(lambda v: jnp.sum(new(v)))(x)
    np.testing.assert_allclose(np.asarray(g), M @ np.ones(3), rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(new(x)), np.asarray(fake_sin(x)))


def make_scaled(w):
    """A custom_vjp that closes over ``w`` (a traced parameter in callers)."""
    @jax.custom_vjp
    def scaled(x):
        return jnp.tanh(w * x)

    def fwd(x):
        y = jnp.tanh(w * x)
        return y, (y,)

    def bwd(res, ct):
        (y,) = res
        return (ct * (1.0 - y ** 2) * w,)

    scaled.defvjp(fwd, bwd)
    return scaled


def closed_over_loss(w, x):
    return jnp.sum(make_scaled(w)(x) ** 2) + jnp.sum(make_scaled(w)(x * 2.0))


def closed_over_loss_plain(w, x):
    """The same function without the rule (whose bwd is the true derivative).
    JAX itself cannot differentiate a custom_vjp closing over a traced value."""
    return jnp.sum(jnp.tanh(w * x) ** 2) + jnp.sum(jnp.tanh(w * x * 2.0))


def test_closed_over_values_follow_the_policy():
    w, x = jnp.float32(0.7), jnp.linspace(-1.0, 1.0, 4, dtype=jnp.float32)
    program = jaxpr_cc.trace(closed_over_loss, w, x)
    eqn = next(e for _, e in program.body.walk() if e.prim.name == "custom_vjp_call")
    assert eqn.params["num_consts"] == 1
    new = run_passes(program, "vjp-to-jvp")
    grad_before = jax.jit(jax.grad(program, argnums=(0, 1)))(w, x)
    for i in (0, 1):
        assert_trees_equal(jax.jit(jax.jacfwd(new, argnums=i))(w, x),
                           jax.jit(jax.jacrev(closed_over_loss_plain, argnums=i))(w, x), exact=False,
                           rtol=RTOL, atol=ATOL)
    assert_trees_equal(jax.jit(jax.grad(new, argnums=(0, 1)))(w, x), grad_before, exact=False,
                       rtol=1e-6, atol=1e-6)
    assert_trees_equal(grad_before, jax.jit(jax.grad(closed_over_loss_plain, argnums=(0, 1)))(w, x),
                       exact=False, rtol=1e-5, atol=1e-5)
    assert_trees_equal(jax.jit(jax.hessian(new, argnums=(0, 1)))(w, x),
                       jax.jit(jax.hessian(closed_over_loss_plain, argnums=(0, 1)))(w, x),
                       exact=False, rtol=1e-4, atol=1e-4)


def halve_until_small(w, x):
    """A custom_vjp whose primal is a while_loop and closes over ``w``: reverse
    mode cannot differentiate the primal w.r.t. ``w``, so the vjp rule's policy
    forms that cotangent in forward mode; the rewritten rule must too."""
    @jax.custom_vjp
    def f(x):
        def cond(c):
            return c[0] < 3
        def body(c):
            return c[0] + 1, c[1] * w
        return lax.while_loop(cond, body, (0, x))[1]

    def fwd(x):
        y = f(x)
        return y, None

    def bwd(_, ct):
        return (ct * w ** 3,)

    f.defvjp(fwd, bwd)
    return jnp.sum(f(x) * x)


def halve_until_small_plain(w, x):
    return jnp.sum(w ** 3 * x * x)


def test_closed_over_value_of_a_while_loop_primal_keeps_forward_cotangents():
    w, x = jnp.float32(0.9), jnp.arange(1.0, 4.0, dtype=jnp.float32)
    program = jaxpr_cc.trace(halve_until_small, w, x)
    eqn = next(e for _, e in program.body.walk() if e.prim.name == "custom_vjp_call")
    assert eqn.params["num_consts"] == 1 and not eqn.params["reverse_ok"]
    new = run_passes(program, "vjp-to-jvp")
    jvp_eqn = next(e for _, e in new.body.walk() if e.prim.name == "custom_jvp_call")
    assert jvp_eqn.params["num_consts"] == 0  # w became a linear input of the tangent map
    # The program before the rewrite (the vjp rule, forward-mode columns for w):
    grad_before = jax.jit(jax.grad(program, argnums=(0, 1)))(w, x)
    assert_trees_equal(jax.jit(jax.grad(new, argnums=(0, 1)))(w, x), grad_before, exact=False,
                       rtol=1e-6, atol=1e-6)
    for i in (0, 1):
        assert_trees_equal(jax.jit(jax.grad(new, argnums=i))(w, x),
                           jax.jit(jax.grad(halve_until_small_plain, argnums=i))(w, x), exact=False,
                           rtol=1e-5, atol=1e-5)
        assert_trees_equal(jax.jit(jax.jacfwd(new, argnums=i))(w, x),
                           jax.jit(jax.jacrev(halve_until_small_plain, argnums=i))(w, x), exact=False,
                           rtol=1e-5, atol=1e-5)


def in_scan(xs):
    def step(carry, x):
        y = fake_sin(x * carry)
        return carry + jnp.sum(y), y
    return lax.scan(step, jnp.float32(1.0), xs)


def test_custom_vjp_inside_a_scan_body():
    xs = jnp.arange(1.0, 7.0, dtype=jnp.float32).reshape(2, 3) / 10
    new = run_passes(jaxpr_cc.trace(in_scan, xs), "vjp-to-jvp")
    assert "custom_vjp_call" not in prims(new)
    assert_trees_equal(jax.jit(jax.jacfwd(new))(xs), jax.jit(jax.jacrev(in_scan))(xs), exact=False,
                       rtol=RTOL, atol=ATOL)


def test_select_rules_by_name():
    prog = next(p for p in CORPUS if p.name == "28_custom_vjp_nested")
    program = jaxpr_cc.trace(functools.partial(prog.fun, **prog.kwargs), *prog.args)
    n_vjp = prims(program).count("custom_vjp_call")
    from jaxpr_cc.passes.manager import PassManager
    pm = PassManager("vjp-to-jvp{rules=safe_abs}")
    new = pm.run(program)
    names = [e.params["name"] for _, e in new.body.walk() if e.prim.name == "custom_vjp_call"]
    assert names == ["shrink"]
    stats = dict(pm.statistics)["vjp-to-jvp{rules=safe_abs}"]
    assert stats["calls-not-selected"] == 1
    assert stats["calls-rewritten"] == n_vjp - 1
    assert stats["rules-rewritten"] == 1  # safe_abs's Regions are shared by its call sites
    # The unselected outer rule is still a custom_vjp; calling the program under
    # forward mode gives it one (issue 17: on by default).
    x, lam = prog.args
    assert_trees_equal(jax.jacfwd(lambda v: new(v, lam))(x),
                       jax.jacrev(lambda v: program(v, lam))(x), exact=False, rtol=1e-5,
                       atol=1e-6)


@jax.custom_vjp
def sin_of_ct(x):
    return x * 2.0


sin_of_ct.defvjp(lambda x: (x * 2.0, None), lambda _, ct: (jnp.sin(ct),))


@jax.custom_vjp
def affine_bwd(x):
    return x * 2.0


affine_bwd.defvjp(lambda x: (x * 2.0, None), lambda _, ct: (ct * 2.0 + 1.0,))


@pytest.mark.parametrize("fn,fragment", [(sin_of_ct, "'sin' is not a linear operation"),
                                         (affine_bwd, "an affine map, not a linear one")])
def test_error_names_the_rule_and_the_equation(fn, fragment):
    x = jnp.ones(3, jnp.float32)
    program = jaxpr_cc.trace(fn, x)
    with pytest.raises(NotTransposableError) as info:
        VjpToJvp(untransposable="error").run(program.copy(), jaxpr_cc.passes.PassContext())
    message = str(info.value)
    assert fragment in message and f"rule '{fn.__name__}'" in message
    assert "test_vjp_to_jvp.py" in message and "\n" not in message


def test_rewritten_program_saves_and_loads(tmp_path):
    x = jnp.array([0.1, 0.2, 0.3], jnp.float32)
    new = run_passes(jaxpr_cc.trace(fake_sin, x), "vjp-to-jvp")
    path = tmp_path / "fake_sin.jcc"
    jaxpr_cc.save(new, path)
    loaded = jaxpr_cc.load(path)
    np.testing.assert_allclose(np.asarray(jax.jacfwd(loaded)(x)), M.T, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(jax.grad(lambda v: jnp.sum(loaded(v)))(x)),
                               M @ np.ones(3), rtol=1e-6)


# ------------------------------------------------------- the test zoo's rules
from zoo import closures as zc  # noqa: E402


def test_zoo_rules_that_are_linear_in_the_cotangent():
    x = jnp.linspace(-1.0, 1.0, 3, dtype=jnp.float32)
    new = run_passes(jaxpr_cc.trace(zc.sin_bwd_times_3, x), "vjp-to-jvp")
    # bwd is 3 * ct (not the derivative of sin): forward mode must give 3 too.
    np.testing.assert_array_equal(np.asarray(jax.jacfwd(new)(x)), 3.0 * np.eye(3))
    np.testing.assert_array_equal(np.asarray(jax.jacrev(new)(x)),
                                  np.asarray(jax.jacrev(zc.sin_bwd_times_3)(x)))
    s = jnp.float32(1.5)
    sq = run_passes(jaxpr_cc.trace(zc.square_grad_10x, s), "vjp-to-jvp")
    assert float(jax.jacfwd(sq)(s)) == float(jax.grad(zc.square_grad_10x)(s)) == 15.0
    assert float(jax.hessian(sq)(s)) == 10.0  # d/dx of the custom gradient 10 x


@pytest.mark.parametrize("fn,arg,reason,derivative", [
    # y0 depends on k, so odeint's bwd is traced for a perturbed y0 too: the part
    # that stacks y0's cotangent is not linear in the cotangent.
    (lambda k: zc.decay_final_state(k, 2.0 + 0.0 * k), jnp.float32(0.7),
     "'stack' adds operand 0", lambda k: -2.0 * np.exp(-k)),
])
def test_zoo_rules_that_are_not_and_the_primal_fallback(fn, arg, reason, derivative):
    program = jaxpr_cc.trace(fn, arg)
    with pytest.raises(PassError, match=reason):
        run_passes(program, "vjp-to-jvp{untransposable=error}")
    new = run_passes(program, "vjp-to-jvp{untransposable=primal}")
    np.testing.assert_allclose(float(jax.jacfwd(new)(arg)), derivative(float(arg)), rtol=2e-4)
    assert_trees_equal(jax.grad(new)(arg), jax.grad(program)(arg), exact=False,
                       rtol=1e-6, atol=1e-7)


def test_zoo_rule_linear_for_the_inputs_jax_perturbs():
    # With a constant y0 JAX never perturbs it, so odeint's bwd is traced without
    # y0's cotangent, and what remains is linear: forward mode works.
    k = jnp.float32(0.7)
    new = run_passes(jaxpr_cc.trace(zc.decay_final_state, k), "vjp-to-jvp{untransposable=error}")
    np.testing.assert_allclose(float(jax.jacfwd(new)(k)), -2.0 * np.exp(-0.7), rtol=2e-4)
    np.testing.assert_allclose(float(jax.grad(new)(k)), -2.0 * np.exp(-0.7), rtol=2e-4)
