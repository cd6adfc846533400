"""The pass manager: pipeline strings, registry and plugins, instrumentation,
crash reproducers, and the ``jaxpr-cc opt`` command."""
import dataclasses
import io
import textwrap
from dataclasses import dataclass
from typing import Literal

import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_cc
from jaxpr_cc.cli.main import main as cli_main
from jaxpr_cc.passes import PASS_REGISTRY, load_plugins
from jaxpr_cc.passes.base import Pass, register_pass
from jaxpr_cc.passes.dce import DeadCodeElimination
from jaxpr_cc.passes.hoist_consts import HoistConstants
from jaxpr_cc.passes.manager import PassError, PassManager, run_passes
from jaxpr_cc.passes.pipeline import Pipeline, PipelineError, parse_pipeline

CONST = np.linspace(-1.0, 1.0, 6, dtype=np.float32)


def _dup(x, y):
    a = jnp.sin(x) * y
    b = jnp.sin(x) * y          # duplicate of a
    unused = jnp.exp(x) + 1.0   # dead
    del unused
    return a + b + CONST


@pytest.fixture
def prog():
    return jaxpr_cc.trace(_dup, jnp.arange(6.0, dtype=jnp.float32), jnp.float32(2.0))


@pytest.fixture
def scratch_passes():
    """Register test-only passes and remove them afterwards."""
    added = []

    def add(name, cls):
        register_pass(name)(cls)
        added.append(name)
        return cls

    yield add
    for name in added:
        PASS_REGISTRY.pop(name, None)


# ------------------------------------------------------------------ pipelines
@pytest.mark.parametrize("text", [
    "closure-convert,hoist-consts{min-bytes=1024 dedupe=true},cse,dce",
    "dce",
    "hoist-consts{literals=true min-bytes=8},cse",
    "closure-convert{closed-over=forward max-forward-size=16},dce",
    "",
])
def test_pipeline_prints_back_to_the_same_string(text):
    parsed = parse_pipeline(text)
    assert str(parsed) == text
    assert parse_pipeline(str(parsed)) == parsed
    assert parse_pipeline(parsed.canonical()) == parsed


def test_pipeline_options_are_typed_and_canonical():
    p = parse_pipeline(" hoist-consts{ min-bytes=1024   dedupe=false } , dce ")
    assert p.passes == (HoistConstants(min_bytes=1024, dedupe=False), DeadCodeElimination())
    assert str(p) == "hoist-consts{min-bytes=1024 dedupe=false},dce"
    assert p.canonical() == "hoist-consts{min-bytes=1024 dedupe=false},dce"
    defaults = parse_pipeline("hoist-consts{dedupe=true}")
    assert defaults.canonical() == "hoist-consts"
    assert defaults == parse_pipeline("hoist-consts")


def test_pipeline_value_types(scratch_passes):
    @dataclass(frozen=True)
    class StraightThrough(Pass):
        ops: tuple[str, ...] = ()
        sizes: tuple[int, ...] = (1,)
        scale: float = 1.0
        mode: Literal["fast", "exact"] = "exact"
        label: str | None = None
        name_: str = "x"

        def run(self, program, ctx):
            return program

    scratch_passes("test-straight-through", StraightThrough)
    p = parse_pipeline("test-straight-through{ops=round,sign sizes=2,3 scale=0.5 mode=fast "
                       "label='a b{c}' name-=none}")[0]
    assert p == StraightThrough(ops=("round", "sign"), sizes=(2, 3), scale=0.5, mode="fast",
                                label="a b{c}", name_="none")
    text = str(parse_pipeline("test-straight-through{ops=round,sign label='a b{c}'}"))
    assert text == "test-straight-through{ops=round,sign label='a b{c}'}"
    assert parse_pipeline(text)[0].label == "a b{c}"
    assert parse_pipeline("test-straight-through{label=none}")[0].label is None
    with pytest.raises(PipelineError, match="expected one of fast, exact"):
        parse_pipeline("test-straight-through{mode=slow}")
    with pytest.raises(PipelineError, match="expected an integer"):
        parse_pipeline("test-straight-through{sizes=2,x}")


