"""jaxpr_cc.jit as a drop-in for jax.jit: every keyword of jax.jit and every AOT stage,
each compared with what jax.jit does on the same function (values, shardings,
donation, errors).  The tests' process has 8 host devices (tests/conftest.py)."""
import dataclasses
import functools
import inspect
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import jaxpr_cc
from jaxref import assert_trees_equal


def _mesh():
    return jax.make_mesh((4, 2), ("x", "y"), devices=jax.devices()[:8])


def _without_addresses(error) -> str:
    return re.sub(r" at 0x[0-9a-f]+", "", str(error))


def _same_error(make_ours, make_ref, kind=Exception):
    with pytest.raises(kind) as ours:
        make_ours()
    with pytest.raises(kind) as ref:
        make_ref()
    assert type(ours.value) is type(ref.value)
    assert _without_addresses(ours.value) == _without_addresses(ref.value)
    return ours.value


def _n_sin(jaxpr) -> int:
    return sum(e.primitive.name == "sin" for e in jaxpr.eqns)


def f_twice_sin(x, y):
    return jnp.sin(x) * jnp.sin(x) + y


# ----------------------------------------------------------------- signature
def test_signature_has_every_jax_jit_keyword():
    ours = inspect.signature(jaxpr_cc.jit).parameters
    theirs = inspect.signature(jax.jit).parameters
    for name, p in theirs.items():
        assert name in ours, name
        assert ours[name].kind == p.kind, name
    assert ours["pipeline"].kind is inspect.Parameter.KEYWORD_ONLY


# ------------------------------------------------------------------ keywords
def test_in_and_out_shardings():
    mesh = _mesh()
    rows, cols = NamedSharding(mesh, P("x", None)), NamedSharding(mesh, P(None, "y"))

    def f(a, b):
        return jnp.tanh(a) @ b, a.sum(axis=0)
    a = jnp.arange(32.0).reshape(8, 4) / 32
    b = jnp.ones((4, 6))
    kw = dict(in_shardings=(rows, None), out_shardings=(cols, NamedSharding(mesh, P())))
    out, ref = jaxpr_cc.jit(f, **kw)(a, b), jax.jit(f, **kw)(a, b)
    assert_trees_equal(out, ref)
    for o, r in zip(out, ref):
        assert o.sharding == r.sharding
    # A sharding prefix that does not fit the arguments: jax.jit's error.
    bad = dict(in_shardings=(rows, None, None))
    _same_error(lambda: jaxpr_cc.jit(f, **bad)(a, b), lambda: jax.jit(f, **bad)(a, b))


def test_static_argnames_and_argnums_errors_are_jax_jits():
    def f(x, n):
        return x * n
    for kw in ({"static_argnums": 2}, {"static_argnames": "m"}, {"static_argnums": "n"},
               {"donate_argnums": 0, "static_argnums": 0}):
        _same_error(lambda: jaxpr_cc.jit(f, **kw), lambda: jax.jit(f, **kw))
    _same_error(lambda: jaxpr_cc.jit(3), lambda: jax.jit(3), TypeError)

    def generator(x):
        yield x
    _same_error(lambda: jaxpr_cc.jit(generator), lambda: jax.jit(generator), TypeError)
    ours = jaxpr_cc.jit(f, static_argnames="n")
    assert_trees_equal(ours(jnp.ones(2), n=3), jax.jit(f, static_argnames="n")(jnp.ones(2), n=3))
    _same_error(lambda: ours(jnp.ones(2), n=[3]),
                lambda: jax.jit(f, static_argnames="n")(jnp.ones(2), n=[3]))


def test_static_values_of_equal_hash_but_other_type_are_other_programs():
    def f(x, n):
        return x * n
    ours = jaxpr_cc.jit(f, static_argnums=1)
    ref = jax.jit(f, static_argnums=1)
    x = jnp.arange(3, dtype=jnp.int32)
    for n in (1, 1.0, True):
        out, want = ours(x, n), ref(x, n)
        assert out.dtype == want.dtype
        assert_trees_equal(out, want)
    assert ours.cache_size() == 3


