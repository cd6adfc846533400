"""The ``jaxpr-cc`` command line, end to end through subprocesses as a user runs it:
trace -> show / emit / exec, results compared with JAX on the original function;
bad input exits with code 2 and one line on stderr."""
from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_cc
import jaxpr_cc.io  # jaxpr_cc.io.dumps below; the package loads its modules lazily
from jaxpr_cc.cli import main as cli_main
from jaxpr_cc.cli.cmd_show import colourize
from jaxref import assert_trees_equal

MODEL = textwrap.dedent('''
    import jax, jax.numpy as jnp

    def loss(w, x, *, scale=1.0):
        h = jnp.tanh(x @ w)
        return {"total": (h * scale).sum(), "hidden": h}

    def example_args():
        return (jnp.ones((3, 2)), jnp.ones((4, 3)))

    def example_kwargs():
        return {"scale": 2.0}

    def keyed(key, x):
        return x + jax.random.normal(key, x.shape), jax.random.split(key)

    def half(x):
        return (x.astype(jnp.bfloat16) * 3).astype(jnp.float32), x.astype(jnp.bfloat16)

    def broken(x):
        raise RuntimeError("this model is broken")
''')

W = np.linspace(-1, 1, 6, dtype=np.float32).reshape(3, 2)
X = np.linspace(0, 2, 12, dtype=np.float32).reshape(4, 3)


def _command() -> list[str]:
    script = os.path.join(os.path.dirname(sys.executable), "jaxpr-cc")
    return [script] if os.path.exists(script) else [sys.executable, "-m", "jaxpr_cc.cli.main"]


def run(*args, cwd, stdin: bytes | None = None, check_code: int | None = 0):
    proc = subprocess.run(_command() + [str(a) for a in args], cwd=cwd, input=stdin,
                          capture_output=True, timeout=300)
    if check_code is not None:
        assert proc.returncode == check_code, (args, proc.returncode, proc.stderr.decode()[-2000:])
    return proc


def run_many(*jobs, cwd) -> list:
    """Independent commands, two at a time (each start-up imports JAX)."""
    import concurrent.futures
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(lambda job: run(*job, cwd=cwd, check_code=None), jobs))


def one_line_error(proc, code: int = 2) -> str:
    err = proc.stderr.decode()
    assert proc.returncode == code, (proc.returncode, err)
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    (d / "model.py").write_text(MODEL)
    return d


def _model(filename: str = "model.py"):
    """model.py's functions; ``filename`` is the source location a trace records
    (saved programs keep it: JAX's debug info names the traced function)."""
    namespace: dict = {}
    exec(compile(MODEL, filename, "exec"), namespace)
    return namespace


@pytest.fixture(scope="module")
def traced(work):
    """model.py:loss traced from a shape spec, from concrete arrays, and from the
    module's own example arguments."""
    run("trace", "model.py:loss", "--args", "f32[3,2], f32[4,3]", "-o", "spec.jcc", cwd=work)
    np.savez(work / "args.npz", arg0=W, arg1=X)
    run("trace", "model.py:loss", "--args-from", "args.npz", "-o", "npz.jcc", cwd=work)
    return work


def test_trace_writes_the_program_jax_traces(traced):
    loss = _model()["loss"]
    expected = jaxpr_cc.trace(loss, jax.ShapeDtypeStruct((3, 2), jnp.float32),
                              jax.ShapeDtypeStruct((4, 3), jnp.float32))
    from_spec = jaxpr_cc.load(traced / "spec.jcc")
    assert str(from_spec) == str(expected)
    # concrete example arrays give the same program as their shapes
    assert str(jaxpr_cc.load(traced / "npz.jcc")) == str(from_spec)


def test_show_prints_the_ir_plain_in_a_pipe(traced):
    proc = run("show", "spec.jcc", cwd=traced)
    text = proc.stdout.decode()
    assert text == str(jaxpr_cc.load(traced / "spec.jcc"))
    assert "\x1b[" not in text and proc.stderr == b""
    coloured = run("show", "spec.jcc", "--color", "always", cwd=traced).stdout.decode()
    assert "\x1b[" in coloured and coloured == colourize(text)


def test_trace_to_stdout_pipes_into_show(traced):
    """`trace -o -` with the module's example_args()/example_kwargs(), piped into
    `show -`."""
    saved = run("trace", "model.py:loss", "-o", "-", cwd=traced).stdout
    shown = run("show", "-", cwd=traced, stdin=saved).stdout.decode()
    namespace = _model(str(traced / "model.py"))
    expected = jaxpr_cc.trace(namespace["loss"], *namespace["example_args"](),
                              **namespace["example_kwargs"]())
    assert shown == str(expected)
    assert saved == jaxpr_cc.io.dumps(expected)