@pytest.mark.parametrize("text, message, caret", [
    ("closure-convert,csee,dce", "unknown pass 'csee'", "                ^^^^"),
    ("hoist-consts{min-bytes=abc}", "expected an integer, got 'abc'", "                       ^^^"),
    ("hoist-consts{dedupe=yes}", "expected true or false", "                    ^^^"),
    ("hoist-consts{min-bytes=1 size=2}", "has no option 'size'", "                         ^^^^"),
    ("hoist-consts{min_bytes=2}", "is spelled 'min-bytes'", "             ^^^^^^^^^"),
    ("hoist-consts{min-bytes=2 min-bytes=3}", "given twice", "                         ^^^^^^^^^"),
    ("hoist-consts{min-bytes=1", "never closed", "            ^"),
    ("cse dce", "expected ',' between passes", "    ^"),
    ("cse,", "expected a pass name after ','", "   ^"),
    ("cse,,dce", "expected a pass name", "    ^"),
    ("hoist-consts{min-bytes=-1}", "min-bytes must be >= 0", "             ^^^^^^^^^^^^"),
    ("closure-convert{closed-over=sideways}", "closed-over must be one of", "                ^^^^^^^^^^^^^^^^^^^^"),
])
def test_pipeline_errors_point_at_the_offending_part(text, message, caret):
    with pytest.raises(PipelineError) as info:
        parse_pipeline(text)
    err = info.value
    assert isinstance(err, ValueError)
    lines = str(err).splitlines()
    assert message in lines[0]
    assert lines[1] == "  " + text
    assert lines[2] == "  " + caret
    assert "\n" not in err.one_line() and f"column {len(caret) - len(caret.lstrip()) + 1}" in err.one_line()


def test_as_pipeline_accepts_passes_and_sequences():
    from jaxpr_cc.passes.pipeline import as_pipeline
    p = as_pipeline([HoistConstants(min_bytes=4), "cse,dce"])
    assert str(p) == "hoist-consts{min-bytes=4},cse,dce"
    assert as_pipeline(DeadCodeElimination()) == parse_pipeline("dce")
    with pytest.raises(TypeError, match="pipeline must be"):
        as_pipeline(42)


# --------------------------------------------------------------- registry
def test_register_pass_decorator_and_errors(scratch_passes, prog):
    @dataclass(frozen=True)
    class Rename(Pass):
        new_name: str = "renamed"

        def run(self, program, ctx):
            program.name = self.new_name
            ctx.count("renamed")
            return program

    scratch_passes("test-rename", Rename)
    out = run_passes(prog, "test-rename{new-name=hello},dce")
    assert out.name == "hello" and prog.name != "hello"

    with pytest.raises(ValueError, match="already registered"):
        @register_pass("dce")
        @dataclass(frozen=True)
        class OtherDce(Pass):
            def run(self, program, ctx):
                return program

    with pytest.raises(TypeError, match="frozen dataclass"):
        @register_pass("test-not-frozen")
        @dataclass
        class NotFrozen(Pass):
            def run(self, program, ctx):
                return program


def _write_plugin(root, module, body, entry):
    (root / f"{module}.py").write_text(textwrap.dedent(body))
    dist = root / f"{module}-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[jaxpr_cc.passes]\n{entry}\n")


def test_entry_point_plugins_are_loaded(tmp_path, monkeypatch, prog):
    _write_plugin(tmp_path, "jcc_test_plugin", """
        from dataclasses import dataclass
        from jaxpr_cc.passes.base import Pass

        @dataclass(frozen=True)
        class CountEquations(Pass):
            def run(self, program, ctx):
                ctx.count("equations-seen", program.num_equations())
                return program
    """, "test-count-equations = jcc_test_plugin:CountEquations")
    _write_plugin(tmp_path, "jcc_broken_plugin", "raise ImportError('no such thing')\n",
                  "test-broken = jcc_broken_plugin:Missing")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.warns(RuntimeWarning, match="'test-broken'.*failed to load"):
            loaded = load_plugins(force=True)
        assert "test-count-equations" in loaded and "test-broken" not in loaded
        manager = PassManager("test-count-equations")
        manager.run(prog)
        assert manager.statistics == [("test-count-equations",
                                       {"equations-seen": prog.num_equations()})]
    finally:
        PASS_REGISTRY.pop("test-count-equations", None)


# ------------------------------------------------------------------ running
def test_run_passes_never_mutates_its_input(prog):
    before = str(prog)
    out = run_passes(prog, "hoist-consts,cse,dce")
    assert str(prog) == before
    assert out is not prog and out.body is not prog.body
    assert out.num_equations() < prog.num_equations()
    x = jnp.arange(6.0, dtype=jnp.float32)
    np.testing.assert_array_equal(out(x, jnp.float32(3.0)), _dup(x, jnp.float32(3.0)))


