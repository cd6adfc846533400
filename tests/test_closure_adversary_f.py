"""Adversarial programs for closure conversion with JAX's perturbation semantics
(issue 15), each checked against JAX running the same function.

* A symbolic-zeros custom_vjp called under ``jax.vmap`` inside the traced function:
  JAX's batching rule re-binds it, the ``closure-convert`` pass materializes that
  staged rule, and its fwd/bwd must still see which arguments are perturbed and
  which output cotangents are symbolic zeros (the rules change the numbers when
  they do not).
* A custom_vjp with four outputs, one dropped by the caller: its bwd asserts that
  cotangent is a SymbolicZero (JAX's ``test_symbolic_zero_custom_vjp_jit_vmap``),
  so a bwd traced for other cotangent patterns raises, and must not break the
  pattern that works.
"""
from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.custom_derivatives import SymbolicZero

import jaxpr_cc
from emitted import emitted_function
from jaxpr_cc.io import dumps, loads

X = jnp.array([0.3, 1.0], jnp.float32)
P = jnp.array([2.0, -1.0], jnp.float32)


def _pattern_rule():
    """fwd records whether b is perturbed, bwd whether each cotangent is a symbolic
    zero; each changes the gradient."""
    @jax.custom_vjp
    def h(a, b):
        return jnp.sin(a) * b, a * 2.0

    def fwd(a, b):
        return h(a.value, b.value), (a.value, b.value, b.perturbed)

    def bwd(res, g):
        a, b, b_perturbed = res
        g1, g2 = g
        if type(g1) is SymbolicZero:
            ga, gb = jnp.zeros_like(a) + 5.0, jnp.zeros_like(b)
        else:
            ga = (1.0 if b_perturbed else 3.0) * jnp.cos(a) * b * g1
            gb = jnp.sin(a) * g1
        if type(g2) is not SymbolicZero:
            ga = ga + 2.0 * g2
        return ga, gb

    h.defvjp(fwd, bwd, symbolic_zeros=True)
    return h


def vmapped_first(x, p):
    y1, _ = jax.vmap(_pattern_rule(), in_axes=(0, None))(x, p[0])
    return jnp.sum(y1 * 0.5)


def vmapped_second(x, p):
    _, y2 = jax.vmap(_pattern_rule(), in_axes=(0, None))(x, p[0])
    return jnp.sum(y2 * p[1])


def vmapped_both(x, p):
    y1, y2 = jax.vmap(_pattern_rule(), in_axes=(0, 0))(x, p)
    return jnp.sum(y1 + y2 * y2)


def _derivatives(fn):
    return {"value": fn(X, P),
            "grad x": jax.grad(fn)(X, P),
            "grad p": jax.grad(fn, 1)(X, P),
            "grad x,p": jnp.concatenate(jax.grad(fn, (0, 1))(X, P)),
            "vmap grad x": jax.vmap(jax.grad(fn), (0, None))(jnp.stack([X, -X]), P),
            "jit grad x": jax.jit(jax.grad(fn))(X, P)}


@pytest.mark.parametrize("fun", [vmapped_first, vmapped_second, vmapped_both],
                         ids=["first", "second", "both"])
def test_staged_symbolic_zero_vjp_under_vmap(fun, tmp_path):
    reference = _derivatives(fun)
    program = jaxpr_cc.trace(fun, X, P)
    staged = [e for _, e in program.body.walk() if e.prim.name == "custom_vjp_call"]
    assert staged and all(e.params.get("bwd_variants") for e in staged)
    pipelined = jaxpr_cc.run_passes(program, jaxpr_cc.DEFAULT_PIPELINE)
    candidates = {"trace": program, "pipeline": pipelined, "save-load": loads(dumps(pipelined)),
                  "jit": jaxpr_cc.jit(fun), "jit reverse": jaxpr_cc.jit(fun, forward_mode=False),
                  "emit": emitted_function(pipelined, tmp_path)}
    for name, candidate in candidates.items():
        got = _derivatives(candidate)
        for key, want in reference.items():
            np.testing.assert_allclose(np.asarray(got[key]), np.asarray(want), rtol=1e-5,
                                       atol=1e-6, err_msg=f"{name}: {key}")


# ------------------------------------------- one of four outputs dropped (JAX's test)
ZERO = SymbolicZero


