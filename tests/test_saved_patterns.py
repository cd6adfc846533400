"""A saved program and an emitted module give JAX's numbers for every pattern of
symbolic zeros JAX can give a rule, not only the patterns traced up front
(``jaxpr_cc.frontend.saved_patterns``).  Each rule below skips a term when its
input's tangent (or an output's cotangent) is a SymbolicZero, where the dense
term is ``0 * inf = NaN``: running the main body for a pattern it was not traced
for gives NaN where JAX gives a number.  Every expectation is JAX itself on the
original function."""
from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.custom_derivatives import SymbolicZero

from emitted import emitted_function

import jaxpr_cc
from jaxpr_cc.frontend import saved_patterns


def _saved(f, args, tmp_path, passes=jaxpr_cc.DEFAULT_PIPELINE):
    program = jaxpr_cc.run_passes(jaxpr_cc.trace(f, *args), passes)
    path = tmp_path / "p.jaxprcc"
    jaxpr_cc.save(program, path)
    return jaxpr_cc.load(path)


_n = itertools.count()


def _emitted(f, args, tmp_path, passes=jaxpr_cc.DEFAULT_PIPELINE):
    program = jaxpr_cc.run_passes(jaxpr_cc.trace(f, *args), passes)
    directory = tmp_path / f"emitted_{next(_n)}"  # one directory per emit in a test
    directory.mkdir()
    return emitted_function(program, directory)


def _close(got, want):
    got, want = jax.tree.leaves(got), jax.tree.leaves(want)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert np.shape(g) == np.shape(w)
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- custom_vjp
@jax.custom_vjp
def _two_out(a, b, c, d, e):
    return a * b, c * d * jnp.sqrt(e - 1.0)


def _two_out_fwd(a, b, c, d, e):
    vals = tuple(z.value for z in (a, b, c, d, e))
    return _two_out(*vals), vals


def _two_out_bwd(res, ct):
    a, b, c, d, e = res
    g0, g1 = ct
    ga = gb = gc = gd = ge = None
    if not isinstance(g0, SymbolicZero):
        ga, gb = g0 * b, g0 * a
    if not isinstance(g1, SymbolicZero):  # at e == 1 the derivative w.r.t. e is inf
        s = jnp.sqrt(e - 1.0)
        gc, gd, ge = g1 * d * s, g1 * c * s, g1 * c * d * 0.5 / s
    return ga, gb, gc, gd, ge


_two_out.defvjp(_two_out_fwd, _two_out_bwd, symbolic_zeros=True)


def _aux_dropped(x, y):
    # Three perturbable inputs (a, c, e): 6 input patterns leave a cotangent budget
    # of one pattern up front; the second output is dropped.
    p, _ = _two_out(x, 2.0, y, 3.0, x)
    return p


@jax.custom_vjp
def _three_out(a, b, c):
    return a * 2.0, jnp.sqrt(b - 1.0) * a, jnp.sqrt(c - 1.0) * b


def _three_out_fwd(a, b, c):
    return _three_out(a.value, b.value, c.value), (a.value, b.value, c.value)


def _three_out_bwd(res, ct):
    a, b, c = res
    g0, g1, g2 = ct
    ga = jnp.zeros_like(a)
    gb = jnp.zeros_like(b)
    gc = jnp.zeros_like(c)
    if not isinstance(g0, SymbolicZero):
        ga = ga + 2.0 * g0
    if not isinstance(g1, SymbolicZero):  # at b == 1: inf
        sb = jnp.sqrt(b - 1.0)
        ga, gb = ga + g1 * sb, gb + g1 * a * 0.5 / sb
    if not isinstance(g2, SymbolicZero):  # at c == 1: inf
        sc = jnp.sqrt(c - 1.0)
        gb, gc = gb + g2 * sc, gc + g2 * b * 0.5 / sc
    return ga, gb, gc


_three_out.defvjp(_three_out_fwd, _three_out_bwd, symbolic_zeros=True)


def _first_only(a, b, c):
    return _three_out(a, b, c)[0]


def _first_two(a, b, c):
    y0, y1, _ = _three_out(a, b, c)
    return y0 + y1


_VJP_CASES = [
    ("aux-dropped", _aux_dropped, (jnp.float32(1.0), jnp.float32(2.0)), (0, 1)),
    ("3-out-first-only", _first_only, (jnp.float32(1.5), jnp.float32(1.0), jnp.float32(1.0)),
     (0, 1, 2)),
    ("3-out-two-used", _first_two, (jnp.float32(1.5), jnp.float32(2.0), jnp.float32(1.0)),
     (0, 1, 2)),
]