# Donating both inputs leaves one unusable (one output): jax.jit warns, and so do we.
@pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")
@pytest.mark.parametrize("kw", [{"donate_argnums": (0,)}, {"donate_argnames": "x"},
                                {"donate_argnames": ("x", "y")}])
def test_donation(kw):
    def f(x, y):
        return x * 2.0 + y
    ours, theirs = jaxpr_cc.jit(f, **kw), jax.jit(f, **kw)
    for _ in range(2):  # the first call, then a cached one
        xo, yo = jnp.arange(4.0), jnp.ones(4)
        xr, yr = jnp.arange(4.0), jnp.ones(4)
        assert_trees_equal(ours(xo, y=yo), theirs(xr, y=yr))
        assert (xo.is_deleted(), yo.is_deleted()) == (xr.is_deleted(), yr.is_deleted())


def test_keep_unused():
    def f(x, unused):
        return x + 1.0
    x, u = jnp.ones(3), jnp.ones(5)
    for keep in (False, True):
        ours = jaxpr_cc.jit(f, keep_unused=keep).lower(x, u).compile()
        ref = jax.jit(f, keep_unused=keep).lower(x, u).compile()
        assert ours.input_shardings == ref.input_shardings
        assert ours.as_text().count("parameter(") == ref.as_text().count("parameter(")
        assert_trees_equal(ours(x, u), ref(x, u))


def test_inline():
    def f(x):
        return jnp.sin(x) * 2.0
    x = jnp.ones(3)
    for inline in (False, True):
        ours, ref = jaxpr_cc.jit(f, inline=inline), jax.jit(f, inline=inline)
        outer = jax.make_jaxpr(lambda x: ours(x) + 1.0)(x)
        want = jax.make_jaxpr(lambda x: ref(x) + 1.0)(x)
        assert ([e.primitive.name for e in outer.eqns] ==
                [e.primitive.name for e in want.eqns])
        assert_trees_equal(jax.jit(lambda x: ours(x) + 1.0)(x), jax.jit(lambda x: ref(x) + 1.0)(x))


