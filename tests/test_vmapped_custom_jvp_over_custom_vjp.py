"""A ``custom_jvp`` whose primal calls a ``custom_vjp`` closing over an argument,
called under ``jax.vmap`` inside the traced function (adversary, stop 32).

JAX stages the vmapped rule in its own form; materializing it traced the jvp with
every argument perturbed, the closed-over one included, which runs forward mode
through the inner custom_vjp: ``jaxpr_cc.trace`` raised although nothing was
differentiated.  JAX only raises when it differentiates with respect to that
argument.  References: JAX's value and ``jax.grad`` of the same function.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_cc

X = np.array([0.3, -0.2, 0.9], np.float32)
P = np.float32(1.3)


def _program(x, p):
    @jax.custom_vjp
    def h(x):
        return jnp.sin(x) * p

    h.defvjp(lambda x: (h(x), x), lambda r, ct: (ct * jnp.cos(r) * p,))

    @jax.custom_jvp
    def s(x):
        return h(x) * 2

    s.defjvp(lambda pr, t: (s(pr[0]), t[0] * jnp.cos(pr[0]) * 2.0))
    return jnp.sum(jax.vmap(s)(x))


@pytest.mark.parametrize("entry", ["trace", "jit"])
def test_values_and_the_gradient_jax_has(entry):
    ours = jaxpr_cc.trace(_program, X, P) if entry == "trace" else jaxpr_cc.jit(_program)
    np.testing.assert_allclose(ours(X, P), jax.jit(_program)(X, P), rtol=1e-6)
    np.testing.assert_allclose(jax.grad(ours)(X, P), jax.grad(_program)(X, P), rtol=1e-6)


def test_the_gradient_jax_refuses_is_the_analytic_one():
    """JAX cannot differentiate with respect to ``p`` (its rule closes over it).
    jaxpr-cc forms that derivative by forward mode through the primal, which runs
    the inner custom_vjp with its forward mode (stop 39; it refused in one line
    before): d/dp sum(2 sin(x) p) = 2 sum(sin(x))."""
    with pytest.raises(jax.errors.UnexpectedTracerError):  # JAX's own behaviour
        jax.grad(_program, argnums=1)(X, P)
    want = 2.0 * np.sin(X.astype(np.float64)).sum()
    for ours in (jaxpr_cc.trace(_program, X, P), jaxpr_cc.jit(_program)):
        np.testing.assert_allclose(jax.grad(ours, argnums=1)(X, P), want, rtol=1e-5)


def test_a_jaxpr_rule_closing_over_an_ended_trace_names_the_user_function():
    """``jax.make_jaxpr`` of a custom_jvp closing over an argument: its staged rule
    holds a tracer of the finished trace.  closure-convert said ``AssertionError``;
    now one line naming the user's rule and the fix."""
    def f(a, b):
        @jax.custom_jvp
        def s(x):
            return jnp.sin(x * b)
        s.defjvp(lambda p, t: (s(p[0]), t[0] * jnp.cos(p[0] * b) * b))
        return s(a)

    args = (np.float32(0.7), np.float32(1.3))
    program = jaxpr_cc.Program.from_jaxpr(jax.make_jaxpr(f)(*args))
    np.testing.assert_allclose(program(*args)[0], f(*args), rtol=1e-6)
    with pytest.raises(Exception, match=r"ClosureConversionError: custom_jvp rule '<lambda>' "
                                        r"\(test_vmapped_custom_jvp_over_custom_vjp.py:\d+\)"
                                        r".*jaxpr_cc.trace"):
        jaxpr_cc.run_passes(program, "closure-convert")
