"""jaxpr_cc.compile / Executable / saved executables, checked against jax.jit of the
original functions."""
import collections
import contextlib
import functools
import json
import os
import subprocess
import sys
import textwrap
import zipfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jaxpr_cc
from jaxpr_cc.backends import xla, xla_archive
from jaxpr_cc.golden.corpus import load_corpus
from jaxref import assert_trees_equal

CORPUS = load_corpus()
BY_NAME = {p.name: p for p in CORPUS}
BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"


def _bound(prog):
    # Keyword arguments of corpus programs are configuration (axis, flags): held
    # fixed, as the reference results do.
    return functools.partial(prog.fun, **prog.kwargs) if prog.kwargs else prog.fun


@functools.cache
def _compiled(name):
    """(executable, reference result of jax.jit on the original), once per program."""
    prog = BY_NAME[name]
    fn = _bound(prog)
    exe = jaxpr_cc.compile(jaxpr_cc.trace(fn, *prog.args))
    ref = jax.block_until_ready(jax.jit(fn)(*prog.args))
    return exe, ref


def _assert_same_placement(out, ref):
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(ref)):
        assert a.sharding == b.sharding, (a.sharding, b.sharding)


@contextlib.contextmanager
def count_compiles():
    """XLA backend compilations while the block runs (JAX's monitoring events)."""
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
def test_compile_matches_jax_jit(name):
    exe, ref = _compiled(name)
    out = exe(*BY_NAME[name].args)
    assert_trees_equal(out, ref, exact=True)
    _assert_same_placement(out, ref)


def test_sharded_programs_span_the_mesh():
    for name in ("47_sharding_constraint", "48_jit_in_shardings", "49_shard_map_normalize"):
        exe, ref = _compiled(name)
        out = exe(*BY_NAME[name].args)
        assert len(exe.devices) == 8
        leaves = jax.tree.leaves(out)
        assert all(isinstance(x.sharding, NamedSharding) for x in leaves)
        assert any(len(x.sharding.device_set) == 8 for x in leaves)
        _assert_same_placement(out, ref)


# ----------------------------------------------------------- compile timing
def _unique_fn(scale):
    # A fresh constant makes a fresh XLA module, so no cached executable is reused.
    def f(x, y):
        return jnp.tanh(x * scale) @ y
    return f


def test_compilation_happens_in_compile_not_at_call():
    f = _unique_fn(1.2345)
    x, y = jnp.ones((4, 3)), jnp.ones((3, 2))
    x2 = x + 1.0
    program = jaxpr_cc.trace(f, x, y)
    with count_compiles() as at_compile:
        exe = jaxpr_cc.compile(program)
    with count_compiles() as at_call:
        out = exe(x, y)
        exe(x2, y)
    assert len(at_compile) == 1 and at_call == []
    assert_trees_equal(out, jax.jit(f)(x, y))


# ---------------------------------------------------------------- params
def _program_with_params(f, params, *args):
    """A Program whose leading inputs are bound parameters, as hoist-consts makes."""
    closed = jax.make_jaxpr(f)(*params, *args)
    out_shape = jax.eval_shape(f, *params, *args)
    program = jaxpr_cc.Program.from_jaxpr(closed)
    return program.replace(in_tree=jax.tree.structure((tuple(args), {})),
                           out_tree=jax.tree.structure(out_shape), params=tuple(params))


def _layer(w, b, x):
    return jnp.tanh(x @ w + b)


