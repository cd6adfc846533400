"""Pass pipeline cost, constant-hoisting compile time, and dce against JAX's.

Three measurements, each printed as a ratio to a reference measured in the same run:

1. IR build + ``closure-convert,hoist-consts,cse,dce`` + emit on a program of N and
   2N equations (with duplicates and dead code, so cse and dce have work), against
   ``jax.make_jaxpr`` of the same function.  Targets (issue 14): build + emit <= 0.25 x
   trace time, build + passes + emit <= 0.5 x, and t(2N)/t(N) <= 2.2.  The passes run
   with the options a user gets: ``jaxpr_cc.run_passes(program, pipeline)``, which
   copies the program and checks input and result structurally.
2. Compile time of ``sum(sin(v * C))`` closing over a 32 MB float32 ``C``:
   ``jaxpr_cc.trace`` + ``hoist-consts`` + ``jaxpr_cc.compile``, against
   ``jax.jit`` of the closure and of the same function taking ``C`` as an argument
   (the floor).  Target: ours <= 1.3 x the floor.
3. Our ``dce`` against ``pe.dce_jaxpr`` on the same jaxpr.  Aim: <= 3x.

Parts 1 and 3 are single-threaded Python and are timed in CPU seconds of this
process (best of several runs), so that other load on a shared machine does not
skew the ratios; part 2 (XLA compiles on several threads) is timed in wall seconds.

    .venv/bin/python tools/bench_passes.py [--n 100000] [--mb 32]
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxpr_cc  # noqa: E402
from bench_common import EXAMPLE, timed  # noqa: E402
from jaxpr_cc.jax_adapter import dce_jaxpr  # noqa: E402
from jaxpr_cc.passes.base import PassContext  # noqa: E402
from jaxpr_cc.passes.dce import DeadCodeElimination  # noqa: E402
from jaxpr_cc.passes.manager import PassManager  # noqa: E402

PIPELINE = "closure-convert,hoist-consts,cse,dce"


def cpu_timed(fn, *args, repeat: int = 1):
    """Best CPU time of ``repeat`` runs (GC held off), and the last result."""
    best, out = float("inf"), None
    for _ in range(repeat):
        gc.collect()
        gc.disable()
        t0 = time.process_time()
        try:
            out = fn(*args)
        finally:
            gc.enable()
        best = min(best, time.process_time() - t0)
    return best, out


def redundant_line(n_eqns: int):
    """About ``n_eqns`` elementwise equations: a straight line in which a sixth of
    the equations repeat another and a sixth compute values nothing reads."""
    def f(x, y):
        a, b = x, y
        for _ in range(n_eqns // 6):
            c = jnp.sin(a)
            d = jnp.sin(a)          # duplicate of c
            e = c * b
            dead = d * e            # never read
            del dead
            a = e + d
            b = b - c
        return a, b
    return f


# --------------------------------------------------------------- 1. pipeline
def measure_pipeline(n: int) -> dict:
    # A new function object each time: make_jaxpr caches traces per function.
    t_trace, closed = cpu_timed(lambda: jax.make_jaxpr(redundant_line(n))(*EXAMPLE), repeat=2)
    n_eqns = len(closed.jaxpr.eqns)
    manager = PassManager(PIPELINE)  # run_passes' defaults

    def build_opt_emit():
        program = jaxpr_cc.Program.from_jaxpr(closed)
        result = manager.run(program)
        return result.to_jaxpr(), result

    def build_emit():
        return jaxpr_cc.Program.from_jaxpr(closed).to_jaxpr()

    t_total, (_, result) = cpu_timed(build_opt_emit, repeat=3)
    t_build_emit, _ = cpu_timed(build_emit, repeat=2)
    per_pass = dict(manager.timings)  # wall seconds of the last run
    t_build, program = cpu_timed(lambda: jaxpr_cc.Program.from_jaxpr(closed), repeat=2)
    t_copy, _ = cpu_timed(program.copy, repeat=2)
    t_emit, _ = cpu_timed(result.to_jaxpr, repeat=2)
    return dict(n=n_eqns, trace=t_trace, total=t_total, build=t_build, emit=t_emit, copy=t_copy,
                build_emit=t_build_emit,
                passes=per_pass, n_after=result.num_equations())


def report_pipeline(n: int) -> None:
    rows = [measure_pipeline(n), measure_pipeline(2 * n)]
    print(f"1. IR build + {PIPELINE} + emit, against jax.make_jaxpr (CPU seconds)")
    print(f"{'eqns':>8} {'after':>7} {'make_jaxpr s':>13} {'build s':>8} {'emit s':>7} "
          f"{'total s':>8} {'total/trace':>12} {'build+emit/trace':>17} {'copy/trace':>11}")
    for r in rows:
        print(f"{r['n']:>8} {r['n_after']:>7} {r['trace']:>13.3f} {r['build']:>8.3f} "
              f"{r['emit']:>7.3f} {r['total']:>8.3f} {r['total'] / r['trace']:>12.3f} "
              f"{r['build_emit'] / r['trace']:>17.3f} {r['copy'] / r['trace']:>11.3f}")
    for r in rows:
        print(f"   passes at {r['n']} eqns (wall): " +
              ", ".join(f"{k} {v:.3f} s" for k, v in r["passes"].items()))
    small, big = rows
    print(f"   scaling N->2N: make_jaxpr x{big['trace'] / small['trace']:.2f}, "
          f"build+passes+emit x{big['total'] / small['total']:.2f}")
    print("   targets: build+emit/trace <= 0.25, total/trace <= 0.5, scaling <= 2.2")


# ------------------------------------------------------------- 2. compile
def measure_compile(mb: int, repeat: int = 3) -> dict:
    n = mb * (1 << 20) // 4
    rng = np.random.default_rng(0)
    const = rng.standard_normal(n).astype(np.float32)
    v = jnp.asarray(rng.standard_normal(n).astype(np.float32))

    def make_closure():
        def closure(x):
            return jnp.sum(jnp.sin(x * const))
        return closure

    def with_arg(x, c):
        return jnp.sum(jnp.sin(x * c))

    def jax_closure():
        jax.clear_caches()
        return jax.jit(make_closure()).lower(v).compile()

    def jax_floor():
        jax.clear_caches()
        return jax.jit(with_arg).lower(v, const).compile()

    def ours():
        jax.clear_caches()
        program = jaxpr_cc.trace(make_closure(), v)
        program = jaxpr_cc.run_passes(program, "hoist-consts")
        return jaxpr_cc.compile(program)

    t_closure, compiled_closure = timed(jax_closure, repeat=repeat)
    t_floor, compiled_floor = timed(jax_floor, repeat=repeat)
    t_ours, executable = timed(ours, repeat=repeat)
    # The three compute the same thing.
    expect = float(compiled_floor(v, const))
    got = float(executable(v))
    assert np.isclose(got, expect, rtol=1e-4), (got, expect)
    assert np.isclose(float(compiled_closure(v)), expect, rtol=1e-4)
    new = const * 0.5
    rebound = float(executable.with_params(new)(v))
    assert np.isclose(rebound, float(compiled_floor(v, new)), rtol=1e-4)
    return dict(mb=mb, closure=t_closure, floor=t_floor, ours=t_ours)


def report_compile(mb: int) -> None:
    r = measure_compile(mb)
    print(f"2. compile sum(sin(v * C)) closing over a {r['mb']} MB float32 C (best of 3)")
    print(f"   jax.jit closure    {r['closure']:.3f} s   {r['closure'] / r['floor']:.2f} x floor")
    print(f"   jax.jit C as arg   {r['floor']:.3f} s   1.00 x floor")
    print(f"   jaxpr-cc trace + hoist-consts + compile   {r['ours']:.3f} s   "
          f"{r['ours'] / r['floor']:.2f} x floor")
    print("   target: ours <= 1.3 x floor")


# ------------------------------------------------------------------- 3. dce
def report_dce(n: int) -> None:
    jax_times, our_times = [], []
    for _ in range(2):
        # A fresh function, so a fresh jaxpr: make_jaxpr and pe.dce_jaxpr both cache.
        closed = jax.make_jaxpr(redundant_line(n))(*EXAMPLE)
        used = [True] * len(closed.jaxpr.outvars)
        t_jax, (pruned, _) = cpu_timed(lambda: dce_jaxpr(closed.jaxpr, used))
        program = jaxpr_cc.Program.from_jaxpr(closed)
        t_ours, _ = cpu_timed(lambda: DeadCodeElimination().run(program, PassContext()))
        jax_times.append(t_jax)
        our_times.append(t_ours)
    t_jax, t_ours = min(jax_times), min(our_times)
    print(f"3. dce on {len(closed.jaxpr.eqns)} equations (CPU seconds): pe.dce_jaxpr {t_jax:.3f} s "
          f"({len(pruned.eqns)} left), ours {t_ours:.3f} s ({program.num_equations()} left): "
          f"ours/jax = {t_ours / t_jax:.2f}")
    print("   aim: <= 3")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000, help="equations in the smaller program")
    ap.add_argument("--mb", type=int, default=32, help="size of the closed-over constant in MB")
    opts = ap.parse_args()
    report_pipeline(opts.n)
    report_compile(opts.mb)
    report_dce(opts.n)


if __name__ == "__main__":
    main()
