"""Driver for tests/test_realworld_roundtrip.py, run in fresh processes.

``save DIR NAME...``: trace each real-world program (tests/test_realworld.py), run the
default pipeline, save it, emit it as Python, and record JAX's value and gradient of
``sum(f(*args)**2)``.  ``check DIR NAME...``: load each saved program and import each
emitted module (a fresh process: nothing from the saving process is reused) and
compare their values and gradients with the recorded JAX ones.  Prints one JSON line
per program.
"""
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))


def diffrax_tsit5(k):
    import diffrax
    sol = diffrax.diffeqsolve(diffrax.ODETerm(lambda t, y, args: -k * y), diffrax.Tsit5(),
                              0.0, 1.0, 0.05, jnp.ones(2),
                              adjoint=diffrax.RecursiveCheckpointAdjoint(),
                              stepsize_controller=diffrax.ConstantStepSize())
    return sol.ys[-1]


def _programs():
    from test_realworld import PROGRAMS
    table = {f.__name__: (f, args) for f, args in PROGRAMS}
    table["diffrax_tsit5"] = (diffrax_tsit5, (jnp.float32(0.7),))
    return table


def _loss(fun):
    return lambda *args: jnp.sum(fun(*args) ** 2)


def _grads(fun, args):
    return jax.grad(_loss(fun), argnums=tuple(range(len(args))))(*args)


def save(out_dir, names):
    import jaxpr_cc
    from jaxpr_cc.passes import DEFAULT_PIPELINE
    table = _programs()
    for name in names:
        fun, args = table[name]
        program = jaxpr_cc.run_passes(jaxpr_cc.trace(fun, *args), DEFAULT_PIPELINE)
        record = {"name": name, "function": program.name}
        arrays = {f"arg{i}": np.asarray(a) for i, a in enumerate(args)}
        arrays["value"] = np.asarray(fun(*args))
        for i, g in enumerate(_grads(fun, args)):
            arrays[f"grad{i}"] = np.asarray(g)
        np.savez(os.path.join(out_dir, f"{name}.npz"), **arrays)
        from jaxpr_cc.backends.python_source import write_python
        json.dump(record, open(os.path.join(out_dir, f"{name}.json"), "w"))
        saved = os.path.join(out_dir, f"{name}.jcc")
        emitted = os.path.join(out_dir, f"{name}_emitted.py")
        for kind, write in (("save", lambda: jaxpr_cc.save(program, saved)),
                            ("emit", lambda: write_python(program, emitted))):
            try:
                write()
                record[kind] = "ok"
            except Exception as e:  # reported (one line) for the test to judge
                record[kind] = f"{type(e).__name__}: {e}"
        print(json.dumps(record), flush=True)


def check(out_dir, names):
    import importlib.util

    import jaxpr_cc
    for name in names:
        want = np.load(os.path.join(out_dir, f"{name}.npz"))
        n_args = sum(k.startswith("arg") for k in want)
        args = [jnp.asarray(want[f"arg{i}"]) for i in range(n_args)]
        record = {"name": name}
        candidates = {}
        if os.path.exists(os.path.join(out_dir, f"{name}.jcc")):
            candidates["load"] = lambda: jaxpr_cc.load(os.path.join(out_dir, f"{name}.jcc"))
        path = os.path.join(out_dir, f"{name}_emitted.py")
        if os.path.exists(path):
            def emitted(path=path):
                spec = importlib.util.spec_from_file_location(f"emitted_{name}", path)
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                function = json.load(open(os.path.join(out_dir, f"{name}.json")))["function"]
                return getattr(module, function)
            candidates["emit"] = emitted
        for kind, make in candidates.items():
            try:
                fun = make()
                value = np.asarray(fun(*args))
                grads = [np.asarray(g) for g in _grads(fun, args)]
                np.testing.assert_allclose(value, want["value"], rtol=1e-5, atol=1e-6)
                for i, g in enumerate(grads):
                    np.testing.assert_allclose(g, want[f"grad{i}"], rtol=1e-4, atol=1e-6)
                record[kind] = "ok"
            except Exception as e:
                record[kind] = f"{type(e).__name__}: {str(e)[:400]}"
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    command, out_dir, names = sys.argv[1], sys.argv[2], sys.argv[3:]
    if command == "save":
        save(out_dir, names)
    else:
        check(out_dir, names)