def test_with_params_rebinds_without_recompiling():
    w = jnp.linspace(-1.0, 1.0, 12, dtype=jnp.float32).reshape(4, 3)
    b = jnp.float32(0.25)
    x = jnp.cos(jnp.arange(8, dtype=jnp.float32)).reshape(2, 4)
    exe = jaxpr_cc.compile(_program_with_params(_layer, (w, b), x))
    ref = jax.jit(_layer)
    assert_trees_equal(exe(x), ref(w, b, x))
    w2, b2 = w * 3.0, jnp.float32(-1.5)
    with count_compiles() as events:
        exe2 = exe.with_params(w2, b2)
        out2 = exe2(x)
    assert events == []
    assert exe2.compiled is exe.compiled
    assert_trees_equal(out2, ref(w2, b2, x))
    assert_trees_equal(exe(x), ref(w, b, x))  # the original keeps its parameters
    with pytest.raises(ValueError, match=r"parameter 0 must be f32\[4,3\], got f32\[3,4\]"):
        exe.with_params(w.T, b)
    with pytest.raises(TypeError, match="takes 2 value"):
        exe.with_params(w)


# ------------------------------------------------------------- inspection
def test_cost_memory_and_text_match_jax():
    f = _unique_fn(0.75)
    x, y = jnp.ones((16, 8)), jnp.ones((8, 4))
    exe = jaxpr_cc.compile(jaxpr_cc.trace(f, x, y))
    ref = jax.jit(f).lower(x, y).compile()
    assert exe.cost_analysis()["flops"] == ref.cost_analysis()["flops"]
    ours_mem, ref_mem = exe.memory_analysis(), ref.memory_analysis()
    assert ours_mem.argument_size_in_bytes == ref_mem.argument_size_in_bytes
    assert ours_mem.output_size_in_bytes == ref_mem.output_size_in_bytes
    stablehlo = exe.as_text("stablehlo")
    assert "func.func public @main" in stablehlo and "stablehlo.dot_general" in stablehlo
    hlo = exe.as_text("hlo")
    assert "HloModule" in hlo and "ENTRY" in hlo
    with pytest.raises(ValueError, match="as_text kind must be one of"):
        exe.as_text("llvm")


def test_in_shardings_option_places_arguments():
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("x", "y"))
    rows = NamedSharding(mesh, P("x", None))

    def f(x, w):
        return jnp.sin(x) @ w
    x = jnp.linspace(-1.0, 1.0, 48, dtype=jnp.float32).reshape(8, 6)
    w = jnp.ones((6, 4), jnp.float32)
    exe = jaxpr_cc.compile(jaxpr_cc.trace(f, x, w), in_shardings=(rows, None))
    ref = jax.jit(f, in_shardings=(rows, None))(x, w)
    out = exe(x, w)
    assert_trees_equal(out, ref)
    assert out.sharding == ref.sharding
    (x_sharding, _), _ = exe.input_shardings
    assert x_sharding.is_equivalent_to(rows, 2)
    with pytest.raises(ValueError, match="pytree prefix of the positional arguments"):
        jaxpr_cc.compile(jaxpr_cc.trace(f, x, w), in_shardings=(rows, None, None))


# -------------------------------------------------------- calling convention
State = collections.namedtuple("State", ["h", "c"])


def _cell(params, state, x, *, gain):
    h = jnp.tanh(params["w"] @ x + state.h * gain)
    return State(h=h, c=state.c + h), {"norm": jnp.sum(h * h)}


def _cell_args():
    params = {"w": jnp.linspace(-1, 1, 6, dtype=jnp.float32).reshape(3, 2)}
    state = State(jnp.zeros(3, jnp.float32), jnp.ones(3, jnp.float32))
    return (params, state, jnp.array([0.5, -0.25], jnp.float32)), {"gain": jnp.float32(0.9)}


def test_pytrees_and_keyword_arguments():
    args, kwargs = _cell_args()
    exe = jaxpr_cc.compile(jaxpr_cc.trace(_cell, *args, **kwargs))
    out = exe(*args, **kwargs)
    assert_trees_equal(out, jax.jit(_cell)(*args, **kwargs))
    assert isinstance(out[0], State)
    with pytest.raises(TypeError, match="arguments have structure"):
        exe(args[0], tuple(args[1]), args[2], **kwargs)


