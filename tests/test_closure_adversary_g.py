"""Adversarial programs for closure conversion (issue 15), each checked against JAX
running the same function.

* Integer and bool inputs of a symbolic-zeros rule: JAX never perturbs them, so a
  ``custom_jvp(symbolic_zeros=True)`` sees a ``SymbolicZero`` tangent for them and a
  ``custom_vjp(symbolic_zeros=True)`` bwd a ``SymbolicZero`` cotangent for an
  integer output, in every rule variant (the dense main rule included).  The rules
  below scale their answer by 1000 when they see anything else.
* Rule reuse after a rebinding the rule can read (docs/closure.md, "Rule reuse"):
  ``-0.0`` after ``0.0``, a submodule's global, a class attribute reached through
  a module, another module's function reading its own global, a class attribute
  holding a function.
"""
from __future__ import annotations

import importlib.util
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.custom_derivatives import SymbolicZero

import jaxpr_cc
from jaxpr_cc.frontend.staged_rules import convert_program
from jaxpr_cc.io import dumps, loads


def _is_zero(t):
    return isinstance(t, SymbolicZero)


def _emitted(program, tmp_path):
    path = tmp_path / f"{program.name}.py"
    jaxpr_cc.write_python(program, path)
    spec = importlib.util.spec_from_file_location(f"emitted_{program.name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, program.name)


def _variants(fun, args, tmp_path):
    program = jaxpr_cc.trace(fun, *args)
    pipelined = jaxpr_cc.run_passes(program, jaxpr_cc.DEFAULT_PIPELINE)
    return {"trace": program, "pipeline": pipelined, "save-load": loads(dumps(pipelined)),
            "emit": _emitted(pipelined, tmp_path), "jit": jaxpr_cc.jit(fun)}


def _check(fun, args, transforms, tmp_path):
    for vname, candidate in _variants(fun, args, tmp_path).items():
        for tname, transform in transforms.items():
            np.testing.assert_allclose(np.asarray(transform(candidate)(*args)),
                                       np.asarray(transform(fun)(*args)), rtol=1e-6,
                                       err_msg=f"{vname}: {tname}")


# ----------------------------------------------- integer inputs of symbolic-zeros rules
def _int_jvp_rule(seen=None):
    @jax.custom_jvp
    def g(x, n):
        return x * n

    def g_jvp(primals, tangents):
        x, n = primals
        if seen is not None:
            seen.append(type(tangents[1]).__name__)
        return g(x, n), tangents[0] * n * (1.0 if _is_zero(tangents[1]) else 1000.0)

    g.defjvp(g_jvp, symbolic_zeros=True)
    return g


def _int_vjp_rule():
    @jax.custom_vjp
    def k(x, n, b):
        return x * n * jnp.where(b, 1.0, 2.0)

    def fwd(x, n, b):
        return k(x.value, n.value, b.value), (n.value, b.value, x.perturbed, n.perturbed,
                                                b.perturbed)

    def bwd(res, ct):
        n, b, px, pn, pb = res
        scale = 1.0 + 10.0 * pn + 100.0 * pb + 1000.0 * (1 - px)
        return ct * n * jnp.where(b, 1.0, 2.0) * scale, None, None

    k.defvjp(fwd, bwd, symbolic_zeros=True)
    return k


def int_arg(x, n):
    return _int_jvp_rule()(x, n)


def int_arg_vmapped(x, n):
    b = x > 0
    u = jax.vmap(_int_vjp_rule(), (0, None, None))(jnp.stack([x, 2 * x]), n, b).sum()
    v = jax.vmap(_int_jvp_rule(), (0, None))(jnp.stack([x, 2 * x]), n).sum()
    return u + v


_FIRST = {"value": lambda h: h,
          "grad": lambda h: jax.grad(h),
          "jvp": lambda h: lambda x, n: jax.jvp(lambda v: h(v, n), (x,), (jnp.float32(1.0),))[1]}


@pytest.mark.parametrize("fun", [int_arg, int_arg_vmapped], ids=["direct", "vmapped"])
def test_integer_argument_gets_symbolic_zero(fun, tmp_path):
    # jvp only where JAX has one (a custom_vjp has none)
    transforms = _FIRST if fun is int_arg else {k: _FIRST[k] for k in ("value", "grad")}
    _check(fun, (jnp.float32(0.3), jnp.int32(3)), transforms, tmp_path)


@pytest.mark.parametrize("make_n", [lambda x: jnp.int32(3), lambda x: x.astype(jnp.int32),
                                    lambda x: x > 0], ids=["constant", "from-x", "bool"])
def test_integer_and_bool_operands_every_rule_variant(make_n):
    seen: list = []
    g = _int_jvp_rule(seen)
    f = lambda x: g(x, make_n(x))  # noqa: E731
    x = jnp.float32(0.5)
    program = jaxpr_cc.trace(f, x)
    # every rule traced (the dense main rule and each pattern) saw a SymbolicZero
    assert seen and set(seen) == {"SymbolicZero"}, seen
    np.testing.assert_allclose(jax.grad(program)(x), jax.grad(f)(x))
    np.testing.assert_allclose(jax.grad(jaxpr_cc.jit(f))(x), jax.grad(f)(x))


def _int_output_rule():
    @jax.custom_vjp
    def k(x):
        return x * 2.0, jnp.int32(3)

    def fwd(x):
        return k(x.value), None

    def bwd(_, ct):
        a, b = ct
        return (a * 2.0 * (1.0 if _is_zero(b) else 1000.0),)

    k.defvjp(fwd, bwd, symbolic_zeros=True)
    return k


def int_output(x):
    y, n = _int_output_rule()(x)
    return y * n


def int_output_vmapped(x):
    y, n = jax.vmap(_int_output_rule())(jnp.stack([x, 3 * x]))
    return (y * n).sum()


@pytest.mark.parametrize("fun", [int_output, int_output_vmapped], ids=["direct", "vmapped"])
def test_integer_output_cotangent_is_symbolic_zero(fun, tmp_path):
    _check(fun, (jnp.float32(0.5),), {"value": lambda h: h, "grad": jax.grad}, tmp_path)
    # the staged rule, as the closure-convert pass finds it in a raw jaxpr
    x = jnp.float32(0.5)
    program = jaxpr_cc.Program.from_jaxpr(jax.make_jaxpr(fun)(x))
    convert_program(program)
    np.testing.assert_allclose(jax.grad(lambda v: program(v)[0])(x), jax.grad(fun)(x))
