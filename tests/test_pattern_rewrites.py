"""The pattern-rewrite API and the passes built on it (``stable-log1pexp``,
``straight-through``); the ``jaxpr-cc opt`` CLI runs every issue-10 pass by name.

Values are compared with JAX on the original functions; the changed gradients
with their definitions (``sigmoid(x)``, the identity) computed by JAX directly.
"""
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxpr_cc
from jaxpr_cc.cli.main import main as cli_main
from jaxpr_cc.passes.manager import PassManager, run_passes
from jaxpr_cc.rewrite import (Pattern, PatternError, Rewrite, RewriteError, all_of,
                              apply_rewrites, find_matches, floating, same_shape)

from jaxref import assert_trees_equal

SCALAR = jax.ShapeDtypeStruct((), jnp.float32)
SOFTPLUS = Pattern.from_function(lambda x: jnp.log(1.0 + jnp.exp(x)), SCALAR, constraint=floating)


def matches(pattern, fn, *args):
    program = jaxpr_cc.trace(fn, *args)
    return [m for region in program.body.regions() for m in find_matches(pattern, region)]


def prims(program):
    return [e.prim.name for _, e in program.body.walk()]


# ------------------------------------------------------------------ matching
@pytest.mark.parametrize("shape,dtype", [((), jnp.float32), ((3, 4), jnp.float32),
                                         ((5,), jnp.bfloat16)])
def test_pattern_matches_other_shapes_dtypes_and_operand_orders(shape, dtype):
    x = jnp.ones(shape, dtype)
    found = matches(SOFTPLUS, lambda x: (jnp.log(1 + jnp.exp(x)), jnp.log(jnp.exp(x) + 1.0)), x)
    assert len(found) == 2
    assert all(m.hole_avals[0].shape == shape and m.hole_avals[0].dtype == dtype for m in found)


def test_literals_holes_and_constraints():
    x = jnp.ones(3, jnp.float32)
    assert not matches(SOFTPLUS, lambda x: jnp.log(2.0 + jnp.exp(x)), x)  # another literal
    square = Pattern.from_function(lambda x: x * x, SCALAR)
    assert len(matches(square, lambda x, y: (x * x, x * y), x, x + 1)) == 1  # one hole, one value
    ints = jnp.arange(3)
    assert len(matches(square, lambda i: i * i, ints)) == 1
    square_f = Pattern.from_function(lambda x: x * x, SCALAR, constraint=floating)
    assert not matches(square_f, lambda i: i * i, ints)
    product = Pattern.from_function(lambda x, y: x * y, SCALAR, SCALAR,
                                    constraint=all_of(floating, same_shape))
    assert len(matches(product, lambda x: (x * (x + 1.0), x * 2.0), x)) == 1  # not x * scalar


def test_matches_inside_nested_regions():
    x = jnp.linspace(-1.0, 1.0, 4, dtype=jnp.float32)

    def fn(x):
        inner = jax.jit(lambda v: jnp.log(1 + jnp.exp(v)))(x)
        ys = lax.scan(lambda c, v: (c + jnp.log(1 + jnp.exp(v)), c), 0.0, x)[0]
        zs = lax.cond(x[0] > 0, lambda v: jnp.log(1 + jnp.exp(v)), lambda v: v, x)
        return inner, ys, zs

    assert len(matches(SOFTPLUS, fn, x)) == 3


def test_user_rewrite_and_interior_values_used_elsewhere():
    x = jnp.linspace(-2.0, 2.0, 5, dtype=jnp.float32)

    def fn(x):
        e = jnp.exp(x)
        return jnp.log(1.0 + e) * 2.0 + e  # the pattern's exp(x) is also used outside

    program = jaxpr_cc.trace(fn, x)
    rewrite = Rewrite(SOFTPLUS, lambda match: (lambda v: jnp.logaddexp(v, 0.0)), name="softplus")
    ctx = jaxpr_cc.passes.PassContext()
    assert apply_rewrites(program, [rewrite], ctx) == 1
    program.verify()
    assert ctx.stats == {"rewrites-softplus": 1}
    names = prims(program)
    assert "exp" in names and "log" not in names  # exp kept for its other use, log erased
    assert_trees_equal(program(x), fn(x), exact=False, rtol=1e-6, atol=1e-6)


def test_replacement_must_fit():
    x = jnp.ones(3, jnp.float32)
    program = jaxpr_cc.trace(lambda x: jnp.log(1 + jnp.exp(x)), x)
    bad = Rewrite(SOFTPLUS, lambda match: (lambda v: jnp.sum(v)), name="bad")
    with pytest.raises(RewriteError, match=r"returns \(f32\[\]\) where the pattern returns"):
        apply_rewrites(program, [bad])


VEC3 = jax.ShapeDtypeStruct((3,), jnp.float32)


@pytest.mark.parametrize("fn,examples,message", [
    (lambda x: (jnp.sin(x), jnp.cos(x)), (SCALAR,), "has 2 outputs"),
    (lambda x: x, (SCALAR,), "returns an input"),
    (lambda x, y: jnp.sin(x), (SCALAR, SCALAR), "input 1 is not used"),
    (lambda x: x + np.arange(3.0, dtype=np.float32), (VEC3,), "array constants"),
    (lambda x: jax.jit(jnp.sin)(x), (SCALAR,), "nested jaxprs"),
])
def test_bad_patterns_are_explained(fn, examples, message):
    with pytest.raises(PatternError, match=message):
        Pattern.from_function(fn, *examples)


