"""Forward mode through custom_vjp (issue 17): known zeros in bwd rules, and
reverse over forward through a bwd that iterates an adjoint solve.

- A bwd whose cotangent for an argument is an accumulator that starts at zero
  and to which only zeros are added (equinox's checkpointed while loop
  accumulates the cotangent of a closed-over value its step does not read) is
  linear: that output is zero, not an affine constant.  A loop that adds a
  non-zero constant, or places one beside the zeros, stays refused.
- ``jax.grad(jax.jacfwd(jaxpr_cc.jit(newton_sqrt)))``: forward mode runs the
  transposed adjoint while_loop of the tutorial's fixed_point; reverse mode then
  differentiates that loop along its residuals, which JAX cannot reverse: the
  derivative is transposed by jaxpr-cc.  References: the analytic derivative and
  float64 central differences of JAX's own gradient.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxpr_cc
from jaxpr_cc.examples import fixed_point as fp
from jaxpr_cc.jax_adapter import ForwardModeRefusedError
from jaxpr_cc.closure.transpose import NotTransposableError, transpose_linear


def _with_accumulating_bwd(step_extra):
    """``f(x, s) = s * x`` whose bwd runs a counted while_loop that halves the
    cotangent three times (then scaled back: ``ct_x = s * ct``) and carries an
    accumulator, starting at zero, updated by ``step_extra(acc)``; the cotangent
    of ``s`` is ``sum(ct * x)`` plus that accumulator."""
    @jax.custom_vjp
    def f(x, s):
        return s * x

    def fwd(x, s):
        return s * x, (x, s)

    def bwd(res, ct):
        x, s = res

        def body(carry):
            i, v, acc = carry
            return i + 1, v * 0.5, step_extra(acc)

        _, v, acc = lax.while_loop(lambda c: c[0] < 3, body, (0, ct, jnp.zeros(())))
        return 8.0 * s * v, jnp.sum(ct * x) + acc

    f.defvjp(fwd, bwd)
    return f


X = jnp.array([0.5, -1.5, 2.0], jnp.float32)
S = jnp.float32(1.3)


def _accumulate_zeros(acc):
    # The cotangent contribution of a value the step does not use: a zero,
    # added behind a branch (as equinox's checkpointed bwd does).
    return lax.cond(acc < 1.0, lambda a: a + jnp.zeros(()), lambda a: a, acc)


def test_a_bwd_accumulating_zeros_is_linear_and_its_forward_mode_equals_reverse():
    f = _with_accumulating_bwd(_accumulate_zeros)
    jf = jaxpr_cc.jit(f)
    for argnum in (0, 1):
        fwd = jax.jacfwd(jf, argnums=argnum)(X, S)
        np.testing.assert_allclose(np.asarray(fwd), np.asarray(jax.jacrev(f, argnums=argnum)(X, S)),
                                   rtol=1e-6, atol=1e-7)
    # The analytic Jacobians of s * x.
    np.testing.assert_allclose(np.asarray(jax.jacfwd(jf)(X, S)), 1.3 * np.eye(3), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(jax.jacfwd(jf, argnums=1)(X, S)), np.asarray(X),
                               rtol=1e-6)


def _bwd_jaxpr(step_extra):
    def bwd(x, s, ct):
        def body(carry):
            i, v, acc = carry
            return i + 1, v * 0.5, step_extra(acc)

        _, v, acc = lax.while_loop(lambda c: c[0] < 3, body, (0, ct, jnp.zeros(())))
        return 8.0 * s * v, jnp.sum(ct * x) + acc
    return jax.make_jaxpr(bwd)(X, S, X)


def test_the_transpose_of_a_bwd_accumulating_zeros_equals_jax():
    closed = _bwd_jaxpr(_accumulate_zeros)
    t = transpose_linear(closed, [False, False, True])
    t_x = jnp.array([0.3, 0.1, -0.2])
    t_s = jnp.float32(0.7)
    got = jax.core.eval_jaxpr(t.jaxpr, t.consts, X, S, t_x, t_s)
    # The bwd is (ct -> (s ct, <ct, x>)); its transpose (t_x, t_s) -> s t_x + t_s x.
    np.testing.assert_allclose(np.asarray(got[0]), np.asarray(S * t_x + t_s * X), rtol=1e-6)


def _zero_placed(acc):
    # Zeros written into a buffer of zeros: still zero.
    return acc + jnp.zeros(2).at[1].set(jnp.zeros(()))[0]


def test_zeros_placed_into_zeros_are_zero():
    f = _with_accumulating_bwd(_zero_placed)
    np.testing.assert_allclose(np.asarray(jax.jacfwd(jaxpr_cc.jit(f), argnums=1)(X, S)),
                               np.asarray(jax.jacrev(f, argnums=1)(X, S)), rtol=1e-6)


@pytest.mark.parametrize("step_extra", [
    lambda acc: acc + 1.0,
    lambda acc: lax.cond(acc < 1.0, lambda a: a + 0.25, lambda a: a, acc),
    # A constant placed beside zeros (a buffer of zeros with 1.0 written in) is
    # not zero, whichever element is read.
    lambda acc: acc + jnp.zeros(2).at[1].set(1.0)[0],
], ids=["adds_a_constant", "adds_a_constant_in_a_branch", "places_a_constant"])
def test_a_bwd_accumulating_a_constant_is_refused(step_extra):
    # The accumulator is affine (a constant reaches the cotangent): no transpose.
    with pytest.raises(NotTransposableError, match="not linear in") as info:
        transpose_linear(_bwd_jaxpr(step_extra), [False, False, True])
    assert "\n" not in str(info.value)
    jf = jaxpr_cc.jit(_with_accumulating_bwd(step_extra))
    with pytest.raises(ForwardModeRefusedError, match="reverse-only rule"):
        jax.jacfwd(jf, argnums=1)(X, S)


# ------------------------------------------------- reverse over forward mode
def _fd64(fun, x, eps):
    with jax.enable_x64(True):
        x64 = np.float64(x)
        return float((fun(x64 + eps) - fun(x64 - eps)) / (2 * eps))


def test_grad_of_jacfwd_of_the_tutorial_fixed_point():
    jf = jaxpr_cc.jit(fp.newton_sqrt)
    x = jnp.float32(2.0)
    got = float(jax.grad(jax.jacfwd(jf))(x))
    # d/dx (1 / (2 sqrt x)) = -x^(-3/2) / 4, and float64 differences of JAX's gradient.
    np.testing.assert_allclose(got, -0.25 * 2.0 ** -1.5, rtol=1e-5)
    np.testing.assert_allclose(got, _fd64(jax.grad(fp.newton_sqrt), 2.0, 1e-4), rtol=1e-4)
    np.testing.assert_allclose(float(jax.jacrev(jax.jacfwd(jf))(x)), got, rtol=1e-6)
    # Reverse over a jvp (no vmap) takes the same path.
    grad_of_jvp = jax.grad(lambda v: jax.jvp(jf, (v,), (jnp.float32(1.0),))[1])(x)
    np.testing.assert_allclose(float(grad_of_jvp), got, rtol=1e-6)


@pytest.mark.heavy
def test_jacrev_of_jacfwd_of_the_fixed_point_on_a_vector():
    jf = jaxpr_cc.jit(fp.newton_sqrt)
    v = jnp.array([2.0, 3.0, 0.5], jnp.float32)
    got = np.asarray(jax.jacrev(jax.jacfwd(jf))(v))
    want = np.zeros((3, 3, 3))
    for i, a in enumerate(np.asarray(v, np.float64)):
        want[i, i, i] = -0.25 * a ** -1.5
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_grad_of_jacfwd_through_a_closed_over_parameter():
    # Plain JAX has no derivative here; the reference is float64 differences of
    # the implicit-function-theorem gradient.
    jf = jaxpr_cc.jit(fp.solve_closed_over)
    x = jnp.float32(0.7)
    got = float(jax.grad(jax.jacfwd(jf))(x))
    np.testing.assert_allclose(got, _fd64(fp.solve_closed_over_reference_grad, 0.7, 1e-3),
                               rtol=3e-3)
    np.testing.assert_allclose(got, float(jax.hessian(jf)(x)), rtol=1e-4)
