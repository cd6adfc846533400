"""The golden suite of the corpus, the numerics format, golden files on disk, and
``jaxpr-cc golden check|update`` end to end in a temporary copy.

``test_corpus_golden`` compares every corpus program's views with
``golden/expected/<program>/`` and runs its ``# RUN:`` FileCheck lines; run
``pytest --update-goldens`` (or ``jaxpr-cc golden update``) to accept changes.
The recorded numerics are themselves checked against JAX on the original
functions (``test_golden_numerics_agree_with_jax``).
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from jaxpr_cc.cli.main import main as cli_main
from jaxpr_cc.golden.corpus import corpus_dir, load_program
from jaxpr_cc.golden import store
from jaxpr_cc.golden.numerics import (HEADER, RTOL, compare_numerics, format_leaves,
                                      format_value, parse_numerics)
from jaxpr_cc.golden.program_checks import parse_program_checks
from jaxpr_cc.golden.pytest_plugin import record_written
from jaxpr_cc.golden.runner import check_program, select_programs, stale_dirs
from jaxpr_cc.golden.sanitize import error_line
from jaxpr_cc.golden.views import NUMERICS_VIEW, compute_views
from jaxpr_cc.passes import DEFAULT_PIPELINE
from jaxpr_cc.passes.base import Pass, register_pass

from jaxref import reference_results

REPO = pathlib.Path(__file__).resolve().parents[1]
PROGRAMS = select_programs([corpus_dir()])
BY_NAME = {p.name: p for p in PROGRAMS}
UPDATE = "--update-goldens"


# ---------------------------------------------------------------------------- corpus
@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.name)
def test_corpus_golden(program, request):
    result = check_program(program, pipeline=DEFAULT_PIPELINE,
                           update=request.config.getoption(UPDATE))
    if result.sync is not None:
        record_written(request.config, [(v.status, os.path.relpath(v.path, REPO))
                                        for v in result.sync.written])
    if not result.ok:
        pytest.fail(result.render(max_diff_lines=200), pytrace=False)


def test_no_stale_goldens(request):
    stale = stale_dirs(PROGRAMS)
    if stale and request.config.getoption(UPDATE):
        for path in stale:
            store.remove_path(path)
        record_written(request.config, [("removed", os.path.relpath(p, REPO)) for p in stale])
        return
    assert not stale, f"golden directories with no program (remove them or run {UPDATE}): " \
                      f"{[str(p) for p in stale]}"


def test_corpus_programs_carry_filecheck_directives():
    with_checks = {}
    for p in PROGRAMS:
        checks = parse_program_checks(store.read_text(p.path), p.name)
        if checks:
            with_checks[p.name] = checks
    assert len(with_checks) >= 8, sorted(with_checks)
    # the directives pin pass behaviour: most programs run some pass, not only trace
    assert sum(any(c.run.pipeline for c in checks) for checks in with_checks.values()) >= 6


def _numerics_of_jax(prog) -> str:
    """The numerics text of JAX's own results on the original function."""
    jax.clear_caches()  # a fresh trace of the original, not one our traces cached
    transforms = ("value", "grad") if "grad" in prog.supports and prog.grad_argnums else ("value",)
    with jax.default_device(jax.devices("cpu")[0]):
        results = reference_results(prog, transforms=transforms)
    lines = [HEADER] + format_leaves("value", results["value"])
    if "grad" in results:
        lines += format_leaves("grad", results["grad"])
    return "\n".join(lines) + "\n"


# The pipeline may change what XLA constant-folds (a hoisted constant is an
# argument), so the optimized program agrees with JAX to a few float32 ulps more
# than the golden's own tolerance; the same bound as tests/test_passes_corpus.py.
JAX_RTOL = {"float32": 2e-5, "complex64": 2e-5}
JAX_SAMPLE = ("01_elementwise_math", "11_cond_branching", "27_custom_vjp_two_sites",
              "35_prng_dropout", "36_int_bitops_hash", "38_half_precision", "39_complex_math",
              "41_namedtuple_state", "51_large_constant", "52_kwargs_temperature")


