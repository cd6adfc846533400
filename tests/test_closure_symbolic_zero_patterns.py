"""symbolic_zeros=True custom_jvp rules see exactly JAX's perturbation pattern.

Which inputs JAX perturbs is known only when the program is differentiated (a
program input may or may not be differentiated later), so such a rule has a
body per pattern of its perturbable inputs and the rule JAX runs picks the one
matching the SymbolicZero tangents it is given (docs/closure.md): in process,
each pattern is traced when JAX first gives it; a saved program or an emitted
module holds every pattern.  The rules here
multiply a derivative by 3 when ``b`` is not perturbed, so a rule traced with the
wrong pattern gives a wrong number.  References: JAX running the same function.
"""
from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.custom_derivatives import SymbolicZero

import jaxpr_cc
from emitted import emitted_function
from jaxpr_cc.io import dumps, loads
from jaxpr_cc.passes.vjp_to_jvp import with_forward_mode

X = jnp.array([0.3, 1.0], jnp.float32)
P = jnp.array([2.0, -1.0], jnp.float32)


def _zero(t, like):
    return jnp.zeros_like(like) if type(t) is SymbolicZero else t


def _rule(c=1.0, recursive=True):
    @jax.custom_jvp
    def h(a, b):
        return jnp.sin(a) * b * c

    def h_jvp(primals, tangents):
        a, b = primals
        ta, tb = tangents
        # The rule calls its own function (recursion), as most rules do.
        out = h(a, b) if recursive else jnp.sin(a) * b * c
        if type(tb) is SymbolicZero:
            return out, 3.0 * jnp.cos(a) * b * c * ta
        return out, jnp.cos(a) * b * c * _zero(ta, a) + jnp.sin(a) * c * tb

    h.defjvp(h_jvp, symbolic_zeros=True)
    return h


def plain(x, p):
    return jnp.sum(_rule()(x, p))


def closing_over(x, p):
    return jnp.sum(_rule(c=p * 2.0, recursive=False)(x, p))


def under_vmap(x, p):
    return jnp.sum(jax.vmap(_rule(), in_axes=(0, None))(x, p[0]))


def _derivatives(fn, wrt_p: bool):
    out = {"grad x": jax.grad(fn)(X, P),
           "jvp x": jax.jvp(lambda x: fn(x, P), (X,), (jnp.ones_like(X),))[1],
           "vmap grad x": jax.vmap(jax.grad(fn), (0, None))(jnp.stack([X, -X]), P)}
    if wrt_p:
        out.update({"grad p": jax.grad(fn, 1)(X, P), "grad x,p": jax.grad(fn, (0, 1))(X, P)})
    return out


# JAX leaks a tracer differentiating a custom_jvp w.r.t. a value it closes over, so
# ``closing_over`` is differentiated w.r.t. x only.
@pytest.mark.parametrize("fun,wrt_p", [(plain, True), (closing_over, False), (under_vmap, True)],
                         ids=["plain", "closing_over", "under_vmap"])
def test_rule_sees_jax_perturbation_pattern(fun, wrt_p, tmp_path):
    reference = _derivatives(fun, wrt_p)
    program = jaxpr_cc.trace(fun, X, P)
    pipelined = jaxpr_cc.run_passes(program, jaxpr_cc.DEFAULT_PIPELINE)
    candidates = {"trace": program, "pipeline": pipelined, "save-load": loads(dumps(pipelined)),
                  "jit": jaxpr_cc.jit(fun), "emit": emitted_function(pipelined, tmp_path)}
    for name, candidate in candidates.items():
        got = _derivatives(candidate, wrt_p)
        for key, want in reference.items():
            np.testing.assert_allclose(np.asarray(got[key]) if key != "grad x,p" else
                                       np.asarray(got[key][0]),
                                       np.asarray(want) if key != "grad x,p" else
                                       np.asarray(want[0]), rtol=1e-5, atol=1e-6,
                                       err_msg=f"{name}: {key}")


def test_patterns_are_traced_when_given_and_stored_in_the_saved_program():
    program = jaxpr_cc.trace(plain, X, P)
    eqns = [e for _, e in program.body.walk() if e.prim.name == "custom_jvp_call"]
    assert eqns
    # None is traced with the program: each is traced when JAX first gives it.
    assert all("jvp_variant_patterns" not in e.params for e in eqns)
    assert all("pattern_rules" in e.params for e in eqns)
    saved = loads(dumps(program))
    eqns = [e for _, e in saved.body.walk() if e.prim.name == "custom_jvp_call"]
    assert eqns
    for eqn in eqns:
        # Two perturbable inputs: the patterns (a only) and (b only) besides (a and b).
        assert set(eqn.params["jvp_variant_patterns"]) == {(True, False), (False, True)}
        assert len(eqn.params["jvp_variants"]) == 2
    assert "jvp_variants" in str(saved)


# ------------------------------------------------------------------ custom_vjp
def _vjp_rule(c=1.0):
    """fwd sees which inputs are perturbed, bwd which output cotangents are
    SymbolicZero; each changes the numbers (a rule traced for the wrong pattern
    gives a wrong gradient)."""
    @jax.custom_vjp
    def h(a, b):
        return jnp.sin(a) * b * c, a * 2.0

    def fwd(a, b):
        return h(a.value, b.value), (a.value, b.value, b.perturbed)

    def bwd(res, g):
        a, b, b_perturbed = res
        g1, g2 = g
        ga = jnp.zeros_like(a)
        if type(g1) is SymbolicZero:
            ga = ga + 5.0
        else:
            ga = ga + (1.0 if b_perturbed else 3.0) * jnp.cos(a) * b * c * g1
        if type(g2) is not SymbolicZero:
            ga = ga + 2.0 * g2
        return ga, jnp.sin(a) * c * _zero(g1, a)

    h.defvjp(fwd, bwd, symbolic_zeros=True)
    return h


