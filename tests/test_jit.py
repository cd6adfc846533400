"""jaxpr_cc.jit as a drop-in for jax.jit, checked against jax.jit of the originals:
values on the whole corpus, grad/jvp/vmap through it, static and donated arguments,
caching, and the fixed point that plain JAX cannot differentiate."""
import contextlib
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_cc
from jaxpr_cc.golden.corpus import load_corpus
from jaxpr_cc.examples import fixed_point
from jaxpr_cc.jit_function import DEFAULT_PIPELINE, default_pipeline
from jaxref import assert_trees_equal, reference_results

CORPUS = load_corpus()
BY_NAME = {p.name: p for p in CORPUS}
BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"

# Transformations through jaxpr_cc.jit on these by default (the rest: -m heavy):
# scan, custom_jvp / custom_vjp (pytree residuals) / linear_call rules, namedtuples.
TRANSFORMED = ["15_rnn_scan", "19_custom_jvp_softplus", "25_custom_vjp_pytree_residuals",
               "30_linear_call_cumsum", "41_namedtuple_state"]


def _ours(prog):
    # Corpus keyword arguments are static configuration (axis, flags): static_argnames.
    return jaxpr_cc.jit(prog.fun, static_argnames=tuple(prog.kwargs))


@contextlib.contextmanager
def count_compiles():
    events = []

    def listener(event, duration, **kwargs):
        if event == BACKEND_COMPILE:
            events.append(duration)
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield events
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


# ------------------------------------------------------------------ corpus
@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_value_matches_jax_jit(name):
    prog = BY_NAME[name]
    ref = jax.jit(functools.partial(prog.fun, **prog.kwargs))(*prog.args)
    ours = _ours(prog)
    out = ours(*prog.args, **prog.kwargs)
    if ours.program(*prog.args, **prog.kwargs).params:
        # hoist-consts turned constants into parameters: XLA can no longer fold them
        # into the arithmetic, which may move results by an ulp.
        assert_trees_equal(out, ref, exact=False, rtol=2e-6, atol=1e-7)
    else:
        assert_trees_equal(out, ref, exact=True)
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(ref)):
        assert a.sharding == b.sharding