def test_manager_is_reusable_and_records_statistics(prog):
    manager = PassManager("hoist-consts,cse,dce")
    first = manager.run(prog)
    stats = dict(manager.statistics)
    assert stats["hoist-consts"] == {"constants-hoisted": 1, "params-added": 1,
                                     "bytes-hoisted": CONST.nbytes}
    assert stats["cse"] == {"equations-merged": 2}          # sin and mul
    assert stats["dce"] == {"equations-removed": 2}         # exp and add
    assert [name for name, _ in manager.timings] == ["hoist-consts", "cse", "dce"]
    assert all(t >= 0 for _, t in manager.timings)
    second = manager.run(prog)
    assert str(first) == str(second)


def test_print_ir_flags(prog):
    out = io.StringIO()
    PassManager("hoist-consts,cse,dce", print_ir_before="cse", print_ir_after=["dce"],
                stream=out).run(prog)
    text = out.getvalue()
    assert text.count("// -----// IR") == 2
    assert "IR before cse (2/3)" in text and "IR after dce (3/3)" in text

    out = io.StringIO()
    PassManager("hoist-consts,cse,dce", print_ir_after_all=True, stream=out).run(prog)
    assert out.getvalue().count("IR after") == 3

    out = io.StringIO()
    result = PassManager("dce,cse,dce,cse", print_ir_after_change=True, stream=out).run(prog)
    text = out.getvalue()
    # Only the first dce and the first cse change anything.
    assert text.count("IR after") == 2
    assert "IR after dce (1/4) (changed)" in text and "IR after cse (2/4) (changed)" in text
    assert text.rstrip().endswith(str(result).rstrip())

    with pytest.raises(ValueError, match="print_ir_after: unknown pass 'dcee'"):
        PassManager("dce", print_ir_after="dcee")


def test_timing_and_statistics_tables(prog):
    out = io.StringIO()
    PassManager("hoist-consts,cse,dce", timing=True, statistics=True, stream=out).run(prog)
    text = out.getvalue()
    assert "jaxpr-cc pass timing" in text and "(verification)" in text and "total" in text
    assert "jaxpr-cc pass statistics" in text
    n = prog.num_equations()
    assert f"cse  (equations {n} -> {n - 2})" in text
    assert "equations-merged" in text and "bytes-hoisted" in text


def test_callbacks_see_each_pass(prog):
    seen = []

    def callback(pass_, before, after, ctx):
        seen.append((pass_.name, before.num_equations(), after.num_equations(), dict(ctx.stats)))

    PassManager("cse,dce", callbacks=[callback]).run(prog)
    n = prog.num_equations()
    assert seen == [("cse", n, n - 2, {"equations-merged": 2}),
                    ("dce", n - 2, n - 4, {"equations-removed": 2})]


@pytest.mark.parametrize("verify_each", [True, False])
def test_invalid_input_is_rejected(prog, verify_each):
    bad = prog.copy()
    bad.body.invars.pop()  # the body no longer matches in_tree
    with pytest.raises(jaxpr_cc.VerificationError, match="input program is invalid"):
        run_passes(bad, "dce", verify_each=verify_each)


# ------------------------------------------------------------ reproducers
def _crashing_pass():
    @dataclass(frozen=True)
    class Crash(Pass):
        def run(self, program, ctx):
            # Change the program first: the reproducer must hold the pass's input.
            program.body.erase(program.body.equations[-1], force=True)
            raise RuntimeError("boom")
    return Crash


def _breaking_pass():
    @dataclass(frozen=True)
    class Break(Pass):
        def run(self, program, ctx):
            program.body.set_outvars(program.body.outvars + program.body.outvars)
            return program
    return Break


def test_crash_writes_a_reproducer(prog, tmp_path, scratch_passes):
    scratch_passes("test-crash", _crashing_pass())
    expected_input = run_passes(prog, "cse")
    with pytest.raises(PassError) as info:
        run_passes(prog, "cse,test-crash,dce", reproducer_dir=str(tmp_path))
    err = info.value
    message = str(err)
    assert message.startswith("pass 'test-crash' failed: RuntimeError: boom; reproduce with: "
                              f"jaxpr-cc opt {err.reproducer} -p 'test-crash,dce'")
    assert isinstance(err.__cause__, RuntimeError)
    assert err.pipeline == "test-crash,dce"
    assert (tmp_path / f"{prog.name}.test-crash.reproducer.pipeline").read_text() == "test-crash,dce\n"
    load = getattr(jaxpr_cc, "load", None)
    if load is not None and err.reproducer.endswith(".jcc"):
        saved = load(err.reproducer)
        assert saved.num_equations() == expected_input.num_equations()
        x, y = jnp.arange(6.0, dtype=jnp.float32), jnp.float32(2.0)
        np.testing.assert_array_equal(saved(x, y), expected_input(x, y))
        # The command in the message replays the failure.
        code = cli_main(["opt", err.reproducer, "-p", err.pipeline,
                         "--reproducer-dir", str(tmp_path / "again")])
        assert code == 1
    else:
        assert "printed IR" in message
        assert open(err.reproducer).read() == str(expected_input)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp files