def test_donated_arguments_are_consumed_like_jax_jit():
    def f(x, y):
        return x * 2.0 + y
    exe = jaxpr_cc.compile(jaxpr_cc.trace(f, jnp.ones(5), jnp.ones(5)), donate_argnums=0)
    ours_x, ref_x, y = jnp.arange(5.0), jnp.arange(5.0), jnp.ones(5)
    out = exe(ours_x, y)
    ref = jax.jit(f, donate_argnums=0)(ref_x, y)
    assert_trees_equal(out, ref)
    assert ours_x.is_deleted() == ref_x.is_deleted()
    assert not y.is_deleted()


def test_compile_rejects_functions():
    with pytest.raises(TypeError, match="use jaxpr_cc.jit for Python functions"):
        jaxpr_cc.compile(lambda x: x)


# ------------------------------------------------------------ save and load
ROUND_TRIP = ["01_elementwise_math", "02_python_scalars", "17_lstm_pytree_carry",
              "41_namedtuple_state", "47_sharding_constraint", "49_shard_map_normalize",
              "51_large_constant"]
SAVABLE = sorted(n for n in BY_NAME if "debug_print" not in BY_NAME[n].tags
                 and "debug_callback" not in BY_NAME[n].tags)


def _round_trip(name, tmp_path):
    exe, ref = _compiled(name)
    path = str(tmp_path / f"{name}.jxe")
    exe.save(path)
    loaded = xla.load_executable(path)
    out = loaded(*BY_NAME[name].args)
    # A namedtuple comes back as the class its module defines now; the corpus loader
    # may have re-imported that module since `ref` was made, so compare structures by
    # their saved form (names and fields) and leaves exactly.
    tree_code = functools.partial(xla_archive.encode_treedef, where="result")
    assert tree_code(jax.tree.structure(out)) == tree_code(jax.tree.structure(ref))
    assert_trees_equal(jax.tree.leaves(out), jax.tree.leaves(ref), exact=True)
    _assert_same_placement(out, ref)


@pytest.mark.parametrize("name", ROUND_TRIP)
def test_save_load_round_trip(name, tmp_path):
    _round_trip(name, tmp_path)


@pytest.mark.heavy
@pytest.mark.parametrize("name", [n for n in SAVABLE if n not in ROUND_TRIP])
def test_save_load_round_trip_whole_corpus(name, tmp_path):
    _round_trip(name, tmp_path)


def test_saved_params_of_every_kind_round_trip(tmp_path):
    def f(w, key, scale, x):
        y = x @ w.astype(jnp.float32)
        return y * scale + jax.random.normal(key, y.shape, jnp.float32)
    w = jnp.linspace(-2, 2, 6).reshape(3, 2).astype(jnp.bfloat16)
    key = jax.random.key(7)
    scale = np.float16(1.5)
    x = jnp.ones((4, 3), jnp.float32)
    exe = jaxpr_cc.compile(_program_with_params(f, (w, key, scale), x))
    path = str(tmp_path / "params.jxe")
    exe.save(path)
    loaded = xla.load_executable(path)
    assert_trees_equal(loaded(x), jax.jit(f)(w, key, scale, x))
    assert_trees_equal(loaded.params, exe.params)


def test_loaded_executable_accepts_new_params_and_python_scalars(tmp_path):
    w = jnp.ones((4, 3), jnp.float32)
    x = jnp.arange(8, dtype=jnp.float32).reshape(2, 4)

    def f(w, x, s):
        return _layer(w, s, x)
    exe = jaxpr_cc.compile(_program_with_params(f, (w,), x, 0.5))
    path = str(tmp_path / "layer.jxe")
    exe.save(path)
    loaded = xla.load_executable(path)
    assert_trees_equal(loaded(x, 0.5), jax.jit(f)(w, x, 0.5))
    w2 = -w
    assert_trees_equal(loaded.with_params(w2)(x, 0.25), jax.jit(f)(w2, x, 0.25))


