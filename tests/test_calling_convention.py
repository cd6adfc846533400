"""A program checks every call against the signature it was traced with.

Each leaf's shape, dtype and weak type must be the traced one; otherwise a
``TypeError`` names the argument path, the given and the traced type and what to
do.  This holds for the program called directly, under ``jax.jit``, ``jax.vmap``
(per-example shape) and ``jax.grad``, for loaded programs and for compiled
executables.  Accepted calls are compared with ``jax.jit`` of the original
function; the weak-type rule is checked against ``jax.jit``'s own cache: a call is
accepted exactly when ``jax.jit`` of the original function reuses its trace.
"""
from __future__ import annotations

import collections
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_cc


def mean(x):
    return jnp.mean(x)


def double(x):
    return x * 2


def weighted(d, *, scale):
    return jnp.sum(d["w"] * d["x"]) * scale


@pytest.fixture(scope="module")
def mean_program():
    return jaxpr_cc.trace(mean, jnp.zeros(3, jnp.float32))


@pytest.fixture(scope="module")
def saved_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("calling_convention")


def _loaded(program, saved_dir):
    path = saved_dir / f"{program.name}_{id(program)}.jcc"
    jaxpr_cc.save(program, path)
    return jaxpr_cc.load(path)


_BUILDERS = {
    "direct": lambda p, d: p,
    "jit": lambda p, d: jax.jit(p),
    "grad": lambda p, d: jax.grad(p),
    "loaded": _loaded,
    "loaded_jit": lambda p, d: jax.jit(_loaded(p, d)),
    "compiled": lambda p, d: jaxpr_cc.compile(p),
    "compiled_loaded": lambda p, d: jaxpr_cc.compile(_loaded(p, d)),
}


def _call_mode(program, saved_dir, mode):
    """``program`` called in one of the ways of MODES."""
    return _BUILDERS[mode](program, saved_dir)


MODES = ["direct", "jit", "grad", "loaded", "loaded_jit", "compiled", "compiled_loaded"]


# ------------------------------------------------------------------ shapes
@pytest.mark.parametrize("mode", MODES)
def test_shape_mismatch_raises_naming_the_argument(mean_program, saved_dir, mode):
    call = _call_mode(mean_program, saved_dir, mode)
    with pytest.raises(TypeError, match=r"mean: args\[0\] is float32\[4\], but the "
                                        r"(program was traced with|executable was compiled "
                                        r"for) float32\[3\]; pass an array of shape \(3,\)"):
        call(jnp.arange(4.0, dtype=jnp.float32))


@pytest.mark.parametrize("mode", MODES)
def test_matching_call_equals_jax(mean_program, saved_dir, mode):
    call = _call_mode(mean_program, saved_dir, mode)
    x = jnp.array([1.0, 2.0, 4.0], jnp.float32)
    ref = (jax.grad(mean) if mode == "grad" else jax.jit(mean))(x)
    # (eager evaluation divides where XLA multiplies by the reciprocal: 1 ulp)
    np.testing.assert_allclose(np.asarray(call(x)), np.asarray(ref), rtol=1e-6)


@pytest.mark.parametrize("mode", ["direct", "jit", "loaded"])
def test_vmap_checks_the_per_example_shape(mean_program, saved_dir, mode):
    call = jax.vmap(_call_mode(mean_program, saved_dir, mode))
    xs = jnp.arange(15.0, dtype=jnp.float32).reshape(5, 3)
    np.testing.assert_allclose(np.asarray(call(xs)), np.asarray(jax.vmap(jax.jit(mean))(xs)),
                               rtol=1e-6)
    with pytest.raises(TypeError, match=r"args\[0\] is float32\[4\]( per example \(under "
                                        r"jax.vmap the mapped axis is not counted\))?, but the "
                                        r"program was traced with float32\[3\]"):
        call(jnp.ones((5, 4), jnp.float32))
    with pytest.raises(TypeError, match=r"args\[0\] is float32\[\]( per example \(under "
                                        r"jax.vmap the mapped axis is not counted\))?, but the "
                                        r"program was traced with float32\[3\]"):
        call(jnp.ones((3,), jnp.float32))


