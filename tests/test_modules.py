"""Programs as modules: shared functions stay one function, recursion is a cycle.

Every value and derivative is checked against JAX itself, or against an analytic
reference where JAX cannot differentiate the original.
"""
import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_cc
from jaxpr_cc.examples import fixed_point as fp
from jaxpr_cc.passes.base import PASS_REGISTRY

X = jnp.linspace(-1.0, 1.0, 8, dtype=jnp.float32)
W = jnp.full((8,), 0.5, jnp.float32)


@jax.jit
def block(x, w):
    for _ in range(5):
        x = jnp.tanh(x * w + 1.0) - x
    return x


def sites(x, w):
    acc = x
    for _ in range(12):
        acc = block(acc, w)
    return jnp.sum(acc * acc)


def _close(a, b, rtol=1e-5):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=1e-6)


def _callees(program):
    return [name for name in program.functions() if name != program.name]


def test_a_jit_called_from_many_sites_is_one_function():
    program = jaxpr_cc.trace(sites, X, W)
    assert _callees(program) == ["block"]
    text = str(program)
    assert text.count("func @block(") == 1 and text.count("jaxpr=@block") == 12
    _close(program(X, W), sites(X, W))
    for got, want in zip(jax.grad(program, argnums=(0, 1))(X, W),
                         jax.grad(sites, argnums=(0, 1))(X, W)):
        _close(got, want)


