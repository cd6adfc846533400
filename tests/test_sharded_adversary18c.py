"""Sharded programs as JAX users expect them (issue 18): sharded constants and
hoisted parameters through save/load, compile and the command line; jax.grad of
jaxpr_cc.jit and of a Program with a custom_vjp inside shard_map with forward mode
on.  Compared to jax.jit (values and output shardings) on 8 host devices, in a
fresh process (tests/sharded_adversary18c_cases.py)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sharded_adversary18c_cases import CASE_NAMES

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("sharded_adversary18c")
    env = dict(os.environ)
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE.parent), env.get("PYTHONPATH"))
                                        if p)
    res = subprocess.run([sys.executable, str(HERE / "sharded_adversary18c_cases.py"),
                          str(out_dir)], env=env, capture_output=True, text=True, timeout=900)
    found = {}
    for line in res.stdout.splitlines():
        if line.startswith("{"):
            report = json.loads(line)
            found[report["case"]] = report
    return res, found


@pytest.mark.parametrize("case", CASE_NAMES)
def test_sharded_adversary18c(reports, case):
    res, found = reports
    assert case in found, res.stderr[-4000:]
    assert found[case]["problems"] == [], "\n".join(found[case]["problems"])
