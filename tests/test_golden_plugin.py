"""The ``golden`` pytest fixture, used from a throwaway project in a temporary
directory that has no conftest and only jaxpr-cc installed: the fixture must come
from the ``pytest11`` entry point.  Each pytest run is a subprocess, as a user's
would be.
"""
from __future__ import annotations

import textwrap

import jax
import jax.numpy as jnp
import pytest

from jaxpr_cc.golden.numerics import compare_numerics, format_leaves, parse_numerics

pytest_plugins = ("pytester",)

SOLVER = '''
import jax.numpy as jnp


def solver(x):
    y = jnp.{op}(x) * 2.0
    return jnp.{op}(x) * 2.0 + y


def test_solver(golden):
    golden.check(solver, jnp.ones(3, jnp.float32), pipeline="cse,dce")
'''


@pytest.fixture
def project(pytester):
    pytester.makepyfile(test_solver=SOLVER.format(op="sin"))
    return pytester


def _run(pytester, *args):
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)


def test_the_fixture_comes_from_the_entry_point(project):
    result = _run(project, "-p", "no:jaxpr_cc_golden")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'golden' not found*"])


@pytest.mark.heavy  # runs pytest three times in a subprocess (~25 s)
def test_missing_goldens_fail_then_changes_show_a_diff_until_updated(project):
    result = _run(project)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*no golden files in goldens/test_solver/test_solver; run pytest "
                                 "--update-goldens to create them*"])
    assert not (project.path / "goldens").exists()

    result = _run(project, "--update-goldens")
    result.assert_outcomes(passed=1)
    directory = project.path / "goldens" / "test_solver" / "test_solver"
    assert sorted(p.name for p in directory.iterdir()) == [
        "00-trace.ir", "01-after-cse.ir", "02-after-dce.ir"]
    result.stdout.fnmatch_lines(["*jaxpr-cc goldens written*",
                                 "created goldens/test_solver/test_solver/00-trace.ir",
                                 "created goldens/test_solver/test_solver/01-after-cse.ir",
                                 "created goldens/test_solver/test_solver/02-after-dce.ir"])
    traced = (directory / "00-trace.ir").read_text()
    assert traced.count("= sin[accuracy=None] %x") == 2          # traced twice ...
    assert (directory / "01-after-cse.ir").read_text().count("sin[") == 1  # ... merged by cse
    before = {p.name: p.read_text() for p in directory.iterdir()}

    project.makepyfile(test_solver=SOLVER.format(op="cos"))
    result = _run(project)
    result.assert_outcomes(failed=1)
    report = result.stdout.str()
    expected = "\n".join([
        "goldens/test_solver/test_solver/00-trace.ir: output differs from the golden file",
        "--- goldens/test_solver/test_solver/00-trace.ir",
        "+++ goldens/test_solver/test_solver/00-trace.ir (actual)",
        "@@ -1,9 +1,9 @@",
        " # in_tree: PyTreeDef(((*,), {}))",
        " # out_tree: PyTreeDef(*)",
        " func @solver(%x:f32[3]) -> (f32[3]) {",
        "-  %0:f32[3] = sin[accuracy=None] %x",
        "+  %0:f32[3] = cos[accuracy=None] %x",
    ])
    assert expected in report
    assert "(run pytest --update-goldens to accept the new output)" in report
    assert {p.name: p.read_text() for p in directory.iterdir()} == before  # nothing written

    result = _run(project, "--update-goldens")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["updated goldens/test_solver/test_solver/00-trace.ir"])
    assert (directory / "00-trace.ir").read_text() == before["00-trace.ir"].replace("sin", "cos")
    _run(project).assert_outcomes(passed=1)


def test_views_names_checks_and_golden_dir(pytester):
    pytester.makeini(textwrap.dedent("""\
        [pytest]
        golden_dir = tests/golden_files
        """))
    pytester.makepyfile(test_more=textwrap.dedent('''
        import jax.numpy as jnp
        import pytest


        def f(x, *, scale):
            return jnp.tanh(x) * scale


        def test_views(golden):
            out = golden.check(f, jnp.arange(3.0, dtype=jnp.float32), kwargs={"scale": 2.0},
                               pipeline="dce", views=("jaxpr", "python", "numerics"),
                               grad_argnums=(0,), name="all")
            x = jnp.arange(3.0, dtype=jnp.float32)
            assert jnp.allclose(out(x, scale=2.0), f(x, scale=2.0), rtol=1e-6)
            golden.check(f, jnp.ones(2, jnp.float32), kwargs={"scale": 1.0}, pipeline="",
                         name="small", checks="CHECK: tanh[accuracy=None] %x\\nCHECK: mul")


        def test_same_name_twice(golden):
            golden.check(f, jnp.ones(2, jnp.float32), kwargs={"scale": 1.0}, pipeline="")
            with pytest.raises(ValueError, match="already called in this test without a name"):
                golden.check(f, jnp.ones(2, jnp.float32), kwargs={"scale": 1.0}, pipeline="")


        def test_failing_filecheck(golden):
            golden.check(f, jnp.ones(2, jnp.float32), kwargs={"scale": 1.0}, pipeline="",
                         checks="CHECK: tanh\\nCHECK-NEXT: sin")
        '''))
    result = _run(pytester, "--update-goldens")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines([
        "*checks:2: error: CHECK-NEXT: expected string not found in input*",
        "*closest match (final IR line *",
    ])
    root = pytester.path / "tests" / "golden_files" / "test_more"
    assert sorted(p.name for p in (root / "test_views--all").iterdir()) == [
        "emitted-jaxpr.ir", "numerics.txt", "python.py.txt"]
    assert sorted(p.name for p in (root / "test_views--small").iterdir()) == ["00-trace.ir"]
    numerics = (root / "test_views--all" / "numerics.txt").read_text()
    # the recorded value and gradient are JAX's own, on the original function
    x = jnp.arange(3.0, dtype=jnp.float32)
    value = jax.jit(lambda v: jnp.tanh(v) * 2.0)(x)
    grad = jax.jit(jax.grad(lambda v: jnp.sum(jnp.tanh(v) * 2.0)))(x)
    assert parse_numerics(numerics) and compare_numerics(numerics, "\n".join(
        format_leaves("value", value) + format_leaves("grad", (grad,)))) == []
    _run(pytester, "-k", "views").assert_outcomes(passed=1)
