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

import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.custom_derivatives import SymbolicZero

import jaxpr_cc
from emitted import emitted_function
from jaxpr_cc.frontend.staged_rules import convert_program
from jaxpr_cc.io import dumps, loads


def _is_zero(t):
    return isinstance(t, SymbolicZero)


def _variants(fun, args, tmp_path):
    program = jaxpr_cc.trace(fun, *args)
    pipelined = jaxpr_cc.run_passes(program, jaxpr_cc.DEFAULT_PIPELINE)
    return {"trace": program, "pipeline": pipelined, "save-load": loads(dumps(pipelined)),
            "emit": emitted_function(pipelined, tmp_path), "jit": jaxpr_cc.jit(fun)}


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


# ------------------------------------------------------- rule reuse after a rebinding
def _both(fun, x, grad=True):
    """``fun`` through trace and jaxpr_cc.jit against JAX: value, and (``grad``) the
    gradient (a custom_vjp bwd reading a late-bound variable differs from JAX by
    design, docs/closure.md, so those compare values only)."""
    for name, candidate in {"trace": jaxpr_cc.trace(fun, x), "jit": jaxpr_cc.jit(fun)}.items():
        np.testing.assert_allclose(np.asarray(candidate(x)), np.asarray(fun(x)), rtol=1e-6,
                                   err_msg=f"{name}: value")
        if grad:
            np.testing.assert_allclose(np.asarray(jax.grad(candidate)(x)),
                                       np.asarray(jax.grad(fun)(x)), rtol=1e-6,
                                       err_msg=f"{name}: grad")


@pytest.fixture
def advpkg(tmp_path, request):
    """A fresh package ``<name>`` with ``settings.dt``, ``consts.Config.dt`` and
    ``physics.force`` (reading ``physics.G``), importable for this test only."""
    name = f"advpkg_{request.node.name.replace('[', '_').replace(']', '').replace('-', '_')}"
    root = tmp_path / name
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "settings.py").write_text("dt = 0.1\n")
    (root / "consts.py").write_text("class Config:\n    dt = 0.1\n")
    (root / "physics.py").write_text(textwrap.dedent("""\
        G = 1.0
        def force(x):
            return G * x
        """))
    sys.path.insert(0, str(tmp_path))
    try:
        import importlib
        package = importlib.import_module(name)
        for sub in ("settings", "consts", "physics"):
            importlib.import_module(f"{name}.{sub}")
        yield package
    finally:
        sys.path.remove(str(tmp_path))
        for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[mod]


SIGN = 0.0


@jax.custom_jvp
def _signed_pi(x):
    return x * jnp.arctan2(SIGN, -1.0)  # +pi for 0.0, -pi for -0.0


@_signed_pi.defjvp
def _signed_pi_jvp(p, t):
    return _signed_pi(p[0]), t[0] * jnp.arctan2(SIGN, -1.0)


def negative_zero(x):
    global SIGN
    SIGN = 0.0
    a = _signed_pi(x)
    SIGN = -0.0
    b = _signed_pi(x)
    SIGN = 0.0
    return a + 2.0 * b


def test_negative_zero_after_zero():
    _both(negative_zero, jnp.float32(1.0))


def test_submodule_global_through_package(advpkg):
    @jax.custom_vjp
    def step(x):
        return x + advpkg.settings.dt * x
    step.defvjp(lambda x: (step(x), None),
                lambda _, ct: (ct * (1 + advpkg.settings.dt),))

    def f(x):
        advpkg.settings.dt = 0.1
        a = step(x)
        advpkg.settings.dt = 0.5
        return step(a)

    _both(f, jnp.float32(1.0), grad=False)


def test_class_attribute_through_module(advpkg):
    consts = advpkg.consts

    @jax.custom_jvp
    def step(x):
        return x * (1 + consts.Config.dt)
    step.defjvp(lambda p, t: (step(p[0]), t[0] * (1 + consts.Config.dt)))

    def f(x):
        consts.Config.dt = 0.1
        a = step(x)
        consts.Config.dt = 0.5
        return step(a)

    _both(f, jnp.float32(1.0))


def test_function_of_another_module_reading_its_global(advpkg):
    physics = advpkg.physics

    @jax.custom_jvp
    def step(x):
        return x + physics.force(x)
    step.defjvp(lambda p, t: (step(p[0]), t[0] + physics.force(t[0])))

    def f(x):
        physics.G = 1.0
        a = step(x)
        physics.G = 3.0
        return step(a)

    _both(f, jnp.float32(1.0))


class _Layer:
    act = staticmethod(jnp.sin)

    def __init__(self, w):
        self.w = w


def rebound_class_method(x):
    layer = _Layer(2.0)

    @jax.custom_vjp
    def g(x):
        return layer.act(x * layer.w)

    def bwd(x, ct):
        return jax.vjp(lambda v: layer.act(v * layer.w), x)[1](ct)

    g.defvjp(lambda x: (g(x), x), bwd)
    try:
        a = g(x)
        _Layer.act = staticmethod(jnp.cos)
        b = g(x)
    finally:
        _Layer.act = staticmethod(jnp.sin)
    return a + 3.0 * b


def test_callable_class_attribute_rebound():
    _both(rebound_class_method, jnp.float32(0.3), grad=False)


def test_rule_is_reused_when_nothing_changed(advpkg):
    """The wider walk still lets 20 calls reading a class, a module's function and
    a package's submodule share one traced rule."""
    import itertools
    traces = itertools.count()
    layer = _Layer(jnp.float32(2.0))

    @jax.custom_vjp
    def step(x):
        return x + advpkg.settings.dt * layer.act(advpkg.physics.force(x) * layer.w)

    def fwd(x):
        next(traces)
        return step(x), x

    def bwd(x, ct):
        return jax.vjp(lambda v: v + advpkg.settings.dt
                       * layer.act(advpkg.physics.force(v) * layer.w), x)[1](ct)

    step.defvjp(fwd, bwd)

    def many(x):
        for _ in range(20):
            x = step(x)
        return x

    x = jnp.float32(0.4)
    program = jaxpr_cc.trace(many, x)
    assert next(traces) <= 2  # once, and once more if found recursive: not 20
    np.testing.assert_allclose(program(x), many(x), rtol=1e-6)
    np.testing.assert_allclose(jax.grad(program)(x), jax.grad(many)(x), rtol=1e-5)


class _Stepper:
    """Holds a module; its method reads ``self.settings.dt``, a name only the method's
    code mentions."""

    def __init__(self, settings):
        self.settings = settings

    def rate(self):
        return 1 + self.settings.dt


def test_module_attribute_named_only_by_a_method(advpkg):
    stepper = _Stepper(advpkg.settings)

    @jax.custom_jvp
    def step(x):
        return x * stepper.rate()
    step.defjvp(lambda p, t: (step(p[0]), t[0] * stepper.rate()))

    def f(x):
        advpkg.settings.dt = 0.1
        a = step(x)
        advpkg.settings.dt = 0.5
        return step(a)

    _both(f, jnp.float32(1.0))


def test_module_attribute_read_by_getattr(advpkg):
    @jax.custom_jvp
    def step(x):
        return x * (1 + getattr(advpkg.settings, "dt"))
    step.defjvp(lambda p, t: (step(p[0]), t[0] * (1 + getattr(advpkg.settings, "dt"))))

    def f(x):
        advpkg.settings.dt = 0.1
        a = step(x)
        advpkg.settings.dt = 0.5
        return step(a)

    _both(f, jnp.float32(1.0))
