"""tools/run_jax_tests.py: calls of jax.jit / jax.closure_convert written in the test
file go to jaxpr-cc's, everything else keeps JAX's own."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "run_jax_tests.py"

FAKE_JAX_TEST = '''
import functools
import jax
import jax.numpy as jnp
from jax import jit

import jaxpr_cc


def test_jit_is_swapped_in_this_file():
    for f in (jax.jit(jnp.sin), jit(jnp.sin), functools.partial(jax.jit, static_argnums=1)(
            lambda x, n: x * n)):
        assert hasattr(f, "program"), f
    assert float(jax.jit(lambda x: x + 1.0)(1.0)) == 2.0


@jax.jit
def decorated(x):
    return x * 2.0


def test_decorator_at_import_is_swapped():
    assert hasattr(decorated, "program") and float(decorated(2.0)) == 4.0


def test_jax_internals_keep_the_real_jit():
    # jnp functions jit themselves inside JAX: no jaxpr-cc there.
    assert not hasattr(jax.jit, "program")
    assert float(jnp.sum(jnp.ones(3))) == 3.0


def test_closure_convert():
    a = jnp.float32(3.0)
    converted, consts = jax.closure_convert(lambda x: x * a, jnp.float32(1.0))
    assert float(converted(jnp.float32(2.0), *consts)) == 6.0
'''


def _run(tmp_path, *flags):
    test_file = tmp_path / "fake_jax_test.py"
    test_file.write_text(FAKE_JAX_TEST)
    return subprocess.run([sys.executable, str(TOOL), str(test_file), *flags, "--", "-q",
                           "-p", "no:cacheprovider"], capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)


def test_swaps_jit_and_closure_convert(tmp_path):
    res = _run(tmp_path, "--swap", "jit", "--swap", "closure_convert")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "4 passed" in res.stdout
    assert "jaxpr_cc.closure_convert stood in for jax.closure_convert 1 times" in res.stdout
    assert "jaxpr_cc.jit stood in for jax.jit" in res.stdout


def test_no_swap_is_the_baseline(tmp_path):
    res = _run(tmp_path, "--no-swap")
    assert res.returncode == 1  # the file checks that jit was swapped
    assert "stood in" not in res.stdout


def test_bad_path_is_a_clear_error(tmp_path):
    res = subprocess.run([sys.executable, str(TOOL), str(tmp_path / "missing_test.py")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "is not a file" in res.stderr
