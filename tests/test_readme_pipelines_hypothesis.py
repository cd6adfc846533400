"""Every pipeline string the README shows, on hypothesis-generated programs, through
the save/load and emitted-Python round trips, checked against JAX (so is every pass
the README names, one at a time, except the rewrites it says change gradients on
purpose).

The pipeline strings are read from README.md itself (``run_passes(program, "...")``,
``jaxpr-cc opt ... -p '...'``, the pipeline-syntax example and ``DEFAULT_PIPELINE``),
so a pipeline added to the README is tested without editing this file.  Programs are
the recipes of tests/test_passes_hypothesis.py (elementwise ops, reductions, cond,
scan, while_loop, jit calls, custom_jvp/custom_vjp, duplicates and dead code).  For
each program and pipeline: the optimized program, the program saved and loaded back,
and the emitted Python module executed, each give JAX's value and derivative (grad,
or jvp where JAX differentiates the program only forward).
"""
import os
import re

import jax
import jax.numpy as jnp
import pytest
from hypothesis import HealthCheck, given, settings

import jaxpr_cc
from jaxpr_cc.passes import DEFAULT_PIPELINE
from jaxpr_cc.passes.pipeline import parse_pipeline

from jaxref import assert_trees_equal
from test_passes_hypothesis import X, Y, build, recipes

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


# Passes the README lists as changing gradients on purpose (pattern rewrites).
CHANGE_GRADIENTS_ON_PURPOSE = {"stable-log1pexp", "straight-through"}


def readme_pipelines() -> list[str]:
    """Pipeline strings (and single pass names) quoted in the README that parse as
    pipelines."""
    text = open(README, encoding="utf-8").read()
    candidates = set(re.findall(r'run_passes\([^,]+,\s*"([^"]+)"\)', text))
    candidates |= set(re.findall(r"-p '([^']+)'", text))
    candidates |= set(re.findall(r"--pipeline[ =]'?([^' \n]+)'?", text))
    candidates |= set(re.findall(r"`([a-z0-9{}=, .|-]+)`", text))
    found = set()
    for c in candidates - CHANGE_GRADIENTS_ON_PURPOSE:
        try:
            parse_pipeline(c)
        except Exception:  # prose in backticks that is not a pipeline
            continue
        found.add(c)
    if "DEFAULT_PIPELINE" in text:
        found.add(DEFAULT_PIPELINE)
    return sorted(found)


# The pipelines (several passes) in the default run; every single pass when heavy.
PIPELINES = [p for p in readme_pipelines() if "," in p]
PASSES = [p for p in readme_pipelines() if "," not in p]


def test_the_readme_pipelines_are_found():
    assert DEFAULT_PIPELINE in PIPELINES
    assert "closure-convert,hoist-consts{min-bytes=1024},cse,dce" in PIPELINES
    assert "hoist-consts,cse,dce" in PIPELINES
    assert len(PIPELINES) >= 4, PIPELINES
    assert {"vjp-to-jvp", "implicit-diff", "cse", "dce"} <= set(PASSES), PASSES


def _results(f, kinds):
    # JAX differentiates while_loop only forward and custom_vjp only backward.
    derivative = "grad" if "while" not in kinds else "jvp" if "custom_vjp" not in kinds else None

    def scalar(x, y):
        return sum(jnp.sum(o) for o in f(x, y))

    def run():
        if derivative == "grad":
            return f(X, Y), jax.grad(scalar, argnums=(0, 1))(X, Y)
        if derivative == "jvp":
            return jax.jvp(f, (X, Y), (jnp.ones_like(X), -jnp.ones_like(Y)))
        return f(X, Y)
    return jax.jit(run)()


def _emitted(program):
    namespace: dict = {}
    exec(compile(jaxpr_cc.emit_python(program), f"<emitted {program.name}>", "exec"), namespace)
    return namespace[program.name]


def _check(recipe, tmp_path, pipelines):
    fun = build(recipe)
    kinds = {step[0] for step in recipe[0]}
    program = jaxpr_cc.trace(fun, X, Y)
    want = _results(fun, kinds)
    for pipeline in pipelines:
        optimized = jaxpr_cc.run_passes(program, pipeline)
        path = tmp_path / "p.jcc"
        jaxpr_cc.save(optimized, path)
        for label, candidate in (("optimized", optimized), ("loaded", jaxpr_cc.load(path)),
                                 ("emitted", _emitted(optimized))):
            try:
                assert_trees_equal(_results(candidate, kinds), want, exact=False, rtol=2e-5,
                                   atol=2e-6)
            except AssertionError as e:
                raise AssertionError(f"{pipeline!r} ({label}) on {recipe}: {e}") from None


@settings(max_examples=8, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(recipe=recipes())
def test_readme_pipelines_preserve_random_programs_through_files_and_python(recipe, tmp_path):
    _check(recipe, tmp_path, PIPELINES)


@pytest.mark.heavy
@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(recipe=recipes())
def test_readme_pipelines_and_passes_preserve_many_random_programs(recipe, tmp_path):
    _check(recipe, tmp_path, PIPELINES + PASSES)
