"""emit_python findings of the issue 16 adversary (stop 38).

* Names: a program or keyword argument named like one of the emitted module's
  helpers (``_batched_while_loop``) shadowed it, and a keyword argument named
  ``_`` was overwritten by the discard target ``_`` (wrong value and gradient).
  Every helper's name and ``_`` are now reserved: the program's function gets
  another name (the module docstring says which), and a keyword argument named
  like anything the module uses (also ``np``, ``jax``, a builtin such as ``max``,
  which were refused) is taken under another name behind a forwarding def.
* ``lax.composite`` could be saved and loaded but not emitted.

References: JAX on the original function.
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxpr_cc
from jaxpr_cc.backends.python_text import PythonEmitError


def _module(program, path):
    jaxpr_cc.write_python(program, path)
    spec = importlib.util.spec_from_file_location(f"emitted_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _batched_while_loop(x):
    # vmap of a loop whose test reads the mapped value: the emitter's helper of
    # the same name runs it.
    return jax.vmap(lambda a: lax.while_loop(lambda c: c[1] < 3.0,
                                             lambda c: (c[0] * 2, c[1] + a), (a, a))[0])(x)


def test_a_program_named_like_a_helper_gets_another_name(tmp_path):
    x = jnp.array([1.0, 2.0])
    module = _module(jaxpr_cc.trace(_batched_while_loop, x), tmp_path / "clash.py")
    assert "Its function is ``_batched_while_loop_1``" in module.__doc__
    np.testing.assert_allclose(module._batched_while_loop_1(x), _batched_while_loop(x))


@pytest.mark.parametrize("key", ["_batched_while_loop", "_", "_bind", "np", "jax", "sum",
                                 "max", "f"])
def test_a_keyword_argument_named_like_a_module_name_keeps_its_name(key, tmp_path):
    # The emitted function takes it under another name, behind a public def that
    # only forwards it.  JAX: value and gradient w.r.t. it.
    def f(x, **kw):
        s = kw[key]["s"]
        w = lax.while_loop(lambda c: c[0] < 3.0, lambda c: (c[0] + 1.0, c[1] * 0.5), (0.0, x))[1]
        return jnp.sum(w * s)

    x, kw = jnp.array([1.0, 2.0]), {key: {"s": jnp.float32(10.0)}}
    module = _module(jaxpr_cc.trace(f, x, **kw), tmp_path / "kw.py")
    np.testing.assert_allclose(module.f(x, **kw), f(x, **kw))
    grad = lambda fun: jax.grad(lambda s: fun(x, **{key: {"s": s}}))(jnp.float32(10.0))  # noqa: E731
    np.testing.assert_allclose(grad(module.f), grad(f))


def test_a_keyword_argument_that_is_not_an_identifier_is_refused():
    p = jaxpr_cc.trace(lambda x, **kw: x * kw["a-b"], jnp.float32(1.0), **{"a-b": 2.0})
    with pytest.raises(PythonEmitError, match="keyword argument 'a-b' is not a Python identifier"):
        jaxpr_cc.emit_python(p)


@partial(lax.composite, name="my.tanh")
def _my_tanh(v):
    return jnp.tanh(v)


@partial(lax.composite, name="my.scaled_pair", version=3)
def _scaled_pair(v, w, *, scale, table):
    return v * scale + w, jnp.asarray(table, v.dtype)[: v.shape[0]] * w


def composite_program(x, y):
    a, b = _scaled_pair(x, y, scale=2.5, table=np.array([1.0, -2.0, 3.0]))
    return jnp.sum(_my_tanh(x) * a) + b


def test_composites_emit_with_their_names_versions_and_attributes(tmp_path):
    x, y = jnp.array([0.3, -1.2, 2.0]), jnp.array([1.0, 0.5, -0.25])
    p = jaxpr_cc.trace(composite_program, x, y)
    module = _module(p, tmp_path / "composite_program.py")
    got = module.composite_program(x, y)
    np.testing.assert_allclose(got, composite_program(x, y), rtol=1e-6)
    # The same composite ops reach XLA (name, version and attributes).
    hlo = jax.jit(module.composite_program).lower(x, y).as_text()
    want = jax.jit(composite_program).lower(x, y).as_text()
    for text in ('stablehlo.composite "my.tanh"', 'stablehlo.composite "my.scaled_pair"',
                 "version = 3 : i32", "scale = 2.500000e+00 : f64",
                 "table = dense<[1.000000e+00, -2.000000e+00, 3.000000e+00]> : tensor<3xf64>"):
        assert text in want and text in hlo, text
    jaxpr_cc.save(p, tmp_path / "c.jaxprcc")  # an array attribute is saved as data
    loaded = jaxpr_cc.load(tmp_path / "c.jaxprcc")
    np.testing.assert_allclose(loaded(x, y), composite_program(x, y), rtol=1e-6)


# --------------------------------------------------------------- custom_vmap
@jax.custom_batching.custom_vmap
def _vmapped(x, pair):
    return jnp.sin(x) + pair["a"], {"b": x * pair["a"]}


@_vmapped.def_vmap
def _vmapped_rule(axis_size, in_batched, xs, pair):
    # Not the batched primal (cos * 10): a rule that is used shows in the numbers.
    x_b, pair_b = in_batched
    batched = x_b or pair_b["a"]
    return (jnp.cos(xs) * 10.0 + pair["a"], {"b": xs * pair["a"]}), (batched, {"b": batched})


def custom_vmap_program(x, w):
    g = lambda v, a: _vmapped(v * (w * 2.0), {"a": a})  # noqa: E731
    y1, d1 = jax.vmap(g, in_axes=(0, None))(x, w)
    y2, d2 = g(x[0], w)
    return jnp.sum(y1) + y2 + jnp.sum(d1["b"]) + d2["b"]


def test_custom_vmap_emits_with_its_rule_imported_by_name(tmp_path):
    x, w = jnp.array([0.3, -1.2, 2.0]), jnp.float32(0.7)
    p = jaxpr_cc.run_passes(jaxpr_cc.trace(custom_vmap_program, x, w), jaxpr_cc.DEFAULT_PIPELINE)
    module = _module(p, tmp_path / "custom_vmap_program.py")
    np.testing.assert_allclose(module.custom_vmap_program(x, w), custom_vmap_program(x, w),
                               rtol=1e-6)
    # vmap of the emitted module batches the unbatched call with the user's rule.
    xs = jnp.stack([x, x + 1.0])
    want = jax.vmap(custom_vmap_program, in_axes=(0, None))(xs, w)
    np.testing.assert_allclose(jax.vmap(module.custom_vmap_program, in_axes=(0, None))(xs, w),
                               want, rtol=1e-6)
    np.testing.assert_allclose(jax.vmap(p, in_axes=(0, None))(xs, w), want, rtol=1e-6)


def test_custom_vmap_save_is_refused_in_one_line(tmp_path):
    p = jaxpr_cc.trace(custom_vmap_program, jnp.array([0.3, -1.2]), jnp.float32(0.7))
    with pytest.raises(jaxpr_cc.SaveError) as e:
        jaxpr_cc.save(p, tmp_path / "p.jcc")
    assert "custom_vmap's batching rule (_vmapped_rule) is Python code" in str(e.value)
    assert len(str(e.value).splitlines()) == 1
    assert not (tmp_path / "p.jcc").exists()


def test_a_derived_custom_vmap_rule_is_refused_by_emit():
    # jvp of a custom_vmap inside the traced function: JAX's derived rule is a closure.
    def f(x):
        return jax.jvp(lambda v: _vmapped(v, {"a": 1.0})[0], (x,), (jnp.ones_like(x),))[1]

    p = jaxpr_cc.trace(f, jnp.float32(0.3))
    with pytest.raises(PythonEmitError, match="the batching rule is one JAX derived"):
        jaxpr_cc.emit_python(p)


# ---------------------------------------------------------- second adversary
def _closed_over_mode(x, w):
    # Named like a function a helper's text defines beside the helper (not a
    # helper's own name): the program's def replaced it, and grad raised.
    @jax.custom_vjp
    def g(y):
        return jnp.sin(y * w)

    g.defvjp(lambda y: (g(y), y), lambda y, ct: (ct * jnp.cos(y * w) * w,))
    return jnp.sum(g(x))


def _PRIMITIVES(x):  # noqa: N802 -- named like a constant the _bind helper reads
    return jnp.sum(lax.top_k(x, 2)[0])


@pytest.mark.parametrize("fun, args", [(_closed_over_mode, (jnp.arange(3.0), jnp.float32(1.3))),
                                       (_PRIMITIVES, (jnp.arange(3.0),))],
                         ids=["_closed_over_mode", "_PRIMITIVES"])
def test_every_name_a_helper_text_binds_is_reserved(fun, args, tmp_path):
    module = _module(jaxpr_cc.trace(fun, *args), tmp_path / "m.py")
    emitted = getattr(module, f"{fun.__name__}_1")
    np.testing.assert_allclose(emitted(*args), fun(*args), rtol=1e-6)
    np.testing.assert_allclose(jax.grad(emitted)(*args), jax.grad(fun)(*args), rtol=1e-6)


@partial(lax.composite, name="my.typed", version=1)
def _typed(x, *, a, b, c):
    return x * 2.0


def test_composite_attributes_keep_numpy_scalar_types(tmp_path):
    # np.int8(-3) was emitted as the Python int -3: an i64 attribute where JAX has i8.
    def prog(x):
        return _typed(x, a=np.int8(-3), b=(np.uint32(7), np.float16(0.5)), c={"k": np.int16(2)})

    x = jnp.arange(3.0)
    module = _module(jaxpr_cc.trace(prog, x), tmp_path / "typed.py")

    def attributes(f):
        return [line.split("composite_attributes = ")[1]
                for line in jax.jit(f).lower(x).as_text().splitlines()
                if "stablehlo.composite" in line]

    want = attributes(prog)
    assert "i8" in want[0] and "i16" in want[0], want
    assert attributes(module.prog) == want


def test_a_rule_defined_in_a_script_is_found_by_another_process(tmp_path):
    # The rule lives in __main__ when the script emits; another process's __main__
    # is another program, so the function is loaded from the script's file.
    script = tmp_path / "script.py"
    script.write_text(
        "import jax, jax.numpy as jnp, jaxpr_cc\n"
        "from jax.custom_batching import custom_vmap\n"
        "@custom_vmap\n"
        "def g(x):\n    return x + 1.0\n"
        "@g.def_vmap\n"
        "def g_rule(axis_size, in_batched, x):\n    return x + 10.0, True\n"
        "def prog(x):\n    return g(x)\n"
        "if __name__ == '__main__':\n"
        f"    jaxpr_cc.write_python(jaxpr_cc.trace(prog, jnp.arange(3.0)), {str(tmp_path / 'out.py')!r})\n")
    subprocess.run([sys.executable, str(script)], check=True, cwd=tmp_path)
    run = subprocess.run(
        [sys.executable, "-c", "import jax, jax.numpy as jnp, out; x = jnp.arange(3.0); "
                               "print(out.prog(x).tolist(), jax.vmap(out.prog)(x[None]).tolist())"],
        capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[1.0, 2.0, 3.0] [[10.0, 11.0, 12.0]]"


# ----------------------------------------------------------- third adversary
def test_a_script_function_is_not_confused_with_the_importers_own(tmp_path):
    # The importing script defines a function of the same name: the emitted module
    # checked only that __main__ had that name, and ran the importer's function.
    (tmp_path / "out").mkdir()
    (tmp_path / "a.py").write_text(
        "import jax, jax.numpy as jnp, jaxpr_cc\n"
        "from jax.custom_batching import custom_vmap\n"
        "@custom_vmap\n"
        "def g(x):\n    return jnp.sin(x)\n"
        "def rule(axis_size, in_batched, x):\n    return jnp.sin(x) + 100.0, in_batched[0]\n"
        "g.def_vmap(rule)\n"
        "def f(x):\n    return g(x) * 2.0\n"
        "if __name__ == '__main__':\n"
        "    jaxpr_cc.write_python(jaxpr_cc.trace(f, jnp.float32(0.0)), 'out/emitted.py')\n")
    (tmp_path / "b.py").write_text(
        "import sys, jax, jax.numpy as jnp\n"
        "sys.path.insert(0, 'out')\n"
        "def rule(axis_size, in_batched, x):\n    return jnp.cos(x) - 7.0, in_batched[0]\n"
        "import emitted\n"
        "print(jax.vmap(emitted.f)(jnp.arange(3.0)).tolist())\n")
    subprocess.run([sys.executable, "a.py"], check=True, cwd=tmp_path)
    run = subprocess.run([sys.executable, "b.py"], capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    want = (2.0 * (np.sin(np.arange(3.0, dtype=np.float32)) + 100.0)).tolist()
    np.testing.assert_allclose(eval(run.stdout), want, rtol=1e-6)


class _RuleBase:
    OFFSET = 1.0

    @classmethod
    def rule(cls, axis_size, in_batched, x):
        return jnp.sin(x) + cls.OFFSET, in_batched[0]


class _RuleDerived(_RuleBase):
    OFFSET = 50.0


def _rule_v1(axis_size, in_batched, x):
    return jnp.sin(x) + 100.0, in_batched[0]


def _changing(axis_size, in_batched, x):  # version 1, used by a program
    return jnp.sin(x) + 100.0, in_batched[0]


_changing_v1 = _changing


def _changing(axis_size, in_batched, x):  # noqa: F811 -- version 2 takes the name
    return jnp.cos(x) - 100.0, in_batched[0]


@pytest.mark.parametrize("rule", [_RuleDerived.rule, _RuleBase.rule, partial(_rule_v1),
                                  _rule_v1.__get__(1), _changing_v1],
                         ids=["subclass classmethod", "classmethod", "partial", "bound method",
                              "rebound name"])
def test_a_function_not_importable_as_itself_is_refused(rule):
    # Imported by __module__ and __qualname__ it came back as another object
    # (Base's classmethod, the rebound name's function): emit refuses, as pickle does.
    @jax.custom_batching.custom_vmap
    def g(x):
        return jnp.sin(x)

    g.def_vmap(rule)
    p = jaxpr_cc.trace(lambda x: g(x), jnp.float32(0.5))
    with pytest.raises(PythonEmitError, match="is not importable by module and name as the "
                                              "same object"):
        jaxpr_cc.emit_python(p)


def test_empty_positional_arguments_keep_their_places(tmp_path):
    # An argument with no leaves (None, (), {}) took a leaf name: the emitted
    # function read the next argument from its slot.
    def f(a, b, c, d):
        return a + 10.0 * c

    a, c = jnp.float32(1.0), jnp.float32(2.0)
    for empty in (None, (), {}):
        module = _module(jaxpr_cc.trace(f, a, empty, c, empty), tmp_path / "empty.py")
        np.testing.assert_allclose(module.f(a, empty, c, empty), f(a, empty, c, empty))


@pytest.mark.parametrize("name", ["__dict__", "__class__", "__getattr__"])
def test_a_dunder_program_name_is_not_handed_out(name, tmp_path):
    def f(x):
        return jnp.sin(x)

    f.__name__ = f.__qualname__ = name
    module = _module(jaxpr_cc.trace(f, jnp.float32(0.5)), tmp_path / "dunder.py")
    assert f"Its function is ``{name}_1``" in module.__doc__
    np.testing.assert_allclose(getattr(module, f"{name}_1")(jnp.float32(0.5)), np.sin(0.5),
                               rtol=1e-6)
    assert not hasattr(module, "missing")


def _host(x, y):
    return {"s": np.sin(x) + y["a"], "c": np.cos(np.asarray(y["a"]))}


def host_callback_program(x):
    from jax.experimental import io_callback
    shapes = {"s": jax.ShapeDtypeStruct(x.shape, x.dtype), "c": jax.ShapeDtypeStruct(x.shape, x.dtype)}
    a = jax.pure_callback(_host, shapes, x, {"a": 2 * x}, vmap_method="sequential")
    b = io_callback(_host, shapes, x, {"a": x}, ordered=True)
    return a["s"] * b["c"] + a["c"]


def test_pure_and_io_callbacks_emit(tmp_path):
    # They were refused ("no Python spelling"), though the README said a callback's
    # function is imported by name.
    x = jnp.array([0.3, -1.2, 2.0])
    module = _module(jaxpr_cc.trace(host_callback_program, x), tmp_path / "cb.py")
    np.testing.assert_allclose(module.host_callback_program(x), host_callback_program(x),
                               rtol=1e-6)
    np.testing.assert_allclose(jax.jit(module.host_callback_program)(x),
                               jax.jit(host_callback_program)(x), rtol=1e-6)


# ---------------------------------------------------------- fourth adversary
def _fresh_process(module_dir, code):
    run = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(module_dir)!r})\n"
                          + code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


def test_jax_modules_the_module_names_are_imported(tmp_path):
    # jax.ad_checkpoint (checkpoint_name) and shard_alike's module are not loaded by
    # `import jax`: the module worked where it was written and failed elsewhere.
    from jax.ad_checkpoint import checkpoint_name
    from jax.experimental.shard_alike import shard_alike

    def f(x, y):
        a, b = shard_alike(jnp.cos(checkpoint_name(jnp.sin(x), "a")), y)
        return a * b

    x = jnp.array([0.3, -1.2, 2.0])
    jaxpr_cc.write_python(jaxpr_cc.trace(f, x, x), tmp_path / "ck.py")
    got = _fresh_process(tmp_path, "import jax.numpy as jnp, ck\n"
                                   "print(ck.f(jnp.array([0.3, -1.2, 2.0]), jnp.array([0.3, -1.2, 2.0])).tolist())")
    np.testing.assert_allclose(eval(got), f(x, x), rtol=1e-6)


def test_modules_import_jax_loads_is_this_jax():
    from jaxpr_cc.jax_adapter import MODULES_IMPORT_JAX_LOADS
    loaded = _fresh_process(".", "import jax\nprint(sorted(m for m in sys.modules if "
                                 "m.startswith('jax.') and not m.startswith('jax._src')))")
    assert set(eval(loaded)) == MODULES_IMPORT_JAX_LOADS


@partial(lax.composite, name="my.dtyped")
def _dtyped(x, *, dt, bt):
    return x * 2.0


def test_a_dtype_attribute_is_emitted_as_a_dtype(tmp_path):
    # np.dtype("float32") was spelled np.float32, a type: jax.jit of the module failed.
    def prog(x):
        return _dtyped(x, dt=np.dtype("float32"), bt=np.dtype(jnp.bfloat16))

    x = jnp.arange(3.0)
    module = _module(jaxpr_cc.trace(prog, x), tmp_path / "dtyped.py")
    np.testing.assert_allclose(jax.jit(module.prog)(x), jax.jit(prog)(x))


def test_a_keyword_python_reads_as_another_is_refused():
    # 'ｎｐ' is an identifier, but Python reads it as np in source.
    p = jaxpr_cc.trace(lambda x, **kw: x * kw["\uff4e\uff50"], jnp.float32(1.0),
                       **{"\uff4e\uff50": jnp.float32(2.0)})
    with pytest.raises(PythonEmitError, match="is read by Python as 'np' in source"):
        jaxpr_cc.emit_python(p)


def test_a_script_namedtuple_comes_back_as_the_scripts_class(tmp_path):
    (tmp_path / "nt.py").write_text(
        "import collections, importlib.util, jax, jax.numpy as jnp, jaxpr_cc\n"
        "NT = collections.namedtuple('NT', 'a b')\n"
        "def f(n):\n    return NT(n.b, n.a * 2)\n"
        "if __name__ == '__main__':\n"
        "    n = NT(jnp.ones(2), jnp.ones(2))\n"
        "    jaxpr_cc.write_python(jaxpr_cc.trace(f, n), 'mod.py')\n"
        "    spec = importlib.util.spec_from_file_location('mod', 'mod.py')\n"
        "    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "    print(type(m.f(n)) is NT, jax.tree.map(lambda a, b: a + b, f(n), m.f(n)).b.tolist())\n")
    run = subprocess.run([sys.executable, "nt.py"], capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "True [4.0, 4.0]"


# ----------------------------------------------------------- fifth adversary
def _with_self(x, *, self, fun=1.0):
    return x * self + fun


def test_a_keyword_argument_named_self_or_fun_reaches_the_function(tmp_path):
    # Program.__call__(self, ...) and trace(fun, ...) took it as their own.
    x = jnp.ones(3)
    want = jax.jit(_with_self)(x, self=2.0, fun=3.0)
    p = jaxpr_cc.trace(_with_self, x, self=2.0, fun=3.0)
    jaxpr_cc.save(p, tmp_path / "s.jcc")
    for fn in (p, jaxpr_cc.load(tmp_path / "s.jcc"), jaxpr_cc.compile(p), jaxpr_cc.jit(_with_self)):
        np.testing.assert_allclose(fn(x, self=2.0, fun=3.0), want)
    np.testing.assert_allclose(jaxpr_cc.jit(_with_self).program(x, self=2.0, fun=3.0)(
        x, self=2.0, fun=3.0), want)


def test_jit_passes_keywords_named_like_trace_options_to_the_function():
    def f(x, *, closed_over, max_forward_size=1.0):
        return x * closed_over + max_forward_size

    x = jnp.ones(2)
    np.testing.assert_allclose(jaxpr_cc.jit(f)(x, closed_over=2.0, max_forward_size=3.0),
                               jax.jit(f)(x, closed_over=2.0, max_forward_size=3.0))


@pytest.mark.parametrize("make", [
    lambda cp: cp.save_from_both_policies(cp.dots_saveable, cp.nothing_saveable),
    lambda cp: cp.offload_dot_with_no_batch_dims("device", "pinned_host")],
    ids=["save_from_both_policies", "offload_dot_with_no_batch_dims"])
def test_a_made_checkpoint_policy_is_refused_saying_what_it_is(make, tmp_path):
    # The messages said it was not one of jax.checkpoint_policies, and to run closure
    # conversion.
    p = jaxpr_cc.trace(jax.checkpoint(lambda x: jnp.cos(jnp.sin(x)) * x,
                                      policy=make(jax.checkpoint_policies)), jnp.ones(3))
    for action, error in ((lambda: jaxpr_cc.emit_python(p), PythonEmitError),
                          (lambda: jaxpr_cc.save(p, tmp_path / "p.jcc"), jaxpr_cc.SaveError)):
        with pytest.raises(error, match="is a closure jax.checkpoint_policies made from other "
                                        "values"):
            action()


def test_a_pass_option_naming_what_the_program_lacks_is_bad_input(tmp_path, capsys):
    from jaxpr_cc.cli.main import main
    from jaxpr_cc.passes.base import PassOptionError

    @jax.custom_vjp
    def g(x):
        return jnp.sin(x)

    g.defvjp(lambda x: (g(x), x), lambda x, ct: (jnp.cos(x) * ct,))
    p = jaxpr_cc.trace(g, jnp.ones(2))
    with pytest.raises(PassOptionError, match="rules=nonexistent: the program has no "
                                              "custom_vjp rule of that name \\(its rules: g\\)"):
        jaxpr_cc.run_passes(p, "vjp-to-jvp{rules=nonexistent}")
    jaxpr_cc.save(p, tmp_path / "g.jcc")
    for pipeline in ("vjp-to-jvp{rules=nonexistent}", "implicit-diff{loops=foo}"):
        assert main(["opt", str(tmp_path / "g.jcc"), "-p", pipeline,
                     "-o", str(tmp_path / "o.jcc")]) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and "failed" not in err, err
        assert not (tmp_path / "o.jcc").exists()


# ----------------------------------------------------------- sixth adversary
def fp(theta):
    return lax.while_loop(lambda s: jnp.abs(s[0] - s[1]) > 1e-6,
                          lambda s: (0.5 * jnp.cos(s[0]) * theta + 0.1, s[0]),
                          (jnp.float32(0.0), jnp.float32(1.0)))[0]


def test_loops_by_name_on_a_loaded_program_says_to_select_by_position(tmp_path):
    # Loop names come from source locations, which a saved program does not keep.
    from jaxpr_cc.passes.base import PassOptionError

    p = jaxpr_cc.trace(lambda x: fp(x) * 2.0, jnp.float32(0.3))
    jaxpr_cc.run_passes(p, "implicit-diff{loops=fp}")  # traced here: source locations
    jaxpr_cc.save(p, tmp_path / "p.jcc")
    loaded = jaxpr_cc.load(tmp_path / "p.jcc")
    with pytest.raises(PassOptionError, match="no source locations .* select them by "
                                              "position: loops=0..0"):
        jaxpr_cc.run_passes(loaded, "implicit-diff{loops=fp}")
    jaxpr_cc.run_passes(loaded, "implicit-diff{loops=0}")


def test_a_keyword_named___debug___is_refused_in_one_line():
    p = jaxpr_cc.trace(lambda x, **kw: x + kw["__debug__"], jnp.float32(1.0),
                       **{"__debug__": jnp.float32(2.0)})
    with pytest.raises(PythonEmitError, match="'__debug__' is not a Python identifier"):
        jaxpr_cc.emit_python(p)


def test_loading_an_executable_as_a_program_says_what_it_is(tmp_path):
    jaxpr_cc.jit(lambda x: x * 2).executable(jnp.ones(3)).save(tmp_path / "f.jxe")
    with pytest.raises(jaxpr_cc.LoadError, match="is a compiled executable .* load it with "
                                                 "jaxpr_cc.backends.xla.load_executable"):
        jaxpr_cc.load(tmp_path / "f.jxe")
