"""jaxpr_cc.jit as a drop-in for jax.jit, adversary round g (issue 18): the
8-device cases (hoist-consts and cse keeping values apart that differ only in
sharding) run in a fresh process (tests/sharded_adversary18g_cases.py).
References: jax.jit itself."""
import pytest

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