def test_exec_matches_jax_on_the_original_function(traced):
    loss = _model()["loss"]
    expected = jax.tree_util.tree_leaves(jax.jit(loss)(W, X))
    np.savez(traced / "by_name.npz", w=W, x=X)
    for inputs, out in (("args.npz", "out.npz"), ("by_name.npz", "-")):
        proc = run("exec", "npz.jcc", "--inputs", inputs, "-o", out, cwd=traced)
        data = np.load(traced / out) if out != "-" else np.load(io.BytesIO(proc.stdout))
        assert sorted(data.files) == [f"out{i}" for i in range(len(expected))]
        assert_trees_equal([data[f"out{i}"] for i in range(len(expected))],
                           [np.asarray(e) for e in expected])


def test_exec_keys_and_bfloat16(work):
    key = jax.random.key(5)
    x = np.arange(3, dtype=np.float32)
    program = jaxpr_cc.trace(_model()["keyed"], key, x)
    program.save(work / "keyed.jcc")
    np.savez(work / "keyed_in.npz", arg0=np.asarray(jax.random.key_data(key)), arg1=x)
    run("exec", "keyed.jcc", "--inputs", "keyed_in.npz", "-o", "keyed_out.npz", cwd=work)
    got = np.load(work / "keyed_out.npz")
    value, keys = _model()["keyed"](key, x)
    np.testing.assert_array_equal(got["out0"], np.asarray(value))
    np.testing.assert_array_equal(got["out1"], np.asarray(jax.random.key_data(keys)))

    run("trace", "model.py:half", "--args", "f32[3]", "-o", "half.jcc", cwd=work)
    np.savez(work / "half_in.npz", arg0=np.array([1.5, -2.0, 0.25], np.float32))
    run("exec", "half.jcc", "--inputs", "half_in.npz", "-o", "half_out.npz", cwd=work)
    out = np.load(work / "half_out.npz")
    ref = _model()["half"](jnp.array([1.5, -2.0, 0.25], jnp.float32))
    np.testing.assert_array_equal(out["out0"], np.asarray(ref[0]))
    # numpy keeps bfloat16 as raw 2-byte items; their bits are JAX's
    assert out["out1"].view(jnp.bfloat16).tobytes() == np.asarray(ref[1]).tobytes()


def test_emit_every_form(traced):
    program = jaxpr_cc.load(traced / "spec.jcc")
    as_jaxpr, as_stablehlo, _, _ = procs = run_many(
        ("emit", "spec.jcc", "--to", "jaxpr"),
        ("emit", "spec.jcc", "--to", "stablehlo"),
        ("emit", "spec.jcc", "--to", "hlo", "-o", "spec.hlo"),
        ("emit", "spec.jcc", "--to", "python", "-o", "emitted.py"),
        cwd=traced)
    assert all(p.returncode == 0 for p in procs), [p.stderr.decode()[-500:] for p in procs]
    assert as_jaxpr.stdout.decode().strip() == str(program.to_jaxpr()).strip()
    stablehlo = as_stablehlo.stdout.decode()
    assert "stablehlo.dot_general" in stablehlo and "func.func public @main" in stablehlo
    hlo = (traced / "spec.hlo").read_text()
    assert hlo.startswith("HloModule jit_loss") and "dot(" in hlo
    namespace: dict = {}
    exec(compile((traced / "emitted.py").read_text(), "emitted.py", "exec"), namespace)
    loss = _model()["loss"]
    assert_trees_equal(jax.jit(namespace["loss"])(W, X), jax.jit(loss)(W, X))


def test_trace_imports_a_module_of_the_current_directory_by_name(traced):
    run("trace", "model:loss", "--args", "f32[3,2], f32[4,3]", "-o", "by_module.jcc", cwd=traced)
    assert jaxpr_cc.load(traced / "by_module.jcc").name == "loss"


def test_exec_runs_a_compiled_executable(traced):
    program = jaxpr_cc.load(traced / "npz.jcc")
    jaxpr_cc.compile(program).save(str(traced / "loss.xla"))
    run("exec", "loss.xla", "--inputs", "args.npz", "-o", "xla_out.npz", cwd=traced)
    got = np.load(traced / "xla_out.npz")
    expected = jax.tree_util.tree_leaves(jax.jit(_model()["loss"])(W, X))
    assert_trees_equal([got["out0"], got["out1"]], [np.asarray(e) for e in expected])
    # An executable keeps no argument names: arrays named as `show` prints them for
    # the saved program are refused in one line that says so.
    np.savez(traced / "named.npz", w=W, x=X)
    proc = run("exec", "loss.xla", "--inputs", "named.npz", "-o", "o.npz", cwd=traced,
               check_code=2)
    assert "not in executables" in one_line_error(proc)


