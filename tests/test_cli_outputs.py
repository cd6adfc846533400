"""Where jaxpr-cc writes, and the command line's rough edges (issue 18).

* The one file writer (``jaxpr_cc.storage.atomic``): a regular file is replaced atomically
  with the user's umask (a replaced file keeps its mode), a FIFO or device is written
  in place and never replaced, a symlink's target is written and the link kept.
* ``-o -`` is stdout on every subcommand that writes; CLI outputs get the umask.
* ``jaxpr-cc demo`` terminates for every ``--b``; the example solver is capped.
* Trace errors name the user's function; ``--debug`` after the subcommand;
  ``trace FILE.py:F`` imports modules next to FILE.py; ``exec --inputs x.npy``;
  constant outputs are jax.Arrays; ``--version``.
"""
from __future__ import annotations

import argparse
import io
import os
import stat
import subprocess
import sys
import textwrap
import threading
import zipfile

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
import pytest

import jaxpr_cc
from jaxpr_cc.cli import cmd_demo
from jaxpr_cc.cli.main import build_parser, main
from jaxpr_cc.examples import fixed_point as ex
from jaxpr_cc.io import SaveError, dumps, loads
from jaxpr_cc.storage.atomic import write_bytes, write_file
from jaxref import assert_trees_equal

MODEL = textwrap.dedent('''
    import jax.numpy as jnp

    def f(x):
        return jnp.sin(x) * 2.0 + 1.0

    def two(x, y):
        return x * y

    def branchy(x):
        if x > 0:
            return x
        return -x
''')
X = np.linspace(-1.0, 2.0, 5, dtype=np.float32)


def f_reference(x):
    return jnp.sin(x) * 2.0 + 1.0


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.fixture
def null_device(tmp_path):
    """A character device that discards what is written: /dev/null itself, except as
    root, where a writer that wrongly replaced it would break the machine; root gets
    its own node of the same device instead."""
    if os.geteuid() != 0:
        return "/dev/null"
    path = tmp_path / "null"
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    return str(path)


