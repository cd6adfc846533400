"""The ``linear_call`` rules registered by ``jax_adapter.register_linear_call_batching``.

JAX 0.10.2 has no batching rule for ``linear_call``, its jvp rule rejects
perturbed residuals and its transpose rule rejects linear operands that are
known constants.  These tests use ``jax.custom_derivatives.linear_call``
directly, independently of any jaxpr-cc pass, and compare with plain JAX
computations of the same maps (loops of single calls, analytic derivatives).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.custom_derivatives import linear_call

from jaxpr_cc import jax_adapter as jx

from jaxref import assert_trees_equal

jx.register_linear_call_batching()

RNG = np.random.default_rng(0)
A = jnp.asarray(RNG.normal(size=(4, 3)), jnp.float32)


def scale_rows(r, x):
    """linear in x, nonlinear in the residual r: diag(sin r) A x."""
    return jnp.sin(r) * (A @ x)


def scale_rows_t(r, ct):
    return A.T @ (jnp.sin(r) * ct)


def f(r, x):
    return linear_call(scale_rows, scale_rows_t, r, x)


def seven(r, ct):
    """A deliberately wrong transpose: tells the custom transpose from JAX's own."""
    del r
    return 7.0 * jnp.ones((3,), ct.dtype) * jnp.sum(ct)


def g(r, x):
    return linear_call(scale_rows, seven, r, x)


R = jnp.asarray(RNG.normal(size=(5, 4)), jnp.float32)
X = jnp.asarray(RNG.normal(size=(5, 3)), jnp.float32)


@pytest.mark.parametrize("in_axes", [(0, 0), (None, 0), (0, None)])
def test_vmap_equals_loop(in_axes):
    r = R if in_axes[0] == 0 else R[0]
    x = X if in_axes[1] == 0 else X[0]
    got = jax.vmap(f, in_axes=in_axes)(r, x)
    rows = [scale_rows(r[i] if in_axes[0] == 0 else r, x[i] if in_axes[1] == 0 else x)
            for i in range(5)]
    assert_trees_equal(got, jnp.stack(rows), exact=False, rtol=1e-6, atol=1e-6)


def test_vmap_nonleading_axis_and_unbatched_everything():
    got = jax.vmap(f, in_axes=(1, 1), out_axes=1)(R.T, X.T)
    want = jnp.stack([scale_rows(R[i], X[i]) for i in range(5)], axis=1)
    assert_trees_equal(got, want, exact=False, rtol=1e-6, atol=1e-6)
    # Nothing batched: the rule must leave the result unbatched (out_axes=None).
    out = jax.vmap(lambda _: f(R[0], X[0]), out_axes=None)(jnp.arange(3.0))
    assert_trees_equal(out, scale_rows(R[0], X[0]), exact=False, rtol=1e-6, atol=1e-6)


def test_linear_transpose_of_vmap_uses_the_custom_transpose():
    ct = jnp.asarray(RNG.normal(size=(5, 4)), jnp.float32)
    example = jax.ShapeDtypeStruct((5, 3), jnp.float32)
    (got,) = jax.linear_transpose(lambda x: jax.vmap(g)(R, x), example)(ct)
    # Row i of the result is seven(R[i], ct[i]) = 7 * sum(ct[i]), not A.T(...).
    want = 7.0 * jnp.sum(ct, axis=1, keepdims=True) * jnp.ones((5, 3))
    assert_trees_equal(got, want, exact=False, rtol=1e-5, atol=1e-5)
    # ... and the batched transpose of f is the batched true transpose.
    (got_f,) = jax.linear_transpose(lambda x: jax.vmap(f)(R, x), example)(ct)
    want_f = jnp.stack([scale_rows_t(R[i], ct[i]) for i in range(5)])
    assert_trees_equal(got_f, want_f, exact=False, rtol=1e-5, atol=1e-5)


def test_transpose_of_batched_transpose_is_batched_callee():
    example_x = jax.ShapeDtypeStruct((5, 3), jnp.float32)
    example_ct = jax.ShapeDtypeStruct((5, 4), jnp.float32)
    transposed = jax.linear_transpose(lambda x: jax.vmap(f)(R, x), example_x)
    (twice,) = jax.linear_transpose(lambda c: transposed(c)[0], example_ct)(X)
    assert_trees_equal(twice, jax.vmap(scale_rows)(R, X), exact=False, rtol=1e-5, atol=1e-5)


