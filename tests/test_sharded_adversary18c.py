"""Sharded programs as JAX users expect them (issue 18): sharded constants and
hoisted parameters through save/load, compile and the command line; jax.grad of
jaxpr_cc.jit and of a Program with a custom_vjp inside shard_map with forward mode
on.  Compared to jax.jit (values and output shardings) on 8 host devices, in a
fresh process (tests/sharded_adversary18c_cases.py)."""
import pytest

from eight_devices import run_case_script
from sharded_adversary18c_cases import CASE_NAMES


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("sharded_adversary18c")
    return run_case_script("sharded_adversary18c_cases.py", str(out_dir))


@pytest.mark.parametrize("case", CASE_NAMES)
def test_sharded_adversary18c(reports, case):
    res, found = reports
    assert case in found, res.stderr[-4000:]
    assert found[case]["problems"] == [], "\n".join(found[case]["problems"])
