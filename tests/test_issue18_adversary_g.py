"""jaxpr_cc.jit as a drop-in for jax.jit, adversary round g (issue 18): compiling
a function that closes over a jax.Ref; the 8-device cases (hoist-consts and cse
keeping apart values that differ only in sharding, `jaxpr-cc exec` of a sharded
program, a saved executable's unused sharded argument) run in a fresh process
(tests/sharded_adversary18g_cases.py).  References: jax.jit itself."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_cc
from eight_devices import run_case_script
from sharded_adversary18g_cases import CASE_NAMES


# ---------------------------------------------------------------- 8 devices
@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("sharded_adversary18g")
    return run_case_script("sharded_adversary18g_cases.py", str(out_dir))


@pytest.mark.parametrize("case", CASE_NAMES)
def test_sharded_adversary18g(reports, case):
    res, found = reports
    assert case in found, res.stderr[-4000:]
    assert found[case]["problems"] == [], "\n".join(found[case]["problems"])


# ------------------------------------------------- a function closing over a Ref
def _closing_over(r):
    def f(x):
        r[...] += x
        return r[...] * 2, x
    return f


@pytest.mark.parametrize("stage", ["executable", "compile", "lower"])
def test_closed_over_ref_compiles_like_jax_jit(stage):
    x = jnp.arange(3.) + 1
    want_r = jax.new_ref(jnp.zeros(3))
    jf = jax.jit(_closing_over(want_r)).lower(x).compile()
    want = [jf(x), jf(x)]
    r = jax.new_ref(jnp.zeros(3))
    f = _closing_over(r)
    exe = {"executable": lambda: jaxpr_cc.jit(f).executable(x),
           "compile": lambda: jaxpr_cc.compile(jaxpr_cc.trace(f, x)),
           "lower": lambda: jaxpr_cc.jit(f).lower(x).compile()}[stage]()
    got = [exe(x), exe(x)]
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    np.testing.assert_array_equal(np.asarray(r[...]), np.asarray(want_r[...]))
    if stage != "lower":
        # (jax.jit's own Compiled.output_shardings raises here: compare with its results)
        assert jax.tree.leaves(exe.output_shardings) == [o.sharding for o in want[0]]
        assert len(jax.tree.leaves(exe.input_shardings)) == 1


def test_saving_an_executable_closing_over_a_ref_is_one_line(tmp_path):
    x = jnp.arange(3.)
    exe = jaxpr_cc.jit(_closing_over(jax.new_ref(jnp.zeros(3)))).executable(x)
    with pytest.raises(jaxpr_cc.SaveError, match=r"closes over a jax\.Ref") as info:
        exe.save(tmp_path / "never-written.jxe")
    assert len(str(info.value).splitlines()) == 1
    assert not (tmp_path / "never-written.jxe").exists()
