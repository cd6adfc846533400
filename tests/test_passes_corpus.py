"""Every pass on every corpus program: JAX's results, a valid program after each
pass, and a dce that keeps no more than JAX's own ``dce_jaxpr``.

Each pass (and the whole default pipeline) is applied to the program
``jaxpr_cc.trace`` gives; the verifier runs after every pass (the pass manager's
``verify_each``).  Results are compared with the original Python function under
JAX: the value here, and ``grad``/``jvp``/``vmap`` (where the original supports
them) in the ``heavy`` test.  To keep compilation count low, the original and
every variant are computed inside one ``jax.jit`` per transformation.  Values
are compared with a tight tolerance, not bitwise: hoisting a constant into an
argument legitimately changes what XLA may constant-fold (``x / c`` becomes
``x * (1/c)`` only for a constant ``c``).
"""
import functools

import jax
import pytest

import jaxpr_cc
from jaxpr_cc.golden.corpus import load_corpus
from jaxpr_cc.jax_adapter import dce_jaxpr
from jaxpr_cc.passes.manager import PassManager

from jaxref import assert_trees_equal, batch_args, batch_in_axes, scalarize, tangents_like

PIPELINES = ("closure-convert", "hoist-consts", "cse", "dce",
             "closure-convert,hoist-consts,cse,dce")
#: Extra pipelines checked only by the heavy tests.
HEAVY_PIPELINES = ("hoist-consts{literals=true},cse,dce", "dce,cse,dce,hoist-consts{min-bytes=64}")
RTOL, ATOL = 2e-5, 2e-6

CORPUS = load_corpus(skip_unavailable=True)


@functools.lru_cache(maxsize=None)
def variants(name: str):
    """``(program, {pipeline: optimized program})`` for one corpus program."""
    prog = next(p for p in CORPUS if p.name == name)
    program = jaxpr_cc.trace(functools.partial(prog.fun, **prog.kwargs), *prog.args)
    out = {}
    for pipeline in PIPELINES + HEAVY_PIPELINES:
        # verify_each: the program is checked in full after every pass.
        out[pipeline] = PassManager(pipeline, verify_each=True).run(program)
    return program, out


def _functions(prog, pipelines):
    _, optimized = variants(prog.name)
    original = functools.partial(prog.fun, **prog.kwargs)
    return original, [optimized[p] for p in pipelines]


def _all_at_once(prog, name, fns):
    """Apply transformation ``name`` to each function, all in one jit."""
    args = tuple(prog.args)
    if name == "value":
        return jax.jit(lambda *a: [f(*a) for f in fns])(*args)
    if name == "grad":
        argnums = tuple(prog.grad_argnums)
        return jax.jit(lambda *a: [jax.grad(scalarize(f), argnums=argnums)(*a) for f in fns])(*args)
    if name == "jvp":
        return jax.jit(lambda primals, tangents: [jax.jvp(f, primals, tangents) for f in fns])(
            args, tangents_like(args))
    if name == "vmap":
        axes = batch_in_axes(args)
        return jax.jit(lambda *a: [jax.vmap(f, in_axes=axes)(*a) for f in fns])(*batch_args(args))
    raise ValueError(name)


def _compare(prog, name, pipelines=PIPELINES):
    original, optimized = _functions(prog, pipelines)
    # Tracing with jaxpr_cc.trace can leave re-bound custom rules in JAX's jit
    # caches (shared library functions such as jnp.logaddexp); the reference must
    # come from a fresh trace of the original function.
    jax.clear_caches()
    results = _all_at_once(prog, name, [original] + optimized)
    reference = results[0]
    for pipeline, result in zip(pipelines, results[1:]):
        try:
            assert_trees_equal(result, reference, exact=False, rtol=RTOL, atol=ATOL)
        except AssertionError as e:
            raise AssertionError(f"{prog.name}: {name} after {pipeline!r}: {e}") from None


@pytest.mark.parametrize("prog", CORPUS, ids=lambda p: p.name)
def test_every_pass_keeps_the_value(prog):
    _compare(prog, "value")


@pytest.mark.heavy
@pytest.mark.parametrize("transform", ["value", "grad", "jvp", "vmap"])
@pytest.mark.parametrize("prog", CORPUS, ids=lambda p: p.name)
def test_every_pass_keeps_transformations(prog, transform):
    if transform != "value" and transform not in prog.supports:
        pytest.skip(f"JAX does not support {transform} on {prog.name}")
    _compare(prog, transform, PIPELINES + HEAVY_PIPELINES)


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


@pytest.mark.parametrize("prog", CORPUS, ids=lambda p: p.name)
def test_dce_removes_at_least_what_jax_removes(prog):
    program, optimized = variants(prog.name)
    closed = program.to_jaxpr()
    reference, _ = dce_jaxpr(closed.jaxpr, [True] * len(closed.jaxpr.outvars), instantiate=True)
    # Count both in JAX's form (first-order rules are emitted as JAX's custom
    # equations, whose rules JAX does not count as equations).
    assert _count(optimized["dce"].to_jaxpr().jaxpr) <= _count(reference)
    # cse and hoist-consts never add equations
    assert optimized["cse"].num_equations() <= program.num_equations()
    assert optimized["hoist-consts"].num_equations() == program.num_equations()
    assert not any(r.constvars for r in optimized["hoist-consts"].body.regions())
