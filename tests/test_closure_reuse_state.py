"""A rule is reused only when nothing it reads changed (adversary, stop 32).

Each program calls one custom function three times and changes, between the
calls, state the primal and the rule read through a path the fingerprint did
not walk: a function's or a partial's attributes, a C method or view of a dict,
a weak reference, a module imported inside the function or served by a PEP 562
``__getattr__``, a metaclass attribute, a program object with
``__jax_array__``, a ``ContextVar``, ``globals()[key]`` with a computed key, a
name set in ``builtins``, attributes of an ndarray or float subclass's
instance, an object array's objects, a ``WeakValueDictionary``'s values, static pytree data that compares equal but is not
(``0.0``/``-0.0``, ``1.0``/``1``/``True``), and JAX's configuration
(``enable_x64``).  jaxpr-cc reused the first call's rules, so even the value was
wrong.  Reference: JAX itself (eager and ``jax.jit``).
"""
import builtins
import contextvars
import dataclasses
import functools
import sys
import types
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_cc

KS = (2.0, 5.0, 7.0)


def _three_calls(read, write):
    """A custom_jvp whose primal and jvp read ``read()``, called once per k."""
    @jax.custom_jvp
    def g(x):
        return jnp.sin(x) + read()

    g.defjvp(lambda p, t: (g(p[0]), t[0] * read()))

    def f(x):
        out = 0.0
        for k in KS:
            write(k)
            out = out + g(x)
        return out
    return f


def _function_attribute():
    def scale():
        return scale.k
    scale.k = 1.0
    return scale, lambda k: setattr(scale, "k", k)


def _partial_attribute():
    pp = functools.partial(lambda: 0.0)
    pp.k = 1.0
    return (lambda: pp.k), lambda k: setattr(pp, "k", k)


def _dict_method():
    cfg = {"k": 1.0}
    get = cfg.get
    return (lambda: get("k")), lambda k: cfg.__setitem__("k", k)


def _dict_getitem():
    cfg = {"k": 1.0}
    item = cfg.__getitem__
    return (lambda: item("k")), lambda k: cfg.__setitem__("k", k)


def _mapping_proxy():
    cfg = {"k": 1.0}
    view = types.MappingProxyType(cfg)
    return (lambda: view["k"]), lambda k: cfg.__setitem__("k", k)


def _dict_values():
    cfg = {"k": 1.0}
    values = cfg.values()
    return (lambda: next(iter(values))), lambda k: cfg.__setitem__("k", k)


class _Settings:
    k = 1.0


def _weak_reference():
    obj = _Settings()
    ref = weakref.ref(obj)
    _weak_reference.keep = obj
    return (lambda: ref().k), lambda k: setattr(obj, "k", k)


def _metaclass_attribute():
    meta = type("Meta", (type,), {"k": 1.0})
    with_meta = meta("WithMeta", (), {})
    return (lambda: with_meta.k), lambda k: setattr(meta, "k", k)


def _jax_array_object():
    class Box:
        v = 1.0

        def __jax_array__(self):
            return jnp.asarray(self.v, jnp.float32)

    box = Box()
    return (lambda: jnp.asarray(box)), lambda k: setattr(box, "v", k)


def _module(tmp_path, name, source):
    (tmp_path / f"{name}.py").write_text(source)
    sys.path.insert(0, str(tmp_path))
    try:
        __import__(name)
    finally:
        sys.path.remove(str(tmp_path))
    return sys.modules[name]


def _imported_inside(tmp_path):
    module = _module(tmp_path, "jaxpr_cc_test_settings_import", "dt = 1.0\n")

    def read():
        import jaxpr_cc_test_settings_import
        return jaxpr_cc_test_settings_import.dt
    return read, lambda k: setattr(module, "dt", k)


def _module_getattr(tmp_path):
    module = _module(tmp_path, "jaxpr_cc_test_settings_lazy",
                     "_SETTINGS = {'dt': 1.0}\n"
                     "def __getattr__(name):\n"
                     "    try:\n        return _SETTINGS[name]\n"
                     "    except KeyError:\n        raise AttributeError(name)\n")
    return (lambda: module.dt), lambda k: module._SETTINGS.__setitem__("dt", k)