@pytest.mark.parametrize("name,f,args,argnums", _VJP_CASES, ids=[c[0] for c in _VJP_CASES])
@pytest.mark.parametrize("how", ["saveload", "emit"])
def test_vjp_patterns_survive(name, f, args, argnums, how, tmp_path):
    g = (_saved if how == "saveload" else _emitted)(f, args, tmp_path)
    _close(g(*args), f(*args))
    for k in argnums:  # each input alone: one pattern of perturbed inputs each
        _close(jax.grad(g, k)(*args), jax.grad(f, k)(*args))
    _close(jax.grad(g, argnums)(*args), jax.grad(f, argnums)(*args))


def test_vjp_patterns_survive_vjp_to_jvp(tmp_path):
    args = (jnp.float32(1.0), jnp.float32(2.0))
    g = _saved(_aux_dropped, args, tmp_path, passes="closure-convert,vjp-to-jvp")
    _close(jax.grad(g)(*args), jax.grad(_aux_dropped)(*args))
    _close(jax.grad(g, (0, 1))(*args), jax.grad(_aux_dropped, (0, 1))(*args))


# ---------------------------------------------------------------- custom_jvp
@jax.custom_jvp
def _sum_sqrt(a, b, c, d, e):
    return a + b * c + jnp.sqrt(d) + jnp.sqrt(e)


def _sum_sqrt_jvp(p, t):
    a, b, c, d, e = p
    ta, tb, tc, td, te = t
    out = jnp.zeros_like(a)
    if not isinstance(ta, SymbolicZero):
        out = out + ta
    if not isinstance(tb, SymbolicZero):
        out = out + tb * c
    if not isinstance(tc, SymbolicZero):
        out = out + b * tc
    if not isinstance(td, SymbolicZero):  # at d == 0: inf
        out = out + td * 0.5 / jnp.sqrt(d)
    if not isinstance(te, SymbolicZero):  # at e == 0: inf
        out = out + te * 0.5 / jnp.sqrt(e)
    return _sum_sqrt(*p), out


_sum_sqrt.defjvp(_sum_sqrt_jvp, symbolic_zeros=True)


def _jvp_prog(x, y, d, e):
    # Four perturbable inputs (beyond the up-front budget of 3), one constant.
    return _sum_sqrt(x, y, 2.0, d, e)


_JVP_ARGS = (jnp.float32(1.0), jnp.float32(3.0), jnp.float32(0.0), jnp.float32(0.0))


@pytest.mark.parametrize("how", ["saveload", "emit"])
def test_jvp_patterns_survive(how, tmp_path):
    f, args = _jvp_prog, _JVP_ARGS
    g = (_saved if how == "saveload" else _emitted)(f, args, tmp_path)
    _close(g(*args), f(*args))
    for k in (0, 1):
        _close(jax.grad(g, k)(*args), jax.grad(f, k)(*args))
        t = tuple(jnp.float32(1.0 if i == k else 0.0) for i in range(4))
        # A zero tangent passed to jax.jvp is dense (perturbed) for JAX too: both
        # give NaN for the sqrt inputs, the same numbers.
        _close(jax.jvp(g, args, t), jax.jvp(f, args, t))
        _close(jax.jvp(lambda x: g(*args[:k], x, *args[k + 1:]), (args[k],), (1.0,)),
               jax.jvp(lambda x: f(*args[:k], x, *args[k + 1:]), (args[k],), (1.0,)))
    _close(jax.grad(g, (0, 1))(*args), jax.grad(f, (0, 1))(*args))


# ---------------------------------------------------------------- limits, IR
def test_too_many_patterns_warn_and_keep_the_up_front_ones(tmp_path, monkeypatch):
    monkeypatch.setattr(saved_patterns, "MAX_SAVED_PATTERNS", 4)
    f, args = _jvp_prog, _JVP_ARGS
    program = jaxpr_cc.run_passes(jaxpr_cc.trace(f, *args), jaxpr_cc.DEFAULT_PIPELINE)
    path = tmp_path / "p.jaxprcc"
    with pytest.warns(saved_patterns.SavedPatternsWarning) as caught:
        jaxpr_cc.save(program, path)
    message = str(caught[0].message)
    assert "\n" not in message
    assert "'_sum_sqrt'" in message and "MAX_SAVED_PATTERNS" in message
    with pytest.warns(saved_patterns.SavedPatternsWarning, match="'_sum_sqrt'"):
        jaxpr_cc.emit_python(program)
    g = jaxpr_cc.load(path)
    # The pattern the main rule was traced for (every input perturbed) is exact.
    _close(g(*args), f(*args))
    _close(jax.grad(g, (0, 1, 2, 3))(*args), jax.grad(f, (0, 1, 2, 3))(*args))


