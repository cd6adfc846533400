"""Real-world library programs (lineax, optimistix, equinox, diffrax) saved, loaded and
emitted, each checked in a fresh process against JAX.

Each program is traced and run through the default pipeline in one process, which
saves it, emits it as a Python module and records JAX's value and gradient; a second
process loads the file and imports the module and compares values and gradients
(tests/realworld_roundtrip_driver.py).  The libraries' own primitives
(``linear_solve``, ``unvmap_any``...) carry pytree structures with custom nodes,
library objects, sentinels, ``functools.partial`` and held jaxprs as parameters.

equinox's runtime error checks (``eqx.error_if``, used by optimistix and diffrax)
stage a ``pure_callback`` of a closure: code, not data.  Those programs are traced
with ``EQX_ON_ERROR=nan`` (equinox's documented switch to checks without callbacks);
in the default mode saving them is refused with one line that names the primitive,
the parameter, the function and that switch.
"""
import ast
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER = os.path.join(HERE, "realworld_roundtrip_driver.py")
# One program per library in the default run; all of them (and diffrax) when heavy.
FAST = ["lineax_lu", "equinox_filter_custom_vjp", "optimistix_newton"]
ALL = ["lineax_lu", "lineax_cg", "lineax_function_operator", "optimistix_newton",
       "optimistix_closure", "equinox_filter_custom_vjp", "equinox_module_solve",
       "diffrax_tsit5"]


def _run(command, out_dir, names, env_extra):
    env = dict(os.environ, **env_extra)
    root = os.path.dirname(HERE)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, DRIVER, command, str(out_dir), *names], env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return {r["name"]: r for r in map(json.loads, done.stdout.strip().splitlines())}


def _round_trip(tmp_path, names, env_extra):
    saved = _run("save", tmp_path, names, env_extra)
    for name in names:
        assert saved[name]["save"] == "ok", saved[name]["save"]
        assert saved[name]["emit"] == "ok", saved[name]["emit"]
    checked = _run("check", tmp_path, names, env_extra)
    for name in names:
        assert checked[name] == {"name": name, "load": "ok", "emit": "ok"}, checked[name]


def test_one_program_per_library_round_trips_in_a_fresh_process(tmp_path):
    _round_trip(tmp_path, FAST, {"EQX_ON_ERROR": "nan"})


@pytest.mark.heavy
def test_every_library_program_round_trips_in_a_fresh_process(tmp_path):
    _round_trip(tmp_path, ALL, {"EQX_ON_ERROR": "nan"})


@pytest.mark.heavy
def test_lineax_programs_round_trip_with_equinox_defaults(tmp_path):
    # Without error checks in the program, nothing depends on EQX_ON_ERROR.
    _round_trip(tmp_path, ["lineax_lu", "lineax_cg", "lineax_function_operator",
                           "equinox_filter_custom_vjp"], {})


REFUSAL_CHECK = """
import sys
import jax.numpy as jnp
import jaxpr_cc
from jaxpr_cc.passes import DEFAULT_PIPELINE
from test_realworld import optimistix_newton
program = jaxpr_cc.run_passes(jaxpr_cc.trace(optimistix_newton, jnp.array([0.5, 0.3])),
                              DEFAULT_PIPELINE)
try:
    jaxpr_cc.save(program, sys.argv[1])
except jaxpr_cc.io.errors.SaveError as e:
    print(repr(str(e)))
"""


def test_equinox_error_callback_is_refused_in_one_line(tmp_path):
    # A fresh process with equinox's default error mode (callbacks staged).
    env = {k: v for k, v in os.environ.items() if k != "EQX_ON_ERROR"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(HERE), HERE, env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", REFUSAL_CHECK, str(tmp_path / "p.jcc")],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    message = ast.literal_eval(done.stdout.strip())  # the repr printed above
    assert "\n" not in message
    for part in ("pure_callback", "'callback'", "equinox._errors", "not data",
                 "EQX_ON_ERROR=nan"):
        assert part in message, message
