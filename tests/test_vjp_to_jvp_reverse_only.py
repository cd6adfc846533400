"""``vjp-to-jvp`` keeps a rule whose bwd is not linear reverse-only, and finishes.

References are JAX on the original functions: gradients (which run the user's
nonlinear bwd) must be unchanged; forward mode through such a rule must raise one
line naming the rule and the nonlinear operation, while the other rules of the
same program get their forward mode.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_cc
from jaxpr_cc.passes.manager import PassManager, run_passes


@jax.custom_vjp
def clip_gradient(x):
    return x


clip_gradient.defvjp(lambda x: (x, None), lambda _, ct: (jnp.clip(ct, -1.0, 1.0),))


@jax.custom_vjp
def times_three(x):
    """A linear bwd (its transpose exists): rewritten for forward mode."""
    return 3.0 * x


times_three.defvjp(lambda x: (3.0 * x, None), lambda _, ct: (3.0 * ct,))


@jax.custom_vjp
def sin_of_ct(x):
    return 2.0 * x


sin_of_ct.defvjp(lambda x: (2.0 * x, None), lambda _, ct: (jnp.sin(ct),))


def model(x, w):
    return jnp.sum(times_three(clip_gradient(w * x) ** 2)) + jnp.sum(times_three(x))


def both_rules(x):
    return clip_gradient(x) + times_three(x)


X = jnp.array([0.5, -2.0, 3.0], jnp.float32)
W = jnp.float32(1.7)


def test_pipeline_finishes_and_statistics_name_the_rule():
    program = jaxpr_cc.trace(model, X, W)
    pm = PassManager("vjp-to-jvp,dce")
    new = pm.run(program)
    stats = dict(pm.statistics)["vjp-to-jvp"]
    assert stats["rules-reverse-only"] == 1 and stats["rules-rewritten"] == 1
    why = next(k for k in stats if k.startswith("rule "))
    assert "clip_gradient" in why and "'max' is not a linear operation" in why
    assert "test_vjp_to_jvp_reverse_only.py" in why and "\n" not in why
    assert "custom_vjp_call" not in [e.prim.name for _, e in new.body.walk()]


def test_reverse_mode_is_unchanged():
    new = run_passes(jaxpr_cc.trace(model, X, W), "vjp-to-jvp")
    for argnums in (0, 1, (0, 1)):
        want = jax.jit(jax.grad(model, argnums=argnums))(X, W)
        got = jax.jit(jax.grad(new, argnums=argnums))(X, W)
        for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6)
    # Second order in reverse mode and forward-over-reverse differentiate the
    # user's bwd, as JAX does on the original.
    hess_rr = jax.jit(jax.jacrev(jax.grad(model)))(X, W)
    np.testing.assert_allclose(np.asarray(jax.jit(jax.jacrev(jax.grad(new)))(X, W)),
                               np.asarray(hess_rr), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(jax.jit(jax.jacfwd(jax.grad(new)))(X, W)),
                               np.asarray(jax.jacfwd(jax.grad(model))(X, W)), rtol=1e-6)
    per = jax.jit(jax.vmap(jax.grad(new), in_axes=(0, None)))(jnp.stack([X, 2 * X]), W)
    ref = jax.vmap(jax.grad(model), in_axes=(0, None))(jnp.stack([X, 2 * X]), W)
    np.testing.assert_allclose(np.asarray(per), np.asarray(ref), rtol=1e-6)


@pytest.mark.parametrize("how", ["jvp", "jit-jvp", "jacfwd", "jit-jacfwd", "linearize"])
def test_forward_mode_through_the_rule_raises_one_line(how):
    new = run_passes(jaxpr_cc.trace(both_rules, X), "vjp-to-jvp")
    ones = jnp.ones_like(X)
    run = {"jvp": lambda: jax.jvp(new, (X,), (ones,)),
           "jit-jvp": lambda: jax.jit(lambda x: jax.jvp(new, (x,), (ones,)))(X),
           "jacfwd": lambda: jax.jacfwd(new)(X),
           "jit-jacfwd": lambda: jax.jit(jax.jacfwd(new))(X),
           "linearize": lambda: jax.linearize(new, X)[1](ones)}[how]
    with pytest.raises(TypeError) as info:
        jax.block_until_ready(run())
    message = str(info.value).strip()
    first = message.splitlines()[0]
    assert "can't apply forward-mode autodiff" in first
    assert "custom_vjp rule 'clip_gradient'" in first
    assert "'max' is not a linear operation" in first
    assert "test_vjp_to_jvp_reverse_only.py" in first


def test_values_vmap_and_the_linear_rule_forward_mode_still_work():
    new = run_passes(jaxpr_cc.trace(both_rules, X), "vjp-to-jvp")
    np.testing.assert_array_equal(np.asarray(jax.jit(new)(X)), np.asarray(both_rules(X)))
    xs = jnp.stack([X, -X])
    np.testing.assert_array_equal(np.asarray(jax.jit(jax.vmap(new))(xs)),
                                  np.asarray(jax.vmap(both_rules)(xs)))
    only_linear = run_passes(jaxpr_cc.trace(times_three, X), "vjp-to-jvp")
    np.testing.assert_array_equal(np.asarray(jax.jacfwd(only_linear)(X)), 3.0 * np.eye(3))


def test_the_reason_names_the_nonlinear_operation_of_other_bwds():
    new = run_passes(jaxpr_cc.trace(sin_of_ct, X), "vjp-to-jvp")
    with pytest.raises(TypeError, match=r"rule 'sin_of_ct'.*'sin' is not a linear operation"):
        jax.jvp(new, (X,), (jnp.ones_like(X),))
    np.testing.assert_allclose(np.asarray(jax.grad(lambda x: jnp.sum(new(x)))(X)),
                               np.asarray(jax.grad(lambda x: jnp.sum(sin_of_ct(x)))(X)), rtol=1e-6)


def test_reverse_only_program_saves_and_loads(tmp_path):
    new = run_passes(jaxpr_cc.trace(both_rules, X), "vjp-to-jvp")
    path = tmp_path / "reverse_only.jcc"
    jaxpr_cc.save(new, path)
    loaded = jaxpr_cc.load(path)
    np.testing.assert_allclose(np.asarray(jax.grad(lambda x: jnp.sum(loaded(x)))(X)),
                               np.asarray(jax.grad(lambda x: jnp.sum(both_rules(x)))(X)),
                               rtol=1e-6)
    with pytest.raises(TypeError, match="rule 'clip_gradient'"):
        jax.jvp(loaded, (X,), (jnp.ones_like(X),))


def test_error_and_skip_modes_are_still_available():
    program = jaxpr_cc.trace(both_rules, X)
    with pytest.raises(Exception, match="untransposable=reverse-only"):
        run_passes(program, "vjp-to-jvp{untransposable=error}")
    skipped = PassManager("vjp-to-jvp{untransposable=skip}")
    out = skipped.run(program)
    assert "custom_vjp_call" in [e.prim.name for _, e in out.body.walk()]
    assert dict(skipped.statistics)["vjp-to-jvp{untransposable=skip}"][
        "rules-skipped-untransposable"] == 1


# ------------------------------------- casts of the cotangent (issue 16, adversary)
@jax.custom_vjp
def int_cast_of_ct(x):
    return jnp.sin(x)


# Truncating the cotangent toward zero: not linear although JAX registers a
# transpose for convert_element_type.
int_cast_of_ct.defvjp(lambda x: (jnp.sin(x), None),
                      lambda _, ct: (ct.astype(jnp.int32).astype(jnp.float32),))


@jax.custom_vjp
def bool_cast_of_ct(x):
    return 2.0 * x


bool_cast_of_ct.defvjp(lambda x: (2.0 * x, None),
                       lambda _, ct: (ct.astype(bool).astype(jnp.float32),))


@jax.custom_vjp
def half_cast_of_ct(x):
    return 3.0 * x


# A float-to-float cast is linear: this rule keeps its forward mode.
half_cast_of_ct.defvjp(lambda x: (3.0 * x, None),
                       lambda _, ct: ((3.0 * ct.astype(jnp.float16)).astype(ct.dtype),))

WEIGHTS = jnp.array([1.0, 2.5, 3.0], jnp.float32)


@pytest.mark.parametrize("rule,dtype", [(int_cast_of_ct, "int32"), (bool_cast_of_ct, "bool")])
def test_cast_of_the_cotangent_to_integers_is_not_linear(rule, dtype):
    def loss(x):
        return jnp.sum(rule(x) * WEIGHTS)

    x = jnp.array([0.3, -1.2, 2.0], jnp.float32)
    pm = PassManager("vjp-to-jvp")
    new = pm.run(jaxpr_cc.trace(loss, x))
    assert dict(pm.statistics)["vjp-to-jvp"]["rules-reverse-only"] == 1
    np.testing.assert_array_equal(np.asarray(jax.grad(new)(x)), np.asarray(jax.grad(loss)(x)))
    for forward in (lambda: jax.jacfwd(new)(x), lambda: jax.jvp(new, (x,), (jnp.ones(3),))):
        with pytest.raises(TypeError) as info:
            jax.block_until_ready(forward())
        first = str(info.value).strip().splitlines()[0]
        assert f"convert_element_type' to {dtype}" in first
        assert rule.__name__ in first


def test_float_cast_of_the_cotangent_stays_linear():
    x = jnp.array([0.3, -1.2, 2.0], jnp.float32)
    pm = PassManager("vjp-to-jvp")
    new = pm.run(jaxpr_cc.trace(half_cast_of_ct, x))
    assert dict(pm.statistics)["vjp-to-jvp"].get("rules-reverse-only", 0) == 0
    np.testing.assert_allclose(np.asarray(jax.jacfwd(new)(x)), 3.0 * np.eye(3), rtol=1e-6)


@jax.custom_vjp
def scatter_at_ct(x):
    return jnp.sin(x)


def _scatter_bwd(_, ct):
    # Scatter indices read from the cotangent (through a float floor, which JAX
    # can transpose only as an index): not linear.
    idx = jnp.zeros((1, 1), jnp.int32) + (ct[:1] > 100.0).astype(jnp.int32).reshape(1, 1)
    dn = jax.lax.ScatterDimensionNumbers(update_window_dims=(), inserted_window_dims=(0,),
                                         scatter_dims_to_operand_dims=(0,))
    return (jax.lax.scatter(ct, idx, ct[:1], dn, unique_indices=True),)


scatter_at_ct.defvjp(lambda x: (jnp.sin(x), None), _scatter_bwd)


def test_scatter_with_indices_from_the_cotangent_has_a_one_line_reason():
    x = jnp.array([0.3, -1.2, 2.0], jnp.float32)
    loss = lambda x: jnp.sum(scatter_at_ct(x) * WEIGHTS)  # noqa: E731
    new = run_passes(jaxpr_cc.trace(loss, x), "vjp-to-jvp")
    np.testing.assert_array_equal(np.asarray(jax.grad(new)(x)), np.asarray(jax.grad(loss)(x)))
    with pytest.raises(TypeError) as info:
        jax.jacfwd(new)(x)
    first = str(info.value).strip().splitlines()[0]
    assert "scatter_at_ct" in first and "JAX says" not in first
    assert "is not a linear operation" in first or "indices that depend" in first


def test_linearity_check_scatter_indices_message():
    """The table entry for plain scatter: indices that depend on the linear input."""
    from jaxpr_cc.closure.transpose import first_nonlinear_equation

    def f(ct, idx_f):
        idx = idx_f.astype(jnp.int32).reshape(1, 1)
        dn = jax.lax.ScatterDimensionNumbers(update_window_dims=(), inserted_window_dims=(0,),
                                             scatter_dims_to_operand_dims=(0,))
        return jax.lax.scatter(ct, idx, ct[:1], dn, unique_indices=True)

    jaxpr = jax.make_jaxpr(f)(jnp.ones(3), jnp.ones(1)).jaxpr
    assert first_nonlinear_equation(jaxpr, [True, False]) is None
    problem = first_nonlinear_equation(jaxpr, [True, True])
    assert problem is not None and "convert_element_type" in problem.reason