def _context_variable():
    var = contextvars.ContextVar("jaxpr_cc_test_k", default=1.0)
    return var.get, var.set


def _computed_global_key():
    key = "_JAXPR_CC_TEST_" + "K"
    globals()[key] = 1.0
    return (lambda: globals()[key]), lambda k: globals().__setitem__(key, k)


def _builtins_name():
    builtins.JAXPR_CC_TEST_K = 1.0
    return (lambda: JAXPR_CC_TEST_K), lambda k: setattr(builtins, "JAXPR_CC_TEST_K", k)  # noqa: F821


class _ScaledArray(np.ndarray):
    pass


def _ndarray_subclass_attribute():
    arr = np.zeros(2).view(_ScaledArray)
    arr.scale = 1.0
    return (lambda: arr.scale), lambda k: setattr(arr, "scale", k)


class _TaggedFloat(float):
    pass


def _float_subclass_attribute():
    tagged = _TaggedFloat(0.0)
    tagged.k = 1.0
    return (lambda: tagged.k), lambda k: setattr(tagged, "k", k)


def _object_array():
    holder = types.SimpleNamespace(k=1.0)
    objects = np.array([holder, None], dtype=object)
    return (lambda: objects[0].k), lambda k: setattr(holder, "k", k)


def _weak_value_dictionary():
    holder = _Settings()
    registry = weakref.WeakValueDictionary(settings=holder)
    _weak_value_dictionary.keep = holder
    return (lambda: registry["settings"].k), lambda k: setattr(holder, "k", k)


class _OneSlot:
    __slots__ = "scale"


def _slots_as_one_string():
    holder = _OneSlot()
    holder.scale = 1.0
    return (lambda: holder.scale), lambda k: setattr(holder, "scale", k)


class _PrivateSlot:
    __slots__ = ("__k",)

    def __init__(self):
        self.__k = 1.0

    def read(self):
        return self.__k

    def write(self, k):
        self.__k = k


def _private_slot():
    holder = _PrivateSlot()
    return holder.read, holder.write


class _AlwaysEqual(str):
    def __eq__(self, other):
        return True

    __hash__ = str.__hash__


def _string_subclass_with_eq():
    box = {"mode": _AlwaysEqual("1.0")}
    return (lambda: float(box["mode"])), lambda k: box.__setitem__("mode", _AlwaysEqual(str(k)))


STATE = {"function_attribute": _function_attribute, "partial_attribute": _partial_attribute,
         "dict_get": _dict_method, "dict_getitem": _dict_getitem,
         "mapping_proxy": _mapping_proxy, "dict_values": _dict_values,
         "weak_reference": _weak_reference, "metaclass_attribute": _metaclass_attribute,
         "jax_array_object": _jax_array_object,
         # (adversary, stop 34)
         "context_variable": _context_variable, "computed_global_key": _computed_global_key,
         "builtins_name": _builtins_name, "ndarray_subclass_attribute": _ndarray_subclass_attribute,
         "float_subclass_attribute": _float_subclass_attribute, "object_array": _object_array,
         "weak_value_dictionary": _weak_value_dictionary,
         "slots_as_one_string": _slots_as_one_string, "private_slot": _private_slot,
         "string_subclass_with_eq": _string_subclass_with_eq}
def _import_module_by_name(tmp_path):
    module = _module(tmp_path, "jaxpr_cc_test_settings_by_name", "dt = 1.0\n")

    def read():
        import importlib
        return importlib.import_module("jaxpr_cc_test_settings_by_name").dt
    return read, lambda k: setattr(module, "dt", k)


MODULES = {"imported_inside": _imported_inside, "module_getattr": _module_getattr,
           "import_module_by_name": _import_module_by_name}


def _check(f):
    x = jnp.float32(0.3)
    want_value, want_grad = float(f(x)), float(jax.grad(f)(x))
    np.testing.assert_allclose(want_value, 3 * np.sin(0.3) + sum(KS), rtol=1e-6)
    for ours in (jaxpr_cc.trace(f, x), jaxpr_cc.jit(f)):
        np.testing.assert_allclose(float(ours(x)), want_value, rtol=1e-6)
        np.testing.assert_allclose(float(jax.grad(ours)(x)), want_grad, rtol=1e-6)


