"""Issue 18, adversary round i: copy.deepcopy of a jaxpr_cc.jit function works as
jax.jit's does (after it was called too); `jaxpr-cc exec PROGRAM` compiles the
program as `jaxpr-cc compile` does (an uneven sharding constraint and a shard_map
program give jax.jit's result, not eager JAX's IndivisibleError); an executable
compiled with x64 says so in one line where x64 is off.  References: jax.jit."""
import copy
import functools
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_cc

ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- deepcopy
def _sin2(a):
    return jnp.sin(a) * 2


@pytest.mark.parametrize("called_first", [False, True])
def test_deepcopy_of_jit_function_works_like_jax_jit(called_first):
    x = jnp.arange(3.)
    ours, theirs = jaxpr_cc.jit(_sin2), jax.jit(_sin2)
    if called_first:
        ours(x), theirs(x)
    ours_copy, theirs_copy = copy.deepcopy(ours), copy.deepcopy(theirs)
    # jax.jit's deepcopy is a new function object sharing the function, as is ours.
    assert (ours_copy is ours) == (theirs_copy is theirs)
    np.testing.assert_array_equal(ours_copy(x), theirs_copy(x))
    np.testing.assert_array_equal(ours_copy(x), jax.jit(_sin2)(x))
    assert ours_copy.__wrapped__ is _sin2
    assert ours_copy.program(x) is not None  # our attributes survive the copy
    holder = copy.deepcopy({"step": jaxpr_cc.jit(_sin2)})
    np.testing.assert_array_equal(holder["step"](x), theirs(x))


def test_deepcopy_after_another_jit_of_the_function_traced_it():
    x = jnp.arange(4.)
    jaxpr_cc.jit(_sin2)(x)  # shares its state with the next one
    fresh = jaxpr_cc.jit(_sin2)
    np.testing.assert_array_equal(copy.deepcopy(fresh)(x), jax.jit(_sin2)(x))
    copied = copy.deepcopy(fresh)
    copied.clear_cache()
    np.testing.assert_array_equal(copied(x + 1), jax.jit(_sin2)(x + 1))


# ---------------------------------------------------------------- the CLI
def _env(devices: int = 8, x64: bool = False) -> dict:
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.pop("JAX_ENABLE_X64", None)
    if x64:
        env["JAX_ENABLE_X64"] = "1"
    return env