def test_saving_is_deterministic(tmp_path):
    exe, _ = _compiled("51_large_constant")
    a, b = tmp_path / "a.jxe", tmp_path / "b.jxe"
    exe.save(str(a))
    exe.save(str(b))
    assert a.read_bytes() == b.read_bytes()
    assert xla.is_executable_file(str(a))
    assert not xla.is_executable_file(__file__)


def test_programs_with_host_callbacks_cannot_be_saved(tmp_path):
    exe, _ = _compiled("34_debug_callback")
    path = tmp_path / "cb.jxe"
    with pytest.raises(jaxpr_cc.SaveError, match="call back into Python"):
        exe.save(str(path))
    assert not path.exists()


def _rewrite(src, dst, edit_manifest=None, edit_members=None):
    """Copy an executable file, changing its manifest or members (checksums redone)."""
    with zipfile.ZipFile(src) as zf:
        manifest = json.loads(zf.read(xla_archive.MANIFEST))
        members = {n: zf.read(n) for n in zf.namelist() if n != xla_archive.MANIFEST}
    if edit_manifest:
        edit_manifest(manifest)
    if edit_members:
        edit_members(members)
    xla_archive.write_archive(str(dst), manifest, members)


@pytest.fixture(scope="module")
def saved_file(tmp_path_factory):
    exe, _ = _compiled("17_lstm_pytree_carry")
    path = tmp_path_factory.mktemp("exe") / "lstm.jxe"
    exe.save(str(path))
    return path


def test_load_rejects_corrupt_files(saved_file, tmp_path):
    data = bytearray(saved_file.read_bytes())
    # Flip a byte inside the stored (uncompressed) program bytes.
    with zipfile.ZipFile(saved_file) as zf:
        info = zf.getinfo(xla_archive.EXPORTED)
    at = info.header_offset + 30 + len(info.filename) + len(info.extra) + 100
    data[at] ^= 0xFF
    bad = tmp_path / "bad.jxe"
    bad.write_bytes(bytes(data))
    with pytest.raises(jaxpr_cc.LoadError, match="member 'exported.bin' is damaged"):
        xla.load_executable(str(bad))
    # A member replaced wholesale (consistent zip, stale manifest): our own checksums.
    swapped = tmp_path / "swapped.jxe"
    with zipfile.ZipFile(saved_file) as src, zipfile.ZipFile(swapped, "w") as dst:
        for name in src.namelist():
            body = src.read(name)
            dst.writestr(name, body[:-1] + b"!" if name == xla_archive.EXPORTED else body)
    with pytest.raises(jaxpr_cc.LoadError, match="checksum mismatch in 'exported.bin'"):
        xla.load_executable(str(swapped))
    junk = tmp_path / "junk.jxe"
    junk.write_bytes(b"not a zip at all")
    with pytest.raises(jaxpr_cc.LoadError, match="not a zip archive"):
        xla.load_executable(str(junk))
    with pytest.raises(jaxpr_cc.LoadError, match="no such file"):
        xla.load_executable(str(tmp_path / "missing.jxe"))


def test_load_refuses_newer_versions(saved_file, tmp_path):
    newer_format = tmp_path / "format.jxe"
    _rewrite(saved_file, newer_format, lambda m: m.update(format_version=99))
    with pytest.raises(jaxpr_cc.LoadError, match="format version 99.*reads versions up to 1"):
        xla.load_executable(str(newer_format))
    newer_jax = tmp_path / "jax.jxe"
    _rewrite(saved_file, newer_jax, lambda m: m["producer"].update(jax="99.0.0"))
    with pytest.raises(jaxpr_cc.LoadError,
                       match=rf"JAX 99\.0\.0, newer than this process's JAX {jax.__version__}"):
        xla.load_executable(str(newer_jax))


