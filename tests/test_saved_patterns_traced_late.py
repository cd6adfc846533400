"""Saved programs whose symbolic-zeros patterns were traced when JAX first gave them.

``jaxpr_cc.jit`` traces no pattern up front, and neither does ``jaxpr_cc.trace`` for
a custom_jvp; ``save`` completes the patterns (``frontend.saved_patterns``).  Two
ways that went wrong, each checked against JAX running the same function:

* a custom_vjp with an output nothing reads: its fwd variants were dropped on save,
  so a loaded program ran the main fwd for "first input only" (a gradient 3x off);
* a recursive custom_jvp: the call of itself in a body traced late became another
  rule without the table, so forward-over-forward of a loaded program ran its main
  body for a partial pattern.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.custom_derivatives import SymbolicZero

import jaxpr_cc
from jaxpr_cc.io import dumps, loads

X = jnp.array([0.3, 1.0], jnp.float32)
P = jnp.array([2.0, -1.0], jnp.float32)
T = jnp.array([1.0, -0.5], jnp.float32)


@jax.custom_vjp
def two_outputs(a, b):
    return jnp.sin(a) * b, a * 2.0


def _fwd(a, b):
    # the residual says whether b is perturbed: the gradient differs by 3x
    return two_outputs(a.value, b.value), (a.value, b.value, b.perturbed)


def _bwd(res, g):
    a, b, b_perturbed = res
    g1, _ = g
    g1 = jnp.zeros_like(a) if type(g1) is SymbolicZero else g1
    return (1.0 if b_perturbed else 3.0) * jnp.cos(a) * b * g1, jnp.sin(a) * g1


two_outputs.defvjp(_fwd, _bwd, symbolic_zeros=True)


def first_output_only(x, p):
    return jnp.sum(two_outputs(x, p)[0])


@jax.custom_jvp
def recursive(a, b):
    return jnp.sin(a) * b


def _recursive_jvp(primals, tangents):
    a, b = primals
    ta, tb = tangents
    out = recursive(a, b)  # the rule calls its own function
    if type(tb) is SymbolicZero:
        return out, 3.0 * jnp.cos(a) * b * ta
    ta = jnp.zeros_like(a) if type(ta) is SymbolicZero else ta
    return out, jnp.cos(a) * b * ta + jnp.sin(a) * tb


recursive.defjvp(_recursive_jvp, symbolic_zeros=True)


def recursive_sum(x, p):
    return jnp.sum(recursive(x, p))


def _programs(fn):
    return {"trace": loads(dumps(jaxpr_cc.trace(fn, X, P))),
            "jit": loads(dumps(jaxpr_cc.jit(fn).program(X, P)))}


@pytest.mark.parametrize("origin", ["trace", "jit"])
def test_a_custom_vjp_with_an_unread_output_keeps_its_input_patterns(origin):
    loaded = _programs(first_output_only)[origin]
    for argnums in (0, 1, (0, 1)):
        got = jax.grad(loaded, argnums)(X, P)
        want = jax.grad(first_output_only, argnums)(X, P)
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6,
                                       err_msg=f"grad argnums={argnums}")


def _forward_over_forward(fn):
    """The outer jvp differentiates the inner jvp's primal output: the rule's call of
    itself, with "first input only" perturbed."""
    def inner_primal(x):
        return jax.jvp(lambda y: fn(y, P), (x,), (T,))[0]
    return jax.jvp(inner_primal, (X,), (T,))[1]


@pytest.mark.parametrize("origin", ["trace", "jit"])
def test_a_recursive_rule_keeps_its_patterns_at_the_next_order(origin):
    loaded = _programs(recursive_sum)[origin]
    np.testing.assert_allclose(np.asarray(_forward_over_forward(loaded)),
                               np.asarray(_forward_over_forward(recursive_sum)), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(jax.hessian(loaded)(X, P)),
                               np.asarray(jax.hessian(recursive_sum)(X, P)), rtol=1e-5)


def test_trace_makes_no_custom_jvp_pattern_up_front():
    program = jaxpr_cc.trace(recursive_sum, X, P)
    eqns = [e for _, e in program.body.walk() if e.prim.name == "custom_jvp_call"]
    assert eqns and not any("jvp_variants" in e.params for e in eqns)


def both_outputs(x, p):
    y1, y2 = two_outputs(x, p)
    return jnp.sum(y1 * 0.5 + y2)


@pytest.mark.parametrize("fn", [first_output_only, both_outputs])
def test_forward_mode_rewrite_of_late_patterns_saves_and_loads(fn):
    """vjp-to-jvp on a program whose patterns are traced when given: completing them
    for the file rewrites the bodies' own calls of the rule now (it once left them as
    on-demand Python callables, which no file can hold)."""
    rewritten = jaxpr_cc.run_passes(jaxpr_cc.jit(fn).program(X, P), "vjp-to-jvp")
    loaded = loads(dumps(rewritten))
    grad = jax.grad(fn)(X, P)  # JAX has no forward mode through a custom_vjp
    np.testing.assert_allclose(np.asarray(jax.grad(loaded)(X, P)), np.asarray(grad), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(jax.jvp(lambda x: loaded(x, P), (X,), (T,))[1]),
                               np.asarray(grad @ T), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(jax.hessian(loaded)(X, P)),
                               np.asarray(jax.jacrev(jax.grad(fn))(X, P)), rtol=1e-5, atol=1e-6)
