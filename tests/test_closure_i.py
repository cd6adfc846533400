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
  computes from unperturbed inputs alone passes it on dense, as JAX does: a rule
  downstream that refuses any tangent (equinox's ``nondifferentiable``) raises as
  in JAX, and one that reads which inputs are perturbed gets JAX's numbers.
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


def test_dense_zero_tangent_of_a_rule_reaches_a_refusing_rule_as_in_jax():
    t = jnp.float32(0.5)
    tx = jnp.array([1.0, -2.0, 0.5], jnp.float32)
    with pytest.raises(RuntimeError, match="Unexpected tangent"):
        jax.jvp(lambda x: clocked_loss(x, t), (X,), (tx,))  # JAX passes the dense zero on
    jl = jaxpr_cc.jit(clocked_loss)
    np.testing.assert_allclose(jl(X, t), clocked_loss(X, t), rtol=1e-6)
    with pytest.raises(ForwardModeRefusedError, match="_nondifferentiable_jvp.*Unexpected tangent"):
        jax.jvp(lambda x: jl(x, t), (X,), (tx,))
    # (JAX's own gradient does not run the refusing rule: it equals JAX's.)
    analytic = 2 * np.sin(X) * np.cos(X) * (0.5 + 1.0)
    np.testing.assert_allclose(jax.grad(jl)(X, t), jax.grad(clocked_loss)(X, t), rtol=1e-6)
    np.testing.assert_allclose(jax.grad(jl)(X, t), analytic, rtol=1e-5)


@jax.custom_jvp
def keep_if_clock_perturbed(value, clock):
    return value


def _keep_if_clock_perturbed_jvp(primals, tangents):
    # A rule that reads which inputs are perturbed, as equinox's checkpointed
    # while_loop does (it drops the tangent of a result whose loop it sees
    # unperturbed).
    value, clock = primals
    t_value, t_clock = tangents
    if isinstance(t_clock, jax.custom_derivatives.SymbolicZero):
        return value, jnp.zeros_like(value)
    return value, jnp.zeros_like(value) if isinstance(
        t_value, jax.custom_derivatives.SymbolicZero) else t_value


keep_if_clock_perturbed.defjvp(_keep_if_clock_perturbed_jvp, symbolic_zeros=True)


def gated_loss(x, t):
    y, clock = value_and_clock(x, t)
    return jnp.sum(keep_if_clock_perturbed(2.0 * y, clock))


def test_a_dense_zero_tangent_a_rule_returns_stays_dense():
    # JAX gives the rule downstream the dense zero the rule upstream returned, so it
    # sees the clock perturbed and keeps the tangent; a symbolic zero there dropped
    # it (wrong forward-over-reverse Hessians through diffrax's checkpointed solve).
    t = jnp.float32(0.5)
    tx = jnp.array([1.0, -2.0, 0.5], jnp.float32)
    jl = jaxpr_cc.jit(gated_loss)
    _, want = jax.jvp(lambda x: gated_loss(x, t), (X,), (tx,))
    _, got = jax.jvp(lambda x: jl(x, t), (X,), (tx,))
    assert abs(float(want)) > 0.1
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(jax.grad(jl)(X, t), jax.grad(gated_loss)(X, t), rtol=1e-6)


@jax.custom_vjp
def marked_sum(a, b, c, d):
    return jnp.sin(a) + b + c + d


def _marked_sum_fwd(a, b, c, d):
    mark = 0.0 if b.perturbed else 1.0  # the bwd is affine when b is not perturbed
    return marked_sum(a.value, b.value, c.value, d.value), (a.value, mark)


def _marked_sum_bwd(res, ct):
    a, mark = res
    return jnp.cos(a) * ct + mark, ct, ct, ct


marked_sum.defvjp(_marked_sum_fwd, _marked_sum_bwd, symbolic_zeros=True)


def test_reverse_mode_runs_a_bwd_that_is_linear_only_for_some_patterns():
    # The pattern JAX gives (only a perturbed) is traced when given; its bwd is not
    # linear, so its forward mode refuses -- but reverse mode, which runs the bwd
    # as JAX does, raised NotTransposableError with it.  JAX: cos(0.1) + 1.
    args = tuple(jnp.float32(0.1 * (i + 1)) for i in range(4))
    want = jax.grad(marked_sum)(*args)
    np.testing.assert_allclose(want, np.cos(0.1) + 1.0, rtol=1e-6)
    for fn in (jaxpr_cc.jit(marked_sum), jaxpr_cc.trace(marked_sum, *args)):
        np.testing.assert_allclose(jax.grad(fn)(*args), want, rtol=1e-6)
        with pytest.raises(ForwardModeRefusedError, match="_marked_sum_bwd|marked_sum"):
            jax.jvp(lambda a: fn(a, *args[1:]), (args[0],), (jnp.float32(1.0),))


def test_filter_custom_vjp_cotangent_for_a_python_float_is_dropped_as_in_jax():
    # equinox passes the Python float in vjp_arg as None (an argument subtree with no
    # leaves); a bwd that returns a cotangent for it has it dropped, as JAX does.
    import equinox as eqx

    @eqx.filter_custom_vjp
    def scaled(vjp_arg, x):
        a, b = vjp_arg
        return a * b * x

    @scaled.def_fwd
    def _(perturbed, vjp_arg, x):
        return scaled(vjp_arg, x), None

    @scaled.def_bwd
    def _(res, g, perturbed, vjp_arg, x):
        a, b = vjp_arg
        return g * b * x, jnp.sum(g * a * x)

    def f(x):
        return jnp.sum(scaled((x, 1.0), 2.0))

    x = jnp.arange(3.0) + 0.5
    np.testing.assert_allclose(jax.grad(jaxpr_cc.trace(f, x))(x), jax.grad(f)(x))
    np.testing.assert_allclose(jax.grad(jaxpr_cc.jit(f))(x), jax.grad(f)(x))