# ----------------------------------------------------------- stable-log1pexp
def softplus_sum(x):
    return jnp.sum(jnp.log(1 + jnp.exp(x)) * jnp.arange(1.0, 1.0 + x.shape[0]))


def test_stable_log1pexp_gradient_at_100_and_unchanged_values():
    x = jnp.array([-30.0, -1.0, 0.0, 2.5, 40.0, 100.0], jnp.float32)
    assert np.isnan(np.asarray(jax.grad(softplus_sum)(x))[-1])  # JAX: inf / inf
    new = run_passes(jaxpr_cc.trace(softplus_sum, x), "stable-log1pexp")
    assert "custom_jvp_call" in prims(new)
    assert_trees_equal(new(x), softplus_sum(x))                       # bitwise, inf included
    assert_trees_equal(jax.jit(new)(x), jax.jit(softplus_sum)(x))
    g = jax.grad(new)(x)
    want = jax.nn.sigmoid(x) * jnp.arange(1.0, 7.0)
    assert_trees_equal(g, want, exact=False, rtol=1e-6, atol=0)
    softplus = lambda v: jnp.log(1 + jnp.exp(v))  # noqa: E731
    scalar = run_passes(jaxpr_cc.trace(softplus, jnp.float32(0.0)), "stable-log1pexp")
    assert float(jax.grad(scalar)(jnp.float32(100.0))) == 1.0
    assert np.isnan(float(jax.grad(softplus)(jnp.float32(100.0))))
    ok = x[:-1]  # where JAX's own gradient is finite, the two agree
    new_ok = run_passes(jaxpr_cc.trace(softplus_sum, ok), "stable-log1pexp")
    assert_trees_equal(jax.grad(new_ok)(ok), jax.grad(softplus_sum)(ok), exact=False,
                       rtol=1e-5, atol=1e-6)
    batch = jnp.stack([x, x - 1.0])
    assert_trees_equal(jax.vmap(new)(batch), jax.vmap(softplus_sum)(batch))


def test_stable_log1pexp_log1p_form_and_second_derivative():
    x = jnp.array([-3.0, 0.5, 90.0], jnp.float32)

    def fn(x):
        return jnp.sum(jnp.log1p(jnp.exp(x)))

    pm = PassManager("stable-log1pexp")
    new = pm.run(jaxpr_cc.trace(fn, x))
    assert dict(pm.statistics)["stable-log1pexp"] == {"rewrites-log1p(exp(x))": 1}
    assert_trees_equal(new(x), fn(x))
    h = jax.hessian(new)(x)
    s = jax.nn.sigmoid(x)
    assert_trees_equal(jnp.diag(h), s * (1 - s), exact=False, rtol=1e-5, atol=1e-7)


# ----------------------------------------------------------- straight-through
def quantize(x):
    return jnp.sum(jnp.round(x * 4.0) * jnp.sign(x) + lax.floor(x))


def test_straight_through_round_and_sign():
    x = jnp.array([-1.3, -0.2, 0.4, 2.6], jnp.float32)
    new = run_passes(jaxpr_cc.trace(quantize, x), "straight-through")
    assert_trees_equal(new(x), quantize(x))
    # With identity tangents for round and sign (floor keeps derivative 0):
    # d/dx [round(4x) sign(x)] -> 4 sign(x) + round(4x).
    want = 4.0 * jnp.sign(x) + jnp.round(x * 4.0)
    assert_trees_equal(jax.grad(new)(x), want, exact=False, rtol=1e-6, atol=1e-6)
    assert_trees_equal(jax.grad(quantize)(x), jnp.zeros(4), exact=True)
    floor_too = run_passes(jaxpr_cc.trace(quantize, x), "straight-through{ops=round,sign,floor}")
    assert_trees_equal(jax.grad(floor_too)(x), want + 1.0, exact=False, rtol=1e-6, atol=1e-6)


def test_straight_through_rejects_unknown_ops():
    with pytest.raises(jaxpr_cc.PipelineError, match="unknown operation 'abs'"):
        PassManager("straight-through{ops=round,abs}")


# ----------------------------------------------------------------------- CLI
@pytest.mark.parametrize("pipeline,emitted", [
    ("stable-log1pexp", "name='stable_log1pexp'"),
    ("straight-through{ops=round,sign}", "name='straight_through_sign'"),
    ("vjp-to-jvp", "linear_call"),
    ("implicit-diff{adjoint=dense}", "name='implicit_diff.fun'"),
    ("implicit-diff,vjp-to-jvp", "name='implicit_diff.fun'"),
])
def test_cli_opt_runs_each_pass_by_name(tmp_path, capsys, pipeline, emitted):
    source = tmp_path / "model.py"
    source.write_text(textwrap.dedent("""
        import jax
        import jax.numpy as jnp
        from jax import lax

        @jax.custom_vjp
        def halved_grad(x):
            return x

        halved_grad.defvjp(lambda x: (x, None), lambda _, g: (0.5 * g,))

        def fun(x):
            def keep_going(s):
                prev, cur = s
                return jnp.max(jnp.abs(cur - prev)) > 1e-6

            def step(s):
                return s[1], 0.5 * jnp.cos(s[1])

            root = lax.while_loop(keep_going, step, (x, 0.5 * jnp.cos(x)))[1]
            return jnp.log(1 + jnp.exp(halved_grad(x))) + jnp.round(root) + jnp.sign(x)
    """))
    code = cli_main(["opt", f"{source}:fun", "--args", "f32[4]", "-p", pipeline, "--statistics"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "jaxpr-cc pass statistics" in captured.err
    assert emitted in captured.out