def _four_outputs(seen):
    def f(static_scalar, static_array, dyn_scalar, dyn_array):
        return static_scalar, static_array, static_scalar + dyn_scalar, static_array + dyn_array

    f = jax.custom_vjp(f)

    def fwd(*args):
        seen.append(("fwd", tuple(a.perturbed for a in args)))
        assert [a.perturbed for a in args] == [False, False, True, True]
        xs = [a.value for a in args]
        return f(*xs), xs

    def bwd(res, g):
        seen.append(("bwd", tuple(type(t) is ZERO for t in g)))
        assert type(g[0]) is ZERO and not any(type(t) is ZERO for t in g[1:])
        return res[0] + 90, g[1] + 91, g[2] + 92, g[3] + 93

    f.defvjp(fwd, bwd, symbolic_zeros=True)
    return f


def _pack(x):
    return lax.broadcast(x, (1,))


def _unpack(x):
    (x,) = x
    return x


def _run(vmapped):
    seen: list = []
    f = _four_outputs(seen)

    def g(dyn_scalar, dyn_array):
        if vmapped:
            def f_(*args):
                out = jax.vmap(f)(*jax.tree.map(_pack, args))
                return jax.tree.map(_unpack, out)
        else:
            f_ = f
        return f_(1., jnp.array([2., 3.]), dyn_scalar, dyn_array)[1:]

    def run(primal_ins, cotangent_outs):
        primal_outs, vjp = jax.vjp(g, *primal_ins)
        return primal_outs, vjp(cotangent_outs)
    return run, seen


@pytest.mark.parametrize("vmapped", [False, True], ids=["plain", "vmap"])
def test_dropped_output_cotangent_is_symbolic_zero(vmapped):
    args = ((4., jnp.array([5., 6.])), (jnp.array([10., 11.]), 7., jnp.array([8., 9.])))
    run, _ = _run(vmapped)
    want = jax.jit(run)(*args)
    run, _ = _run(vmapped)
    got = jaxpr_cc.jit(run)(*args)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(got[1][0]), 99.0)


# ------------------------------------------- two calls of one custom_vjp stay two calls
def _clip_gradient():
    @jax.custom_vjp
    def clip_gradient(x):
        return x

    clip_gradient.defvjp(lambda x: (x, None), lambda _, g: (jnp.clip(g, -1.0, 1.0),))
    return clip_gradient


def clipped_twice(x):
    clip = _clip_gradient()
    return jnp.sum(clip(x) * 0.8 + clip(x) * 0.9)


def clipped_in_two_jits(x):
    clip = _clip_gradient()
    return jnp.sum(jax.jit(lambda x: clip(x) * 2.0)(x) + jax.jit(lambda x: clip(x) * 2.0)(x))


def _three_outputs():
    """bwd multiplies its first cotangent by 1 + the index of the first output whose
    cotangent is a SymbolicZero: each call must see its own cotangent pattern."""
    @jax.custom_vjp
    def h(a, b):
        return a * b, a + b, a - b

    def bwd(res, g):
        a, b = res
        zero = [type(t) is SymbolicZero for t in g]
        k = 1.0 + zero.index(True) if True in zero else 1.0
        g = [jnp.zeros_like(a) if type(t) is SymbolicZero else t for t in g]
        return k * (g[0] * b + g[1] + g[2]), g[0] * a + g[1] - g[2]

    h.defvjp(lambda a, b: (h(a.value, b.value), (a.value, b.value)), bwd, symbolic_zeros=True)
    return h


def two_calls_first_and_last(x, p):
    h = _three_outputs()
    return h(x, p)[0] * 2.0 + h(x, p)[2]


# cse merged the two calls: the bwd then ran once, on the summed cotangents (gradient
# clipping clipped the sum; the rule saw the union of the two cotangent patterns).
@pytest.mark.parametrize("fun,args", [(clipped_twice, (jnp.array([1.0, 2.0]),)),
                                      (clipped_in_two_jits, (jnp.array([1.0, 2.0]),)),
                                      (two_calls_first_and_last, (X, P))],
                         ids=["clip", "clip-in-jits", "cotangent-patterns"])
def test_calls_of_one_custom_vjp_are_not_merged(fun, args):
    grad = jax.grad(lambda *a: jnp.sum(fun(*a)))
    want = grad(*args)
    program = jaxpr_cc.trace(fun, *args)
    pipelined = jaxpr_cc.run_passes(program, jaxpr_cc.DEFAULT_PIPELINE)
    assert sum(e.prim.name == "custom_vjp_call" for _, e in pipelined.body.walk()) >= 2
    for name, candidate in {"pipeline": pipelined, "jit": jaxpr_cc.jit(fun)}.items():
        got = jax.grad(lambda *a: jnp.sum(candidate(*a)))(*args)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, err_msg=name)