def _cli(*args, cwd, env):
    return subprocess.run([sys.executable, "-m", "jaxpr_cc.cli.main", *map(str, args)],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


_UNEVEN = """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import PartitionSpec as P, NamedSharding
mesh = jax.make_mesh((8,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
def f(a):   # 6 elements over 8 devices: jax.jit pads, eager JAX raises IndivisibleError
    return jax.lax.with_sharding_constraint(a * 2, NamedSharding(mesh, P("d")))
def example_args():
    return (jnp.arange(6.),)
"""

_SHARD_MAP = """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import PartitionSpec as P, NamedSharding
mesh = jax.make_mesh((8,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
def f(a):
    g = jax.shard_map(lambda v: jax.lax.psum(jnp.sin(v), "d"), mesh=mesh, in_specs=P("d"),
                      out_specs=P())
    return jax.lax.with_sharding_constraint(g(a) * 2, NamedSharding(mesh, P("d")))
def example_args():
    return (jax.device_put(jnp.arange(16.), NamedSharding(mesh, P("d"))),)
"""

_REFERENCE = """
import sys, jax, numpy as np
sys.path.insert(0, ".")
import model
args = model.example_args()
np.save("in.npy", np.asarray(args[0]))
np.save("ref.npy", np.asarray(jax.jit(model.f)(*args)))
"""


@pytest.mark.parametrize("source,trace_args", [(_UNEVEN, ()), (_SHARD_MAP, ()),
                                               pytest.param(_SHARD_MAP, ("--args", "f32[16]"),
                                                            marks=pytest.mark.heavy)],
                         ids=["uneven_constraint", "shard_map", "shard_map_args_spec"])
def test_exec_of_a_program_compiles_it_like_compile_then_exec(tmp_path, source, trace_args):
    env = _env()
    (tmp_path / "model.py").write_text(textwrap.dedent(source))
    (tmp_path / "ref.py").write_text(textwrap.dedent(_REFERENCE))
    ref = subprocess.run([sys.executable, "ref.py"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert ref.returncode == 0, ref.stderr[-3000:]
    res = _cli("trace", "model.py:f", *trace_args, "-o", "p.jcc", cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    res = _cli("exec", "p.jcc", "--inputs", "in.npy", "-o", "prog.npz", cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    res = _cli("compile", "p.jcc", "-o", "p.jxe", cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    res = _cli("exec", "p.jxe", "--inputs", "in.npy", "-o", "exe.npz", cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    expected = np.load(tmp_path / "ref.npy")
    np.testing.assert_allclose(np.load(tmp_path / "prog.npz")["out0"], expected, rtol=1e-6)
    np.testing.assert_allclose(np.load(tmp_path / "exe.npz")["out0"], expected, rtol=1e-6)


def test_x64_executable_run_without_x64_is_one_clear_line(tmp_path):
    (tmp_path / "one.py").write_text("import jax.numpy as jnp\n"
                                     "def g(x): return jnp.cos(x) * 2\n")
    np.save(tmp_path / "x64.npy", np.ones(3))
    on, off = _env(1, x64=True), _env(1)
    assert _cli("trace", "one.py:g", "--args", "f64[3]", "-o", "g.jcc",
                cwd=tmp_path, env=on).returncode == 0
    assert _cli("compile", "g.jcc", "-o", "g.jxe", cwd=tmp_path, env=on).returncode == 0
    ok = _cli("exec", "g.jxe", "--inputs", "x64.npy", "-o", "o.npz", cwd=tmp_path, env=on)
    assert ok.returncode == 0, ok.stderr
    with jax.enable_x64(True):
        expected = np.asarray(jax.jit(lambda x: jnp.cos(x) * 2)(np.ones(3)))
    np.testing.assert_allclose(np.load(tmp_path / "o.npz")["out0"], expected, rtol=1e-15)
    for name in ("g.jcc", "g.jxe"):
        res = _cli("exec", name, "--inputs", "x64.npy", "-o", "o2.npz", cwd=tmp_path, env=off)
        assert res.returncode == 2
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1, res.stderr
        assert "float64" in lines[0] and "JAX_ENABLE_X64=1" in lines[0], lines[0]
        assert "compiling" not in lines[0], lines[0]


# ---------------------------------------------------------------- weak cotangents
def _fixed_point():
    """A custom_vjp fixed-point solver (implicit differentiation) of x = f(p, x)."""
    import functools

    @functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
    def fp(f, p, x0):
        def body(c): return f(p, c[0]), c[0]
        def cond(c): return jnp.abs(c[0] - c[1]) > 1e-6
        return jax.lax.while_loop(cond, body, (f(p, x0), x0))[0]

    def fp_fwd(f, p, x0):
        x = fp(f, p, x0)
        return x, (p, x)

    def fp_bwd(f, res, g):
        p, x = res
        _, vjp_p = jax.vjp(lambda p: f(p, x), p)
        _, vjp_x = jax.vjp(lambda x: f(p, x), x)
        def body(c): return vjp_x(c[0])[0] + g, c[0]
        def cond(c): return jnp.abs(c[0] - c[1]) > 1e-6
        w = jax.lax.while_loop(cond, body, (vjp_x(g)[0] + g, g))[0]
        return vjp_p(w)[0], jnp.zeros_like(x)
    fp.defvjp(fp_fwd, fp_bwd)
    return fp


_FP = _fixed_point()


def _closing_over_b(b, a):  # the solver's update closes over b: x = sqrt(a b / (2 - b))
    return _FP(lambda a, x: 0.5 * b * (x + a / x), a, a)


def _passing_b(b, a):       # the same with b passed to the custom_vjp: JAX differentiates it
    return _FP(lambda p, x: 0.5 * p[1] * (x + p[0] / x), (a, b), a)


@pytest.mark.parametrize("how", ["grad_of_jit", "jit_of_grad"])
def test_cotangent_of_closed_over_python_float_is_weak_like_jax(how):
    grad = functools.partial(jax.grad, argnums=(0, 1))
    expected = grad(_passing_b)(1.0, 2.0)
    closed_form = grad(lambda b, a: jnp.sqrt(a * b / (2 - b)))(1.0, 2.0)
    got = (grad(jaxpr_cc.jit(_closing_over_b)) if how == "grad_of_jit"
           else jaxpr_cc.jit(grad(_closing_over_b)))(1.0, 2.0)
    for g, e, c in zip(got, expected, closed_form):
        assert jax.typeof(g) == jax.typeof(e) == jax.typeof(c)  # dtype and weak_type
        assert jax.typeof(g).weak_type
        np.testing.assert_allclose(g, e, rtol=1e-5)
        np.testing.assert_allclose(g, c, rtol=1e-5)


def test_cotangent_of_closed_over_array_stays_strong():
    grad = functools.partial(jax.grad, argnums=(0, 1))
    b, a = jnp.float32(1.0), jnp.float32(2.0)
    expected = grad(_passing_b)(b, a)
    got = grad(jaxpr_cc.jit(_closing_over_b))(b, a)
    for g, e in zip(got, expected):
        assert jax.typeof(g) == jax.typeof(e)
        assert not jax.typeof(g).weak_type
        np.testing.assert_allclose(g, e, rtol=1e-5)