def _check_transforms(prog):
    ref = reference_results(prog)
    ours = reference_results(prog, fn=_ours(prog))
    assert set(ours) == set(ref)
    for key in ref:
        # The program runs as one jit call inside the transformed function, with
        # hoisted constants as arguments: XLA may fuse and fold differently (an ulp).
        assert_trees_equal(ours[key], ref[key], exact=False, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("name", TRANSFORMED)
def test_grad_jvp_vmap_match_jax(name):
    _check_transforms(BY_NAME[name])


@pytest.mark.heavy
@pytest.mark.parametrize("name", sorted(n for n in BY_NAME if n not in TRANSFORMED))
def test_grad_jvp_vmap_match_jax_whole_corpus(name):
    _check_transforms(BY_NAME[name])


# --------------------------------------------------- the tutorial's fixed point
def test_fixed_point_with_closed_over_parameter_differentiates():
    b = jnp.float32(0.7)
    with pytest.raises(Exception, match="closed-over value"):
        jax.grad(jax.jit(fixed_point.solve_closed_over))(b)
    ours = jaxpr_cc.jit(fixed_point.solve_closed_over)
    np.testing.assert_allclose(ours(b), fixed_point.solve_closed_over(b), rtol=1e-6)
    # The reference is the implicit-function-theorem derivative written out by hand;
    # both sides solve to the solver's 1e-6 tolerance.
    np.testing.assert_allclose(jax.grad(ours)(b),
                               fixed_point.solve_closed_over_reference_grad(b), rtol=1e-3)


# ------------------------------------------------------------------ caching
def _warm_up():
    # JAX registers some configuration lazily on first use, which changes jax.jit's
    # dispatch cache key once per process: compile counts are taken after that.
    jaxpr_cc.jit(lambda a: a + 1.0)(jnp.ones(2))


def test_cached_per_signature_without_recompiling():
    _warm_up()
    scale = 2.7183

    def f(x, y):
        return jnp.sin(x) * scale + y
    ours = jaxpr_cc.jit(f)
    x, y = jnp.arange(4.0), jnp.ones(4)
    x2 = x + 1.0
    with count_compiles() as first:
        out = ours(x, y)
    with count_compiles() as again:
        out2 = ours(x2, y)
    assert len(first) == 1 and again == []
    assert ours.cache_size() == 1
    assert_trees_equal(out, jax.jit(f)(x, y))
    assert_trees_equal(out2, jax.jit(f)(x2, y))
    # A new shape and a weakly typed Python scalar are new programs; a committed array
    # on another device is the same program, compiled again for its device.
    ours(jnp.arange(5.0), jnp.ones(5))
    ours(x, 1.0)
    with count_compiles() as moved:
        ours(jax.device_put(x, jax.devices()[1]), y)
    assert len(moved) == 1
    assert ours.cache_size() == 3
    assert_trees_equal(ours(x, 1.0), jax.jit(f)(x, 1.0))
    ours.clear_cache()
    assert ours.cache_size() == 0


def test_cached_calls_do_not_trace_or_compile_again():
    _warm_up()
    traces = []
    table = np.linspace(-1.0, 1.0, 2048, dtype=np.float32)  # hoisted into a parameter

    def f(x, y):
        traces.append(1)  # runs only while a program is traced
        return jnp.tanh(x * table) + y
    ours = jaxpr_cc.jit(f)
    x, y = jnp.ones(2048), jnp.float32(0.5)
    with count_compiles() as first:
        out = ours(x, y)
    assert len(traces) == 1 and len(first) == 1 and len(ours.program(x, y).params) == 1
    xs = [x + i for i in range(3)]
    with count_compiles() as again:
        outs = [ours(xi, y) for xi in xs]
    assert len(traces) == 1 and again == []
    assert_trees_equal(out, jax.jit(f)(x, y))
    assert_trees_equal(outs[2], jax.jit(f)(x + 2, y))


def test_committed_arguments_keep_their_device():
    def f(x):
        return x * 2.0
    x = jax.device_put(jnp.arange(3.0), jax.devices()[3])
    out, ref = jaxpr_cc.jit(f)(x), jax.jit(f)(x)
    assert out.sharding == ref.sharding
    assert_trees_equal(out, ref)


def test_executable_and_program_are_inspectable():
    def f(x):
        return jnp.tanh(x) @ x.T
    ours = jaxpr_cc.jit(f)
    x = jnp.ones((3, 2))
    program = ours.program(x)
    assert isinstance(program, jaxpr_cc.Program)
    exe = ours.executable(x)
    assert isinstance(exe, jaxpr_cc.Executable)
    assert_trees_equal(exe(x), jax.jit(f)(x))
    assert ours.executable(x) is exe  # cached, and the one __call__ uses


# ------------------------------------------------------------ static arguments
def test_static_argnums_and_names():
    def power_sum(x, n, *, mode):
        out = jnp.zeros_like(x)
        for k in range(n):
            out = out + x ** k
        return out if mode == "sum" else -out

    ours = jaxpr_cc.jit(power_sum, static_argnums=1, static_argnames="mode")
    ref = jax.jit(power_sum, static_argnums=1, static_argnames="mode")
    x = jnp.linspace(0.0, 1.0, 5)
    for n, mode in [(3, "sum"), (4, "sum"), (3, "neg")]:
        assert_trees_equal(ours(x, n, mode=mode), ref(x, n, mode=mode))
    # Given only one of static_argnums/static_argnames, the other is inferred.
    def power(x, n):
        return power_sum(x, n, mode="sum")
    for kw in ({"static_argnums": 1}, {"static_argnames": "n"}):
        ours_kw, ref_kw = jaxpr_cc.jit(power, **kw), jax.jit(power, **kw)
        assert_trees_equal(ours_kw(x, n=4), ref_kw(x, n=4))
        assert_trees_equal(ours_kw(x, 2), ref_kw(x, 2))
    # Unhashable static values: jax.jit's own error (the same dispatcher raises it),
    # and ours where jax.jit has no counterpart.
    with pytest.raises(ValueError, match="Non-hashable static arguments") as ours_err:
        ours(x, [3], mode="sum")
    with pytest.raises(ValueError) as ref_err:
        ref(x, [3], mode="sum")
    assert str(ours_err.value) == str(ref_err.value)
    with pytest.raises(TypeError, match=r"static argument 1 has unhashable type list"):
        ours.program(x, [3], mode="sum")
    # Bad static specifications: jax.jit's own errors, when jit is called.
    for kw in ({"static_argnames": "nope"}, {"static_argnums": 3}):
        with pytest.raises(ValueError) as ours_err:
            jaxpr_cc.jit(power, **kw)
        with pytest.raises(ValueError) as ref_err:
            jax.jit(power, **kw)
        assert str(ours_err.value) == str(ref_err.value)


def test_decorator_forms_and_methods():
    @jaxpr_cc.jit(static_argnums=(1,))
    def repeat(x, times):
        return jnp.concatenate([x] * times)

    class Layer:
        def __init__(self, w):
            self.w = w

        @functools.partial(jaxpr_cc.jit, static_argnums=0)
        def __call__(self, x):
            return x @ self.w

    x = jnp.arange(3.0)
    assert_trees_equal(repeat(x, 2), jnp.concatenate([x, x]))
    layer = Layer(jnp.ones((3, 2)))
    assert_trees_equal(layer(x), x @ layer.w)
    assert repeat.__name__ == "repeat" and repeat.__wrapped__ is not None


def _without_addresses(error) -> str:
    # Messages show the function's repr, whose address differs between two objects.
    return re.sub(r" at 0x[0-9a-f]+", "", str(error))


def test_non_array_argument_is_jax_jits_error():
    def f(x, s):
        return x
    with pytest.raises(TypeError, match="not marked as static") as ours_err:
        jaxpr_cc.jit(f)(jnp.ones(2), "hello")
    with pytest.raises(TypeError) as ref_err:
        jax.jit(f)(jnp.ones(2), "hello")
    assert _without_addresses(ours_err.value) == _without_addresses(ref_err.value)
    # jaxpr-cc's own inspection methods say what to do.
    with pytest.raises(TypeError, match="argument leaf of type str is not an array; mark it "
                                        "static"):
        jaxpr_cc.jit(f).program(jnp.ones(2), "hello")


# ------------------------------------------------------------- transformations
def test_outer_jit_sees_one_call():
    def f(x):
        return jnp.sin(x) * 2.0

    ours = jaxpr_cc.jit(f)
    outer = lambda x: ours(x) + 1.0  # noqa: E731
    x = jnp.arange(3.0)
    assert_trees_equal(jax.jit(outer)(x), jax.jit(lambda x: f(x) + 1.0)(x))
    top = [e.primitive.name for e in jax.make_jaxpr(outer)(x).jaxpr.eqns]
    assert top == ["jit", "add"]


def test_custom_rule_is_what_grad_sees():
    @jax.custom_vjp
    def clip_grad(x):
        return x

    clip_grad.defvjp(lambda x: (x, None), lambda _, g: (jnp.clip(g, -0.5, 0.5),))

    def f(x):
        return jnp.sum(clip_grad(x) * 3.0)
    x = jnp.arange(3.0)
    assert_trees_equal(jax.grad(jaxpr_cc.jit(f))(x), jax.grad(f)(x))
    assert_trees_equal(jax.grad(jaxpr_cc.jit(f))(x), jnp.full(3, 0.5))


def test_closure_over_outer_tracer_is_not_cached_stale():
    def loss(a):
        # The jitted function closes over `a`, a tracer of the enclosing grad.
        return jaxpr_cc.jit(lambda x: jnp.sum(jnp.sin(x * a)))(jnp.arange(3.0))

    for a in (0.5, 1.5):
        assert_trees_equal(jax.grad(loss)(a), jax.grad(
            lambda a: jax.jit(lambda x: jnp.sum(jnp.sin(x * a)))(jnp.arange(3.0)))(a),
            exact=False, rtol=1e-6)


def test_user_errors_propagate_unchanged():
    class Boom(Exception):
        pass

    def f(x):
        raise Boom("from the user's function")

    with pytest.raises(Boom, match="from the user's function"):
        jaxpr_cc.jit(f)(jnp.ones(2))

    def g(x):
        return jnp.dot(x, jnp.ones((5, 5)))
    with pytest.raises(TypeError) as ours:
        jaxpr_cc.jit(g)(jnp.ones(3))
    with pytest.raises(TypeError) as ref:
        jax.jit(g)(jnp.ones(3))
    assert str(ours.value).splitlines()[0] == str(ref.value).splitlines()[0]


def test_donate_argnums_like_jax_jit():
    def f(x, y):
        return x + y
    ours, theirs = jaxpr_cc.jit(f, donate_argnums=0), jax.jit(f, donate_argnums=0)
    for i in range(2):  # the first call, then the cached fast path
        ours_x, ref_x, y = jnp.arange(4.0) + i, jnp.arange(4.0) + i, jnp.ones(4)
        out, ref = ours(ours_x, y), theirs(ref_x, y)
        assert_trees_equal(out, ref)
        assert ours_x.is_deleted() == ref_x.is_deleted()
        assert not y.is_deleted()
    with pytest.raises(ValueError) as ours_err:
        jaxpr_cc.jit(f, static_argnums=0, donate_argnums=0)
    with pytest.raises(ValueError) as ref_err:
        jax.jit(f, static_argnums=0, donate_argnums=0)
    assert str(ours_err.value) == str(ref_err.value)


# ------------------------------------------------------------------- pipeline
def test_pipeline_choices():
    big = np.linspace(0.0, 1.0, 4096, dtype=np.float32)

    def f(x):
        return x * big + jnp.sin(x) * jnp.sin(x)
    x = jnp.ones(4096)
    assert default_pipeline() == DEFAULT_PIPELINE  # every default pass is registered
    with_passes = jaxpr_cc.jit(f)
    without = jaxpr_cc.jit(f, pipeline=None)
    explicit = jaxpr_cc.jit(f, pipeline="cse,dce")
    ref = jax.jit(f)(x)
    for fn in (with_passes, without, explicit):
        assert_trees_equal(fn(x), ref)
    # hoist-consts made the closed-over array a parameter; cse merged the two sines
    assert len(with_passes.program(x).params) == 1 and without.program(x).params == ()
    n_sin = lambda p: sum(e.prim.name == "sin" for _, e in p.body.walk())  # noqa: E731
    assert n_sin(without.program(x)) == 2 and n_sin(explicit.program(x)) == 1
    with pytest.raises(TypeError, match="pipeline must be a pass pipeline string"):
        jaxpr_cc.jit(f, pipeline=3)