def _agree_with_jax(name: str) -> None:
    program = BY_NAME[name]
    prog = load_program(program.path)
    recorded = store.read_text(program.expected_dir / NUMERICS_VIEW)
    problems = compare_numerics(recorded, _numerics_of_jax(prog), rtol=JAX_RTOL)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", JAX_SAMPLE)
def test_golden_numerics_agree_with_jax(name):
    _agree_with_jax(name)


@pytest.mark.heavy
@pytest.mark.parametrize("name", [p.name for p in PROGRAMS if p.name not in JAX_SAMPLE])
def test_golden_numerics_agree_with_jax_whole_corpus(name):
    _agree_with_jax(name)


# ---------------------------------------------------------------------------- numerics
def _roundtrip(values: np.ndarray) -> np.ndarray:
    tokens = [format_value(v, values.dtype) for v in values.reshape(-1)]
    if values.dtype.kind == "c":
        return np.array([complex(t) for t in tokens]).astype(values.dtype)
    return np.array([float(t) for t in tokens]).astype(values.dtype)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.float64])
def test_floats_are_printed_exactly(dtype):
    rng = np.random.RandomState(0)
    finfo = ml_dtypes.finfo(dtype)
    special = [0.0, -0.0, np.inf, -np.inf, float(finfo.max), float(finfo.tiny),
               float(finfo.smallest_subnormal), 1e-5, 0.1]
    # every binade of the type, subnormals included
    exponents = rng.randint(int(finfo.minexp) - int(finfo.nmant), int(finfo.maxexp), 400)
    values = np.concatenate([rng.uniform(-1.99, 1.99, 400) * np.exp2(exponents.astype(float)),
                             np.array(special)]).astype(dtype)
    back = _roundtrip(values)
    assert np.array_equal(back.view(np.uint8), values.view(np.uint8))  # bit for bit
    nan = np.array([np.nan], dtype)
    assert np.isnan(_roundtrip(nan).astype(np.float32))[0]


def test_complex_values_are_printed_exactly():
    rng = np.random.RandomState(1)
    for dtype in (np.complex64, np.complex128):
        values = (rng.randn(50) + 1j * rng.randn(50) * 1e-7).astype(dtype)
        assert np.array_equal(_roundtrip(values), values)
    assert format_value(np.complex64(1.5 - 0.25j), np.dtype(np.complex64)) == "1.5-0.25j"


def test_numerics_layout_is_readable():
    tree = {"w": np.arange(10, dtype=np.float32).reshape(2, 5) / 4,
            "n": np.array([True, False]), "k": np.int32(-3)}
    text = "\n".join(format_leaves("value", tree))
    assert text == textwrap.dedent("""\
        value['k']: int32[]
          [] -3
        value['n']: bool[2]
          [0] true false
        value['w']: float32[2,5]
          [0,0] 0 0.25 0.5 0.75 1
          [1,0] 1.25 1.5 1.75 2 2.25""")
    long_row = "\n".join(format_leaves("v", np.arange(10, dtype=np.int8)))
    assert long_row.splitlines()[1:] == ["  [0] 0 1 2 3 4 5 6 7", "  [8] 8 9"]
    leaves = parse_numerics(text)
    assert [(l.path, l.dtype, l.shape, len(l.values)) for l in leaves] == [
        ("value['k']", "int32", (), 1), ("value['n']", "bool", (2,), 2),
        ("value['w']", "float32", (2, 5), 10)]


def _numerics(array) -> str:
    return "\n".join([HEADER] + format_leaves("value", array)) + "\n"


