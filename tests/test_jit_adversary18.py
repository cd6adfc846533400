"""Adversary round 18 against jax.jit: jaxpr_cc.jit inside shard_map with
check_vma, jax.clear_caches() retracing jaxpr_cc.jit functions, and
jaxpr_cc.compile following an argument committed to one device.  The 8-device
cases run in a fresh process (tests/jit_adversary18_cases.py), since the host
device count must be set before JAX is imported."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_cc
from eight_devices import run_case_script
from jit_adversary18_cases import CASE_NAMES


@pytest.fixture(scope="module")
def reports():
    return run_case_script("jit_adversary18_cases.py")


@pytest.mark.parametrize("case", CASE_NAMES)
def test_on_eight_devices(reports, case):
    res, found = reports
    assert case in found, res.stderr[-4000:]
    assert found[case]["problems"] == [], "\n".join(found[case]["problems"])


SCALE = 1.0


def _reads_global(a):
    return a * SCALE  # read at trace time


@pytest.mark.parametrize("make", [jax.jit, jaxpr_cc.jit,
                                  lambda f: jaxpr_cc.jit(f, pipeline="canonicalize")],
                         ids=["jax.jit", "jaxpr_cc.jit", "jaxpr_cc.jit-pipeline"])
def test_clear_caches_retraces(make):
    global SCALE
    x = jnp.ones(3)
    try:
        SCALE = 1.0
        kept = make(_reads_global)
        np.testing.assert_array_equal(kept(x), x)
        SCALE = 3.0
        # Without clearing, both jax.jit and jaxpr_cc.jit keep the traced value.
        np.testing.assert_array_equal(kept(x), x)
        jax.clear_caches()
        # The same object and a new one (the shared per-function cache) retrace.
        np.testing.assert_array_equal(kept(x), 3 * x)
        np.testing.assert_array_equal(make(_reads_global)(x), 3 * x)
    finally:
        SCALE = 1.0


def test_clear_caches_forgets_programs():
    f = jaxpr_cc.jit(lambda a: a + 1)
    f(jnp.ones(2))
    f(jnp.ones(3))
    assert f.cache_size() == 2
    jax.clear_caches()
    assert f.cache_size() == 0
    np.testing.assert_array_equal(f(jnp.ones(2)), jnp.ones(2) + 1)
    assert f.cache_size() == 1


@pytest.mark.parametrize("convert", [jax.closure_convert, jaxpr_cc.closure_convert],
                         ids=["jax", "jaxpr_cc"])
def test_clear_caches_reconverts_closures(convert):
    global SCALE
    x = jnp.ones(3)
    try:
        SCALE = 1.0
        g, consts = convert(_reads_global, x)
        np.testing.assert_array_equal(g(x, *consts), x)
        SCALE = 3.0
        jax.clear_caches()
        g, consts = convert(_reads_global, x)
        np.testing.assert_array_equal(g(x, *consts), 3 * x)
    finally:
        SCALE = 1.0


@pytest.mark.parametrize("spec", ["f32[99999999999999999999]", "f32[4294967296,4294967296]",
                                  "f32[3], i32[0,9223372036854775808]"])
def test_cli_args_refuses_shapes_beyond_int64(spec):
    from jaxpr_cc.cli.errors import CliError
    from jaxpr_cc.cli.loading import parse_args_spec
    with pytest.raises(CliError, match=r"--args: argument \d '.*\]' has a dimension or element "
                                       r"count above 2\*\*63-1"):
        parse_args_spec(spec)


def test_cli_args_accepts_the_largest_shape():
    from jaxpr_cc.cli.loading import parse_args_spec
    (spec,) = parse_args_spec("u8[9223372036854775807]")
    assert spec.shape == (2**63 - 1,)
