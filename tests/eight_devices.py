"""Run a case script on host devices in a fresh process (the device count must be
set before JAX is imported) and collect its JSON report lines by case name."""
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run_case_script(script: str, *args: str, devices: int = 8):
    """``(completed process, {case: report})`` of ``tests/<script> ARGS...`` on
    ``devices`` host devices."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE.parent), env.get("PYTHONPATH"))
                                        if p)
    res = subprocess.run([sys.executable, str(HERE / script), *args], env=env,
                         capture_output=True, text=True, timeout=900)
    found = {}
    for line in res.stdout.splitlines():
        if line.startswith("{"):
            report = json.loads(line)
            found[report["case"]] = report
    return res, found
