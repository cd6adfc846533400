"""A loop under ``jax.vmap`` whose exit test depends on the mapped value is staged as a
``while`` with a batched condition, which ``lax.while_loop`` refuses. The emitted module
spells it with a helper that runs while any element is active; values and forward-mode
derivatives of the emitted module are checked against JAX on the original function."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxpr_cc


def _emitted(fn, *args, pipeline=None):
    prog = jaxpr_cc.trace(fn, *args)
    if pipeline:
        prog = jaxpr_cc.run_passes(prog, pipeline)
    source = jaxpr_cc.emit_python(prog)
    namespace: dict = {}
    exec(compile(source, "<emitted>", "exec"), namespace)
    return source, namespace[fn.__name__]


def counting(th):
    def one(t):
        return lax.while_loop(lambda c: c[0] < t, lambda c: (c[0] + 1.0, c[1] * t),
                              (0.0, jnp.ones(2) * t))
    return jax.vmap(one)(th)


def fixed_points(th):
    def one(t):
        def cond(c):
            return jnp.max(jnp.abs(c[0] - c[1])) > 1e-6
        return lax.while_loop(cond, lambda c: (jnp.cos(t * c[0]), c[0]),
                              (jnp.float32(0.0), jnp.float32(1e3)))[0]
    return jax.vmap(one)(th)


def test_batched_exit_test_runs_per_element():
    th = jnp.array([0.3, 2.7, 5.1], jnp.float32)
    source, emitted = _emitted(counting, th)
    assert "_batched_while_loop" in source
    for got, want in zip(emitted(th), counting(th)):
        np.testing.assert_array_equal(got, want)
    got = jax.jvp(emitted, (th,), (jnp.ones(3),))[1]
    want = jax.jvp(counting, (th,), (jnp.ones(3),))[1]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6)
    np.testing.assert_array_equal(jax.jit(emitted)(th)[1], counting(th)[1])


def test_vmapped_fixed_point_after_implicit_diff():
    th = jnp.array([0.3, 0.7, 1.1], jnp.float32)
    source, emitted = _emitted(fixed_points, th, pipeline="implicit-diff")
    assert "_batched_while_loop" in source
    np.testing.assert_allclose(emitted(th), fixed_points(th), rtol=1e-6)
    got = jax.jvp(emitted, (th,), (jnp.ones(3),))[1]
    want = jax.jvp(fixed_points, (th,), (jnp.ones(3),))[1]
    np.testing.assert_allclose(got, want, rtol=1e-4)