def test_sharing_survives_the_pipeline_save_load_and_emission(tmp_path):
    program = jaxpr_cc.run_passes(jaxpr_cc.trace(sites, X, W),
                                  "closure-convert,hoist-consts,cse,dce")
    assert _callees(program) == ["block"]
    path = tmp_path / "sites.jcc"
    jaxpr_cc.save(program, path)
    loaded = jaxpr_cc.load(path)
    assert _callees(loaded) == ["block"]
    _close(loaded(X, W), sites(X, W))
    _close(jax.grad(loaded)(X, W), jax.grad(sites)(X, W))
    source = jaxpr_cc.emit_python(program)
    assert source.count("def block(") == 1, source
    module_path = tmp_path / "emitted_sites.py"
    jaxpr_cc.write_python(program, module_path)
    spec = importlib.util.spec_from_file_location("emitted_sites", module_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _close(getattr(module, program.name)(X, W), sites(X, W))
    again = jaxpr_cc.trace(getattr(module, program.name), X, W)
    assert _callees(again) == ["block"]


def test_a_call_site_that_needs_its_own_version_gets_a_copy():
    @jax.jit
    def two(x):
        return jnp.sin(x) * 2.0, jnp.cos(x) + 1.0

    def f(x):
        a, _ = two(x)          # this site reads only the first result
        b, c = two(x + 1.0)    # this one reads both
        return a + b * c

    program = jaxpr_cc.run_passes(jaxpr_cc.trace(f, X), "dce")
    _close(program(X), f(X))
    _close(jax.grad(lambda x: jnp.sum(program(x)))(X), jax.grad(lambda x: jnp.sum(f(x)))(X))


@jax.custom_vjp
def sin_times(x):
    return jnp.sin(x) * x


def _sin_times_fwd(x):
    return sin_times(x), x      # the fwd calls the function itself


def _sin_times_bwd(x, ct):
    return ((jnp.cos(x) * x + jnp.sin(x)) * ct,)


sin_times.defvjp(_sin_times_fwd, _sin_times_bwd)


@jax.custom_jvp
def softplus(x):
    return jnp.logaddexp(x, 0.0)


@softplus.defjvp
def _softplus_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return softplus(x), jax.nn.sigmoid(x) * t   # the jvp calls the function itself


RECURSIVE = {"fwd_calls_f": (sin_times, 0.7), "jvp_calls_f": (softplus, 0.3)}


def _derivatives(f, x, order):
    out, g = [], f
    for _ in range(order + 1):
        out.append(g(x))
        g = jax.grad(g)
    return out


@pytest.mark.parametrize("name", sorted(RECURSIVE))
def test_recursive_rule_is_a_cycle_and_every_order_matches_jax(name):
    fn, x = RECURSIVE[name]
    program = jaxpr_cc.trace(fn, x)
    text = str(program)
    assert "=@" in text, "the recursive rule refers to itself by symbol"
    jax_text = str(jax.make_jaxpr(fn)(x))
    assert len(text) <= 4 * len(jax_text), (len(text), len(jax_text))
    for got, want in zip(_derivatives(program, x, 3), _derivatives(fn, x, 3)):
        _close(got, want, rtol=1e-4)


def test_fixed_point_recursion_matches_the_analytic_derivatives():
    # newton_sqrt: fixed_point's fwd calls fixed_point, its bwd solves with a new
    # function at every level (the same structure at other values).
    program = jaxpr_cc.trace(fp.newton_sqrt, 2.0)
    a = 2.0
    want = [np.sqrt(a), 0.5 * a ** -0.5, -0.25 * a ** -1.5]
    for got, w in zip(_derivatives(program, a, 2), want):
        _close(got, w, rtol=1e-4)


# The project's passes (test modules register broken-on-purpose passes of their own).
PROJECT_PASSES = sorted(n for n, cls in PASS_REGISTRY.items()
                        if cls.__module__.startswith("jaxpr_cc."))


@pytest.mark.parametrize("pass_name", PROJECT_PASSES)
@pytest.mark.parametrize("name", sorted(RECURSIVE))
def test_every_pass_and_round_trip_keeps_a_recursive_program(pass_name, name, tmp_path):
    fn, x = RECURSIVE[name]
    program = jaxpr_cc.run_passes(jaxpr_cc.trace(fn, x), pass_name)
    want = _derivatives(fn, x, 2)
    for got, w in zip(_derivatives(program, x, 2), want):
        _close(got, w, rtol=1e-4)
    path = tmp_path / "p.jcc"
    jaxpr_cc.save(program, path)
    for got, w in zip(_derivatives(jaxpr_cc.load(path), x, 2), want):
        _close(got, w, rtol=1e-4)


# A custom_jvp whose jvp calls itself (optimistix's ``_asarray``), under jacfwd of a
# function JAX closure-converted: JAX re-stages the vmapped rule in its own form at
# every level; converting it must find the inner call to be the rule being converted.
@jax.custom_jvp
def same(x):
    return x * 1.0


@same.defjvp
def _same_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return same(x), same(t)


def jacobian_of_converted(a):
    g = lambda y: jnp.tanh(same(y)) * a - y  # noqa: E731
    y0 = jnp.linspace(0.1, 0.9, 3, dtype=jnp.float32) * a
    converted, consts = jax.closure_convert(g, y0)
    return jax.jacfwd(lambda y: converted(y, *consts))(y0)


def test_a_rule_jax_restages_at_every_level_is_converted_as_recursion(tmp_path):
    a = jnp.float32(0.7)
    program = jaxpr_cc.run_passes(jaxpr_cc.trace(jacobian_of_converted, a),
                                  "closure-convert,hoist-consts,cse,dce")
    text = str(program)
    assert "jvp_jaxpr_fun" not in text  # every rule first-order
    path = tmp_path / "jac.jcc"
    jaxpr_cc.save(program, path)
    loaded = jaxpr_cc.load(path)
    module_path = tmp_path / "emitted_jac.py"
    jaxpr_cc.write_python(program, module_path)
    spec = importlib.util.spec_from_file_location("emitted_jac", module_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    emitted = getattr(module, program.name)
    def total(f):
        return lambda a: jnp.sum(f(a))

    want = _derivatives(total(jacobian_of_converted), a, 2)
    _close(program(a), jacobian_of_converted(a))
    for candidate in (program, loaded, emitted):
        for got, w in zip(_derivatives(total(candidate), a, 2), want):
            _close(got, w, rtol=1e-4)
