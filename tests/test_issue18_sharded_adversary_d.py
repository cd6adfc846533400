"""Sharded programs, adversary round d (issue 18): forward mode and closed-over
derivatives of custom_vjp rules inside shard_map, custom_vjp rules in eagerly
evaluated shard_map bodies, output shardings after hoist-consts, executables called
with arguments committed elsewhere.  Checked against float64 references and
jax.jit on 8 host devices, in a fresh process (tests/sharded_adversary18d_cases.py)."""
import pytest

from eight_devices import run_case_script
from sharded_adversary18d_cases import CASE_NAMES


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("sharded_adversary18d")
    return run_case_script("sharded_adversary18d_cases.py", str(out_dir))


@pytest.mark.parametrize("case", CASE_NAMES)
def test_sharded_adversary18d(reports, case):
    res, found = reports
    assert case in found, res.stderr[-4000:]
    assert found[case]["problems"] == [], "\n".join(found[case]["problems"])
