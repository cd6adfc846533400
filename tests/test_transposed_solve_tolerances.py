"""Forward mode through a bwd that solves with ``jax.scipy.sparse.linalg.gmres``.

gmres computes its stopping tolerance ``tol * |b|`` from the right-hand side
outside its ``custom_linear_solve``, so the bwd reads the cotangent nonlinearly
there.  JAX defines the solve as exact and linear in ``b`` whatever its
tolerances are, so the bwd is linear; its transpose solves the transposed system
with the tolerance taken from the transposed right-hand side.  References: JAX's
own reverse mode (``jacrev``) and the analytic Jacobian.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.scipy.sparse.linalg import gmres

import jaxpr_cc
from jaxpr_cc.io.api import dumps, loads
from jaxpr_cc.jax_adapter import ForwardModeRefusedError

A = jnp.array([[3.0, 1.0, 0.0], [0.5, 4.0, 1.0], [0.0, 1.0, 5.0]], jnp.float32)
B = jnp.array([1.0, 2.0, 3.0], jnp.float32)


def _solver(adjoint):
    @jax.custom_vjp
    def solve(a, b):
        return jnp.linalg.solve(a, b)

    def fwd(a, b):
        x = solve(a, b)
        return x, (a, x)

    def bwd(res, ct):
        a, x = res
        u = adjoint(a, ct)
        return -jnp.outer(u, x), u

    solve.defvjp(fwd, bwd)
    return solve


def _gmres_adjoint(a, ct):
    return gmres(lambda v: a.T @ v, ct, tol=1e-7, atol=0.0)[0]


def _loss(solve):
    return lambda a, b: jnp.sin(solve(a, b))


def test_jacfwd_through_a_gmres_adjoint_equals_jax_reverse_mode():
    f = _loss(_solver(_gmres_adjoint))
    with pytest.raises(TypeError, match="custom_vjp"):
        jax.jacfwd(f, argnums=1)(A, B)  # JAX refuses forward mode
    want_b = jax.jacrev(f, argnums=1)(A, B)
    want_a = jax.jacrev(f, argnums=0)(A, B)
    jf = jaxpr_cc.jit(f)
    np.testing.assert_allclose(jax.jacfwd(jf, argnums=1)(A, B), want_b, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(jax.jacfwd(jf, argnums=0)(A, B), want_a, rtol=1e-4, atol=1e-5)
    # ... and the analytic Jacobian: d sin(A^-1 b) / db = diag(cos x) A^-1.
    x = np.linalg.solve(np.asarray(A, np.float64), np.asarray(B, np.float64))
    analytic = np.diag(np.cos(x)) @ np.linalg.inv(np.asarray(A, np.float64))
    np.testing.assert_allclose(jax.jacfwd(jf, argnums=1)(A, B), analytic, rtol=1e-4, atol=1e-5)


def _check_jvp_along_b(program):
    """jvp along b equals the analytic ``diag(cos x) A^-1 t``, x = A^-1 b."""
    t = jnp.array([0.3, -1.0, 0.5], jnp.float32)
    x = np.linalg.solve(np.asarray(A, np.float64), np.asarray(B, np.float64))
    want = np.cos(x) * np.linalg.solve(np.asarray(A, np.float64), np.asarray(t, np.float64))
    _, got = jax.jvp(lambda b: program(A, b), (B,), (t,))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_a_program_gives_jvp_through_a_gmres_adjoint():
    f = _loss(_solver(_gmres_adjoint))
    program = jaxpr_cc.trace(f, A, B)
    _check_jvp_along_b(program)
    # The rewrite saves and loads with the transposed solve in it.
    _check_jvp_along_b(loads(dumps(jaxpr_cc.run_passes(program, "vjp-to-jvp"))))


def _scaled_by_norm(a, ct):
    # The cotangent's norm scales the result, not only the tolerance: not linear.
    return _gmres_adjoint(a, ct) * jnp.linalg.norm(ct)


def _tolerance_read_elsewhere(a, ct):
    # The same norm is the tolerance and a factor of the result.
    norm = jnp.linalg.norm(ct)
    u = gmres(lambda v: a.T @ v, ct, tol=1e-7, atol=1e-7 * norm)[0]
    return u + norm * 0.0 + u * (norm > 1.0)


@pytest.mark.parametrize("adjoint", [_scaled_by_norm, _tolerance_read_elsewhere])
def test_a_bwd_reading_the_cotangent_norm_elsewhere_stays_reverse_only(adjoint):
    f = _loss(_solver(adjoint))
    jf = jaxpr_cc.jit(f)
    np.testing.assert_allclose(jax.jacrev(jf, argnums=1)(A, B), jax.jacrev(f, argnums=1)(A, B),
                               rtol=1e-5, atol=1e-6)
    with pytest.raises(ForwardModeRefusedError, match="not linear"):
        jax.jacfwd(jf, argnums=1)(A, B)


WRAPPED = {
    "jit": lambda a, ct: jax.jit(_gmres_adjoint)(a, ct),
    "cond": lambda a, ct: jax.lax.cond(a[0, 0] > 0, lambda c: _gmres_adjoint(a, c),
                                       lambda c: c, ct),
    "scan": lambda a, ct: jax.lax.scan(lambda c, _: (_gmres_adjoint(a, c), None), ct, None,
                                       length=1)[0],
    "two_solves": lambda a, ct: 0.5 * gmres(lambda v: a.T @ v, ct, tol=1e-7)[0]
    + 0.5 * gmres(lambda v: a.T @ v, ct, tol=1e-6)[0],
}


@pytest.mark.parametrize("where", sorted(WRAPPED))
def test_a_program_gives_jvp_through_gmres_inside_regions(where):
    # adv29b: inside a jit (whose body keeps gmres's dead tolerance equations), a
    # cond or a scan, and two solves sharing the cotangent's norm.
    f = _loss(_solver(WRAPPED[where]))
    program = jaxpr_cc.trace(f, A, B)
    _check_jvp_along_b(program)