def test_vmap_message_says_per_example(mean_program):
    with pytest.raises(TypeError, match=r"is float32\[4\] per example \(under jax.vmap"):
        jax.vmap(mean_program)(jnp.ones((5, 4), jnp.float32))


def test_the_reported_bug_mean_of_four_is_not_two(mean_program):
    # Before the check, the f32[3] program read the first three of four elements.
    x = jnp.array([0.0, 1.0, 2.0, 3.0], jnp.float32)
    assert float(jax.jit(mean)(x)) == 1.5
    with pytest.raises(TypeError):
        mean_program(x)


# ------------------------------------------------------------------ dtypes
@pytest.mark.parametrize("mode", MODES)
def test_float_where_int_was_traced_raises(saved_dir, mode):
    program = jaxpr_cc.trace(double, jnp.int32(3))
    call = _call_mode(program, saved_dir, mode)
    if mode == "grad":  # grad of an int program is refused by JAX itself
        call = jax.jit(program)
    with pytest.raises(TypeError, match=r"double: args\[0\] is float32\[\], but the "
                                        r"(program was traced with|executable was compiled for) "
                                        r"int32\[\]; pass a value of dtype int32"):
        call(jnp.float32(3.0))


@pytest.mark.parametrize("mode", ["direct", "jit", "loaded", "compiled"])
def test_python_float_where_python_int_was_traced_raises(saved_dir, mode):
    program = jaxpr_cc.trace(double, 3)
    call = _call_mode(program, saved_dir, mode)
    with pytest.raises(TypeError, match=r"args\[0\] is weakly typed float32\[\] \(like a "
                                        r"Python scalar\), but the .* weakly typed int32\[\]"):
        call(3.0)
    assert int(call(4)) == int(jax.jit(double)(4)) == 8


def test_int_array_where_float_array_was_traced_raises(mean_program):
    with pytest.raises(TypeError, match=r"args\[0\] is int32\[3\], .* float32\[3\]"):
        mean_program(jnp.arange(3, dtype=jnp.int32))


def test_canonicalized_numpy_dtype_is_accepted_as_jax_jit_accepts_it(mean_program):
    # Without x64, JAX reads a float64 NumPy array as float32 (and jax.jit does not
    # retrace for it): the same value reaches the program.
    if jax.config.jax_enable_x64:
        pytest.skip("float64 stays float64 with x64 enabled")
    x = np.array([1.0, 2.0, 4.5])
    np.testing.assert_allclose(np.asarray(mean_program(x)), np.asarray(jax.jit(mean)(x)),
                               rtol=1e-6)


# --------------------------------------------------------------- weak types
WEAK_CASES = [
    # (traced with, called with)
    ("python float / python float", 2.0, 3.5),
    ("python float / f32 array", 2.0, jnp.float32(3.5)),
    ("f32 array / python float", jnp.float32(2.0), 3.5),
    ("f32 array / numpy f32", jnp.float32(2.0), np.float32(3.5)),
    ("python int / python int", 3, 4),
    ("python int / i32 array", 3, jnp.int32(4)),
    ("weak jnp scalar / python float", jnp.asarray(2.0), 3.5),
    ("python float / weak jnp scalar", 2.0, jnp.asarray(3.5)),
    ("python bool / numpy bool", True, np.bool_(False)),
]


def _jax_jit_reuses_trace(fun, traced_with, called_with) -> bool:
    """Whether ``jax.jit(fun)`` traces ``fun`` again for ``called_with`` after
    ``traced_with`` (counted by the Python side effect of tracing)."""
    traces = []

    def counted(x):
        traces.append(None)
        return fun(x)
    jitted = jax.jit(counted)
    jitted(traced_with)
    jitted(called_with)
    return len(traces) == 1


@pytest.mark.parametrize("label,traced_with,called_with", WEAK_CASES,
                         ids=[c[0] for c in WEAK_CASES])
