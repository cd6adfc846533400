"""Issue 18's last open items: jax.vmap of a shard_map whose custom_vjp closes over
constants (the rule JAX stages again is traced in the body's axis context); an
executable compiled with device= keeps its device through save/load (a one-line
LoadError where that device does not exist); an executable's argument check is
jax.jit's compiled call's (shapes and dtypes, not weak types).  The multi-device
cases run in fresh processes (tests/sharded_issue18h_cases.py).  References:
jax.jit and jax.jit(...).lower(...).compile()."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_cc
from eight_devices import run_case_script
from sharded_issue18h_cases import CASE_NAMES


# ---------------------------------------------------------------- 8 devices
@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("issue18h")
    return out_dir, run_case_script("sharded_issue18h_cases.py", str(out_dir))


@pytest.mark.parametrize("case", CASE_NAMES)
def test_sharded_case(saved, case):
    _, (res, found) = saved
    assert case in found, res.stderr[-4000:]
    assert found[case]["problems"] == [], "\n".join(found[case]["problems"])


def test_device_executable_loaded_where_its_device_is_missing_is_one_line(saved):
    out_dir, (res, found) = saved
    assert "device_executable_kept_through_save_and_load" in found, res.stderr[-4000:]
    res1, found1 = run_case_script("sharded_issue18h_cases.py", str(out_dir), "--one-device",
                                   devices=1)
    error = found1.get("load_on_missing_device", {}).get("error")
    assert error is not None, res1.stderr[-4000:]
    assert len(error.splitlines()) == 1, error
    assert "compiled for cpu device 3" in error and "its cpu devices are ids 0;" in error


# ------------------------------------- weak types: jax.jit's compiled call's rule
def _double(x):
    return x * 2


CALLED_WITH = {
    "python float": 2.5, "python int": 2, "numpy float32": np.float32(2.5),
    "numpy float64": np.float64(2.5), "numpy float16": np.float16(2.5),
    "jnp float32": jnp.float32(2.5), "numpy 0-d float32 array": np.array(2.5, np.float32),
    "weak jnp scalar": jnp.asarray(2.5), "jnp float32[3]": jnp.ones(3),
    "jnp int32": jnp.int32(2), "bfloat16": jnp.bfloat16(2.5), "python bool": True,
    "python complex": 1j,
}


@pytest.mark.parametrize("traced_with", [2.0, jnp.float32(2.0)], ids=["weak", "strong"])
@pytest.mark.parametrize("called", list(CALLED_WITH))
@pytest.mark.parametrize("how", ["executable", "saved"])
def test_executable_takes_what_jax_compiled_takes(tmp_path, traced_with, called, how):
    x = CALLED_WITH[called]
    want_exe = jax.jit(_double).lower(traced_with).compile()
    exe = jaxpr_cc.jit(_double).executable(traced_with)
    if how == "saved":
        from jaxpr_cc.backends.xla import load_executable
        exe.save(str(tmp_path / "double.jxe"))
        exe = load_executable(str(tmp_path / "double.jxe"))
    try:
        want = want_exe(x)
    except TypeError:
        with pytest.raises(TypeError, match=r"_double: args\[0\] is .*, but the executable "
                                            r"was compiled for") as info:
            exe(x)
        assert len(str(info.value).splitlines()) == 1
        return
    got = exe(x)
    assert jax.typeof(got) == jax.typeof(want)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


# ------------------------------------- JAX's api_test failures that were jaxpr-cc bugs
def test_closed_over_token_is_returned_like_jax_jit():
    # (api_test test_jit_capturing_token) hoist-consts made the token a parameter.
    tok = jax.lax.create_token()
    f = lambda x: (x + 2, tok)  # noqa: E731
    want = jax.jit(f)(7)
    for got in (jaxpr_cc.jit(f)(7), jaxpr_cc.jit(f).executable(7)(7)):
        assert type(got[1]) is type(want[1])
        assert jax.typeof(got[0]) == jax.typeof(want[0]) and int(got[0]) == int(want[0])


@pytest.mark.heavy
def test_no_tracer_leaks_under_jax_check_tracer_leaks():
    # (api_test test_leak_checker_internal_error) the trace session kept tracers of
    # a finished checkpoint trace alive.
    def apply_fn(inp):
        fn = jax.checkpoint(lambda x: jax.nn.relu(1.0 * x))
        return jax.vjp(fn, inp)

    with jax.check_tracer_leaks():
        want_y, want_vjp = jax.jit(apply_fn)(1.0)
        got_y, got_vjp = jaxpr_cc.jit(apply_fn)(1.0)
    assert float(got_y) == float(want_y)
    assert float(got_vjp(1.0)[0]) == float(want_vjp(1.0)[0])


def _leaks_through_remat():
    seq = [jnp.zeros([])]

    def g():
        seq[0] += 1
        return seq[0]
    jax.checkpoint(g)()
    jax.checkpoint(lambda: g())()


def test_escaped_tracer_is_jax_jits_error():
    # (api_test test_escaped_tracer_remat) the leaked tracer became an unused
    # constant that dce dropped: jax.jit raises for it.
    with pytest.raises(jax.errors.UnexpectedTracerError, match="global state") as want:
        jax.jit(_leaks_through_remat)()
    with pytest.raises(jax.errors.UnexpectedTracerError, match="global state") as got:
        jaxpr_cc.jit(_leaks_through_remat)()
    assert str(got.value).splitlines()[0] == str(want.value).splitlines()[0]


@pytest.mark.parametrize("outer", ["grad", "vmap", "jit"])
def test_closing_over_live_outer_tracers_still_works(outer):
    def inner_user(x):
        y = jnp.sin(x) * 2
        return jaxpr_cc.jit(lambda v: v * y)(x).sum() if outer != "vmap" else \
            jaxpr_cc.jit(lambda v: v * y)(x)

    def reference(x):
        y = jnp.sin(x) * 2
        return (x * y).sum() if outer != "vmap" else x * y
    x = jnp.arange(3.) + 0.5
    transform = {"grad": jax.grad, "vmap": jax.vmap, "jit": jax.jit}[outer]
    np.testing.assert_allclose(np.asarray(transform(inner_user)(x)),
                               np.asarray(transform(reference)(x)), rtol=1e-6)


def _call_through_custom_jvp(f, *args):
    f = jax.custom_jvp(f)
    f.defjvp(lambda primals, tangents: (f(*primals), sum(tangents)))
    return f(*args)


@pytest.mark.parametrize("jit", [jax.jit, jaxpr_cc.jit], ids=["jax", "jaxpr_cc"])
def test_closing_over_a_batch_tracer_from_inside_a_custom_jvp_function(jit):
    # (custom_api_test test_fun_with_nested_calls_2) under vmap, JAX runs a
    # custom_jvp function under a batch trace whose parent is not the one the
    # closed-over x belongs to: x is live, not leaked.
    def fun(x):
        def bar(y):
            return jit(lambda w: _call_through_custom_jvp(lambda v: y * v, x) + w)(x)
        return _call_through_custom_jvp(bar, x)
    x = jnp.arange(3.)
    np.testing.assert_allclose(np.asarray(jax.vmap(fun)(x)), np.asarray(x * x + x))


def _cache_miss_logs(jit, caplog):
    def f(x, y):
        return x
    jf = jit(f)
    jf(np.float32(0), np.float32(1))
    caplog.clear()
    with jax.explain_cache_misses(True), caplog.at_level("WARNING"):
        jf(np.float32(0), np.int32(1))
    return [r.getMessage() for r in caplog.records if "TRACING CACHE MISS" in r.getMessage()]


def test_cache_miss_explained_once_like_jax_jit(caplog):
    # (api_test test_cache_miss_explanations_*) jaxpr_cc's own trace of a fresh
    # wrapper was explained too ("never seen function").
    want = _cache_miss_logs(jax.jit, caplog)
    got = _cache_miss_logs(jaxpr_cc.jit, caplog)
    assert len(got) == len(want) == 1, got
    assert "at y, now i32[] and before f32[]" in got[0]