def _is_null_device(path) -> bool:
    st = os.lstat(path)
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3)


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(MODEL)
    return path


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _leftovers(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


class FifoReader:
    """Reads a FIFO to its end on a thread (a writer's open() waits for a reader)."""

    def __init__(self, path):
        self.data = None
        self._thread = threading.Thread(target=self._read, args=(path,), daemon=True)
        self._thread.start()

    def _read(self, path):
        with open(path, "rb") as f:
            self.data = f.read()

    def result(self) -> bytes:
        self._thread.join(timeout=120)
        assert not self._thread.is_alive(), "the FIFO's reader never saw end of file"
        return self.data


# ------------------------------------------------------------- the file writer
@pytest.mark.parametrize("umask, expected", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_new_files_get_the_umask(tmp_path, umask, expected):
    old = os.umask(umask)
    try:
        write_bytes(tmp_path / "new.bin", b"data")
    finally:
        os.umask(old)
    assert (tmp_path / "new.bin").read_bytes() == b"data"
    assert _mode(tmp_path / "new.bin") == expected
    assert _leftovers(tmp_path) == []


def test_a_replaced_regular_file_keeps_its_mode_and_is_a_new_file(tmp_path, umask_022):
    target = tmp_path / "old.bin"
    target.write_bytes(b"old content, longer than the new one")
    os.chmod(target, 0o600)
    inode = os.stat(target).st_ino
    write_bytes(target, b"new")
    assert target.read_bytes() == b"new"
    assert _mode(target) == 0o600
    assert os.stat(target).st_ino != inode  # renamed into place, not rewritten
    assert _leftovers(tmp_path) == []


def test_a_symlink_is_followed_and_kept(tmp_path, umask_022):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = elsewhere / "real.bin"
    target.write_bytes(b"old")
    link = tmp_path / "link.bin"
    link.symlink_to(target)
    write_bytes(link, b"through the link")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_bytes() == b"through the link"
    assert _leftovers(tmp_path) == [] and _leftovers(elsewhere) == []
    # a dangling link: its target is created (as the shell's `>` does)
    dangling = tmp_path / "dangling.bin"
    dangling.symlink_to(elsewhere / "created.bin")
    write_bytes(dangling, b"created")
    assert dangling.is_symlink() and (elsewhere / "created.bin").read_bytes() == b"created"
    assert _mode(elsewhere / "created.bin") == 0o644


def test_a_fifo_is_written_in_place(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = FifoReader(fifo)
    arrays = {"a": np.arange(6.0).reshape(2, 3), "b": np.array([1, 2], np.int32)}
    # np.savez seeks while writing a zip: the writer gets a seekable file even here
    write_file(fifo, lambda f: np.savez(f, **arrays))
    with np.load(io.BytesIO(reader.result())) as got:
        assert_trees_equal(dict(got), arrays)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert _leftovers(tmp_path) == []


def test_a_symlink_to_a_fifo_writes_the_fifo(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    link = tmp_path / "link"
    link.symlink_to(fifo)
    reader = FifoReader(fifo)
    write_bytes(link, b"x" * 200_000)  # more than a pipe's buffer
    assert reader.result() == b"x" * 200_000
    assert link.is_symlink() and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_device_is_never_replaced(null_device):
    inode = os.stat(null_device).st_ino
    write_bytes(null_device, b"discarded")
    assert _is_null_device(null_device) and os.stat(null_device).st_ino == inode


def test_directories_are_refused(tmp_path):
    with pytest.raises(SaveError, match="is a directory"):
        write_bytes(tmp_path, b"x")
    with pytest.raises(SaveError, match="does not exist"):
        write_bytes(tmp_path / "no" / "such" / "dir.bin", b"x")


def test_save_follows_the_same_rules(tmp_path, umask_022, null_device):
    program = jaxpr_cc.trace(f_reference, X)
    data = dumps(program)
    jaxpr_cc.save(program, tmp_path / "p.jcc")
    assert _mode(tmp_path / "p.jcc") == 0o644
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = FifoReader(fifo)
    program.save(fifo)
    assert reader.result() == data
    jaxpr_cc.save(program, null_device)
    assert _is_null_device(null_device)
    link = tmp_path / "link.jcc"
    link.symlink_to(tmp_path / "p.jcc")
    jaxpr_cc.save(program, link)
    assert link.is_symlink()
    np.testing.assert_allclose(jaxpr_cc.load(link)(X), f_reference(X), rtol=1e-6)


# ------------------------------------------------------------ the command line
def _stdout_of(argv, capsysbinary) -> bytes:
    assert main([str(a) for a in argv]) == 0, capsysbinary.readouterr().err.decode()
    return capsysbinary.readouterr().out


def test_dash_o_dash_is_stdout_on_every_writing_subcommand(model, tmp_path, capsysbinary,
                                                           monkeypatch):
    monkeypatch.chdir(tmp_path)
    target = f"{model}:f"
    traced = loads(_stdout_of(["trace", target, "--args", "f32[5]", "-o", "-"], capsysbinary))
    np.testing.assert_allclose(traced(X), f_reference(X), rtol=1e-6)
    saved = tmp_path / "f.jcc"
    jaxpr_cc.save(traced, saved)

    optimized = loads(_stdout_of(["opt", saved, "-p", "cse,dce", "-o", "-"], capsysbinary))
    np.testing.assert_allclose(optimized(X), f_reference(X), rtol=1e-6)

    compiled = _stdout_of(["compile", saved, "-o", "-"], capsysbinary)
    assert zipfile.is_zipfile(io.BytesIO(compiled))
    (tmp_path / "f.jxe").write_bytes(compiled)
    from jaxpr_cc.backends.xla import load_executable
    np.testing.assert_allclose(load_executable(str(tmp_path / "f.jxe"))(X), f_reference(X),
                               rtol=1e-6)

    emitted = _stdout_of(["emit", saved, "--to", "jaxpr", "-o", "-"], capsysbinary).decode()
    assert "sin" in emitted and "lambda" in emitted

    np.savez(tmp_path / "in.npz", arg0=X)
    with np.load(io.BytesIO(_stdout_of(["exec", saved, "--inputs", "in.npz", "-o", "-"],
                                       capsysbinary))) as out:
        np.testing.assert_allclose(out["out0"], f_reference(X), rtol=1e-6)
    assert not (tmp_path / "-").exists()  # no file named '-' anywhere


def test_compile_to_stdout_refuses_show(model, tmp_path, capsys):
    assert main(["compile", f"{model}:f", "--args", "f32[5]", "-o", "-", "--show", "hlo"]) == 2
    err = capsys.readouterr().err
    assert "--show" in err and "-o -" in err and len(err.splitlines()) == 1


def test_cli_outputs_get_the_umask_and_keep_devices(model, tmp_path, capsys, umask_022,
                                                    null_device):
    target = f"{model}:f"
    outputs = {
        "trace": ["trace", target, "--args", "f32[5]", "-o"],
        "opt": ["opt", target, "--args", "f32[5]", "-p", "dce", "-o"],
        "compile": ["compile", target, "--args", "f32[5]", "-o"],
        "emit.py": ["emit", target, "--args", "f32[5]", "--to", "python", "-o"],
        "emit.mlir": ["emit", target, "--args", "f32[5]", "--to", "stablehlo", "-o"],
    }
    for name, argv in outputs.items():
        path = tmp_path / (name if "." in name else name + ".out")
        assert main(argv + [str(path)]) == 0, capsys.readouterr().err
        assert _mode(path) == 0o644, name
        assert main(argv + [null_device]) == 0, capsys.readouterr().err
        assert _is_null_device(null_device), name
    np.savez(tmp_path / "in.npz", arg0=X)
    assert main(["exec", str(tmp_path / "trace.out"), "--inputs", str(tmp_path / "in.npz"),
                 "-o", str(tmp_path / "out.npz")]) == 0
    assert _mode(tmp_path / "out.npz") == 0o644
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_cli_writes_a_fifo_and_follows_a_symlink(model, tmp_path, capsys):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = FifoReader(fifo)
    assert main(["trace", f"{model}:f", "--args", "f32[5]", "-o", str(fifo)]) == 0
    np.testing.assert_allclose(loads(reader.result())(X), f_reference(X), rtol=1e-6)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    (tmp_path / "real.jcc").write_bytes(b"")
    link = tmp_path / "link.jcc"
    link.symlink_to(tmp_path / "real.jcc")
    assert main(["compile", f"{model}:f", "--args", "f32[5]", "-o", str(link)]) == 0
    assert link.is_symlink() and zipfile.is_zipfile(tmp_path / "real.jcc")


# ------------------------------------------------------------------- the demo
def test_demo_range_matches_the_example():
    assert cmd_demo.B_RANGE == ex.B_RANGE


def test_demo_rejects_b_outside_its_range_in_one_line(capsys):
    for value in ("2", "-3", "nan", "inf", "two", "1e30"):
        with pytest.raises(SystemExit) as info:
            main(["demo", "--b", value])
        assert info.value.code == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and "argument --b" in err and "Traceback" not in err


def test_demo_reports_non_convergence(capsys):
    # The range check is argparse's; the demo still checks the solver itself.
    assert cmd_demo.run(argparse.Namespace(b=2.0, show_ir=False)) == 1
    out = capsys.readouterr().out
    assert f"did not converge within {ex.MAX_ITERATIONS} steps" in out
    assert out.rstrip().endswith("NOT CONVERGED")


def test_demo_terminates_for_values_that_used_to_hang(tmp_path):
    cmd = [sys.executable, "-m", "jaxpr_cc.cli.main", "demo", "--b"]
    proc = subprocess.run(cmd + ["2"], capture_output=True, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.decode().splitlines()) == 1
    # the end of the range where the iteration is slowest converges and matches the
    # implicit-function reference (the whole range: the test below)
    proc = subprocess.run(cmd + ["1"], capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()
    assert proc.stdout.decode().rstrip().endswith("match")


def test_the_example_solver_terminates_outside_its_range():
    # Each of these used to loop forever (2 oscillates; 1e6 is a contraction only on
    # paper: float32 cannot resolve steps below 0.03 there).
    script = textwrap.dedent("""
        import jax, jax.numpy as jnp, jaxpr_cc
        from jaxpr_cc.examples import fixed_point as ex
        program = jaxpr_cc.trace(ex.solve_closed_over, jnp.float32(0.7))
        for b in (2.0, -3.0, 1e6):
            b = jnp.float32(b)
            value, grad = jax.jit(program)(b), jax.jit(jax.grad(program))(b)
            x, steps, converged = ex.solve_closed_over_status(b)
            assert int(steps) == ex.MAX_ITERATIONS and not bool(converged), (b, steps)
            assert float(value) == float(jax.jit(ex.solve_closed_over)(b)), b
        print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.decode().strip() == "ok", proc.stderr.decode()


def test_the_capped_solver_matches_jax_and_the_reference_in_range():
    bs = jnp.linspace(*ex.B_RANGE, 61, dtype=jnp.float32)
    x, steps, converged = jax.jit(jax.vmap(ex.solve_closed_over_status))(bs)
    assert bool(converged.all()) and int(steps.max()) < ex.MAX_ITERATIONS
    program = jaxpr_cc.trace(ex.solve_closed_over, jnp.float32(0.7))
    np.testing.assert_allclose(jax.jit(jax.vmap(program))(bs),
                               jax.jit(jax.vmap(ex.solve_closed_over))(bs), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(jax.jit(jax.vmap(jax.grad(program)))(bs),
                               jax.vmap(ex.solve_closed_over_reference_grad)(bs),
                               rtol=1e-3, atol=1e-4)


# -------------------------------------------------------------- rough edges
def test_trace_errors_name_the_users_function(model, tmp_path, capsys):
    assert main(["trace", f"{model}:branchy", "--args", "f32[]", "-o", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert "flat_fun" not in err and len(err.splitlines()) == 1
    line = MODEL.splitlines().index("def branchy(x):") + 1
    assert f"the function branchy at {model}:{line} " in err and "argument x" in err


def test_trace_errors_name_the_users_function_in_the_library():
    def my_model(x, *, scale):
        return x * scale if x.sum() > 0 else x
    with pytest.raises(jax.errors.TracerBoolConversionError) as info:
        jaxpr_cc.trace(my_model, X, scale=2.0)
    message = str(info.value)
    assert "flat_fun" not in message and "the function my_model at" in message
    assert "argument x" in message


def test_debug_is_accepted_after_the_subcommand(capsys):
    parser = build_parser()
    assert parser.parse_args(["--debug", "show", "x.jcc"]).debug is True
    assert parser.parse_args(["show", "x.jcc", "--debug"]).debug is True
    assert parser.parse_args(["golden", "check", "--debug"]).debug is True
    assert parser.parse_args(["show", "x.jcc"]).debug is False
    assert main(["show", "--debug", "missing.jcc"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.rstrip().endswith("missing.jcc: no such file")
    assert main(["show", "missing.jcc"]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_trace_imports_modules_next_to_the_file(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    helper = "jaxpr_cc_h18_neighbour"
    monkeypatch.delitem(sys.modules, helper, raising=False)
    (tmp_path / f"{helper}.py").write_text("def scale(x):\n    return 3.0 * x\n")
    (tmp_path / "uses_neighbour.py").write_text(textwrap.dedent(f"""
        from {helper} import scale

        def f(x):
            import {helper}  # imported again while tracing
            return {helper}.scale(scale(x)) + 1.0
    """))
    monkeypatch.chdir(os.path.dirname(os.path.abspath(__file__)))  # not next to the file
    out = tmp_path / "f.jcc"
    assert main(["trace", f"{tmp_path / 'uses_neighbour.py'}:f", "--args", "f32[5]",
                 "-o", str(out)]) == 0, capsys.readouterr().err
    np.testing.assert_allclose(jaxpr_cc.load(out)(X), 9.0 * X + 1.0, rtol=1e-6)
    monkeypatch.delitem(sys.modules, helper, raising=False)


def test_exec_takes_an_npy_file_for_a_single_argument(model, tmp_path, capsys):
    program = tmp_path / "f.jcc"
    assert main(["trace", f"{model}:f", "--args", "f32[5]", "-o", str(program)]) == 0
    np.save(tmp_path / "x.npy", X)
    assert main(["exec", str(program), "--inputs", str(tmp_path / "x.npy"),
                 "-o", str(tmp_path / "out.npz")]) == 0, capsys.readouterr().err
    with np.load(tmp_path / "out.npz") as out:
        np.testing.assert_allclose(out["out0"], f_reference(X), rtol=1e-6)
    # a compiled executable takes it too
    assert main(["compile", str(program), "-o", str(tmp_path / "f.jxe")]) == 0
    assert main(["exec", str(tmp_path / "f.jxe"), "--inputs", str(tmp_path / "x.npy"),
                 "-o", str(tmp_path / "out2.npz")]) == 0, capsys.readouterr().err
    with np.load(tmp_path / "out2.npz") as out:
        np.testing.assert_allclose(out["out0"], f_reference(X), rtol=1e-6)
    # a program of two arguments: a clear one-line error
    two = tmp_path / "two.jcc"
    assert main(["trace", f"{model}:two", "--args", "f32[5], f32[5]", "-o", str(two)]) == 0
    capsys.readouterr()
    assert main(["exec", str(two), "--inputs", str(tmp_path / "x.npy"), "-o", "-"]) == 2
    err = capsys.readouterr().err
    assert "one array" in err and "2 argument leaves" in err and len(err.splitlines()) == 1


def test_constant_outputs_are_jax_arrays(tmp_path):
    def f(x):
        return x * 2, jnp.float32(3.0), np.ones(2, np.float32), 1.5, 2, x

    expected = jax.jit(f)(X[:2])
    program = jaxpr_cc.trace(f, X[:2])
    jaxpr_cc.save(program, tmp_path / "c.jcc")
    variants = {"traced": program, "loaded": jaxpr_cc.load(tmp_path / "c.jcc"),
                "optimized": jaxpr_cc.run_passes(program, jaxpr_cc.DEFAULT_PIPELINE),
                "compiled": jaxpr_cc.compile(program)}
    for name, run in variants.items():
        for arg in (X[:2], jnp.asarray(X[:2])):  # numpy in, jax.Array out (as jax.jit)
            got = run(arg)
            for i, (g, e) in enumerate(zip(got, expected)):
                assert isinstance(g, jax.Array), (name, i, type(g))
                assert (g.dtype, g.weak_type) == (e.dtype, e.weak_type), (name, i)
                np.testing.assert_array_equal(g, e)


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    out = capsys.readouterr().out.strip()
    assert out == (f"jaxpr-cc {jaxpr_cc.__version__} (jax {jax.__version__}, "
                   f"jaxlib {jaxlib.__version__})")


def test_help_tells_the_truth(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "--version" in out and "--debug" in out
    for command, needle in (("demo", "[-2, 1]"), ("opt", "'-' for stdout"),
                            ("compile", "'-' for stdout"), ("trace", "'-' for stdout"),
                            ("exec", ".npy"), ("show", "--debug")):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert needle in " ".join(capsys.readouterr().out.split()), command


# ------------------------------------------------- adversarial findings (issue 18)
def _cli(argv, **kwargs):
    """The command line in a child process (stdout and stderr as bytes)."""
    return subprocess.run([sys.executable, "-m", "jaxpr_cc.cli.main", *map(str, argv)],
                          capture_output=True, timeout=300, **kwargs)


def test_user_prints_do_not_corrupt_stdout_results(tmp_path):
    (tmp_path / "pr.py").write_text(textwrap.dedent("""
        import os, sys
        import jax
        print("at import")
        os.write(1, b"fd one at import\\n")

        def f(x):
            print("while tracing")
            sys.__stdout__.write("the original stdout\\n")
            sys.__stdout__.flush()
            jax.debug.print("debug {}", x)
            return x * 2.0
    """))
    proc = _cli(["trace", f"{tmp_path / 'pr.py'}:f", "--args", "f32[3]", "-o", "-"])
    assert proc.returncode == 0, proc.stderr.decode()
    program = loads(proc.stdout)  # nothing but the saved program
    np.testing.assert_allclose(program(X[:3]), 2.0 * X[:3])
    err = proc.stderr.decode()
    for line in ("at import", "fd one at import", "while tracing", "the original stdout"):
        assert line in err, line
    # the same for every subcommand that prints its result to stdout
    proc = _cli(["show", f"{tmp_path / 'pr.py'}:f", "--args", "f32[3]"])
    assert proc.returncode == 0 and "func @f" in proc.stdout.decode(), proc.stderr
    assert "at import" not in proc.stdout.decode()
    assert "while tracing" not in proc.stdout.decode()
    proc = _cli(["emit", f"{tmp_path / 'pr.py'}:f", "--args", "f32[3]", "--to", "jaxpr"])
    assert proc.returncode == 0 and "at import" not in proc.stdout.decode()
    assert "lambda" in proc.stdout.decode()


def test_user_prints_in_process_go_to_stderr(tmp_path, capsysbinary):
    (tmp_path / "pr.py").write_text("def f(x):\n    print('hello')\n    return x\n")
    assert main(["trace", f"{tmp_path / 'pr.py'}:f", "--args", "f32[3]", "-o", "-"]) == 0
    captured = capsysbinary.readouterr()
    assert captured.out.startswith(b"PK") and b"hello" in captured.err
    assert sys.stdout is not sys.stderr  # restored


@pytest.mark.parametrize("command", ["trace", "exec"])
def test_a_trailing_slash_names_a_directory(model, tmp_path, capsys, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    saved = tmp_path / "f.jcc"
    assert main(["trace", f"{model}:f", "--args", "f32[5]", "-o", str(saved)]) == 0
    np.savez(tmp_path / "in.npz", arg0=X)
    argv = {"trace": ["trace", f"{model}:f", "--args", "f32[5]"],
            "exec": ["exec", str(saved), "--inputs", str(tmp_path / "in.npz")]}[command]
    capsys.readouterr()
    assert main(argv + ["-o", "newdir/"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "ending in '/' names a directory" in err
    assert not (tmp_path / "newdir").exists()
    (tmp_path / "adir").mkdir()
    assert main(argv + ["-o", "adir/"]) == 2
    assert "adir/: is a directory" in capsys.readouterr().err
    with pytest.raises(SaveError, match="names a directory"):
        write_bytes(str(tmp_path / "other") + "/", b"x")
    assert not (tmp_path / "other").exists()


def test_output_path_messages(model, tmp_path, capsys):
    (tmp_path / "p.jcc").write_bytes(b"a file")
    argv = ["trace", f"{model}:f", "--args", "f32[5]", "-o"]
    for out, needle in ((str(tmp_path / "p.jcc" / "x.jcc"), f"{tmp_path / 'p.jcc'} is not a directory"),
                        (str(tmp_path / "p.jcc" / "d" / "x.jcc"),
                         f"{tmp_path / 'p.jcc'} is not a directory"),
                        ("", "the output path is empty"),
                        (str(tmp_path / "no" / "x.jcc"), "does not exist")):
        assert main(argv + [out]) == 2, out
        err = capsys.readouterr().err
        assert needle in err and len(err.splitlines()) == 1, (out, err)
    with pytest.raises(SaveError, match="is not a directory"):
        write_bytes(tmp_path / "p.jcc" / "x.jcc", b"x")
    with pytest.raises(SaveError, match="empty"):
        write_bytes("", b"x")
    assert (tmp_path / "p.jcc").read_bytes() == b"a file"


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file another owner needs root")
def test_a_replaced_file_keeps_its_owner_and_setuid_as_root(tmp_path):
    target = tmp_path / "prog"
    target.write_bytes(b"old")
    os.chown(target, 1234, 1234)
    os.chmod(target, 0o4755)
    write_bytes(target, b"new")
    st = os.stat(target)
    assert (st.st_uid, st.st_gid) == (1234, 1234)
    assert stat.S_IMODE(st.st_mode) == 0o4755 and target.read_bytes() == b"new"


def test_setuid_is_dropped_when_the_owner_cannot_be_kept(tmp_path, monkeypatch):
    target = tmp_path / "prog"
    target.write_bytes(b"old")
    if os.geteuid() == 0:  # (an unprivileged user's own file keeps its owner)
        os.chown(target, 1234, 1234)
    os.chmod(target, 0o6755 if os.geteuid() == 0 else 0o2755)  # after chown, which clears it
    real_chown = os.chown

    def refused(*args, **kwargs):
        raise PermissionError(1, "Operation not permitted")
    monkeypatch.setattr(os, "chown", refused)
    before = os.stat(target)
    write_bytes(target, b"new")
    monkeypatch.setattr(os, "chown", real_chown)
    st = os.stat(target)
    assert target.read_bytes() == b"new"
    if (st.st_uid, st.st_gid) != (before.st_uid, before.st_gid):
        assert stat.S_IMODE(st.st_mode) & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX) == 0
        assert stat.S_IMODE(st.st_mode) == 0o755
    else:  # the same owner (an unprivileged user's own file): the mode is kept
        assert stat.S_IMODE(st.st_mode) == stat.S_IMODE(before.st_mode)


@pytest.mark.parametrize("source, needle", [
    ("raise SystemExit(3)\n", "importing it called sys.exit(3)"),
    ("import sys\nsys.exit('bye')\n", "importing it called sys.exit('bye')"),
    ("import sys\ndef f(x):\n    sys.exit(4)\n", "tracing it called sys.exit(4)"),
    ("import sys\ndef f(x):\n    return x\ndef example_args():\n    sys.exit()\n",
     "example_args() called sys.exit()"),
])
def test_user_code_exiting_is_an_error_naming_the_file(tmp_path, capsys, source, needle):
    path = tmp_path / "e.py"
    path.write_text(source)
    args = [] if "example_args" in source else ["--args", "f32[3]"]
    assert main(["trace", f"{path}:f", *args, "-o", str(tmp_path / "t.jcc")]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and needle in err and str(path) in err, err
    assert not (tmp_path / "t.jcc").exists()


def test_a_closed_stdout_ends_quietly(tmp_path):
    saved = tmp_path / "big.jcc"
    jaxpr_cc.save(jaxpr_cc.trace(lambda x: x * 2.0, np.ones(1_000_000, np.float32)), saved)
    np.savez(tmp_path / "in.npz", arg0=np.ones(1_000_000, np.float32))
    proc = subprocess.Popen([sys.executable, "-m", "jaxpr_cc.cli.main", "exec", str(saved),
                             "--inputs", str(tmp_path / "in.npz"), "-o", "-"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.read(10)
    proc.stdout.close()  # the reader goes away, as `| head -c 10` does
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == 141 and err == b"", err.decode()


def test_a_full_stdout_is_one_line(model, tmp_path):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    with open("/dev/full", "wb") as full:
        proc = subprocess.run([sys.executable, "-m", "jaxpr_cc.cli.main", "trace",
                               f"{model}:f", "--args", "f32[5]", "-o", "-"],
                              stdout=full, stderr=subprocess.PIPE, timeout=300)
    err = proc.stderr.decode()
    assert proc.returncode == 2 and len(err.splitlines()) == 1 and "stdout: cannot write" in err


# ------------------------------------------- stdout closed, /dev/stdout, pipes as inputs
def _run_with_fds(argv, close_stdout=False, **kwargs):
    command = [sys.executable, "-m", "jaxpr_cc.cli.main", *map(str, argv)]
    if close_stdout:  # as the shell's `>&-` does
        command = ["sh", "-c", 'exec "$0" "$@" >&-', *command]
    return subprocess.run(command, timeout=300, **kwargs)


def test_a_command_writing_a_file_does_not_need_stdout(model, tmp_path):
    out = tmp_path / "cl.jcc"
    proc = _run_with_fds(["trace", f"{model}:f", "--args", "f32[5]", "-o", out],
                         close_stdout=True, stderr=subprocess.PIPE)
    assert proc.returncode == 0, proc.stderr.decode()
    np.testing.assert_allclose(jaxpr_cc.load(out)(X), f_reference(X), rtol=1e-6)
    np.save(tmp_path / "x.npy", X)
    proc = _run_with_fds(["exec", out, "--inputs", tmp_path / "x.npy", "-o", tmp_path / "o.npz"],
                         close_stdout=True, stderr=subprocess.PIPE)
    assert proc.returncode == 0, proc.stderr.decode()
    np.testing.assert_allclose(np.load(tmp_path / "o.npz")["out0"], f_reference(X), rtol=1e-6)
    # -o - with stdout closed from the start: one line, exit 2 (a reader that went
    # away mid-write is the quiet 141 above)
    proc = _run_with_fds(["trace", f"{model}:f", "--args", "f32[5]", "-o", "-"],
                         close_stdout=True, stderr=subprocess.PIPE)
    err = proc.stderr.decode()
    assert proc.returncode == 2 and len(err.splitlines()) == 1, err
    assert "cannot write to stdout" in err, err


@pytest.mark.parametrize("name", ["/dev/stdout", "/dev/fd/1", "/proc/self/fd/1", "link"])
def test_an_output_path_naming_stdout_is_stdout(tmp_path, name):
    (tmp_path / "pr.py").write_text("def f(x):\n    print('user print')\n    return x * 2.0\n")
    if name == "link":
        os.symlink("/dev/stdout", tmp_path / "link")
        name = tmp_path / "link"
    if not os.path.exists("/proc/self/fd/1"):
        pytest.skip("no /proc on this system")
    # stdout is a pipe this test reads; the path is resolved by the child itself
    proc = _run_with_fds(["trace", f"{tmp_path / 'pr.py'}:f", "--args", "f32[3]", "-o", name],
                         capture_output=True)
    assert proc.returncode == 0, proc.stderr.decode()
    np.testing.assert_allclose(loads(proc.stdout)(X[:3]), 2.0 * X[:3])
    assert b"user print" in proc.stderr and b"PK" not in proc.stderr


def test_exec_reads_its_program_and_inputs_from_pipes_and_fifos(model, tmp_path):
    saved = tmp_path / "p.jcc"
    jaxpr_cc.save(jaxpr_cc.trace(f_reference, X), saved)
    np.save(tmp_path / "x.npy", X)
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    program_r, program_w = os.pipe()
    inputs_r, inputs_w = os.pipe()

    def feed(fd, data):
        with os.fdopen(fd, "wb") as f:
            f.write(data)

    def feed_fifo():
        with open(fifo, "wb") as f:
            f.write((tmp_path / "x.npy").read_bytes())

    feeders = [threading.Thread(target=feed, args=(program_w, saved.read_bytes())),
               threading.Thread(target=feed, args=(inputs_w, (tmp_path / "x.npy").read_bytes()))]
    for t in feeders:
        t.start()
    proc = _run_with_fds(["exec", f"/dev/fd/{program_r}", "--inputs", f"/dev/fd/{inputs_r}",
                          "-o", "-"], capture_output=True, pass_fds=(program_r, inputs_r))
    for t in feeders:
        t.join()
    os.close(program_r)
    os.close(inputs_r)
    assert proc.returncode == 0, proc.stderr.decode()
    np.testing.assert_allclose(np.load(io.BytesIO(proc.stdout))["out0"], f_reference(X),
                               rtol=1e-6)
    feeder = threading.Thread(target=feed_fifo)
    feeder.start()
    proc = _run_with_fds(["exec", saved, "--inputs", fifo, "-o", "-"], capture_output=True)
    feeder.join()
    assert proc.returncode == 0, proc.stderr.decode()
    np.testing.assert_allclose(np.load(io.BytesIO(proc.stdout))["out0"], f_reference(X),
                               rtol=1e-6)


def test_exec_input_messages(tmp_path, capsys):
    saved = tmp_path / "p.jcc"
    jaxpr_cc.save(jaxpr_cc.trace(f_reference, X), saved)
    np.save(tmp_path / "x.npy", X)
    (tmp_path / "d").mkdir()
    cases = [([saved, "--inputs", tmp_path / "d"], "is a directory"),
             ([tmp_path / "d", "--inputs", tmp_path / "x.npy"], "is a directory"),
             ([tmp_path / "nope.jcc", "--inputs", tmp_path / "x.npy"], "no such file"),
             ([saved, "--inputs", tmp_path / "nope.npz"], "no such file"),
             # (np.load said a text file holds pickled data; adversary, stop 38)
             ([saved, "--inputs", tmp_path / "t.txt"], "t.txt: is not an .npz archive or "
                                                        ".npy array (--inputs); write one")]
    (tmp_path / "t.txt").write_text("1.0 2.0\n")
    for argv, needle in cases:
        assert main(["exec", *map(str, argv), "-o", str(tmp_path / "o.npz")]) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and needle in err, err


def test_exec_names_inputs_that_mix_positional_and_argument_names(tmp_path, capsys):
    def two(a, b):
        return a + b

    saved = tmp_path / "two.jcc"
    jaxpr_cc.save(jaxpr_cc.trace(two, X, X), saved)
    np.savez(tmp_path / "mixed.npz", arg0=np.asarray(X), b=np.asarray(X))
    assert main(["exec", str(saved), "--inputs", str(tmp_path / "mixed.npz"),
                 "-o", str(tmp_path / "o.npz")]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "mixes positional names ['arg0']" in err, err
    np.savez(tmp_path / "half.npz", a=np.asarray(X))
    assert main(["exec", str(saved), "--inputs", str(tmp_path / "half.npz"),
                 "-o", str(tmp_path / "o.npz")]) == 2
    err = capsys.readouterr().err
    assert "missing ['b']" in err, err


def test_emit_never_replaces_its_inputs_or_a_users_npz(model, tmp_path, capsys):
    # (adversary stop 37: `emit m.py:f --args-from f.npz --to python -o f.py` replaced
    # the user's f.npz, the arguments it had just read, with the module's constants.)
    big = tmp_path / "big.py"
    big.write_text(textwrap.dedent('''
        import numpy as np
        import jax.numpy as jnp
        C = np.linspace(-1.0, 1.0, 2000, dtype=np.float32)

        def f(x):
            return x * jnp.asarray(C)[:3] + jnp.asarray(C).sum()
    '''))
    args = tmp_path / "f.npz"
    np.savez(args, arg0=np.array([1.0, 2.0, 3.0], np.float32))
    before = args.read_bytes()
    assert main(["emit", f"{big}:f", "--args-from", str(args), "--to", "python",
                 "-o", str(tmp_path / "f.py")]) == 2
    err = capsys.readouterr().err
    assert "f.npz: exists and is not the constants file jaxpr-cc wrote for f.py" in err
    assert len(err.splitlines()) == 1
    assert args.read_bytes() == before and not (tmp_path / "f.py").exists()
    # -o naming an input is refused before anything is read or written.
    assert main(["emit", f"{big}:f", "--args-from", str(args), "--to", "jaxpr",
                 "-o", str(args)]) == 2
    assert "is the --args-from file" in capsys.readouterr().err and args.read_bytes() == before
    saved = tmp_path / "f.jcc"
    assert main(["trace", f"{model}:f", "--args", "f32[5]", "-o", str(saved)]) == 0
    program_bytes = saved.read_bytes()
    assert main(["emit", str(saved), "--to", "python", "-o", str(saved)]) == 2
    assert "is the input program" in capsys.readouterr().err
    assert saved.read_bytes() == program_bytes
    # Another name works, and emitting again replaces the sidecar it wrote.
    for _ in range(2):
        assert main(["emit", f"{big}:f", "--args-from", str(args), "--to", "python",
                     "-o", str(tmp_path / "g.py")]) == 0, capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.glob("g.*")) == ["g.npz", "g.py"]


def test_no_subcommand_replaces_a_file_it_reads(model, tmp_path, capsys):
    # (adversary stop 37: trace m.py:f -o m.py, compile p -o p, exec --inputs x -o x
    # and emit m.py:f -o m.py replaced their own inputs.)
    saved = tmp_path / "p.jcc"
    assert main(["trace", f"{model}:f", "--args", "f32[5]", "-o", str(saved)]) == 0
    inputs = tmp_path / "in.npz"
    np.savez(inputs, arg0=X)
    originals = {p: p.read_bytes() for p in (model, saved, inputs)}
    cases = [
        (["trace", f"{model}:f", "--args", "f32[5]", "-o", str(model)], "the traced module"),
        (["emit", f"{model}:f", "--args", "f32[5]", "--to", "python", "-o", str(model)],
         "the input program"),
        (["opt", str(saved), "-p", "dce", "-o", str(saved)], "the input program"),
        (["compile", str(saved), "-o", str(saved)], "the input program"),
        (["exec", str(saved), "--inputs", str(inputs), "-o", str(inputs)], "the --inputs file"),
        (["exec", str(saved), "--inputs", str(inputs), "-o", str(saved)], "the program"),
    ]
    for argv, what in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert f"is {what}" in err and len(err.splitlines()) == 1, err
    assert {p: p.read_bytes() for p in originals} == originals


def test_a_sidecar_path_that_is_not_a_regular_file_is_refused(tmp_path):
    # (adversary stop 37: a FIFO at OUT.npz made emit hang reading it.)
    weights = np.linspace(0.0, 1.0, 100, dtype=np.float32)
    program = jaxpr_cc.trace(lambda x: x * jnp.asarray(weights), jnp.ones(100))
    os.mkfifo(tmp_path / "m.npz")
    with pytest.raises(SaveError, match="m.npz: exists and is not a regular file"):
        jaxpr_cc.write_python(program, tmp_path / "m.py")
    assert not (tmp_path / "m.py").exists()


def _run_cli(argv, cwd, stdin=None):
    with open(stdin, "rb") if stdin else open(os.devnull, "rb") as f:
        return subprocess.run([sys.executable, "-m", "jaxpr_cc.cli.main", *argv], cwd=cwd,
                              stdin=f, capture_output=True, text=True, timeout=300)


def test_files_read_another_way_are_not_replaced_either(tmp_path):
    # (adversary 5, stop 37: a MODULE:FUNCTION target's file, a module the traced
    # file imports, and a program read from stdin redirected from the -o file were
    # replaced.)
    (tmp_path / "helper.py").write_text("SCALE = 2.0\n")
    (tmp_path / "f.py").write_text("import jax.numpy as jnp\nfrom helper import SCALE\n\n"
                                   "def f(x):\n    return jnp.sin(x) * SCALE\n")
    originals = {name: (tmp_path / name).read_bytes() for name in ("f.py", "helper.py")}
    for argv in (["trace", "f:f", "--args", "f32[3]", "-o", "f.py"],
                 ["emit", "f:f", "--args", "f32[3]", "--to", "python", "-o", "f.py"],
                 ["trace", "f.py:f", "--args", "f32[3]", "-o", "helper.py"]):
        done = _run_cli(argv, tmp_path)
        assert done.returncode == 2 and "a file the command read" in done.stderr, argv
        assert len(done.stderr.splitlines()) == 1, done.stderr
    assert {n: (tmp_path / n).read_bytes() for n in originals} == originals
    assert _run_cli(["trace", "f.py:f", "--args", "f32[3]", "-o", "p.jcc"], tmp_path).returncode == 0
    program = (tmp_path / "p.jcc").read_bytes()
    for argv in (["emit", "--to", "jaxpr", "-", "-o", "p.jcc"],
                 ["opt", "-", "-p", "cse", "-o", "p.jcc"]):
        done = _run_cli(argv, tmp_path, stdin=tmp_path / "p.jcc")
        assert done.returncode == 2 and "read from stdin" in done.stderr, done.stderr
        assert (tmp_path / "p.jcc").read_bytes() == program


def test_golden_update_never_writes_through_a_link(tmp_path, capsys):
    # (adversary 5, stop 37: links in the expected directory to the program and to
    # a user's file were written through.)
    programs, expected = tmp_path / "progs", tmp_path / "E"
    programs.mkdir()
    (expected / "01_p").mkdir(parents=True)
    source = textwrap.dedent('''
        import jax.numpy as jnp
        TAGS = ("elementwise", "float32")
        SUPPORTS = ("jit",)

        def fun(x):
            return jnp.sin(x)

        def example_args():
            return (jnp.ones(3, jnp.float32),)
    ''')
    (programs / "01_p.py").write_text(source)
    (tmp_path / "user.txt").write_text("precious\n")
    (expected / "01_p" / "python.py.txt").symlink_to(programs / "01_p.py")
    (expected / "01_p" / "numerics.txt").symlink_to(tmp_path / "user.txt")
    assert main(["golden", "update", str(programs / "01_p.py"), "--expected", str(expected)]) == 2
    err = capsys.readouterr().err
    assert "is a symbolic link, not a golden file update wrote" in err and len(err.splitlines()) == 1
    assert (programs / "01_p.py").read_text() == source
    assert (tmp_path / "user.txt").read_text() == "precious\n"
    assert sorted(p.name for p in (expected / "01_p").iterdir()) == ["numerics.txt",
                                                                      "python.py.txt"]


def test_files_the_traced_code_loaded_by_hand_or_from_a_zip_are_not_replaced(tmp_path):
    # (adversary 6, stop 37: a module loaded with importlib but not registered, one
    # imported from a zip, and a module that swaps its own sys.modules entry.)
    import zipfile as zf
    (tmp_path / "hid.py").write_text("SCALE = 3.0\n")
    with zf.ZipFile(tmp_path / "lib.zip", "w") as z:
        z.writestr("zmod.py", "SCALE = 5.0\n")
    (tmp_path / "t.py").write_text(textwrap.dedent('''
        import importlib.util, os, sys
        import jax.numpy as jnp
        here = os.path.dirname(os.path.abspath(__file__))

        def h(x):
            spec = importlib.util.spec_from_file_location("hid", os.path.join(here, "hid.py"))
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return x * module.SCALE

        def z(x):
            sys.path.insert(0, os.path.join(here, "lib.zip"))
            import zmod
            return x * zmod.SCALE
    '''))
    (tmp_path / "wrapmod.py").write_text(textwrap.dedent('''
        import sys, types
        import jax.numpy as jnp

        def _f(x):
            return jnp.sin(x)

        sys.modules[__name__] = types.SimpleNamespace(f=_f)
    '''))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    for target, out in (("t.py:h", "hid.py"), ("t.py:z", "lib.zip"), ("wrapmod:f", "wrapmod.py")):
        done = _run_cli(["trace", target, "--args", "f32[3]", "-o", out], tmp_path)
        assert done.returncode == 2 and "a file the command read" in done.stderr, done.stderr
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_sidecar_links_and_failed_writes_leave_nothing(tmp_path):
    # (adversary 6, stop 37: a sidecar written through a link into another
    # module's sidecar; a sidecar left behind when the module could not be
    # written; a linked OUT.py got its sidecar beside the link, not the module.)
    weights = np.linspace(-1.0, 1.0, 100, dtype=np.float32)
    program = jaxpr_cc.trace(lambda x: x * jnp.asarray(weights), jnp.ones(100))
    (tmp_path / "s2").mkdir()
    jaxpr_cc.write_python(program, tmp_path / "s2" / "out.py")
    theirs = (tmp_path / "s2" / "out.npz").read_bytes()
    (tmp_path / "s1").mkdir()
    (tmp_path / "s1" / "out.npz").symlink_to(tmp_path / "s2" / "out.npz")
    with pytest.raises(SaveError, match="is not a regular file"):
        jaxpr_cc.write_python(program, tmp_path / "s1" / "out.py")
    assert (tmp_path / "s2" / "out.npz").read_bytes() == theirs
    (tmp_path / "a" / "out.py").mkdir(parents=True)
    with pytest.raises(SaveError):
        jaxpr_cc.write_python(program, tmp_path / "a" / "out.py")
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["out.py"]
    (tmp_path / "L2").mkdir()
    (tmp_path / "L1").mkdir()
    (tmp_path / "L2" / "real.py").write_text("# to be replaced\n")
    (tmp_path / "L1" / "out.py").symlink_to(tmp_path / "L2" / "real.py")
    jaxpr_cc.write_python(program, tmp_path / "L1" / "out.py")
    assert sorted(p.name for p in (tmp_path / "L2").iterdir()) == ["real.npz", "real.py"]
    module = {"__file__": str(tmp_path / "L2" / "real.py")}
    exec(compile((tmp_path / "L2" / "real.py").read_text(), str(tmp_path / "L2" / "real.py"),
                 "exec"), module)
    x = jnp.arange(100.0, dtype=jnp.float32)
    np.testing.assert_array_equal(np.asarray(module[program.name](x)), np.asarray(x * weights))


def test_any_exception_of_user_code_is_one_line(tmp_path):
    # (adversary 6, stop 37: a BaseException subclass printed a traceback.)
    (tmp_path / "b.py").write_text("class Boom(BaseException):\n    pass\n\n"
                                   "def f(x):\n    raise Boom('boom')\n")
    done = _run_cli(["trace", "b.py:f", "--args", "f32[3]", "-o", "p.jcc"], tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "Boom: boom" in done.stderr and not (tmp_path / "p.jcc").exists()


def test_golden_update_checks_every_program_before_writing_any(tmp_path, capsys):
    # (adversary 6, stop 37: programs before the one holding a link were already
    # updated; a linked program directory was written through.)
    programs, expected = tmp_path / "progs", tmp_path / "E"
    programs.mkdir()
    source = textwrap.dedent('''
        import jax.numpy as jnp
        TAGS = ("elementwise", "float32")
        SUPPORTS = ("jit",)

        def fun(x):
            return jnp.sin(x) * SCALE

        def example_args():
            return (jnp.ones(3, jnp.float32),)
    ''')
    for name, scale in (("01_a", 1.0), ("02_b", 2.0)):
        (programs / f"{name}.py").write_text(f"SCALE = {scale}\n" + source)
    assert main(["golden", "update", str(programs), "--expected", str(expected)]) == 0
    capsys.readouterr()
    (programs / "01_a.py").write_text("SCALE = 5.0\n" + source)  # 01_a's goldens are stale
    stale = {p: p.read_bytes() for p in (expected / "01_a").iterdir()}
    (tmp_path / "user.txt").write_text("precious\n")
    numerics = expected / "02_b" / "numerics.txt"
    numerics.unlink()
    numerics.symlink_to(tmp_path / "user.txt")
    assert main(["golden", "update", str(programs), "--expected", str(expected)]) == 2
    assert "is a symbolic link" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in (expected / "01_a").iterdir()} == stale
    numerics.unlink()
    (tmp_path / "outside").mkdir()
    for p in (expected / "02_b").iterdir():
        p.rename(tmp_path / "outside" / p.name)
    (expected / "02_b").rmdir()
    (expected / "02_b").symlink_to(tmp_path / "outside")
    outside = {p: p.read_bytes() for p in (tmp_path / "outside").iterdir()}
    assert main(["golden", "update", str(programs), "--expected", str(expected)]) == 2
    assert "02_b: is a symbolic link" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in (tmp_path / "outside").iterdir()} == outside


def test_traced_code_that_changes_directory_moves_neither_reads_nor_output(tmp_path):
    # (adversary 7, stop 37: a file read after os.chdir was recorded relative to the
    # wrong directory, and -o landed where the traced code left the process.)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "d.txt").write_text("2.5")
    (tmp_path / "t.py").write_text(textwrap.dedent('''
        import os

        def back(x):
            old = os.getcwd()
            os.chdir("sub")
            scale = float(open("d.txt").read())
            os.chdir(old)
            return x * scale

        def stay(x):
            os.chdir("sub")
            return x * float(open("d.txt").read())
    '''))
    done = _run_cli(["trace", "t.py:back", "--args", "f32[3]", "-o", "sub/d.txt"], tmp_path)
    assert done.returncode == 2 and "a file the command read" in done.stderr, done.stderr
    assert (tmp_path / "sub" / "d.txt").read_text() == "2.5"
    done = _run_cli(["trace", "t.py:stay", "--args", "f32[3]", "-o", "p.jcc"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "p.jcc").exists() and not (tmp_path / "sub" / "p.jcc").exists()
