"""Rules see what JAX would give them: which inputs are perturbed, symbolic zeros,
untraced residuals, and AD applied inside the traced function.  References: JAX."""
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.custom_derivatives import SymbolicZero

import jaxpr_cc


def test_symbolic_zero_skips_a_term_as_in_jax():
    # The jvp skips y's term when y is not perturbed; with y = inf and a dense
    # zero tangent, the term would be 0 * inf = nan.
    @jax.custom_jvp
    def mul(x, y):
        return x * y

    def mul_jvp(primals, tangents):
        (x, y), (tx, ty) = primals, tangents
        t = tx * y if type(tx) is not SymbolicZero else jnp.zeros_like(x)
        if type(ty) is not SymbolicZero:
            t = t + x * ty
        return x * y, t

    mul.defjvp(mul_jvp, symbolic_zeros=True)

    def f(x):
        y = jnp.full_like(x, jnp.inf)  # a constant: JAX never perturbs it
        return jnp.sum(jnp.exp(-mul(x, 1.0 / y)))

    x = jnp.array([0.5, 2.0])
    program = jaxpr_cc.trace(f, x)
    np.testing.assert_allclose(jax.grad(program)(x), jax.grad(f)(x))
    assert np.all(np.isfinite(jax.grad(program)(x)))
    np.testing.assert_allclose(jax.jvp(program, (x,), (jnp.ones(2),))[1],
                               jax.jvp(f, (x,), (jnp.ones(2),))[1])


def _flagged_scale():
    """A custom_vjp whose fwd reads the perturbed flags and hands one to bwd as a
    Python bool residual (equinox passes its flags this way)."""
    @jax.custom_vjp
    def scale(x, s):
        return x * s

    def fwd(x, s):
        return scale(x.value, s.value), (x.value, s.value, s.perturbed)

    def bwd(res, ct):
        x, s, s_perturbed = res
        assert isinstance(s_perturbed, bool)  # not a tracer
        return ct * s, (jnp.sum(ct * x) if s_perturbed else None)

    scale.defvjp(fwd, bwd, symbolic_zeros=True)
    return scale


@pytest.mark.parametrize("s_is_constant", [True, False])
def test_perturbed_flags_and_python_residuals(s_is_constant):
    scale = _flagged_scale()

    def f(x, s):
        if s_is_constant:
            s = jax.lax.stop_gradient(s)
        return jnp.sum(scale(x, s) ** 2)

    x, s = jnp.array([1.0, -2.0]), jnp.float32(3.0)
    program = jaxpr_cc.trace(f, x, s)
    for got, want in zip(jax.grad(program, argnums=(0, 1))(x, s),
                         jax.grad(f, argnums=(0, 1))(x, s)):
        np.testing.assert_allclose(got, want)


def test_rule_that_refuses_tangents_is_not_run_for_constants():
    # Like equinox's nondifferentiable: the rule raises whenever JAX runs it.
    @partial(jax.custom_jvp, nondiff_argnums=(0,))
    def nondifferentiable(msg, x):
        return x

    @nondifferentiable.defjvp
    def _(msg, primals, tangents):
        raise RuntimeError(msg)

    def f(x, options):
        options = nondifferentiable("options cannot be differentiated", options)
        return jnp.sum(x * options)

    x = jnp.array([1.0, 2.0])
    program = jaxpr_cc.trace(lambda x: f(x, jnp.array([3.0, 4.0])), x)
    np.testing.assert_allclose(jax.grad(program)(x), [3.0, 4.0])
    # Where JAX would run the rule, it still raises.
    program2 = jaxpr_cc.trace(f, x, x)
    with pytest.raises(Exception, match="options cannot be differentiated"):
        jax.grad(program2, argnums=1)(x, x)


def test_ad_inside_the_trace_runs_rules_as_jax_does():
    # The bwd records whether its cotangent is a symbolic zero (a side effect that
    # diffrax's checkpointed loops rely on); JAX runs it during the backward pass.
    seen = []

    @jax.custom_vjp
    def record(x):
        return x

    def bwd(_, ct):
        seen.append(type(ct) is SymbolicZero)
        return (ct,)

    record.defvjp(lambda x: (x.value, None), bwd, symbolic_zeros=True)

    def f(x):
        _, vjp = jax.vjp(lambda v: (record(v), v * 2.0), x)
        (g,) = vjp((jnp.zeros_like(x), jnp.ones_like(x)))
        return g * x

    x = jnp.array([1.0, 2.0])
    program = jaxpr_cc.trace(f, x)
    traced_seen = list(seen)
    seen.clear()
    np.testing.assert_allclose(program(x), f(x))
    assert traced_seen == seen == [False]


def test_tangent_outputs_follow_the_primal_structure():
    @jax.custom_jvp
    def pair(x):
        return {"a": x * 2.0, "b": None, "c": (x,)}

    @pair.defjvp
    def _(primals, tangents):
        (x,), (t,) = primals, tangents
        return pair(x), {"a": t * 2.0, "b": None, "c": (t,)}

    f = lambda x: jnp.sum(pair(x)["a"] + pair(x)["c"][0])  # noqa: E731
    x = jnp.array([1.0, 2.0])
    program = jaxpr_cc.trace(f, x)
    np.testing.assert_allclose(jax.grad(program)(x), jax.grad(f)(x))
