"""Driver for the save/load/emit column of tests/test_realworld_corpus.py, run in fresh
processes with ``EQX_ON_ERROR=nan`` (see tests/test_realworld_roundtrip.py for why).

``save DIR ID...``: trace each corpus program (tests/realworld_corpus.py), run the
default pipeline, save it and emit it as a Python module, and record the reference
value and gradient (JAX's, or float64 finite differences where JAX raises).
``check DIR ID...``: load each saved program and import each emitted module (nothing
from the saving process is reused) and compare their values and gradients with the
recorded references.  Prints one JSON line per program.
"""
import importlib.util
import json
import os
import sys

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from realworld_corpus import PROGRAMS, jax_gradient, reference_gradient  # noqa: E402

TABLE = {name: (fun, args) for name, fun, args in PROGRAMS}


def _leaves(tree):
    return [np.asarray(leaf) for leaf in jax.tree.leaves(tree)]


def save(out_dir, names):
    import jaxpr_cc
    from jaxpr_cc.passes import DEFAULT_PIPELINE
    for name in names:
        fun, args = TABLE[name]
        program = jaxpr_cc.run_passes(jaxpr_cc.trace(fun, *args), DEFAULT_PIPELINE)
        record = {"name": name, "function": program.name}
        value = _leaves(fun(*args))
        grads = _leaves(reference_gradient(name, fun, args))
        np.savez(os.path.join(out_dir, f"{name}.npz"),
                 **{f"value{i}": v for i, v in enumerate(value)},
                 **{f"grad{i}": g for i, g in enumerate(grads)})
        for kind, write in (
                ("save", lambda: jaxpr_cc.save(program, os.path.join(out_dir, f"{name}.jcc"))),
                ("emit", lambda: jaxpr_cc.write_python(
                    program, os.path.join(out_dir, f"{name}_emitted.py")))):
            try:
                write()
                record[kind] = "ok"
            except Exception as e:  # reported (one line) for the test to judge
                record[kind] = f"{type(e).__name__}: {str(e)[:400]}"
        with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
            json.dump(record, f)
        print(json.dumps(record), flush=True)


def _import_emitted(out_dir, name):
    path = os.path.join(out_dir, f"{name}_emitted.py")
    spec = importlib.util.spec_from_file_location(f"emitted_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with open(os.path.join(out_dir, f"{name}.json")) as f:
        return getattr(module, json.load(f)["function"])


def check(out_dir, names):
    import jaxpr_cc
    for name in names:
        _, args = TABLE[name]
        want = np.load(os.path.join(out_dir, f"{name}.npz"))
        want_value = [want[k] for k in sorted((k for k in want if k.startswith("value")),
                                              key=lambda k: int(k[5:]))]
        want_grads = [want[k] for k in sorted((k for k in want if k.startswith("grad")),
                                              key=lambda k: int(k[4:]))]
        record = {"name": name}
        makers = {"load": lambda: jaxpr_cc.load(os.path.join(out_dir, f"{name}.jcc")),
                  "emit": lambda: _import_emitted(out_dir, name)}
        for kind, make in makers.items():
            try:
                fun = make()
                value, grads = _leaves(fun(*args)), _leaves(jax_gradient(fun, args))
                assert len(value) == len(want_value) and len(grads) == len(want_grads)
                for got, ref in zip(value, want_value):
                    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
                for got, ref in zip(grads, want_grads):
                    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
                record[kind] = "ok"
            except Exception as e:
                record[kind] = f"{type(e).__name__}: {str(e)[:400]}"
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    command, out_dir, ids = sys.argv[1], sys.argv[2], sys.argv[3:]
    if command == "save":
        save(out_dir, ids)
    else:
        check(out_dir, ids)