@pytest.mark.parametrize("mode", ["direct", "jit", "loaded", "compiled"])
def test_weak_type_rule_is_jax_jit_cache_rule(saved_dir, label, traced_with, called_with, mode):
    program = jaxpr_cc.trace(double, traced_with)
    call = _call_mode(program, saved_dir, mode)
    if mode == "compiled":
        # A compiled executable follows jax.jit's compiled call instead: shapes and
        # dtypes must match, the weak type was fixed when compiling.
        want = jax.jit(double).lower(traced_with).compile()
        out, ref = call(called_with), want(called_with)
        np.testing.assert_array_equal(np.asarray(out), np.asarray(ref))
        assert jax.typeof(out) == jax.typeof(ref)
    elif _jax_jit_reuses_trace(double, traced_with, called_with):
        out = call(called_with)
        ref = jax.jit(double)(called_with)
        np.testing.assert_array_equal(np.asarray(out), np.asarray(ref))
        assert jnp.asarray(out).dtype == ref.dtype
    else:
        with pytest.raises(TypeError, match=r"weakly typed|JAX promotes weakly typed values"):
            call(called_with)


def test_weak_type_changes_what_jax_computes():
    # Why a strongly typed f32[] is refused where a Python float was traced: JAX's
    # promotion reads the weak type, so the retrace computes something else.
    def add_bf16(x):
        return x + jnp.ones(3, jnp.bfloat16)

    program = jaxpr_cc.trace(add_bf16, 2.0)
    assert program(2.5).dtype == jax.jit(add_bf16)(2.5).dtype == jnp.bfloat16
    assert jax.jit(add_bf16)(jnp.float32(2.5)).dtype == jnp.float32
    with pytest.raises(TypeError, match=r"args\[0\] is float32\[\], but the program was traced "
                                        r"with weakly typed float32\[\] \(like a Python scalar\); "
                                        r"pass a Python scalar"):
        program(jnp.float32(2.5))


def test_grad_keeps_the_weak_type_of_a_python_float():
    program = jaxpr_cc.trace(lambda x: x * x * 3.0, 2.0)
    assert float(jax.grad(program)(1.5)) == float(jax.grad(lambda x: x * x * 3.0)(1.5))
    with pytest.raises(TypeError, match="weakly typed"):
        jax.grad(program)(jnp.float32(1.5))


def test_compiled_executable_checks_shapes_and_dtypes_not_weak_types():
    # As jax.jit(f).lower(2.0).compile(): the weak type was fixed when compiling.
    program = jaxpr_cc.trace(double, 2.0)
    exe = jaxpr_cc.compile(program)
    want = jax.jit(double).lower(2.0).compile()
    for x in (4.0, jnp.float32(4.0), np.float32(4.0)):
        got = exe(x)
        assert float(got) == float(want(x)) == 8.0
        assert jax.typeof(got) == jax.typeof(want(x))
    with pytest.raises(TypeError, match=r"double: args\[0\] is int32\[\], but the executable "
                                        r"was compiled for weakly typed float32\[\]"):
        exe(jnp.int32(4))


# --------------------------------------------------------- paths, structure
def test_nested_paths_are_named(saved_dir):
    d = {"w": jnp.ones(3), "x": jnp.arange(3.0)}
    program = jaxpr_cc.trace(weighted, d, scale=2.0)
    ref = jax.jit(weighted)(d, scale=2.0)
    np.testing.assert_array_equal(np.asarray(program(d, scale=2.0)), np.asarray(ref))
    for call in (program, jax.jit(program), jaxpr_cc.compile(program)):
        with pytest.raises(TypeError, match=r"args\[0\]\['x'\] is float32\[4\]"):
            call({"w": jnp.ones(3), "x": jnp.ones(4)}, scale=2.0)
        with pytest.raises(TypeError, match=r"kwargs\['scale'\] is weakly typed int32\[\]"):
            call(d, scale=2)


