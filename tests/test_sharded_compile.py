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


def _run(out_dir, n_devices: int, *extra):
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={n_devices}"
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE.parent), env.get("PYTHONPATH"))
                                        if p)
    res = subprocess.run([sys.executable, str(HERE / "sharded_compile_cases.py"), str(out_dir),
                          *extra], env=env, capture_output=True, text=True, timeout=900)
    found = {}
    for line in res.stdout.splitlines():
        if line.startswith("{"):
            report = json.loads(line)
            found[report["case"]] = report
    return res, found


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("sharded_compile")


@pytest.fixture(scope="module")
def reports(out_dir):
    return _run(out_dir, 8)


@pytest.mark.parametrize("case", CASE_NAMES)
def test_sharded_compile(reports, case):
    res, found = reports
    assert case in found, res.stderr[-4000:]
    assert found[case]["problems"] == [], "\n".join(found[case]["problems"])


def test_saved_sharded_program_loads_with_one_device(reports, out_dir):
    assert "named_inputs_no_in_shardings" in reports[1], reports[0].stderr[-4000:]
    res, found = _run(out_dir, 1, "--one-device")
    assert "load_with_one_device" in found, res.stderr[-4000:]
    assert found["load_with_one_device"]["problems"] == [], \
        "\n".join(found["load_with_one_device"]["problems"])