def test_bad_input_is_one_line_with_exit_code_2(traced):
    np.savez(traced / "wrong.npz", a=W)
    # (a float64 array would be taken as float32 without x64, as a Program call takes it)
    np.savez(traced / "wrong_dtype.npz", arg0=W.astype(np.int32), arg1=X)
    procs = run_many(
        ("trace", "model.py:loss", "--args", "f32[3,", "-o", "x.jcc"),
        ("trace", "model.py:nothing", "--args", "f32[3]", "-o", "x.jcc"),
        ("trace", "model.py:broken", "--args", "f32[3]", "-o", "x.jcc"),
        ("show", "missing.jcc"),
        ("exec", "npz.jcc", "--inputs", "wrong.npz", "-o", "o.npz"),
        ("exec", "npz.jcc", "--inputs", "wrong_dtype.npz", "-o", "o.npz"),
        cwd=traced)
    errors = [one_line_error(p) for p in procs]
    assert "--args" in errors[0]
    assert "model.py" in errors[1] and "nothing" in errors[1]
    assert "tracing failed" in errors[2] and "this model is broken" in errors[2]
    assert "missing.jcc: no such file" in errors[3]
    assert "wrong.npz" in errors[4] and "arg0" in errors[4] and "w, x" in errors[4]
    assert "arg0 is int32[3, 2]" in errors[5] and "float32[3,2]" in errors[5]
    assert not (traced / "x.jcc").exists() and not (traced / "o.npz").exists()


def test_debug_shows_the_traceback(traced):
    proc = run("--debug", "show", "missing.jcc", cwd=traced, check_code=2)
    assert "Traceback" in proc.stderr.decode()


# ---------------------------------------------------- in-process: help, colour
@pytest.mark.parametrize("command", ["trace", "show", "emit", "exec"])
def test_every_subcommand_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main.main([command, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: jaxpr-cc " + command)


def test_help_lists_the_subcommands(work):
    out = run("--help", cwd=work).stdout.decode()
    for command in ("trace", "show", "emit", "exec"):
        assert command in out


def test_colour_only_on_a_terminal(monkeypatch):
    from jaxpr_cc.cli.cmd_show import use_colour

    class Tty(io.StringIO):
        def isatty(self):
            return True
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert use_colour("auto", Tty()) and not use_colour("auto", io.StringIO())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not use_colour("auto", Tty()) and use_colour("always", io.StringIO())


def test_progress_only_on_a_terminal():
    from jaxpr_cc.cli import progress as progress_module

    class Tty(io.StringIO):
        def isatty(self):
            return True
    pipe, tty = io.StringIO(), Tty()
    with progress_module.progress("quiet", stream=pipe):
        pass
    assert pipe.getvalue() == ""
    import time
    old = progress_module._FIRST_DELAY
    progress_module._FIRST_DELAY = 0.0
    try:
        with progress_module.progress("tracing f", stream=tty):
            time.sleep(0.3)
    finally:
        progress_module._FIRST_DELAY = old
    assert "tracing f ..." in tty.getvalue() and tty.getvalue().endswith("\r\x1b[2K")


def test_exec_takes_inputs_as_a_program_call_does(work):
    """Without x64 a float64 array is a float32 argument (as for a Program call and
    jax.jit); integers are never read as the bits of a bfloat16, while a bfloat16
    .npy (numpy stores its raw 2-byte items) is."""
    (work / "dbl.py").write_text("def double(x):\n    return x * 2\n")
    run_many(("trace", "dbl.py:double", "--args", "f32[2]", "-o", "f32.jcc"),
             ("trace", "dbl.py:double", "--args", "bf16[2]", "-o", "bf16.jcc"), cwd=work)
    np.savez(work / "f64.npz", arg0=np.array([1.5, 2.5]))
    np.savez(work / "u16.npz", arg0=np.array([16256, 16384], np.uint16))
    np.savez(work / "bf16.npz", arg0=np.asarray(jnp.array([1.0, 2.0], jnp.bfloat16)))
    run("exec", "f32.jcc", "--inputs", "f64.npz", "-o", "f64_out.npz", cwd=work)
    want = jax.jit(lambda x: x * 2)(np.array([1.5, 2.5]))
    np.testing.assert_array_equal(np.load(work / "f64_out.npz")["out0"], np.asarray(want))
    message = one_line_error(run("exec", "bf16.jcc", "--inputs", "u16.npz", "-o", "u_out.npz",
                                 cwd=work, check_code=2))
    assert "uint16" in message and "bfloat16" in message
    assert not (work / "u_out.npz").exists()
    run("exec", "bf16.jcc", "--inputs", "bf16.npz", "-o", "bf_out.npz", cwd=work)
    got = np.load(work / "bf_out.npz")["out0"].view(jnp.bfloat16)
    want = jax.jit(lambda x: x * 2)(jnp.array([1.0, 2.0], jnp.bfloat16))
    assert got.tobytes() == np.asarray(want).tobytes()