@pytest.mark.parametrize("args,kwargs,message", [
    (({"w": jnp.ones(3)},), {"scale": 2.0}, r"args\[0\] lacks keys \['x'\]"),
    (({"w": jnp.ones(3), "x": jnp.ones(3), "y": jnp.ones(3)},), {"scale": 2.0},
     r"args\[0\] has unexpected keys \['y'\]"),
    (([jnp.ones(3), jnp.ones(3)],), {"scale": 2.0},
     r"args\[0\] is a list where the program takes a dict"),
    (({"w": jnp.ones(3), "x": jnp.ones(3)},), {}, r"kwargs lacks keys \['scale'\]"),
    (({"w": jnp.ones(3), "x": (jnp.ones(3),)},), {"scale": 2.0},
     r"args\[0\]\['x'\] is a tuple where the program takes an array"),
])
def test_structure_mismatch_names_the_place(args, kwargs, message):
    program = jaxpr_cc.trace(weighted, {"w": jnp.ones(3), "x": jnp.ones(3)}, scale=2.0)
    with pytest.raises(TypeError, match=message):
        program(*args, **kwargs)
    with pytest.raises(TypeError, match=message):
        jax.jit(program)(*args, **kwargs)


def test_non_array_leaf_is_refused(mean_program):
    with pytest.raises(TypeError, match=r"args\[0\] is a value of type str, not an array; the "
                                        r"program was traced with float32\[3\] there"):
        mean_program("abc")


def test_error_is_one_line(mean_program):
    with pytest.raises(TypeError) as info:
        mean_program(jnp.ones(5))
    assert "\n" not in str(info.value)
    assert re.search(r"trace the function again", str(info.value))


def test_command_line_exec_gives_python_scalar_inputs_as_traced(tmp_path):
    # An .npz holds arrays only; an input traced as a Python scalar is fed as one.
    from jaxpr_cc.cli.main import main

    def scale(x, s):
        return x * s + jnp.ones(2, jnp.bfloat16)

    program = jaxpr_cc.trace(scale, jnp.float32(1.0), 2.0)
    jaxpr_cc.save(program, tmp_path / "p.jcc")
    np.savez(tmp_path / "in.npz", arg0=np.float32(3.0), arg1=np.float32(0.5))
    assert main(["exec", str(tmp_path / "p.jcc"), "--inputs", str(tmp_path / "in.npz"),
                 "-o", str(tmp_path / "out.npz")]) == 0
    out = np.load(tmp_path / "out.npz")["out0"]
    ref = jax.jit(scale)(jnp.float32(3.0), 0.5)
    assert out.dtype == ref.dtype
    np.testing.assert_array_equal(out, np.asarray(ref))


def test_namedtuple_of_another_class_with_the_same_name(tmp_path):
    import collections
    traced_class = collections.namedtuple("P", "a b")
    other_class = collections.namedtuple("P", "a b")
    fun = lambda p: p.a + p.b  # noqa: E731
    x = jnp.ones(3)
    traces = []
    jitted = jax.jit(lambda p: traces.append(1) or fun(p))
    jitted(traced_class(x, x))
    jitted(other_class(x, x))
    assert len(traces) == 2  # jax.jit traces again for the other class
    program = jaxpr_cc.trace(fun, traced_class(x, x))
    for target in (program, jaxpr_cc.compile(program)):
        with pytest.raises(TypeError, match=r"args\[0\] is a .*P of another class than the one "
                                            r"the program was traced with"):
            target(other_class(x, x))
        np.testing.assert_array_equal(np.asarray(target(traced_class(x, x))),
                                      np.asarray(jax.jit(fun)(traced_class(x, x))))
    # a loaded program holds a class rebuilt from the name: it compares by name
    jaxpr_cc.save(program, tmp_path / "nt.jcc")
    loaded = jaxpr_cc.load(tmp_path / "nt.jcc")
    np.testing.assert_array_equal(np.asarray(loaded(other_class(x, x))),
                                  np.asarray(jax.jit(fun)(other_class(x, x))))


def test_compiling_an_x64_program_without_x64_says_so():
    with jax.enable_x64(True):
        program = jaxpr_cc.trace(lambda x: jnp.sum(x.astype(jnp.float64)).astype(jnp.float32),
                                 np.ones(3, np.float32))
        np.testing.assert_array_equal(np.asarray(jaxpr_cc.compile(program)(np.ones(3, np.float32))),
                                      np.float32(3.0))
    with pytest.raises(TypeError, match=r"^jaxpr_cc.compile: .* uses float64 \(it was traced "
                                        r"with jax_enable_x64\), but this process runs with "
                                        r"jax_enable_x64 disabled; set JAX_ENABLE_X64=1[^\n]*$"):
        jaxpr_cc.compile(program)


