"""Random programs: every pass preserves their results (value and gradient).

Hypothesis draws a *recipe* -- a list of steps over a pool of float32[3]
values: elementwise and reduction ops, dot products, ``cond``, ``scan``,
``while_loop``, ``jit`` calls and custom_jvp/custom_vjp functions, exact
repeats of earlier steps (duplicates for cse) and values that never reach an
output (dead code for dce, including dead loop carries and branch outputs).
The recipe is interpreted by a Python function that is traced with
``jaxpr_cc.trace``; each pipeline's result must match JAX running the same
Python function.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jaxpr_cc
from jaxpr_cc.jax_adapter import dce_jaxpr
from jaxpr_cc.passes.manager import PassManager

from jaxref import assert_trees_equal

PIPELINES = ("closure-convert", "hoist-consts{literals=true}", "cse", "dce",
             "closure-convert,hoist-consts,cse,dce", "dce,cse,dce")

UNARY = {"sin": jnp.sin, "cos": jnp.cos, "tanh": jnp.tanh, "neg": jnp.negative,
         "exp": lambda a: jnp.exp(jnp.clip(a, -3.0, 3.0)), "abs": jnp.abs}
BINARY = {"add": jnp.add, "sub": jnp.subtract, "mul": lambda a, b: jnp.tanh(a * b),
          "max": jnp.maximum}
TABLE = np.array([0.25, -0.5, 1.5], np.float32)


@jax.custom_jvp
def softplus(x):
    return jnp.log1p(jnp.exp(-jnp.abs(x))) + jnp.maximum(x, 0.0)


@softplus.defjvp
def _softplus_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return softplus(x), t * jax.nn.sigmoid(x)


@jax.custom_vjp
def clip_grad(x):
    return jnp.sin(x) * TABLE


clip_grad.defvjp(lambda x: (clip_grad(x), x),
                 lambda x, g: (jnp.clip(g * jnp.cos(x) * TABLE, -0.5, 0.5),))


# ------------------------------------------------------------------- recipes
def _index(n_values: int):
    return st.integers(0, n_values - 1)


@st.composite
def recipes(draw):
    n = 2  # the two arguments
    steps = []
    for _ in range(draw(st.integers(1, 9))):
        kinds = ["unary", "binary", "reduce", "dot", "cond", "scan", "while", "jit",
                 "custom_jvp", "custom_vjp", "const"]
        if steps:
            kinds.append("repeat")
        kind = draw(st.sampled_from(kinds))
        if kind == "repeat":
            step = draw(st.sampled_from(steps))
        elif kind == "unary":
            step = (kind, draw(st.sampled_from(sorted(UNARY))), draw(_index(n)))
        elif kind == "binary":
            step = (kind, draw(st.sampled_from(sorted(BINARY))), draw(_index(n)), draw(_index(n)))
        elif kind in ("dot", "jit"):
            step = (kind, draw(_index(n)), draw(_index(n)))
        elif kind == "cond":
            step = (kind, draw(_index(n)), draw(_index(n)), draw(_index(n)))
        elif kind == "scan":
            step = (kind, draw(_index(n)), draw(_index(n)), draw(st.booleans()))
        else:
            step = (kind, draw(_index(n)))
        steps.append(step)
        n += _N_OUT[step[0]]
    outputs = draw(st.lists(_index(n), min_size=1, max_size=3, unique=True))
    return tuple(steps), tuple(outputs)


_N_OUT = {"unary": 1, "binary": 1, "reduce": 1, "dot": 1, "cond": 3, "scan": 4, "while": 2,
          "jit": 2, "custom_jvp": 1, "custom_vjp": 1, "const": 1}


def _step(pool, step):
    kind = step[0]
    v = pool.__getitem__
    if kind == "unary":
        return [UNARY[step[1]](v(step[2]))]
    if kind == "binary":
        return [BINARY[step[1]](v(step[2]), v(step[3]))]
    if kind == "reduce":
        return [jnp.broadcast_to(jnp.max(v(step[1])) - jnp.mean(v(step[1])), (3,))]
    if kind == "dot":
        return [jnp.tanh(jnp.dot(v(step[1]), v(step[2])) * v(step[1]))]
    if kind == "cond":
        pred = jnp.sum(v(step[1])) > 0.0
        return list(jax.lax.cond(pred,
                                 lambda a, b: (a * 0.5 + b, jnp.sin(a), a + 1.0),
                                 lambda a, b: (a - b, jnp.cos(b), b * 2.0),
                                 v(step[2]), v(step[3])))
    if kind == "scan":
        xs = jnp.stack([v(step[2]), v(step[2]) * 0.5])

        def body(carry, x):
            c, junk = carry
            return (jnp.tanh(c * 0.5 + x), junk * 1.5 + c), (c * x, jnp.sin(junk))

        (c, junk), (ys, zs) = jax.lax.scan(body, (v(step[1]), v(step[1])), xs, reverse=step[3])
        return [c, junk, ys[0] + ys[1], zs[1]]
    if kind == "while":
        def body(s):
            i, a, junk = s
            return i + 1, jnp.tanh(a + 0.25), junk * a

        _, a, junk = jax.lax.while_loop(lambda s: s[0] < 3, body, (0, v(step[1]), v(step[1])))
        return [a, junk]
    if kind == "jit":
        return list(jax.jit(lambda a, b: (jnp.sin(a) * b, a - b))(v(step[1]), v(step[2])))
    if kind == "custom_jvp":
        return [softplus(v(step[1]))]
    if kind == "custom_vjp":
        return [clip_grad(v(step[1]))]
    if kind == "const":
        return [v(step[1]) * TABLE + np.float32(0.5)]
    raise ValueError(kind)


def build(recipe):
    steps, outputs = recipe

    def fun(x, y):
        pool = [x, y]
        for step in steps:
            pool.extend(_step(pool, step))
        return [pool[i] for i in outputs]
    return fun


def _count(jaxpr) -> int:
    n = 0
    for eqn in jaxpr.eqns:
        n += 1
        for p in eqn.params.values():
            for sub in (p if isinstance(p, tuple) else (p,)):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    n += _count(inner)
    return n


X = jnp.array([0.3, -1.2, 0.7], jnp.float32)
Y = jnp.array([1.1, 0.4, -0.6], jnp.float32)


@settings(max_examples=8, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(recipes())
def test_every_pass_preserves_random_programs(recipe):
    _check(recipe)


@pytest.mark.heavy
@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(recipes())
def test_every_pass_preserves_many_random_programs(recipe):
    _check(recipe)


def _check(recipe):
    fun = build(recipe)
    program = jaxpr_cc.trace(fun, X, Y)
    optimized = [PassManager(p).run(program) for p in PIPELINES]  # verified after each pass

    kinds = {step[0] for step in recipe[0]}
    # JAX differentiates while_loop only forward and custom_vjp only backward.
    derivative = "grad" if "while" not in kinds else "jvp" if "custom_vjp" not in kinds else None

    def results_of(f):
        def scalar(x, y):
            return sum(jnp.sum(o) for o in f(x, y))
        if derivative == "grad":
            return f(X, Y), jax.grad(scalar, argnums=(0, 1))(X, Y)
        if derivative == "jvp":
            return jax.jvp(f, (X, Y), (jnp.ones_like(X), -jnp.ones_like(Y)))
        return f(X, Y)

    jax.clear_caches()  # a fresh trace of the original (see test_passes_corpus.py)
    results = jax.jit(lambda: [results_of(f) for f in [fun] + optimized])()
    for pipeline, result in zip(PIPELINES, results[1:]):
        try:
            assert_trees_equal(result, results[0], exact=False, rtol=2e-5, atol=2e-6)
        except AssertionError as e:
            raise AssertionError(f"{pipeline!r} on {recipe}: {e}") from None

    # dce keeps no more than JAX's own dce_jaxpr (both counted in JAX's form)
    closed = program.to_jaxpr()
    reference, _ = dce_jaxpr(closed.jaxpr, [True] * len(closed.jaxpr.outvars), instantiate=True)
    dced = optimized[PIPELINES.index("dce")]
    assert _count(dced.to_jaxpr().jaxpr) <= _count(reference)


def test_recipes_cover_every_kind_of_step():
    """The interpreter understands every step the strategy can draw."""
    for kind, n_out in _N_OUT.items():
        step = {"unary": ("unary", "sin", 0), "binary": ("binary", "add", 0, 1),
                "cond": ("cond", 0, 0, 1), "scan": ("scan", 0, 1, True),
                "dot": ("dot", 0, 1), "jit": ("jit", 0, 1)}.get(kind, (kind, 0))
        fun = build(((step,), tuple(range(2 + n_out))))
        out = fun(X, Y)
        assert len(out) == 2 + n_out
        program = jaxpr_cc.trace(fun, X, Y)
        ours = PassManager("hoist-consts,cse,dce").run(program)
        for a, b in zip(jax.jit(lambda x, y: ours(x, y))(X, Y), jax.jit(fun)(X, Y)):
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)