def vjp_first(x, p):
    return jnp.sum(_vjp_rule()(x, p)[0])


def vjp_second(x, p):
    return jnp.sum(_vjp_rule()(x, p)[1])


def vjp_both(x, p):
    y1, y2 = _vjp_rule()(x, p)
    return jnp.sum(y1 * 0.5 + y2)


def vjp_closing_over(x, p):
    return jnp.sum(_vjp_rule(c=p * 2.0)(x, p)[0])


def _as_custom_vjp(program):
    """The program evaluated as its jaxpr: custom_vjp equations stay custom_vjp (a
    Program called under autodiff rewrites them to custom_jvp first: vjp-to-jvp,
    which does not carry the variants yet; docs/closure.md)."""
    from jaxpr_cc.jax_adapter import eval_jaxpr

    def run(*args):
        closed = program.to_jaxpr()
        return eval_jaxpr(closed.jaxpr, closed.consts, *program.params, *args)[0]
    return run


def _vjp_derivatives(fn, wrt_p: bool):
    out = {"grad x": jax.grad(fn)(X, P),
           "vmap grad x": jax.vmap(jax.grad(fn), (0, None))(jnp.stack([X, -X]), P)}
    if wrt_p:
        out.update({"grad p": jax.grad(fn, 1)(X, P),
                    "grad x,p": jnp.concatenate(jax.grad(fn, (0, 1))(X, P))})
    return out


# JAX refuses a custom_vjp differentiated w.r.t. a value it closes over.
@pytest.mark.parametrize("fun,wrt_p", [(vjp_first, True), (vjp_second, True), (vjp_both, True),
                                       (vjp_closing_over, False)],
                         ids=["first", "second", "both", "closing_over"])
def test_custom_vjp_rule_sees_jax_perturbation_pattern(fun, wrt_p, tmp_path):
    reference = _vjp_derivatives(fun, wrt_p)
    program = jaxpr_cc.trace(fun, X, P)
    pipelined = jaxpr_cc.run_passes(program, jaxpr_cc.DEFAULT_PIPELINE)
    candidates = {"trace": _as_custom_vjp(program), "pipeline": _as_custom_vjp(pipelined),
                  "save-load": _as_custom_vjp(loads(dumps(pipelined))),
                  "jit": jaxpr_cc.jit(fun, forward_mode=False),
                  "emit": emitted_function(pipelined, tmp_path)}
    for name, candidate in candidates.items():
        got = _vjp_derivatives(candidate, wrt_p)
        for key, want in reference.items():
            np.testing.assert_allclose(np.asarray(got[key]), np.asarray(want), rtol=1e-5,
                                       atol=1e-6, err_msg=f"{name}: {key}")


# A Program differentiated as called, and jaxpr_cc.jit, run vjp-to-jvp first (forward
# mode through every custom_vjp): the custom_jvp it builds picks the fwd variant for
# the perturbed inputs, and its tangent's transpose the bwd variant for the output
# cotangents that are symbolic zeros.
@pytest.mark.parametrize("fun,wrt_p", [(vjp_first, True), (vjp_second, True), (vjp_both, True),
                                       (vjp_closing_over, False)],
                         ids=["first", "second", "both", "closing_over"])
def test_custom_vjp_pattern_through_forward_mode_rewrite(fun, wrt_p):
    reference = _vjp_derivatives(fun, wrt_p)
    program = jaxpr_cc.trace(fun, X, P)
    rewritten = with_forward_mode(program)
    assert not any(e.prim.name == "custom_vjp_call" for e in rewritten.body.equations)
    candidates = {"program": program, "jit": jaxpr_cc.jit(fun),
                  "rewritten": _as_custom_vjp(rewritten),
                  "rewritten save-load": _as_custom_vjp(loads(dumps(rewritten))),
                  "pipeline": jaxpr_cc.run_passes(program, jaxpr_cc.DEFAULT_PIPELINE)}
    for name, candidate in candidates.items():
        got = _vjp_derivatives(candidate, wrt_p)
        for key, want in reference.items():
            np.testing.assert_allclose(np.asarray(got[key]), np.asarray(want), rtol=1e-5,
                                       atol=1e-6, err_msg=f"{name}: {key}")


def test_rewritten_tangent_stores_cotangent_variants():
    rewritten = with_forward_mode(jaxpr_cc.trace(vjp_first, X, P))
    jvps = [e for _, e in rewritten.body.walk() if e.prim.name == "custom_jvp_call"]
    assert jvps and all(set(e.params["jvp_variant_patterns"]) == {(True, False), (False, True)}
                        for e in jvps)
    linear = [e for _, e in rewritten.body.walk() if e.prim.name == "linear_call"]
    # Two outputs: a cotangent for the first only, or for the second only.
    assert linear and all(set(e.params["transpose_variant_patterns"]) ==
                          {(True, False), (False, True)} for e in linear)