def _refused_by_jax_jit(fun, *args) -> bool:
    try:
        jax.jit(fun)(*args)
    except TypeError:
        return True
    return False


@pytest.mark.parametrize("mode", ["program", "compiled"])
def test_values_jax_jit_refuses_get_one_line_messages(mode):
    fun = lambda x, y: x * 2 + y  # noqa: E731
    x = jnp.ones(3)
    program = jaxpr_cc.trace(fun, x, x)
    target = program if mode == "program" else jaxpr_cc.compile(program)
    big_endian = np.ones(3, ">f4")
    spec = jax.ShapeDtypeStruct((3,), jnp.float32)
    assert _refused_by_jax_jit(fun, big_endian, x) and _refused_by_jax_jit(fun, spec, x)
    with pytest.raises(TypeError, match=r"^_lambda_: args\[0\] is a NumPy array of non-native "
                                        r"byte order >f4, .* pass x\.astype\('float32'\)$"):
        target(big_endian, x)
    with pytest.raises(TypeError, match=r"^_lambda_: args\[0\] is a jax\.ShapeDtypeStruct \(a "
                                        r"type, not a value[^\n]*$"):
        target(spec, x)
    # types only: jax.eval_shape, as for jax.jit
    assert jax.eval_shape(program, spec, x) == jax.eval_shape(jax.jit(fun), spec, x)


def test_key_and_float0_messages_name_the_dtype():
    draw = lambda k: jax.random.normal(k, (2,))  # noqa: E731
    typed = jaxpr_cc.trace(draw, jax.random.key(0))
    raw = jaxpr_cc.trace(draw, jax.random.PRNGKey(0))
    with pytest.raises(TypeError, match=r"args\[0\] is uint32\[2\], but the program was traced "
                                        r"with key<fry>\[\]; the dtype is the problem: .*"
                                        r"jax\.random\.wrap_key_data"):
        typed(jax.random.PRNGKey(1))
    with pytest.raises(TypeError, match=r"the dtype is the problem: .*jax\.random\.key_data"):
        raw(jax.random.key(1))
    np.testing.assert_array_equal(np.asarray(typed(jax.random.key(1))),
                                  np.asarray(jax.jit(draw)(jax.random.key(1))))
    ident = jaxpr_cc.trace(lambda t: t, np.zeros(3, jax.dtypes.float0))
    with pytest.raises(TypeError, match=r"args\[0\] is bool\[3\], but the program was traced "
                                        r"with float0\[3\]; pass a value of dtype float0 "):
        ident(np.zeros(3, bool))


LivePoint = collections.namedtuple("LivePoint", "a b")


def test_loaded_program_compares_namedtuples_by_name_even_when_the_class_is_live(tmp_path):
    x = jnp.ones(3)
    fun = lambda p: p.a - p.b  # noqa: E731
    jaxpr_cc.save(jaxpr_cc.trace(fun, LivePoint(x, 2 * x)), tmp_path / "p.jcc")
    loaded = jaxpr_cc.load(tmp_path / "p.jcc")
    assert loaded.in_tree.children()[0].children()[0].node_data()[0] is LivePoint
    same_name = collections.namedtuple("LivePoint", "a b", module=__name__)
    for target in (loaded, jaxpr_cc.compile(loaded)):
        np.testing.assert_array_equal(np.asarray(target(same_name(x, 2 * x))),
                                      np.asarray(jax.jit(fun)(same_name(x, 2 * x))))


def test_a_python_int_out_of_range_is_named_so():
    # It said the int was "a int, not an array", though a Python int is taken there
    # (adversary, stop 38); jax.jit raises OverflowError.
    def f(x, n):
        return x * n

    x = jnp.ones(3)
    with pytest.raises(OverflowError):
        jax.jit(f)(x, 2 ** 40)
    p = jaxpr_cc.trace(f, x, 3)
    np.testing.assert_allclose(p(x, 5), f(x, 5))
    with pytest.raises(TypeError, match=r"args\[1\] is the Python int 1099511627776, which "
                                        r"overflows the integer type JAX gives it"):
        p(x, 2 ** 40)