@pytest.mark.parametrize("verify_each", [True, False])
def test_invalid_result_is_reported_with_a_reproducer(prog, tmp_path, scratch_passes, verify_each):
    # By default the result is checked once at the end and the pipeline replayed to
    # name the pass at fault; verify_each checks after every pass.
    scratch_passes("test-break", _breaking_pass())
    with pytest.raises(PassError, match=r"pass 'test-break' failed: produced an invalid program: "
                                        r".*outputs but out_tree.*reproduce with: jaxpr-cc opt .* "
                                        r"-p 'test-break,cse'"):
        run_passes(prog, "dce,test-break,cse", reproducer_dir=str(tmp_path),
                   verify_each=verify_each)


def test_pass_returning_none_is_an_error(prog, tmp_path, scratch_passes):
    @dataclass(frozen=True)
    class Forgetful(Pass):
        def run(self, program, ctx):
            return None

    scratch_passes("test-forgetful", Forgetful)
    with pytest.raises(PassError, match="returned None"):
        run_passes(prog, "test-forgetful", reproducer_dir=str(tmp_path))


# --------------------------------------------------------------------- CLI
@pytest.fixture
def program_file(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(textwrap.dedent("""
        import jax.numpy as jnp
        import numpy as np
        C = np.arange(5.0, dtype=np.float32)
        def f(x, y):
            a = jnp.sin(x) * y
            b = jnp.sin(x) * y
            unused = jnp.exp(x)
            return a + b + C
    """))
    return str(path)


def test_cli_opt_prints_the_result_and_instrumentation(program_file, capsys):
    code = cli_main(["opt", f"{program_file}:f", "--args", "f32[5], f32[]", "-p", "hoist-consts,cse,dce",
                     "--statistics", "--timing", "--print-ir-after=cse"])
    out, err = capsys.readouterr()
    assert code == 0
    assert "# bound params: 1" in out and "exp" not in out
    assert out.count("sin") == 1
    assert "IR after cse (2/3)" in err and "jaxpr-cc pass timing" in err
    assert "equations-merged" in err and "equations-removed" in err


def test_cli_opt_usage_errors(program_file, capsys):
    assert cli_main(["opt", f"{program_file}:f", "--args", "f32[5], f32[]", "-p", "cse,dcee"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("jaxpr-cc opt: error: -p: unknown pass 'dcee'") and "\n" not in err
    assert cli_main(["opt", f"{program_file}:f", "--args", "f32[5], f32[]"]) == 2
    assert "give a pipeline with -p" in capsys.readouterr().err
    assert cli_main(["opt", "-p", "dce"]) == 2
    assert "give a PROGRAM" in capsys.readouterr().err
    assert cli_main(["opt", f"{program_file}:f", "--args", "f32[5], f32[]", "-p", "dce",
                     "--print-ir-after=nope"]) == 2
    assert "unknown pass 'nope'" in capsys.readouterr().err


def test_cli_list_passes(capsys):
    assert cli_main(["opt", "--list-passes"]) == 0
    out = capsys.readouterr().out
    for name in ("closure-convert", "hoist-consts", "cse", "dce"):
        assert f"{name}: " in out
    assert "min-bytes=0  (int)" in out and "closed-over=auto  (str)" in out


def test_cli_opt_saves_with_output(program_file, tmp_path, capsys):
    if getattr(jaxpr_cc, "save", None) is None:
        assert cli_main(["opt", f"{program_file}:f", "--args", "f32[5], f32[]", "-p", "dce",
                         "-o", str(tmp_path / "out.jcc")]) == 2
        assert "saving programs is not available" in capsys.readouterr().err
        return
    out_path = tmp_path / "out.jcc"
    assert cli_main(["opt", f"{program_file}:f", "--args", "f32[5], f32[]", "-p", "hoist-consts,cse,dce",
                     "-o", str(out_path)]) == 0
    loaded = jaxpr_cc.load(str(out_path))
    x = jnp.arange(5.0, dtype=jnp.float32)
    expect = 2 * (jnp.sin(x) * 2.0) + np.arange(5.0, dtype=np.float32)
    np.testing.assert_array_equal(loaded(x, jnp.float32(2.0)), expect)


def test_pass_options_are_dataclass_fields():
    names = [f.name for f in dataclasses.fields(HoistConstants)]
    assert names == ["min_bytes", "dedupe", "literals"]
    assert isinstance(parse_pipeline("dce"), Pipeline)
