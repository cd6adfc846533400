"""Sharded programs on JAX's own SPMD: NamedSharding inputs, jax.set_mesh (Explicit
axes), shard_map, sharding constraints and jit in_shardings/out_shardings go
trace -> default passes -> compile -> save -> load -> run on 8 host devices and
give jax.jit's numbers and output shardings; the saved files then run under
jax.distributed in two CPU processes (4 devices each) with the numbers of one
process.  Each runs in fresh processes (tests/sharded_cases.py), since the host
device count must be set before JAX is imported."""
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sharded_cases import CASE_NAMES

HERE = Path(__file__).resolve().parent
WORKER = HERE / "sharded_cases.py"
SINGLE_TIMEOUT = 900
DISTRIBUTED_TIMEOUT = 600


def _env(n_devices: int) -> dict:
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={n_devices}"
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE.parent), env.get("PYTHONPATH"))
                                        if p)
    return env


def _reports(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def single_process(tmp_path_factory):
    out = tmp_path_factory.mktemp("sharded")
    res = subprocess.run([sys.executable, str(WORKER), "single", str(out)], env=_env(8),
                         capture_output=True, text=True, timeout=SINGLE_TIMEOUT)
    return out, res, {r["case"]: r for r in _reports(res.stdout)}


@pytest.mark.parametrize("case", CASE_NAMES)
def test_sharded_program_on_8_devices(single_process, case):
    _, res, reports = single_process
    assert case in reports, res.stderr[-4000:]
    report = reports[case]
    assert report["problems"] == [], "\n".join(report["problems"])
    assert report["devices"] == list(range(8))
    # Every case has an output split over the mesh (not only replicated).
    assert any(spec not in ("P()", "P(None,)", "P(None, None)")
               for spec, _ in report["out_shardings"])


def _run_distributed(out: Path, tmp: Path) -> list[tuple]:
    """Two jax.distributed processes (coordinator on 127.0.0.1, a free port) on the
    files in ``out``: ``[(returncode, stdout, stderr)]``.  Their output goes to
    files, not pipes: a process blocked writing to a full pipe while the other
    waits for it in a collective would hang both.  Both are killed on any failure."""
    port = _free_port()
    logs = [(open(tmp / f"p{i}.out", "w+"), open(tmp / f"p{i}.err", "w+")) for i in range(2)]
    procs = [subprocess.Popen([sys.executable, str(WORKER), "distributed", str(out), str(port),
                               str(i), "2"], env=_env(4), stdout=o, stderr=e, text=True)
             for i, (o, e) in enumerate(logs)]
    # One deadline for both: a process waiting on a dead peer must not get a fresh
    # timeout of its own.
    deadline = time.monotonic() + DISTRIBUTED_TIMEOUT
    try:
        # Polled, so that a process that fails stops the run at once: its peer would
        # otherwise wait for it in a collective until the deadline.
        while time.monotonic() < deadline:
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes) or any(c not in (None, 0) for c in codes):
                break
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    results = []
    for p, (o, e) in zip(procs, logs):
        o.seek(0)
        e.seek(0)
        results.append((p.returncode, o.read(), e.read()))
        o.close()
        e.close()
    return results


# What the coordinator says when the port chosen free was taken before it bound it.
_PORT_TAKEN = ("address already in use", "failed to add port")


def test_saved_programs_run_in_two_jax_distributed_processes(single_process, tmp_path):
    out, single, _ = single_process
    assert single.returncode == 0, single.stdout[-2000:] + single.stderr[-4000:]
    for attempt in range(3):
        run_dir = tmp_path / f"attempt{attempt}"
        run_dir.mkdir()
        results = _run_distributed(out, run_dir)
        if not any(word in results[0][2].lower() for word in _PORT_TAKEN):
            break
    outputs = [(stdout, stderr) for _, stdout, stderr in results]
    codes = [code for code, _, _ in results]
    local_devices = []
    for i, (code, (stdout, stderr)) in enumerate(zip(codes, outputs)):
        reports = {r["case"]: r for r in _reports(stdout)}
        assert set(reports) == set(CASE_NAMES), f"process {i}:\n{stderr[-4000:]}"
        for case, report in reports.items():
            assert report["problems"] == [], f"process {i}, {case}:\n" + \
                "\n".join(report["problems"])
            assert report["shards_checked"] >= 2
        assert code == 0, stderr[-4000:]
        local_devices.append(reports[CASE_NAMES[0]]["local_devices"])
    # The processes hold disjoint halves of the 8 devices, numbered apart from the
    # ids the single process saved (so the mesh was found by device position).
    assert len(local_devices[0]) == len(local_devices[1]) == 4
    assert not set(local_devices[0]) & set(local_devices[1])
    assert not set(local_devices[1]) <= set(range(8))
