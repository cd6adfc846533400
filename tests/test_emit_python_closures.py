"""Emitted Python for rules that close over traced values is first-order.

Every closed-over value of a custom rule is an explicit argument of the emitted
custom function, and the derivative with respect to it follows the rule's recorded
``closed_over`` policy, as the Program's does.  Each program is emitted as traced
and after the default pipeline (whose ``hoist-consts`` turns constants into module
parameters); in ONE fresh process every emitted module is imported without
jaxpr_cc, and its values and gradients with respect to every argument are compared
with JAX where JAX can differentiate the original, and with float64 central
differences of a NumPy reference everywhere.
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

import jaxpr_cc
from emit_closure_programs import PROGRAMS, scaled_clip

TESTS_DIR = pathlib.Path(__file__).resolve().parent
PIPELINES = {"traced": None, "default": jaxpr_cc.DEFAULT_PIPELINE}

_WORKER = textwrap.dedent('''
    import importlib.util, json, sys, traceback
    import jax
    import numpy as np
    manifest = json.load(open(sys.argv[1]))
    functions = {}
    for entry in manifest:
        spec = importlib.util.spec_from_file_location("emitted_" + entry["key"], entry["path"])
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        functions[entry["key"]] = getattr(module, entry["function"])
    leaked = sorted(m for m in sys.modules if m == "jaxpr_cc" or m.startswith("jaxpr_cc."))
    sys.path.insert(0, sys.argv[2])
    from emit_closure_programs import PROGRAMS, finite_difference_grad
    by_name = {p.name: p for p in PROGRAMS}
    report = {"leaked": leaked, "results": {}}
    for entry in manifest:
        prog = by_name[entry["program"]]
        emitted = functions[entry["key"]]
        argnums = tuple(range(len(prog.args)))
        out = {}
        try:
            out["value"] = float(emitted(*prog.args))
            out["jax_value"] = float(prog.fun(*prog.args))
            out["reference_value"] = float(prog.reference(*prog.args))
            out["grad"] = [np.asarray(g, np.float64).tolist()
                           for g in jax.grad(emitted, argnums=argnums)(*prog.args)]
            out["fd_grad"] = [g.tolist() for g in finite_difference_grad(prog.reference, prog.args)]
            try:
                out["jax_grad"] = [np.asarray(g, np.float64).tolist()
                                   for g in jax.grad(prog.fun, argnums=argnums)(*prog.args)]
            except Exception as e:
                out["jax_grad_error"] = type(e).__name__
        except Exception as e:
            out["error"] = "".join(traceback.format_exception_only(type(e), e))[-800:]
        report["results"][entry["key"]] = out
    print(json.dumps(report))
''')


def _emit_all(tmp_path) -> list[dict]:
    manifest = []
    for prog in PROGRAMS:
        program = jaxpr_cc.trace(prog.fun, *prog.args, **prog.options)
        for label, pipeline in PIPELINES.items():
            p = program if pipeline is None else jaxpr_cc.run_passes(program, pipeline)
            key = f"{prog.name}_{label}"
            path = tmp_path / f"{key}.py"
            jaxpr_cc.write_python(p, path)
            manifest.append({"key": key, "program": prog.name, "path": str(path),
                             "function": p.name})
    return manifest


@pytest.fixture(scope="module")
def fresh_report(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("closures")
    manifest = _emit_all(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    run = subprocess.run([sys.executable, "-c", _WORKER, str(tmp_path / "manifest.json"),
                          str(TESTS_DIR)], capture_output=True, text=True,
                         env=dict(os.environ), timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    return manifest, report


@pytest.mark.heavy
def test_emitted_modules_do_not_import_jaxpr_cc(fresh_report):
    _, report = fresh_report
    assert report["leaked"] == []


@pytest.mark.heavy
@pytest.mark.parametrize("key", [f"{p.name}_{label}" for p in PROGRAMS for label in PIPELINES])
def test_emitted_closure_program_matches_jax_and_finite_differences(key, fresh_report):
    _, report = fresh_report
    prog = next(p for p in PROGRAMS if key.startswith(p.name + "_")
                and key[len(p.name) + 1:] in PIPELINES)
    out = report["results"][key]
    assert "error" not in out, out.get("error")
    np.testing.assert_allclose(out["value"], out["jax_value"], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out["value"], out["reference_value"], rtol=2e-4, atol=2e-5)
    # JAX differentiates the original exactly when the program says it does.
    assert ("jax_grad" in out) == prog.jax_grad_works, out.get("jax_grad_error")
    for got, fd in zip(out["grad"], out["fd_grad"]):
        np.testing.assert_allclose(got, fd, rtol=2e-3, atol=2e-4)
    if prog.jax_grad_works:
        for got, want in zip(out["grad"], out["jax_grad"]):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.heavy
def test_hoisted_parameters_are_module_constants(fresh_report):
    """After hoist-consts, the emitted function reads its parameters from module-level
    constants and every custom function gets them as explicit arguments."""
    manifest, _ = fresh_report
    for entry in manifest:
        source = pathlib.Path(entry["path"]).read_text()
        assert "_with_consts(" in source, entry["key"]
        if entry["key"] == "odeint_closure_default":
            assert "\nPARAM0 = " in source


def _exec_module(source: str) -> dict:
    namespace: dict = {}
    exec(compile(source, "<emitted>", "exec"), namespace)
    return namespace


def test_error_policy_raises_the_programs_error():
    """closed_over='error': differentiating w.r.t. the closed-over value raises the
    same one-line message from the emitted module as from the Program; w.r.t. the
    explicit argument both still work and agree with each other."""
    args = (np.float32(1.3), np.array([0.3, -1.2, 0.8], np.float32))
    program = jaxpr_cc.trace(scaled_clip, *args, closed_over="error")
    emitted = _exec_module(jaxpr_cc.emit_python(program))[program.name]
    with pytest.raises(jaxpr_cc.ClosedOverError) as want:
        jax.grad(program)(*args)
    with pytest.raises(ValueError) as got:
        jax.grad(emitted)(*args)
    assert type(got.value).__name__ == "ClosedOverError"
    assert str(got.value) == str(want.value)
    g_x = jax.grad(emitted, argnums=1)(*args)
    fd = _central_difference(lambda x: float(scaled_clip(args[0], x)), args[1])
    np.testing.assert_allclose(np.asarray(g_x), fd, rtol=2e-3, atol=2e-3)


def _central_difference(f, x, eps=1e-3):
    x = np.asarray(x, np.float64)
    g = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        hi, lo = x.copy(), x.copy()
        hi[idx] += eps
        lo[idx] -= eps
        g[idx] = (f(hi.astype(np.float32)) - f(lo.astype(np.float32))) / (2 * eps)
    return g


def test_emitted_closure_modules_jit_and_vmap():
    """The first-order form also survives jit and vmap (values against JAX)."""
    prog = next(p for p in PROGRAMS if p.name == "custom_vjp_closure")
    program = jaxpr_cc.run_passes(jaxpr_cc.trace(prog.fun, *prog.args), jaxpr_cc.DEFAULT_PIPELINE)
    emitted = _exec_module(jaxpr_cc.emit_python(program))[program.name]
    ws = np.array([0.5, 1.0, 2.0], np.float32)
    got = jax.jit(jax.vmap(jax.grad(emitted), in_axes=(0, None)))(ws, prog.args[1])
    fd = np.array([_central_difference(lambda w: float(prog.fun(w, prog.args[1])), np.float64(w))
                   for w in ws])
    np.testing.assert_allclose(np.asarray(got), fd, rtol=2e-3, atol=2e-3)
