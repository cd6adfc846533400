"""``jaxpr_cc.compile`` of programs traced from NamedSharding arrays or under
jax.set_mesh, without in_shardings, and with PartitionSpec in_shardings under
jax.set_mesh: jax.jit's values and output shardings through passes, save, load,
compile and executable save/load (tests/sharded_compile_cases.py, on 8 host
devices in a fresh process)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sharded_compile_cases import CASE_NAMES

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    env = dict(os.environ)
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE.parent), env.get("PYTHONPATH"))
                                        if p)
    res = subprocess.run([sys.executable, str(HERE / "sharded_compile_cases.py"),
                          str(tmp_path_factory.mktemp("sharded_compile"))],
                         env=env, capture_output=True, text=True, timeout=900)
    found = {}
    for line in res.stdout.splitlines():
        if line.startswith("{"):
            report = json.loads(line)
            found[report["case"]] = report
    return res, found


@pytest.mark.parametrize("case", CASE_NAMES)
def test_sharded_compile(reports, case):
    res, found = reports
    assert case in found, res.stderr[-4000:]
    assert found[case]["problems"] == [], "\n".join(found[case]["problems"])
