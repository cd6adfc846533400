"""Linear bwds written with primitives JAX cannot transpose (adversary, stop 30).

``g ** 1`` (``integer_pow[y=1]``) and a sort whose keys come from residuals
(``lax.sort((keys, g), num_keys=1)`` permutes ``g``) are linear in the
cotangent; forward mode through them was refused.  The reference is
``jax.jacrev`` of the same function: JAX runs the user's bwd.  A sort keyed by
the cotangent itself and ``g ** 2`` are not linear and stay refused.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxpr_cc


def _rule(bwd_body):
    @jax.custom_vjp
    def f(x):
        return jnp.sin(x) * x[::-1]

    f.defvjp(lambda x: (f(x), (x,)), lambda res, g: (bwd_body(res[0], g),))
    return f


def _permuted(x, g):
    # g reordered by the residual's order, and again along the other axis of a
    # 2-d view with two keys (the second breaking the first's ties).
    once = lax.sort((jnp.cos(x), g), num_keys=1)[1]
    grid_keys = jnp.round(x.reshape(2, 3) * 2.0)
    twice = lax.sort((grid_keys, -x.reshape(2, 3), g.reshape(2, 3)), dimension=1,
                     num_keys=2, is_stable=False)[2].reshape(6)
    return jnp.cos(x) * g + 2.0 * once - twice


LINEAR = {
    "power_one": lambda x, g: jnp.cos(x) * g ** 1,
    "sorted_by_residual": _permuted,
}
X = jnp.array([0.3, -0.7, 1.1, 0.2, -0.4, 0.9])


@pytest.mark.parametrize("body", list(LINEAR.values()), ids=list(LINEAR))
def test_forward_mode_through_a_linear_bwd_jax_cannot_transpose(body):
    f = _rule(body)
    want = jax.jacrev(f)(X)
    for ours in (jaxpr_cc.jit(f), jaxpr_cc.trace(f, X)):
        np.testing.assert_allclose(np.asarray(jax.jacfwd(ours)(X)), np.asarray(want),
                                   rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(np.asarray(jax.jacrev(ours)(X)), np.asarray(want),
                                   rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("body, fragment", [
    (lambda x, g: lax.sort((g, jnp.cos(x)), num_keys=1)[0], "sort"),
    (lambda x, g: jnp.cos(x) * g ** 2, "integer_pow"),
], ids=["sorted_by_the_cotangent", "power_two"])
def test_a_nonlinear_bwd_stays_refused(body, fragment):
    f = _rule(body)
    with pytest.raises(Exception, match="not linear") as info:
        jax.jacfwd(jaxpr_cc.jit(f))(X)
    assert fragment in str(info.value)


def test_a_scan_placing_its_scanned_rows_beside_the_cotangent_is_nan():
    """``scan(lambda a, t: (B @ where(mask, a, t), None), c * g, T)`` puts a
    constant (a row of T) beside the cotangent: affine, so forward mode is NaN.
    The affine check evaluated the scan's body once on all of T (a shape error
    from JAX; adversary, stop 33).  Reference: ``jax.jacrev`` for reverse mode."""
    b = jnp.array([[0.2, 0.1, 0.0], [0.0, 0.1, 0.4], [0.1, 0.0, 0.2]])
    rows = jnp.array([[1.0, -1.0, 2.0], [-1.0, 1.0, 1.0]])
    mask = jnp.array([True, False, True])

    @jax.custom_vjp
    def f(x):
        return jnp.sin(x)

    f.defvjp(lambda x: (jnp.sin(x), jnp.cos(x)),
             lambda c, g: (jax.lax.scan(lambda a, t: (b @ jnp.where(mask, a, t), None),
                                        c * g, rows)[0],))
    x = jnp.array([0.3, -0.7, 1.1])
    got = np.asarray(jax.jacfwd(jaxpr_cc.jit(f))(x))
    assert np.all(np.isnan(got))
    np.testing.assert_allclose(jax.jacrev(jaxpr_cc.jit(f))(x), jax.jacrev(f)(x), rtol=1e-6)


def test_max_pooling_of_the_cotangent_is_refused_by_name():
    """A bwd applying max pooling's vjp at the cotangent (the cotangent selects the
    window maxima: not linear) was refused with JAX's bare AssertionError; the
    refusal names the operation (adversary, stop 33)."""
    def pool(z):
        return lax.reduce_window(z, -jnp.inf, lax.max, (2,), (2,), "VALID")

    @jax.custom_vjp
    def f(x):
        return jnp.sin(x)

    f.defvjp(lambda x: (jnp.sin(x), jnp.cos(x)),
             lambda c, g: (jax.vjp(pool, g)[1](c[:2])[0],))
    x = jnp.array([0.3, -0.7, 1.1, 0.5])
    np.testing.assert_allclose(jax.jacrev(jaxpr_cc.jit(f))(x), jax.jacrev(f)(x))
    with pytest.raises(Exception, match="window selection.*select_and_scatter_add") as err:
        jax.jacfwd(jaxpr_cc.jit(f))(x)
    assert "\n" not in str(err.value)


def test_a_bwd_calling_its_own_custom_function():
    """``s(v) = 2 v`` whose bwd is ``s(g)``: linear, and its value is the primal's.
    Forward mode raised JAX's "Transpose rule for 'custom_vjp_call' not
    implemented" (adversary, stop 33).  References: ``jax.jacrev`` (2 I) and the
    analytic Hessian of ``sum(sin(s(x)))``, ``diag(-4 sin(2 x))``."""
    @jax.custom_vjp
    def s(v):
        return 2.0 * v

    s.defvjp(lambda v: (2.0 * v, None), lambda _, g: (s(g),))
    with jax.enable_x64(True):
        x = jnp.array([0.3, -0.7, 1.1])
        np.testing.assert_allclose(jax.jacfwd(jaxpr_cc.jit(s))(x), jax.jacrev(s)(x))
        hessian = jax.hessian(jaxpr_cc.jit(lambda x: jnp.sum(jnp.sin(s(x)))))(x)
        np.testing.assert_allclose(hessian, np.diag(-4 * np.sin(2 * np.asarray(x))),
                                   rtol=1e-12, atol=1e-14)