def test_float_comparison_uses_the_dtype_tolerance():
    base = np.array([1.0, -2.5, 3e-3, 0.0], np.float32)
    ulp = np.nextafter(base, np.float32(np.inf), dtype=np.float32)  # one ulp up
    assert compare_numerics(_numerics(base), _numerics(ulp)) == []
    moved = base.copy()
    moved[1] *= np.float32(1 + 1e-4)
    problems = compare_numerics(_numerics(base), _numerics(moved))
    assert problems == [f"value[1]: expected -2.5, got {format_value(moved[1], moved.dtype)} "
                        f"(rtol 1e-06 for float32)"]
    # one bfloat16 ulp at 1.0 (0.78%) is within bfloat16's tolerance, not float32's;
    # a float16 change of 6% is beyond float16's
    one, next_b16 = np.float32(1.0), np.float32(1.0078125)
    assert compare_numerics(_numerics(np.array([one], ml_dtypes.bfloat16)),
                            _numerics(np.array([next_b16], ml_dtypes.bfloat16))) == []
    assert compare_numerics(_numerics(np.array([one])), _numerics(np.array([next_b16])))
    assert compare_numerics(_numerics(np.array([one], np.float16)),
                            _numerics(np.array([1.0625], np.float16)))
    assert RTOL["float32"] == 1e-6 and RTOL["bfloat16"] == 1e-2


def test_elements_near_zero_get_a_floor_relative_to_the_leaf():
    base = np.array([100.0, 0.0, 1e-9], np.float32)
    near = np.array([100.0, 5e-5, -5e-5], np.float32)  # below 1e-6 * 100
    assert compare_numerics(_numerics(base), _numerics(near)) == []
    far = np.array([100.0, 5e-4, 0.0], np.float32)
    assert compare_numerics(_numerics(base), _numerics(far))
    # a leaf of rounding noise (exactly zero in real arithmetic): floor 1e-6 x 1
    noise = np.array([0.0, 6e-8, -1.2e-7], np.float32)
    assert compare_numerics(_numerics(noise), _numerics(-noise)) == []
    small = np.array([0.0, 0.5], np.float32)
    assert compare_numerics(_numerics(small), _numerics(np.array([0.0, 0.5001], np.float32)))


def test_integers_booleans_and_specials_compare_exactly():
    assert compare_numerics(_numerics(np.array([1, 2], np.int32)),
                            _numerics(np.array([1, 3], np.int32))) == [
        "value[1]: expected 2, got 3 (compared exactly)"]
    assert compare_numerics(_numerics(np.array([True])), _numerics(np.array([False])))
    specials = np.array([np.nan, np.inf, 1.0], np.float32)
    assert compare_numerics(_numerics(specials), _numerics(specials.copy())) == []
    assert compare_numerics(_numerics(specials), _numerics(np.array([1.0, np.inf, 1.0], np.float32)))
    assert compare_numerics(_numerics(specials), _numerics(np.array([np.nan, -np.inf, 1.0],
                                                                    np.float32)))


def test_structure_changes_are_reported():
    a = _numerics(np.zeros((2, 3), np.float32))
    assert compare_numerics(a, _numerics(np.zeros((3, 2), np.float32))) == [
        "value: expected float32[2, 3], got float32[3, 2]"]
    assert compare_numerics(a, _numerics(np.zeros((2, 3), np.float16))) == [
        "value: expected float32[2, 3], got float16[2, 3]"]
    two = "\n".join([HEADER] + format_leaves("value", (np.zeros((2, 3), np.float32),) * 2))
    assert compare_numerics(a, two) == ["leaves differ: expected ['value'], got ['value[0]', "
                                        "'value[1]']"]
    assert compare_numerics("garbage\n", a)[0].startswith("the golden numerics file is malformed")


def test_prng_keys_are_recorded_as_key_data():
    key = jax.random.key(7)
    text = "\n".join(format_leaves("value", key))
    data = np.asarray(jax.random.key_data(key))
    # one row per key: its raw key data, labelled by the key data's index
    assert text == ("value: key<threefry2x32>[]\n  [0] " + " ".join(str(int(v)) for v in data))
    assert compare_numerics(text, text) == []