@pytest.mark.parametrize("make", list(STATE.values()), ids=list(STATE))
def test_state_read_through_an_object_is_seen(make):
    _check(_three_calls(*make()))


@pytest.mark.parametrize("make", list(MODULES.values()), ids=list(MODULES))
def test_state_of_a_program_module_is_seen(make, tmp_path):
    _check(_three_calls(*make(tmp_path)))


@dataclasses.dataclass(frozen=True)
class Config:
    w: jax.Array
    z: object


jax.tree_util.register_dataclass(Config, data_fields=["w"], meta_fields=["z"])


def test_static_pytree_data_is_compared_by_type_and_bits():
    @jax.custom_jvp
    def angle(c, x):
        return x * c.w * jnp.arctan2(c.z, -1.0)   # pi at +0.0, -pi at -0.0

    angle.defjvp(lambda p, t: (angle(*p), t[1] * p[0].w * jnp.arctan2(p[0].z, -1.0)))

    @jax.custom_jvp
    def kind(c, x):
        return x * c.w * {bool: 100.0, int: 10.0}.get(type(c.z), 1.0)

    kind.defjvp(lambda p, t: (kind(*p), t[1]))

    def f(x, w):
        return (angle(Config(w, 0.0), x) - angle(Config(w, -0.0), x),
                kind(Config(w, 1.0), x) + kind(Config(w, 1), x) + kind(Config(w, True), x))

    x, w = jnp.float32(0.3), jnp.float32(1.0)
    want = [float(v) for v in jax.jit(f)(x, w)]
    np.testing.assert_allclose(want, [0.6 * np.pi, 33.3], rtol=1e-6)
    for ours in (jaxpr_cc.trace(f, x, w), jaxpr_cc.jit(f)):
        np.testing.assert_allclose([float(v) for v in ours(x, w)], want, rtol=1e-6)


def test_a_call_under_another_jax_configuration_is_traced_again():
    @jax.custom_jvp
    def g(x):
        return x + jnp.arange(3).dtype.itemsize   # 4 without x64, 8 with it

    g.defjvp(lambda p, t: (g(p[0]), t[0]))

    def f(x):
        a = g(x)
        with jax.enable_x64(True):
            b = g(x)
        return a, b

    x = jnp.float32(0.5)
    want = [float(v) for v in jax.jit(f)(x)]
    assert want == [4.5, 8.5]
    for ours in (jaxpr_cc.trace(f, x), jaxpr_cc.jit(f)):
        assert [float(v) for v in ours(x)] == want


def _called_twice(call, state, key):
    """``x -> call(x) + call(x)`` with ``state[key]`` 2.0 at the first call and
    5.0 at the second."""
    def program(x):
        state[key] = 2.0
        y = call(x)
        state[key] = 5.0
        return y + call(x)
    return program


def _all_agree_with_jax(program, x, want_grad=None):
    """Values and gradients of ``jaxpr_cc.trace`` and ``jaxpr_cc.jit`` of
    ``program`` equal JAX's (and JAX's gradient ``want_grad`` when given)."""
    want, grad = float(program(x)), float(jax.grad(program)(x))
    if want_grad is not None:
        np.testing.assert_allclose(grad, want_grad, rtol=1e-6)
    for ours in (jaxpr_cc.trace(program, x), jaxpr_cc.jit(program)):
        np.testing.assert_allclose(float(ours(x)), want, rtol=1e-6)
        np.testing.assert_allclose(float(jax.grad(ours)(x)), grad, rtol=1e-6)


def _named_call_reading(state):
    return jax.named_call(lambda a: a * state["t"], name="scaled")


def _custom_gradient_reading(state):
    @jax.custom_gradient
    def scaled(a):
        return a * state["t"], lambda g: g
    return scaled


def _eqx_filter_custom_jvp_reading(state):
    import equinox as eqx

    @eqx.filter_custom_jvp
    def scaled(a):
        return a * state["t"]

    @scaled.def_jvp
    def _scaled_jvp(primals, tangents):
        return scaled(*primals), tangents[0]
    return scaled