def test_saving_leaves_the_program_unchanged(tmp_path):
    program = jaxpr_cc.run_passes(jaxpr_cc.trace(_aux_dropped, jnp.float32(1.0),
                                                 jnp.float32(2.0)), jaxpr_cc.DEFAULT_PIPELINE)
    printed = str(program)
    jaxpr_cc.save(program, tmp_path / "p.jaxprcc")
    jaxpr_cc.emit_python(program)
    assert str(program) == printed


def _staged_a_b_a(fn, args):
    # Staged once (as equinox stages its rules), then differentiated with several
    # patterns: JAX hands bwd the residual tree of the pattern traced last.
    staged = jax.make_jaxpr(fn)(*args)

    def h(*xs):
        return jax.core.eval_jaxpr(staged.jaxpr, staged.consts, *xs)[0]
    return (jax.grad(h, (0, 1, 2))(*args), jax.grad(h, 2)(*args), jax.grad(h, 1)(*args),
            jax.grad(h, (0, 1, 2))(*args))


@pytest.mark.parametrize("how", ["saveload", "emit"])
def test_completed_patterns_staged_then_differentiated_a_b_a(how, tmp_path):
    args = (jnp.float32(1.5), jnp.float32(2.0), jnp.float32(1.0))
    g = (_saved if how == "saveload" else _emitted)(_first_two, args, tmp_path)
    _close(_staged_a_b_a(g, args), _staged_a_b_a(_first_two, args))


def _product(*a):
    return functools.reduce(lambda x, y: x * y, a)


def _product_vjp(n):
    f = jax.custom_vjp(_product)

    def bwd(a, g):
        return tuple(None if i == 1 else g * a[0] for i in range(n))
    f.defvjp(lambda *a: (f(*a), a), bwd)
    return f


def _product_jvp(n):
    f = jax.custom_jvp(_product)
    f.defjvp(lambda p, t: (f(*p), sum(ti * p[0] for ti in t)))
    return f


@pytest.mark.parametrize("make, n", [(_product_vjp, 4), (_product_jvp, 5)])
@pytest.mark.parametrize("how", ["saved", "emitted"])
def test_patterns_of_a_vmapped_rule_with_many_inputs_are_first_order(make, n, how, tmp_path):
    # A rule JAX staged under vmap, with more inputs than patterns traced up front:
    # the bodies traced at save time call the function itself in JAX's staged form,
    # which must be made first-order too ("holds a Python callable" before).
    g = make(n)

    def f(x):
        return jnp.sum(jax.vmap(g)(*[x * (i + 1) for i in range(n)]))

    x = jnp.arange(3.0) + 0.5
    got = (_saved if how == "saved" else _emitted)(f, (x,), tmp_path)
    np.testing.assert_allclose(got(x), f(x), rtol=1e-6)
    np.testing.assert_allclose(jax.grad(got)(x), jax.grad(f)(x), rtol=1e-6)


@jax.custom_vjp
def _four(x, y):
    return x * y, x + y, x - y, x * 2


def _four_bwd(r, g):
    x, y = r
    cx, cy = jnp.zeros_like(x), None
    for gi, dx, dy in zip(g, (y, 1.0, 1.0, 2.0), (x, 1.0, -1.0, None)):
        if type(gi) is SymbolicZero:
            continue
        cx = cx + gi * dx
        if dy is not None:
            cy = (0 if cy is None else cy) + gi * dy
    return cx, cy  # None for y when only output 3 has a cotangent


_four.defvjp(lambda x, y: (_four(x.value, y.value), (x.value, y.value)), _four_bwd,
             symbolic_zeros=True)


@jax.custom_vjp
def _tag(y):
    return jnp.sqrt(y)


_tag.defvjp(lambda y: (_tag(y.value), y.value),
            lambda y, g: (jnp.full_like(y, -7.0),) if type(g) is SymbolicZero else (g * 1000.0,),
            symbolic_zeros=True)


@pytest.mark.parametrize("how", ["saved", "emitted"])
def test_two_calls_reading_different_outputs_keep_both_patterns(how, tmp_path):
    # Beyond the up-front budget (4 outputs), the saved patterns of a rule are the
    # union of what its calls read: the second call reads output 3 only, where the
    # bwd returns None for y and the rule upstream sees a symbolic zero (-7).
    def f(x, y):
        return jnp.sum(_four(x, _tag(y))[0]) + jnp.sum(_four(x, _tag(y))[3])

    x, y = jnp.arange(3.0) + 0.5, jnp.full(3, 2.0)
    got = (_saved if how == "saved" else _emitted)(f, (x, y), tmp_path)
    want = jax.grad(f, argnums=(0, 1))(x, y)
    for g, w in zip(jax.grad(got, argnums=(0, 1))(x, y), want):
        np.testing.assert_allclose(g, w, rtol=1e-6)
