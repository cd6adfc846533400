"""Rules that refuse tangents for some inputs, and tangents a rule computes as
zeros (issues 15 and 17; docs/closure.md, "Patterns traced when JAX first gives
them").

- A symbolic-zeros custom_vjp whose fwd asserts an input is unperturbed (as
  equinox's ``filter_custom_vjp`` does for its non-differentiated arguments)
  raises when traced with every input perturbed; the pattern JAX gives is traced
  when given, so ``jax.grad`` equals JAX's and the forward-over-reverse Hessian
  (which JAX refuses) equals float64 differences of JAX's gradient.  Differentiating
  the asserted input is refused in one line, as JAX refuses it.
- A symbolic-zeros custom_jvp that returns a dense zero tangent for an output it
  computes from unperturbed inputs alone gives a symbolic zero there, so a rule
  downstream that refuses any tangent (equinox's ``nondifferentiable``) is not
  run.  JAX's own ``jax.jvp`` passes the dense zero on and raises; jaxpr-cc's
  equals the analytic derivative (and its gradient JAX's).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_cc
from jaxpr_cc.jax_adapter import ForwardModeRefusedError


@jax.custom_vjp
def scaled_sin(x, s):
    return jnp.sin(x) * s


def _scaled_sin_fwd(x, s):
    assert s.perturbed is False  # s is never differentiated (equinox's check)
    return scaled_sin(x.value, s.value), (x.value, s.value)


def _scaled_sin_bwd(res, ct):
    x, s = res
    return jnp.cos(x) * s * ct, jnp.zeros_like(s)


scaled_sin.defvjp(_scaled_sin_fwd, _scaled_sin_bwd, symbolic_zeros=True)


def scaled_sin_loss(x, s):
    return jnp.sum(scaled_sin(x, s) ** 2)


X = jnp.array([0.3, -0.7, 1.1], jnp.float32)
S = jnp.float32(1.5)


def _fd_hessian(grad, x, eps=1e-4):
    with jax.enable_x64(True):
        x = jnp.asarray(x, jnp.float64)
        cols = [(np.asarray(grad(x + eps * e)) - np.asarray(grad(x - eps * e))) / (2 * eps)
                for e in np.eye(x.size)]
    return np.stack(cols, axis=1)


def test_rule_asserting_an_input_unperturbed_grad_equals_jax():
    jl = jaxpr_cc.jit(scaled_sin_loss)
    np.testing.assert_allclose(jl(X, S), scaled_sin_loss(X, S), rtol=1e-6)
    np.testing.assert_allclose(jax.grad(jl)(X, S), jax.grad(scaled_sin_loss)(X, S), rtol=1e-6)


def test_rule_asserting_an_input_unperturbed_hessian_equals_differences():
    jl = jaxpr_cc.jit(scaled_sin_loss)
    with pytest.raises(TypeError, match="custom_vjp"):
        jax.hessian(scaled_sin_loss)(X, S)  # JAX refuses forward mode
    want = _fd_hessian(jax.jit(jax.grad(lambda x: scaled_sin_loss(x, jnp.float64(S)))), X)
    np.testing.assert_allclose(jax.hessian(jl)(X, S), want, rtol=1e-3, atol=1e-3)


def test_differentiating_the_asserted_input_is_refused_in_one_line():
    jl = jaxpr_cc.jit(scaled_sin_loss)
    with pytest.raises(AssertionError):
        jax.grad(scaled_sin_loss, argnums=1)(X, S)  # JAX's own refusal
    with pytest.raises(ForwardModeRefusedError) as info:
        np.asarray(jax.grad(jl, argnums=1)(X, S))
    message = str(info.value)
    assert "\n" not in message.strip()
    assert "_scaled_sin_fwd" in message and "raised when it was traced" in message


@jax.custom_jvp
def nondifferentiable(x):
    return x


@nondifferentiable.defjvp
def _nondifferentiable_jvp(primals, tangents):
    raise RuntimeError("Unexpected tangent")


@jax.custom_jvp
def value_and_clock(x, t):
    return jnp.sin(x), t + 1.0


def _value_and_clock_jvp(primals, tangents):
    x, t = primals
    dx, _ = tangents
    dx = jnp.zeros_like(x) if isinstance(dx, jax.custom_derivatives.SymbolicZero) else dx
    # The clock's tangent is returned as a dense zero, as equinox's rules return
    # ``zeros_like`` for an output with no tangent.
    return value_and_clock(x, t), (jnp.cos(x) * dx, jnp.zeros_like(t))


value_and_clock.defjvp(_value_and_clock_jvp, symbolic_zeros=True)


def clocked_loss(x, t):
    y, clock = value_and_clock(x, t)
    return jnp.sum(y ** 2) * nondifferentiable(clock)


def test_dense_zero_tangent_of_a_rule_reaches_no_refusing_rule():
    t = jnp.float32(0.5)
    tx = jnp.array([1.0, -2.0, 0.5], jnp.float32)
    with pytest.raises(RuntimeError, match="Unexpected tangent"):
        jax.jvp(lambda x: clocked_loss(x, t), (X,), (tx,))  # JAX passes the dense zero on
    jl = jaxpr_cc.jit(clocked_loss)
    np.testing.assert_allclose(jl(X, t), clocked_loss(X, t), rtol=1e-6)
    analytic = 2 * np.sin(X) * np.cos(X) * (0.5 + 1.0)
    _, got = jax.jvp(lambda x: jl(x, t), (X,), (tx,))
    np.testing.assert_allclose(got, np.dot(analytic, tx), rtol=1e-5)
    # (JAX's own gradient does not run the refusing rule: it equals JAX's.)
    np.testing.assert_allclose(jax.grad(jl)(X, t), jax.grad(clocked_loss)(X, t), rtol=1e-6)
    np.testing.assert_allclose(jax.grad(jl)(X, t), analytic, rtol=1e-5)