LIBRARY_CLOSURES = {"jax.named_call": _named_call_reading,
                    "jax.custom_gradient": _custom_gradient_reading,
                    "equinox.filter_custom_jvp": _eqx_filter_custom_jvp_reading}


@pytest.mark.parametrize("make", list(LIBRARY_CLOSURES.values()), ids=list(LIBRARY_CLOSURES))
def test_a_library_closure_over_the_programs_function_is_walked(make):
    """``jax.named_call`` wraps the program's function (``__wrapped__``), and
    ``jax.custom_gradient`` and equinox's ``filter_custom_jvp`` hand JAX a
    library closure whose cells hold it: what it reads (a global changed between
    two calls) is the rule's state (adversary, stops 33 and 34: the second call
    reused the first's rule).  Reference: JAX."""
    state = {"t": 1.0}
    scaled = make(state)

    @jax.custom_vjp
    def outer(a):
        return scaled(a) * a

    outer.defvjp(lambda a: (outer(a), a), lambda r, g: (g * r,))
    program = _called_twice(outer, state, "t")
    x = np.float32(1.5)
    np.testing.assert_allclose(float(program(x)), 1.5 * 2 * 1.5 + 1.5 * 5 * 1.5)
    _all_agree_with_jax(program, x)


def test_an_equinox_jvp_rule_reading_a_changed_global_is_traced_again():
    """equinox's ``filter_custom_jvp`` called twice, its jvp reading a global
    changed in between: JAX runs each call's jvp with the value at that call
    (grad 2 + 5; the reused rule gave 4)."""
    import equinox as eqx

    state = {"u": 1.0}

    @eqx.filter_custom_jvp
    def doubled(a):
        return a * 2.0

    @doubled.def_jvp
    def _doubled_jvp(primals, tangents):
        (a,), (ta,) = primals, tangents
        return doubled(a), ta * state["u"]

    _all_agree_with_jax(_called_twice(doubled, state, "u"), np.float32(1.5), want_grad=7.0)


def test_an_equinox_bwd_reading_a_global_rebound_after_the_call_sees_the_late_value():
    """equinox's ``filter_custom_vjp`` bwd is a library closure over the
    program's bwd; JAX traces it when it differentiates, after the global was
    rebound: g * a * 5 (the value at the call gave 6)."""
    import equinox as eqx

    state = {"u": 1.0}

    @eqx.filter_custom_vjp
    def product(vjp_arg, a):
        return vjp_arg * a

    @product.def_fwd
    def _product_fwd(perturbed, vjp_arg, a):
        return product(vjp_arg, a), None

    @product.def_bwd
    def _product_bwd(res, g, perturbed, vjp_arg, a):
        return g * a * state["u"]

    def program(x):
        state["u"] = 2.0
        y = product(x, 3.0)
        state["u"] = 5.0
        return y

    x = np.float32(1.5)
    want = jax.grad(program)(x)
    assert float(want) == 15.0
    assert float(jax.grad(jaxpr_cc.trace(program, x))(x)) == 15.0
    assert float(jax.grad(jaxpr_cc.jit(program))(x)) == 15.0


def test_a_custom_rule_wrapping_a_library_function_is_walked_for_its_rules():
    """``jax.custom_jvp(jnp.sin)`` wraps a library function but holds the
    program's jvp (reading a global): a rule whose jvp differentiates it is
    traced again when that global changes (adversary, stop 34: the wrapper was
    found once, as a library callable).  Reference: JAX's gradient."""
    state = {"k": 1.0}
    sine = jax.custom_jvp(jnp.sin)
    sine.defjvp(lambda p, t: (jnp.sin(p[0]), t[0] * jnp.cos(p[0]) * state["k"]))

    @jax.custom_jvp
    def doubled(x):
        return sine(x) * 2

    doubled.defjvp(lambda p, t: (doubled(p[0]), jax.jvp(sine, p, t)[1] * 2))
    _all_agree_with_jax(_called_twice(doubled, state, "k"), jnp.float32(0.3),
                        want_grad=14 * np.cos(0.3))