def test_backend_device_and_compiler_options():
    def f(x):
        return jnp.cos(x) + 1.0
    x = jnp.arange(4.0)
    for kw in ({"backend": "cpu"}, {"device": jax.devices()[2]}):
        with warnings.catch_warnings(record=True) as ours_warn:
            warnings.simplefilter("always")
            ours = jaxpr_cc.jit(f, **kw)
        with warnings.catch_warnings(record=True) as ref_warn:
            warnings.simplefilter("always")
            ref = jax.jit(f, **kw)
        assert [w.category for w in ours_warn] == [w.category for w in ref_warn]
        out, want = ours(x), ref(x)
        assert_trees_equal(out, want)
        assert out.sharding == want.sharding
    both = {"backend": "cpu", "device": jax.devices()[0]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        _same_error(lambda: jaxpr_cc.jit(f, **both), lambda: jax.jit(f, **both))
    opts = {"xla_embed_ir_in_executable": True}
    ours = jaxpr_cc.jit(f, compiler_options=opts)
    assert_trees_equal(ours(x), jax.jit(f, compiler_options=opts)(x))
    bad = {"no_such_xla_option": 1}
    _same_error(lambda: jaxpr_cc.jit(f, compiler_options=bad)(x),
                lambda: jax.jit(f, compiler_options=bad)(x))


# -------------------------------------------------------------------- stages
def test_trace_stage_holds_the_jaxpr_cc_program():
    x, y = jnp.ones(4), jnp.float32(0.5)
    traced = jaxpr_cc.jit(f_twice_sin).trace(x, y)
    ref = jax.jit(f_twice_sin).trace(x, y)
    # The default pipeline's cse merged the two sines: what JAX stages is our program.
    assert _n_sin(traced.jaxpr.jaxpr) == 1 and _n_sin(ref.jaxpr.jaxpr) == 2
    assert traced.out_info == ref.out_info
    assert_trees_equal(traced.lower().compile()(x, y), ref.lower().compile()(x, y))


def test_lower_compile_as_text_cost_analysis():
    x, y = jnp.ones((4, 4)), jnp.ones((4, 4))

    def f(a, b):
        return jnp.tanh(a @ b).sum()
    lowered, ref = jaxpr_cc.jit(f).lower(x, y), jax.jit(f).lower(x, y)
    text = lowered.as_text()
    assert text.startswith("module @jit_f") and "stablehlo.dot_general" in text
    assert lowered.as_text(dialect="hlo").startswith("HloModule jit_f")
    assert lowered.cost_analysis()["flops"] == ref.cost_analysis()["flops"]
    compiled, ref_compiled = lowered.compile(), ref.compile()
    assert compiled.cost_analysis()["flops"] == ref_compiled.cost_analysis()["flops"]
    assert "HloModule" in compiled.as_text()
    assert_trees_equal(compiled(x, y), ref_compiled(x, y))
    assert lowered.in_tree == ref.in_tree and lowered.out_info == ref.out_info
    # A compiled stage rejects other argument types as jax.jit's does.
    _same_error(lambda: compiled(jnp.ones((2, 2)), y), lambda: ref_compiled(jnp.ones((2, 2)), y),
                TypeError)


def test_eval_shape_stage_and_jax_eval_shape():
    def f(x, n):
        return {"y": jnp.repeat(x, n), "s": x.sum()}
    x = jax.ShapeDtypeStruct((3, 2), jnp.float32)
    ours = jaxpr_cc.jit(f, static_argnums=1)
    ref = jax.jit(f, static_argnums=1)
    assert ours.eval_shape(x, 2) == ref.eval_shape(x, 2)
    assert jax.eval_shape(ours, x, 2) == jax.eval_shape(ref, x, 2)
    assert jax.eval_shape(ours, x, 3)["y"].shape == (18,)


def test_stages_under_transformations():
    x = jnp.linspace(0.1, 1.0, 5)
    ours = jaxpr_cc.jit(lambda x: jnp.sum(jnp.sin(x) ** 2))
    ref = jax.jit(lambda x: jnp.sum(jnp.sin(x) ** 2))
    g_ours = jax.jit(jax.grad(ours)).lower(x).compile()
    g_ref = jax.jit(jax.grad(ref)).lower(x).compile()
    assert_trees_equal(g_ours(x), g_ref(x), exact=False, rtol=1e-6)
    assert_trees_equal(jax.vmap(jax.grad(ours))(x[:, None]), jax.vmap(jax.grad(ref))(x[:, None]),
                       exact=False, rtol=1e-6)


def test_disable_jit_runs_python_like_jax_jit():
    seen = []

    def f(x):
        seen.append(type(x))
        return x * 2.0
    x = jnp.ones(2)
    with jax.disable_jit():
        assert_trees_equal(jaxpr_cc.jit(f)(x), jax.jit(f)(x))
    assert seen[0] is seen[1] and not issubclass(seen[0], jax.core.Tracer)


def test_methods_bind_like_jax_jit():
    class Scale:
        def __init__(self, k):
            self.k = k

        def __hash__(self):
            return hash(self.k)

        def __eq__(self, other):
            return isinstance(other, Scale) and other.k == self.k

        @jaxpr_cc.jit
        def apply(self, x):
            return x * 2.0

        def apply_static(self, x):
            return x * self.k
        apply_static = jaxpr_cc.jit(apply_static, static_argnums=0)

    x = jnp.arange(3.0)
    s = Scale(3.0)
    assert_trees_equal(s.apply_static(x), x * 3.0)
    assert_trees_equal(Scale(4.0).apply_static(x), x * 4.0)
    assert isinstance(Scale.__dict__["apply"], type(jax.jit(lambda x: x)))
    assert np.array_equal(np.asarray(Scale.apply_static(s, x)), np.asarray(x * 3.0))


def test_programs_are_keyed_on_the_axis_environment():
    # A program traced under vmap with axis "i" of size 2 bakes that size in; under
    # size 3 it is another program (as jax.jit's caches tell them apart).
    def f():
        return jax.lax.axis_size("i")
    ours = jaxpr_cc.jit(f)
    for n in (2, 3):
        got = jax.vmap(ours, axis_name="i", axis_size=n, out_axes=None)()
        want = jax.vmap(jax.jit(f), axis_name="i", axis_size=n, out_axes=None)()
        assert int(got) == int(want) == n


def test_jit_of_the_same_function_twice_traces_once():
    # JAX registers some configuration on first use, which changes the trace
    # context once per process: warm up first.
    jaxpr_cc.jit(lambda a: a + 1.0)(1.0)
    traces = []

    def f(x):
        traces.append(1)
        return x * 2.0
    jaxpr_cc.jit(f)(2.0)
    jaxpr_cc.jit(f)(3.0)  # a new jit object: jax.jit's global cache, and ours
    assert len(traces) == 1
    jaxpr_cc.jit(f, static_argnums=())(3.0)
    jaxpr_cc.jit(f, pipeline=None)(3.0)  # other options: other programs
    assert len(traces) == 3


def test_dropping_the_function_frees_what_it_closed_over():
    import gc
    import weakref
    x = jnp.ones(10)
    f = (lambda x: lambda: x)(x)
    g = jaxpr_cc.jit(f)
    x = weakref.ref(x)
    assert_trees_equal(g(), jnp.ones(10))
    del f
    assert x() is not None and g() is not None
    del g
    gc.collect()  # jaxpr-cc's IR graphs hold back-references: freed by the collector
    assert x() is None


def test_names_repr_and_tokens_like_jax_jit():
    import functools

    def my_function(x):
        return x
    for fun in (my_function, functools.partial(my_function),
                functools.partial(functools.partial(my_function))):
        ours, ref = jaxpr_cc.jit(fun), jax.jit(fun)
        assert ours.__getstate__()["function_name"] == ref.__getstate__()["function_name"]
        assert repr(ours) == repr(ref)
        assert inspect.signature(ours) == inspect.signature(ref)

    class NoWeakref:
        __slots__ = []

        def __call__(self, x):
            return x + 1
    _same_error(lambda: jaxpr_cc.jit(NoWeakref())(3), lambda: jax.jit(NoWeakref())(3),
                TypeError)
    token = jax.lax.create_token()
    arr, out_token = jaxpr_cc.jit(lambda a, t: (a * 2.0, t))(jnp.ones(3), token)
    assert type(out_token) is type(token) and out_token is not token
    assert_trees_equal(arr, jnp.full(3, 2.0))


def test_equal_but_distinct_callables_trace_themselves():
    class Scaled:
        def __init__(self, k):
            self.k = k

        def __eq__(self, other):
            return isinstance(other, Scaled)  # all equal, as some module libraries do

        def __hash__(self):
            return 0

        def __call__(self, x):
            return x * self.k
    two, three = Scaled(2.0), Scaled(3.0)
    assert float(jaxpr_cc.jit(two)(1.0)) == 2.0
    f3 = jaxpr_cc.jit(three)
    del two
    assert float(f3(jnp.float32(1.0))) == float(three(jnp.float32(1.0))) == 3.0


def test_wrapped_attributes_like_jax_jit():
    def f(x: int) -> int:
        """docstring of f."""
        return x + 1
    f.some_value = 4
    ours, ref = jaxpr_cc.jit(f), jax.jit(f)
    for attr in ("__doc__", "__name__", "__module__", "__qualname__", "__annotations__",
                 "some_value"):
        assert getattr(ours, attr) == getattr(ref, attr), attr


def test_first_function_is_traced_once():
    # In a fresh process: the first trace must not change JAX's trace context
    # between the first call and the second (the cache key would change).
    import subprocess
    import sys
    code = ("import jax.numpy as jnp, jaxpr_cc\n"
            "n = [0]\n"
            "def f(x):\n    n[0] += 1\n    return x * 2\n"
            "g = jaxpr_cc.jit(f)\n"
            "x = jnp.arange(3.)\n"
            "g(x); g(x + 1)\n"
            "print(n[0], g.cache_size())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.split() == ["1", "1"], out.stderr


def test_disable_jit_runs_a_call_without_dynamic_arguments_eagerly():
    def f(n):
        y = jnp.arange(3.0) * n
        return y if float(y.sum()) > 1 else -y  # needs concrete values

    with jax.disable_jit():
        np.testing.assert_array_equal(jaxpr_cc.jit(f, static_argnums=0)(2),
                                      jax.jit(f, static_argnums=0)(2))


def test_unhashable_callable_fails_as_in_jax():
    @dataclasses.dataclass
    class Scale:  # eq=True makes it unhashable
        k: float

        def __call__(self, x):
            return x * self.k

    with pytest.raises(TypeError, match="unhashable type: 'Scale'"):
        jax.jit(Scale(2.0))(jnp.ones(3))
    with pytest.raises(TypeError, match="unhashable type: 'Scale'"):
        jaxpr_cc.jit(Scale(2.0))(jnp.ones(3))


def test_errors_name_the_function_under_a_partial():
    def my_user_fn(x, s):
        return x if x > 0 else s

    p = functools.partial(my_user_fn, s=2.0)
    with pytest.raises(jax.errors.TracerBoolConversionError, match="tracing the function my_user_fn"):
        jaxpr_cc.jit(p)(1.0)
    with pytest.raises(jax.errors.TracerBoolConversionError, match="tracing the function my_user_fn"):
        jaxpr_cc.trace(p, 1.0)


def test_docstring_and_deprecation_warnings_as_in_jax():
    def f(x):
        return x

    assert jaxpr_cc.jit(f).__doc__ == jax.jit(f).__doc__
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jaxpr_cc.jit(f, device=jax.devices()[0])
    assert [w.filename for w in caught if w.category is DeprecationWarning] == [__file__]


def test_program_and_executable_of_a_dropped_jit_object():
    x = jnp.ones(3)
    program = jaxpr_cc.jit(lambda a: a * 2).program(x)
    np.testing.assert_array_equal(program(x), x * 2)
    executable = jaxpr_cc.jit(lambda a: a * 3).executable
    np.testing.assert_array_equal(executable(x)(x), x * 3)


@pytest.mark.parametrize("statics", [dict(static_argnames="mode"), dict(static_argnums=2)])
def test_a_trace_error_with_static_arguments_names_the_users_function(statics):
    # The function JAX traces binds the statics; JAX locates errors by unwrapping
    # it to the user's function (adv18k: it named jaxpr-cc's jit_function.py).
    def f(x, n, mode="a"):
        for _ in range(n):
            x = x * 2
        return x
    _same_error(lambda: jaxpr_cc.jit(f, **statics)(jnp.ones(3), 2, "b"),
                lambda: jax.jit(f, **statics)(jnp.ones(3), 2, "b"),
                jax.errors.TracerIntegerConversionError)


def test_executable_refuses_keyword_arguments_with_in_shardings_as_jit_does():
    mesh = _mesh()
    sharding = NamedSharding(mesh, P("x"))

    def f(a, b):
        return a + b
    x = jnp.ones(8)
    _same_error(lambda: jaxpr_cc.jit(f, in_shardings=sharding).executable(x, b=x),
                lambda: jax.jit(f, in_shardings=sharding)(x, b=x), ValueError)