def test_grad_of_vmap_and_vmap_of_grad_run_the_custom_transpose():
    loss = lambda r, x: jnp.sum(g(r, x))  # noqa: E731
    per_example = jax.vmap(jax.grad(loss, argnums=1))(R, X)
    assert_trees_equal(per_example, jnp.full((5, 3), 7.0 * 4), exact=False, rtol=1e-6, atol=1e-6)
    total = jax.grad(lambda x: jnp.sum(jax.vmap(g)(R, x)))(X)
    assert_trees_equal(total, jnp.full((5, 3), 7.0 * 4), exact=False, rtol=1e-6, atol=1e-6)


# ------------------------------------------------ custom_jvp with a linear_call tangent
@jax.custom_jvp
def h(r, x):
    return jnp.sin(r) * (A @ x)


@h.defjvp
def _h_jvp(primals, tangents):
    r, x = primals
    t_r, t_x = tangents
    # d/dr is folded in with ordinary ops; d/dx goes through linear_call.
    return h(r, x), jnp.cos(r) * (A @ x) * t_r + linear_call(scale_rows, scale_rows_t, r, t_x)


def h_plain(r, x):
    return jnp.sin(r) * (A @ x)


def test_jacfwd_through_linear_call_tangent():
    r, x = R[0], X[0]
    for argnums in (0, 1):
        got = jax.jacfwd(h, argnums=argnums)(r, x)
        want = jax.jacfwd(h_plain, argnums=argnums)(r, x)
        assert_trees_equal(got, want, exact=False, rtol=1e-5, atol=1e-5)


def test_grad_wrt_one_argument_with_known_zero_linear_operand():
    # jax.grad w.r.t. r only: the custom_jvp instantiates x's zero tangent, a known
    # linear operand of linear_call at transposition.
    r, x = R[0], X[0]
    got = jax.grad(lambda r: jnp.sum(h(r, x)))(r)
    want = jax.grad(lambda r: jnp.sum(h_plain(r, x)))(r)
    assert_trees_equal(got, want, exact=False, rtol=1e-5, atol=1e-5)


def test_hessian_perturbs_residuals():
    r, x = R[0], X[0]
    for argnums in ((0,), (1,), (0, 1)):
        got = jax.hessian(lambda r, x: jnp.sum(h(r, x) ** 2), argnums=argnums)(r, x)
        want = jax.hessian(lambda r, x: jnp.sum(h_plain(r, x) ** 2), argnums=argnums)(r, x)
        assert_trees_equal(got, want, exact=False, rtol=1e-4, atol=1e-4)


def test_jvp_with_perturbed_residual_matches_product_rule():
    r, x = R[0], X[0]
    t_r, t_x = jnp.ones_like(r), jnp.ones_like(x)
    _, got = jax.jvp(f, (r, x), (t_r, t_x))
    want = jnp.cos(r) * (A @ x) * t_r + jnp.sin(r) * (A @ t_x)
    assert_trees_equal(got, want, exact=False, rtol=1e-5, atol=1e-5)


def test_jit_of_vmap_of_jvp():
    r, x = R[0], X[0]
    basis = jnp.eye(3, dtype=jnp.float32)
    got = jax.jit(jax.vmap(lambda t: jax.jvp(lambda x: h(r, x), (x,), (t,))[1]))(basis)
    want = (jnp.sin(r)[:, None] * A).T
    assert_trees_equal(got, want, exact=False, rtol=1e-5, atol=1e-5)


def test_jvp_with_a_constant_linear_operand():
    # JAX's own linear_call jvp binds a symbolic zero tangent (the constant b's) as
    # an operand and raises (TypeError: ... ad_util.Zero); so did the registered
    # rule, reached by jacfwd of jacfwd through diffrax's checkpointed solve.
    # d/da (r a + b) = r, analytically.
    def callee(r, lin):
        a, b = lin
        return r * a + b

    def transpose(r, ct):
        return (r * ct, ct)

    def f(a):
        return linear_call(callee, transpose, 2.0, (a, 1.0))

    y, t = jax.jvp(f, (3.0,), (1.0,))
    assert (float(y), float(t)) == (7.0, 2.0)
    y, t = jax.jvp(lambda b: linear_call(callee, transpose, 2.0, (3.0, b)), (1.0,), (0.5,))
    assert (float(y), float(t)) == (7.0, 0.5)
