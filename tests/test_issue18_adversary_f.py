"""jaxpr_cc.jit as a drop-in for jax.jit, adversary round f (issue 18): jax.Ref
arguments, keyword-argument donation in ``.executable``, a closed stdout in the CLI;
the 8-device cases (hoisted sharded constants' output placement, ``device=`` in
``.executable``, forward mode through a check_vma zero term) run in a fresh process
(tests/sharded_adversary18f_cases.py).  References: jax.jit itself."""
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_cc
from eight_devices import run_case_script
from sharded_adversary18f_cases import CASE_NAMES


# ------------------------------------------------------------ jax.Ref arguments
def _accumulate(r, x):
    r[...] += x
    return x.sum()


@pytest.mark.parametrize("jit", [jax.jit, jaxpr_cc.jit], ids=["jax", "jaxpr_cc"])
def test_ref_argument_is_mutated_in_place(jit):
    x = jnp.arange(3.) + 1
    r = jax.new_ref(jnp.zeros(3))
    f = jit(_accumulate)
    s = f(r, x)
    f(r, x)
    assert float(s) == 6.0
    np.testing.assert_array_equal(np.asarray(r[...]), [2., 4., 6.])


def _refs_in_pytree(x, *, st):
    st["a"][...] = st["a"][...] * 2 + x
    st["b"][0] = 7.
    return x * 3


def test_refs_in_a_keyword_pytree_match_jax_jit():
    x = jnp.arange(3.)
    got, want = [], []
    for jit, into in ((jax.jit, want), (jaxpr_cc.jit, got)):
        a, b = jax.new_ref(jnp.ones(3)), jax.new_ref(jnp.zeros(2))
        out = jit(_refs_in_pytree)(x, st={"a": a, "b": b})
        into.extend([np.asarray(out), np.asarray(a[...]), np.asarray(b[...])])
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_ref_argument_through_the_aot_stages_and_executable():
    x = jnp.arange(3.) + 1
    jf = jaxpr_cc.jit(_accumulate)
    r = jax.new_ref(jnp.zeros(3))
    assert jax.eval_shape(jf, r, x) == jax.eval_shape(jax.jit(_accumulate), r, x)
    assert str(jf.trace(r, x).jaxpr) == str(jax.jit(_accumulate).trace(r, x).jaxpr)
    assert float(jf.lower(r, x).compile()(r, x)) == 6.0
    exe = jf.executable(r, x)
    exe(r, x)
    np.testing.assert_array_equal(np.asarray(r[...]), [2., 4., 6.])
    # jax.export cannot serialize Ref inputs: one line naming the argument.
    with pytest.raises(jaxpr_cc.SaveError, match=r"argument leaf 0 is a jax\.Ref"):
        exe.save("/nonexistent-dir/never-written.jxe")


def test_compile_of_a_traced_program_with_a_ref_argument():
    x = jnp.arange(3.) + 1
    r = jax.new_ref(jnp.zeros(3))
    exe = jaxpr_cc.compile(jaxpr_cc.trace(_accumulate, r, x))
    assert float(exe(r, x)) == 6.0
    np.testing.assert_array_equal(np.asarray(r[...]), [1., 2., 3.])


def _accumulate_in_loop(r, x):
    def body(i, count):
        r[...] += x * i
        return count + 1
    return jax.lax.fori_loop(0, 3, body, 0)


def test_ref_argument_written_inside_a_loop_matches_jax_jit():
    # The loop body's effects name the Ref: kept by position in the IR, so the
    # emitted body (new Vars) still names its own input.
    x = jnp.arange(3.) + 1
    results = []
    for run in (jax.jit(_accumulate_in_loop),
                jaxpr_cc.jit(_accumulate_in_loop),
                lambda r, x: jaxpr_cc.compile(jaxpr_cc.trace(_accumulate_in_loop, r, x))(r, x)):
        r = jax.new_ref(jnp.ones(3))
        count = run(r, x)
        results.append((int(count), np.asarray(r[...])))
    for count, value in results[1:]:
        assert count == results[0][0]
        np.testing.assert_array_equal(value, results[0][1])


# ---------------------------------------------- donation of keyword arguments
def _add(x, y):
    return x + y


@pytest.mark.parametrize("donate", [dict(donate_argnames="y"), dict(donate_argnums=1)],
                         ids=["argnames", "argnums"])
@pytest.mark.parametrize("by_keyword", [True, False], ids=["keyword", "positional"])
def test_executable_donates_as_jax_jit_does(donate, by_keyword):
    def call(f, b):
        return f(jnp.ones(4), y=b) if by_keyword else f(jnp.ones(4), b)
    b = jnp.ones(4)
    call(jax.jit(_add, **donate), b)
    want = b.is_deleted()
    b = jnp.ones(4)
    exe = call(jaxpr_cc.jit(_add, **donate).executable, b)
    call(exe, b)
    assert b.is_deleted() == want


def _scale(x, *, s, t):
    return x * s + t


def test_keyword_donation_picks_the_named_leaves_only():
    a, s, t = jnp.ones(3), jnp.full(3, 2.), jnp.full(3, 5.)
    exe = jaxpr_cc.jit(_scale, donate_argnames="t").executable(a, s=s, t=t)
    out = exe(a, s=s, t=t)
    np.testing.assert_array_equal(np.asarray(out), [7., 7., 7.])
    assert t.is_deleted() and not s.is_deleted() and not a.is_deleted()


# ---------------------------------------------------------- CLI, stdout closed
def _run_closed_stdout(args):
    command = ["sh", "-c", 'exec "$0" "$@" >&-', sys.executable, "-m", "jaxpr_cc.cli.main",
               *map(str, args)]
    return subprocess.run(command, stderr=subprocess.PIPE, timeout=300)


@pytest.fixture(scope="module")
def small_program(tmp_path_factory):
    path = tmp_path_factory.mktemp("closed") / "p.jcc"
    jaxpr_cc.save(jaxpr_cc.trace(jnp.sin, jax.ShapeDtypeStruct((3,), jnp.float32)), path)
    return path


@pytest.mark.parametrize("command", [["opt", "{p}", "-p", "dce", "-o", "-"],
                                     ["opt", "{p}", "-p", "dce", "-o", "/dev/stdout"],
                                     ["show", "{p}"], ["opt", "--list"], ["--version"]],
                         ids=["opt -o -", "opt -o /dev/stdout", "show", "opt --list",
                              "--version"])
def test_a_result_for_a_closed_stdout_is_one_line(small_program, command):
    proc = _run_closed_stdout([a.format(p=small_program) for a in command])
    err = proc.stderr.decode()
    assert proc.returncode == 2 and len(err.splitlines()) == 1, (proc.returncode, err)
    assert "cannot write to stdout" in err and "Traceback" not in err, err


# ---------------------------------------------------------------- 8 devices
@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("sharded_adversary18f")
    return run_case_script("sharded_adversary18f_cases.py", str(out_dir))


@pytest.mark.parametrize("case", CASE_NAMES)
def test_sharded_adversary18f(reports, case):
    res, found = reports
    assert case in found, res.stderr[-4000:]
    assert found[case]["problems"] == [], "\n".join(found[case]["problems"])