# ---------------------------------------------------------------------------- store
def test_sync_views_writes_only_what_changed(tmp_path):
    def exact(view, expected, actual):
        return [] if expected == actual else ["differs"]
    d = tmp_path / "prog"
    views = {"00-trace.ir": "one\n", "01-after-cse.ir": "two\n"}
    first = store.sync_views(d, views, update=True, problems=exact)
    assert [(v.name, v.status) for v in first.views] == [("00-trace.ir", "created"),
                                                          ("01-after-cse.ir", "created")]
    stamp = (d / "00-trace.ir").stat().st_mtime_ns
    (d / "02-after-dce.ir").write_text("old\n")
    (d / "NOTES.md").write_text("not a view: never reported or removed\n")
    views["01-after-cse.ir"] = "TWO\n"
    check = store.sync_views(d, views, update=False, problems=exact)
    assert [(v.name, v.status) for v in check.views] == [
        ("00-trace.ir", "same"), ("01-after-cse.ir", "changed"), ("02-after-dce.ir", "stale")]
    assert not check.ok and (d / "01-after-cse.ir").read_text() == "two\n"  # a check writes nothing
    second = store.sync_views(d, views, update=True, problems=exact)
    assert [(v.name, v.status) for v in second.written] == [("01-after-cse.ir", "updated"),
                                                            ("02-after-dce.ir", "removed")]
    assert (d / "00-trace.ir").stat().st_mtime_ns == stamp
    assert sorted(p.name for p in d.iterdir()) == ["00-trace.ir", "01-after-cse.ir", "NOTES.md"]
    assert (d / "01-after-cse.ir").read_bytes() == b"TWO\n"  # no temp files left, \n line ends


def test_only_directories_of_views_are_stale(tmp_path):
    root = tmp_path / "expected"
    for name, files in (("01_kept", ["00-trace.ir"]), ("02_gone", ["00-trace.ir", "numerics.txt"]),
                        ("notes", ["README.md"]), ("03_mixed", ["00-trace.ir", "keep.py"])):
        (root / name).mkdir(parents=True)
        for f in files:
            (root / name / f).write_text("x\n")
    (root / "README.md").write_text("about the goldens\n")
    assert store.stale_program_dirs(root, ["01_kept"]) == [root / "02_gone"]


def test_unified_diff_is_labelled_with_the_golden_path():
    diff = store.unified_diff("a\nb\nc\n", "a\nB\nc\n", "golden/expected/p/00-trace.ir")
    assert diff.splitlines() == [
        "--- golden/expected/p/00-trace.ir", "+++ golden/expected/p/00-trace.ir (actual)",
        "@@ -1,3 +1,3 @@", " a", "-b", "+B", " c"]
    cut = store.unified_diff("".join(f"{i}\n" for i in range(50)), "", "x", max_lines=5)
    assert cut.splitlines()[-1] == "... (48 more diff lines not shown)"


