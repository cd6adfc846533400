"""Sharded and multi-device cases of adversary round g (issue 18), for
tests/test_issue18_adversary_g.py (run in a fresh process: the host device count
must be set before JAX is imported).

``python sharded_adversary18g_cases.py OUT_DIR`` prints one JSON line per case:
``{"case": name, "problems": [...]}``.  References: ``jax.jit`` (values, output
shardings, output types).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from sharded_compile_cases import run_cases


def _same(got, want, where: str) -> list:
    import jax
    problems = []
    if got.shape != want.shape or not np.allclose(np.asarray(got), np.asarray(want),
                                                  rtol=1e-6, atol=1e-6):
        problems.append(f"{where}: value differs from jax.jit's")
    if not got.sharding.is_equivalent_to(want.sharding, got.ndim) or \
            got.sharding.device_set != want.sharding.device_set:
        problems.append(f"{where}: sharding {got.sharding} is not jax.jit's {want.sharding}")
    if str(jax.typeof(got)) != str(jax.typeof(want)):
        problems.append(f"{where}: type {jax.typeof(got)} is not jax.jit's {jax.typeof(want)}")
    return problems


def _all_same(got, want, where: str) -> list:
    import jax
    got, want = jax.tree.leaves(got), jax.tree.leaves(want)
    if len(got) != len(want):
        return [f"{where}: {len(got)} outputs, jax.jit has {len(want)}"]
    return [p for i, (g, w) in enumerate(zip(got, want)) for p in _same(g, w, f"{where}[{i}]")]


def cases(out_dir: Path):
    import jax
    import jax.numpy as jnp
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

    import jaxpr_cc

    def hoisted_equal_constants_with_different_shardings():
        # Two closed-over arrays with equal bytes but different shardings are two
        # parameters: on an Explicit mesh their types differ too.
        problems = []
        explicit = jax.make_mesh((4, 2), ("x", "y"))
        auto = jax.make_mesh((4, 2), ("x", "y"), axis_types=(AxisType.Auto,) * 2)
        for mesh_name, mesh in (("explicit", explicit), ("auto", auto)):
            e1 = jax.device_put(jnp.ones(8), NamedSharding(mesh, P("x")))
            e2 = jax.device_put(jnp.ones(8), NamedSharding(mesh, P("y")))
            fns = {"arith": lambda v: (e1 * 2, e2 * 2, v), "identity": lambda v: (e1, e2),
                   # two nested jit bodies alike but for their constant's sharding
                   "nested jits": lambda v: (jax.jit(lambda: e1 * 2)(),
                                             jax.jit(lambda: e2 * 2)())}
            with jax.set_mesh(mesh):
                x = jax.device_put(jnp.ones(8), NamedSharding(mesh, P("x")))
                for name, fn in fns.items():
                    want = jax.jit(fn)(x)
                    for pipe in ("default", "closure-convert,hoist-consts,cse", "cse"):
                        jf = jaxpr_cc.jit(fn) if pipe == "default" else \
                            jaxpr_cc.jit(fn, pipeline=pipe)
                        problems += _all_same(jf(x), want, f"{mesh_name} {name} {pipe}")
        return problems

    def cse_keeps_copies_with_different_sharding_requests():
        # jax.jit lays out a copy feeding with_sharding_constraint as requested and
        # the other copy like its input: merged, both would take the request.
        mesh = jax.make_mesh((4, 2), ("x", "y"), axis_types=(AxisType.Auto,) * 2)
        x = jax.device_put(jnp.arange(32.).reshape(8, 4), NamedSharding(mesh, P("x", "y")))

        def wsc(v):
            return jax.lax.with_sharding_constraint(v, NamedSharding(mesh, P("y")))
        constrained_call = jax.jit(lambda u: wsc(u) + 1)

        fns = {
            "plain": lambda v: (v * 2, wsc(v * 2)),
            "opt barrier": lambda v: jax.lax.optimization_barrier((v * 2, wsc(v * 2))),
            "sin": lambda v: (jnp.sin(v), wsc(jnp.sin(v))),
            "through a chain": lambda v: (jnp.cos(v * 2), wsc(jnp.cos(v * 2) + 1)),
            "inside a jit": lambda v: jax.jit(lambda u: (u * 2, wsc(u * 2)))(v),
            "both constrained alike": lambda v: (wsc(v * 2), wsc(v * 2)),
            "request inside a called jit": lambda v: (v * 2, jax.jit(lambda u: wsc(u) + 1)(v * 2)),
            "request inside a cond branch": lambda v: (
                v * 2, jax.lax.cond(True, wsc, lambda u: u, v * 2)),
            "two equal calls": lambda v: (constrained_call(v * 2), constrained_call(v * 2)),
        }
        problems = []
        for name, fn in fns.items():
            want = jax.jit(fn)(x)
            for pipe in ("default", "cse"):
                jf = jaxpr_cc.jit(fn) if pipe == "default" else jaxpr_cc.jit(fn, pipeline=pipe)
                problems += _all_same(jf(x), want, f"{name} {pipe}")
        # Equal requests still merge: the pass loses nothing where layouts agree.
        for name in ("both constrained alike", "two equal calls"):
            q = jaxpr_cc.run_passes(jaxpr_cc.trace(fns[name], x), "cse")
            prims = [e.prim.name for e in q.body.equations]
            if prims.count("mul") != 1 or prims.count("jit") > 1:
                problems.append(f"{name}: cse left {prims}")
        return problems

    def exec_places_host_inputs_of_a_sharded_program():
        # `jaxpr-cc exec PROGRAM` reads host arrays: a program traced on sharded
        # arguments (here feeding a shard_map) places them as compile does.
        import os
        import subprocess
        mesh = jax.make_mesh((4, 2), ("x", "y"))
        x = jax.device_put(jnp.arange(32.).reshape(8, 4), NamedSharding(mesh, P("x", "y")))
        sm = jax.shard_map(lambda a: jax.lax.psum(a, "x"), mesh=mesh, in_specs=P("x", "y"),
                           out_specs=P(None, "y"))
        f = lambda a: (sm(a), a * 2)  # noqa: E731
        want = [np.asarray(o) for o in jax.jit(f)(x)]
        prog = jaxpr_cc.run_passes(jaxpr_cc.trace(f, x), jaxpr_cc.DEFAULT_PIPELINE)
        jaxpr_cc.save(prog, out_dir / "sh.jcc")
        np.savez(out_dir / "in.npz", arg0=np.asarray(x))
        res = subprocess.run([sys.executable, "-m", "jaxpr_cc.cli.main", "exec",
                              str(out_dir / "sh.jcc"), "--inputs", str(out_dir / "in.npz"),
                              "-o", str(out_dir / "out.npz")],
                             capture_output=True, text=True, env=dict(os.environ), timeout=600)
        if res.returncode != 0:
            return [f"exec: rc {res.returncode}: {res.stderr.strip()[-400:]}"]
        got = np.load(out_dir / "out.npz")
        return [f"exec: out{i} differs from jax.jit's" for i, w in enumerate(want)
                if not np.array_equal(got[f"out{i}"], w)]

    def saved_executable_accepts_its_unused_sharded_argument():
        # A fresh executable does not look at an argument it never reads; the one
        # saved from it and loaded back accepts the same arguments.
        from jaxpr_cc.backends.xla import load_executable
        mesh = jax.make_mesh((4, 2), ("x", "y"))
        x = jax.device_put(jnp.arange(32.).reshape(8, 4), NamedSharding(mesh, P("x", "y")))
        y = jax.device_put(jnp.arange(8.), NamedSharding(mesh, P("x")))
        auto = jax.make_mesh((4, 2), ("x", "y"), axis_types=(AxisType.Auto,) * 2)
        xa = jax.device_put(jnp.arange(32.).reshape(8, 4), NamedSharding(auto, P("x", "y")))
        ya = jax.device_put(jnp.arange(8.), NamedSharding(auto, P("x")))
        table = [("only unused", lambda a: jnp.arange(3.), (x,)),
                 ("unused and used", lambda a, b: b * 2, (x, y)),
                 ("auto mesh: unused and used", lambda a, b: b * 2, (xa, ya))]
        problems = []
        for name, f, args in table:
            want = jax.jit(f)(*args)
            for how, exe in (("executable", jaxpr_cc.jit(f).executable(*args)),
                             ("compile", jaxpr_cc.compile(jaxpr_cc.trace(f, *args)))):
                problems += _same(exe(*args), want, f"{name} {how}: fresh")
                path = out_dir / f"unused-{how}.jxe"
                exe.save(path)
                try:
                    got = load_executable(str(path))(*args)
                except Exception as e:  # the reproducer's failure was an exception
                    problems.append(f"{name} {how}: loaded: {type(e).__name__}: "
                                    f"{str(e)[:300]}")
                    continue
                problems += _same(got, want, f"{name} {how}: loaded")
        return problems

    return {
        "saved_executable_accepts_its_unused_sharded_argument":
            saved_executable_accepts_its_unused_sharded_argument,
        "exec_places_host_inputs_of_a_sharded_program":
            exec_places_host_inputs_of_a_sharded_program,
        "hoisted_equal_constants_with_different_shardings":
            hoisted_equal_constants_with_different_shardings,
        "cse_keeps_copies_with_different_sharding_requests":
            cse_keeps_copies_with_different_sharding_requests,
    }


CASE_NAMES = ("saved_executable_accepts_its_unused_sharded_argument",
              "exec_places_host_inputs_of_a_sharded_program",
              "hoisted_equal_constants_with_different_shardings",
              "cse_keeps_copies_with_different_sharding_requests")


def main(out_dir: Path) -> int:
    return run_cases(cases(out_dir), CASE_NAMES)


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
