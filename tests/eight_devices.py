"""Run a case script on 8 host devices in a fresh process (the device count must be
set before JAX is imported) and collect its JSON report lines by case name."""
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run_case_script(script: str, *args: str):
    """``(completed process, {case: report})`` of ``tests/<script> ARGS...``."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
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