def test_load_runs_no_code_from_the_file(saved_file, tmp_path):
    evil_tree = tmp_path / "tree.jxe"
    payload = "__import__('os').system('touch pwned')"

    def plant(manifest):
        manifest["in_tree"] = {"namedtuple": payload, "module": "os", "fields": ["a"],
                               "children": ["*"]}
    _rewrite(saved_file, evil_tree, plant)
    with pytest.raises(jaxpr_cc.LoadError, match="in_tree"):
        xla.load_executable(str(evil_tree))
    assert not (tmp_path / "pwned").exists()

    with_params = tmp_path / "params.jxe"
    exe_with_params = jaxpr_cc.compile(
        _program_with_params(_layer, (jnp.ones((4, 3)), jnp.float32(0.0)), jnp.ones((2, 4))))
    exe_with_params.save(str(with_params))
    pickled = tmp_path / "pickled.jxe"

    def pickle_param(members):
        import io
        buf = io.BytesIO()
        np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
        members["params/0.npy"] = buf.getvalue()
    _rewrite(with_params, pickled, edit_members=pickle_param)
    with pytest.raises(jaxpr_cc.LoadError, match="parameter 0"):
        xla.load_executable(str(pickled))


def test_sharded_executable_needs_its_devices(tmp_path):
    exe, _ = _compiled("47_sharding_constraint")
    path = tmp_path / "sharded.jxe"
    exe.save(str(path))
    script = textwrap.dedent(f"""
        import jaxpr_cc
        from jaxpr_cc.backends.xla import load_executable
        try:
            load_executable({str(path)!r})
        except jaxpr_cc.LoadError as e:
            print("LOADERROR", e)
    """)
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1")
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, timeout=120)
    assert "LOADERROR" in res.stdout, res.stderr
    assert "runs on 8 devices" in res.stdout
    assert "xla_force_host_platform_device_count=8" in res.stdout


# --------------------------------------------------------------------- CLI
def test_cli_compile_writes_a_loadable_executable(tmp_path, capsys):
    from jaxpr_cc.cli.main import main
    src = tmp_path / "model.py"
    src.write_text(textwrap.dedent("""
        import jax.numpy as jnp
        W = jnp.linspace(-1.0, 1.0, 12, dtype=jnp.float32).reshape(3, 4)

        def predict(x, bias):
            return jnp.tanh(W @ x + bias)
    """))
    out = tmp_path / "model.jxe"
    code = main(["compile", f"{src}:predict", "--args", "f32[4], f32[]", "-o", str(out),
                 "--show", "cost"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert json.loads(captured.out)["flops"] > 0
    assert f"wrote {out}" in captured.err
    loaded = xla.load_executable(str(out))
    W = jnp.linspace(-1.0, 1.0, 12, dtype=jnp.float32).reshape(3, 4)
    x, bias = jnp.arange(4, dtype=jnp.float32), jnp.float32(0.5)
    assert_trees_equal(loaded(x, bias), jax.jit(lambda x, b: jnp.tanh(W @ x + b))(x, bias))
    assert len(loaded.params) == 1  # the default pipeline hoisted W into a parameter

    code = main(["compile", f"{src}:predict", "--args", "f32[4], f32[]", "-o", str(out),
                 "-p", "no-such-pass"])
    assert code == 2
    assert "unknown pass 'no-such-pass'" in capsys.readouterr().err


def test_saved_executable_keeps_weakly_typed_results(tmp_path):
    # A Python-scalar result is weakly typed in jax.jit, so it does not promote a
    # bfloat16 operand later; a saved and loaded executable must agree.
    def f(x):
        return x * 2, 2.5, 3

    x = jnp.ones(3, jnp.bfloat16)
    path = tmp_path / "f.jxe"
    jaxpr_cc.jit(f).executable(x).save(path)
    got = xla.load_executable(path)(x)
    want = jax.jit(f)(x)
    assert [r.weak_type for r in got] == [r.weak_type for r in want] == [False, True, True]
    assert (got[1] + x).dtype == (want[1] + x).dtype == jnp.bfloat16