# ---------------------------------------------------------------------------- CLI
@pytest.mark.parametrize("argv, message", [
    (["golden", "check", "no/such/dir"], "no/such/dir: no such file or directory"),
    (["golden", "check", "-k", "zzz_no_program"], "-k 'zzz_no_program': matches no program name"),
    (["golden", "check", "-p", "cse,nope"], "--pipeline: unknown pass 'nope'"),
    (["golden", "update", "--load", "no_such_plugin.py"], "--load no_such_plugin.py: no such file"),
    (["golden", "check", "--max-diff-lines", "-1"], "--max-diff-lines must be 0"),
])
def test_cli_usage_errors(argv, message, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("jaxpr-cc golden: error: ") and message in err
    assert len(err.strip().splitlines()) == 1


def test_cli_reports_a_program_that_cannot_be_loaded(tmp_path, capsys):
    programs = tmp_path / "golden" / "programs"
    programs.mkdir(parents=True)
    (programs / "01_broken.py").write_text("def fun(x):\n    return x\n")  # no example_args
    assert cli_main(["golden", "check", str(programs)]) == 1
    out = capsys.readouterr().out
    assert "ERROR 01_broken:" in out and "missing callable `example_args`" in out


TINY = '''\
"""A tiny program for the end-to-end golden test: sin(x) is computed twice."""
import jax.numpy as jnp

TAGS = ("elementwise", "float32")
SUPPORTS = ("grad",)


def fun(x):
    return jnp.sin(x) * jnp.sin(x) + x


def example_args():
    return (jnp.linspace(-1.0, 1.0, 4, dtype=jnp.float32),)
'''

# "Editing a pass's behaviour": a --load file that turns the registered cse pass
# into a no-op.
DISABLE_CSE = '''\
from jaxpr_cc.passes.base import PASS_REGISTRY

PASS_REGISTRY["cse"].run = lambda self, program, ctx: program
'''


def _cli(cwd, *args):
    env = dict(os.environ)
    env.pop("JAXPR_CC_CORPUS", None)
    proc = subprocess.run([sys.executable, "-m", "jaxpr_cc.cli.main", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stdout, proc.stderr


def _snapshot(directory: pathlib.Path) -> dict:
    return {str(p.relative_to(directory)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.mark.heavy  # ~30 s: a full golden update of the corpus after a pass edit
def test_edit_a_pass_then_update_end_to_end(tmp_path):
    golden = tmp_path / "golden"
    (golden / "programs").mkdir(parents=True)
    repo_golden = REPO / "golden"
    for name in ("02_python_scalars", "36_int_bitops_hash"):
        shutil.copy(repo_golden / "programs" / f"{name}.py", golden / "programs")
        shutil.copytree(repo_golden / "expected" / name, golden / "expected" / name)
    (golden / "programs" / "90_tiny.py").write_text(TINY)
    (golden / "expected" / "80_removed").mkdir()
    (golden / "expected" / "80_removed" / "00-trace.ir").write_text("gone\n")
    (tmp_path / "disable_cse.py").write_text(DISABLE_CSE)

    # A program without goldens and goldens without a program: reported, exit 1.
    code, out, err = _cli(tmp_path, "golden", "check")
    assert code == 1, err
    assert "MISSING 90_tiny: no golden directory golden/expected/90_tiny" in out
    assert "STALE golden/expected/80_removed" in out
    assert out.splitlines()[-2] == "golden check: 3 programs: 2 ok, 0 changed, 1 missing, 1 stale"

    code, out, err = _cli(tmp_path, "golden", "update")
    assert code == 0, err
    tiny_files = sorted(p.name for p in (golden / "expected" / "90_tiny").iterdir())
    assert tiny_files == ["00-trace.ir", "01-after-closure-convert.ir", "02-after-hoist-consts.ir",
                          "03-after-cse.ir", "04-after-dce.ir", "emitted-jaxpr.ir", "numerics.txt",
                          "python.py.txt"]
    assert sorted(l for l in out.splitlines() if l.startswith(("created", "updated", "removed"))) \
        == sorted([f"created golden/expected/90_tiny/{f}" for f in tiny_files]
                  + ["removed golden/expected/80_removed (no program 80_removed.py next to the "
                     "goldens)"])
    assert not (golden / "expected" / "80_removed").exists()
    code, out, err = _cli(tmp_path, "golden", "check")
    assert (code, out.splitlines()[-1]) == (0, "golden check: 3 programs: 3 ok, 0 changed, "
                                               "0 missing, 0 stale"), out + err
    before = _snapshot(golden / "expected")

    # cse stops merging: the views from cse on change, with a readable diff.
    code, out, err = _cli(tmp_path, "golden", "check", "--load", "disable_cse.py")
    assert code == 1, err
    changed = sorted(l.split()[1] for l in out.splitlines() if l.startswith("CHANGED"))
    assert "golden/expected/02_python_scalars/03-after-cse.ir" in changed
    assert "golden/expected/90_tiny/03-after-cse.ir" in changed
    assert not [c for c in changed if "36_int_bitops_hash" in c or c.endswith("00-trace.ir")]
    assert "--- golden/expected/90_tiny/03-after-cse.ir\n" \
           "+++ golden/expected/90_tiny/03-after-cse.ir (actual)\n" in out
    # Without cse, the output of the cse step is its input: every added line of the
    # diff is a line of the hoist-consts view.
    hoisted = (golden / "expected" / "90_tiny" / "02-after-hoist-consts.ir").read_text()
    section = out.split("+++ golden/expected/90_tiny/03-after-cse.ir (actual)\n")[1].split("CHANGED")[0]
    added = [l[1:] for l in section.splitlines() if l.startswith("+")]
    assert added and all(line in hoisted.splitlines() for line in added)
    assert sum(l.strip().endswith("= sin[accuracy=None] %x") for l in hoisted.splitlines()) == 2

    code, out, err = _cli(tmp_path, "golden", "update", "--load", "disable_cse.py")
    assert code == 0, err
    written = sorted(l.split()[1] for l in out.splitlines() if l.startswith("updated"))
    assert written == changed  # exactly the files the check showed, nothing else
    after = _snapshot(golden / "expected")
    untouched = [k for k in before if k.replace(os.sep, "/") not in
                 {c.removeprefix("golden/expected/") for c in changed}]
    assert untouched and all(after[k] == before[k] for k in untouched)  # same bytes, same mtime
    code, out, err = _cli(tmp_path, "golden", "check", "--load", "disable_cse.py")
    assert code == 0, out + err

    # The real cse again: update restores the repository's goldens byte for byte.
    code, out, err = _cli(tmp_path, "golden", "update")
    assert code == 0, err
    for name in ("02_python_scalars", "36_int_bitops_hash"):
        for path in (repo_golden / "expected" / name).iterdir():
            assert (golden / "expected" / name / path.name).read_bytes() == path.read_bytes()
    assert {k: v[0] for k, v in _snapshot(golden / "expected").items()} == \
        {k: v[0] for k, v in before.items()}


# ---------------------------------------------------------------------------- error views
def _branchy(x):
    if x.sum() > 0:  # Python control flow on a traced value: tracing fails
        return x
    return -x


def test_a_failed_trace_is_recorded_as_its_view():
    result = compute_views(_branchy, (jnp.ones(3),), pipeline="cse")
    assert list(result.views) == ["00-trace.ir"]
    text = result.views["00-trace.ir"]
    assert text.startswith("error: TracerBoolConversionError: Attempted boolean conversion")
    assert text.count("\n") == 1 and "/" not in text.split("Attempted", 1)[1]
    assert result.traced is None and result.final is None


@register_pass("test-golden-raises")
@dataclasses.dataclass(frozen=True)
class _Raises(Pass):
    def run(self, program, ctx):
        raise RuntimeError("broken on purpose")


def test_a_failed_pass_is_recorded_and_later_views_are_absent():
    result = compute_views(lambda x: jnp.sin(x) * 2.0, (jnp.ones(3),),
                           pipeline="cse,test-golden-raises,dce")
    assert list(result.views) == ["00-trace.ir", "01-after-cse.ir", "02-after-test-golden-raises.ir"]
    assert result.views["02-after-test-golden-raises.ir"] == (
        "error: pass 'test-golden-raises' failed: RuntimeError: broken on purpose\n")
    assert result.final is None


def test_error_lines_drop_machine_specific_text():
    e = ValueError("cannot read /home/someone/project/golden/programs/01_x.py:12 "
                   "(object at 0x7f3a2b4c5d60)\nsecond line")
    assert error_line(e) == "ValueError: cannot read 01_x.py:12 (object)"
    assert error_line(KeyError()) == "KeyError"
    assert error_line(ValueError("see '/opt/x/lib.py'"), {"/opt/x": "<lib>"}) == \
        "ValueError: see '<lib>/lib.py'"
