"""Cost of call sites of one shared function: N calls of one jitted 40-equation block.

For N = 20 and N = 200 (and 1 and 100 for sizes), in one run: the time of
``jaxpr_cc.trace``, the default pipeline (``run_passes`` with a user's default
options), ``save``, ``load`` and printing, and the size of the printed IR and the
saved file, beside ``jax.make_jaxpr`` and JAX's printed jaxpr.  Times are CPU
seconds of this process (best of several runs).
Targets (issue 14): 10x the call sites costs at most 2.5x on every stage; the
printed IR of 100 sites is at most 2x JAX's printed jaxpr; the saved file of 100
sites is at most 3x the file of one site.

    .venv/bin/python tools/bench_sharing.py
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jaxpr_cc  # noqa: E402

PIPELINE = "closure-convert,hoist-consts,cse,dce"
REPEAT = 9  # best of: each stage takes milliseconds


@jax.jit
def block(x, w):
    # 40 equations: ten rounds of four elementwise operations.
    for _ in range(10):
        x = jnp.tanh(x * w + 1.0) - x
    return x


def calls(n: int):
    def f(x, w):
        acc = x
        for _ in range(n):
            acc = block(acc, w)
        return acc
    return f


ARGS = (jnp.ones((8,), jnp.float32), jnp.full((8,), 0.5, jnp.float32))


def cpu_timed(fn, repeat: int = REPEAT):
    """Best CPU time of ``repeat`` runs (GC held off), and the last result.  Every
    stage is single-threaded Python taking milliseconds: wall time on a shared
    machine would measure the other load, not the stage."""
    best, out = float("inf"), None
    for _ in range(repeat):
        gc.collect()
        gc.disable()
        t0 = time.process_time()
        try:
            out = fn()
        finally:
            gc.enable()
        best = min(best, time.process_time() - t0)
    return best, out


def measure(n: int, folder: str) -> dict:
    # A new function for every run, so no run reuses another's trace.
    t_jax, closed = cpu_timed(lambda: jax.make_jaxpr(calls(n))(*ARGS))
    t_trace, program = cpu_timed(lambda: jaxpr_cc.trace(calls(n), *ARGS))
    t_pipe, optimized = cpu_timed(lambda: jaxpr_cc.run_passes(program, PIPELINE))
    path = os.path.join(folder, f"sites{n}.jcc")
    t_save, _ = cpu_timed(lambda: jaxpr_cc.save(optimized, path))
    t_load, _ = cpu_timed(lambda: jaxpr_cc.load(path))
    t_print, text = cpu_timed(lambda: str(program))
    return dict(n=n, jax=t_jax, trace=t_trace, pipeline=t_pipe, save=t_save, load=t_load,
                print=t_print, printed=len(text), jax_printed=len(str(closed)),
                saved=os.path.getsize(path))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        rows = {n: measure(n, folder) for n in (1, 20, 100, 200)}
    print("CPU milliseconds")
    print(f"{'sites':>6} {'make_jaxpr':>10} {'trace':>8} {'pipeline':>9} {'save':>8} {'load':>8} "
          f"{'print':>8} {'printed B':>10} {'jax printed':>11} {'saved B':>9}")
    for r in rows.values():
        ms = {k: 1000 * r[k] for k in ("jax", "trace", "pipeline", "save", "load", "print")}
        print(f"{r['n']:>6} {ms['jax']:>10.2f} {ms['trace']:>8.2f} {ms['pipeline']:>9.2f} "
              f"{ms['save']:>8.2f} {ms['load']:>8.2f} {ms['print']:>8.2f} {r['printed']:>10} "
              f"{r['jax_printed']:>11} {r['saved']:>9}")
    small, big = rows[20], rows[200]
    growth = {k: big[k] / small[k] for k in ("trace", "pipeline", "save", "load", "print",
                                            "printed", "saved")}
    print("20 -> 200 sites: " + ", ".join(f"{k} x{v:.2f}" for k, v in growth.items())
          + f" (make_jaxpr x{big['jax'] / small['jax']:.2f})")
    # Each stage costs a fixed part (the shared body, once) plus a part per call
    # site; the growth target bounds the latter relative to the former.
    print("per added call site (ms): " + ", ".join(
        f"{k} {1000 * (big[k] - small[k]) / 180:.3f}"
        for k in ("jax", "trace", "pipeline", "save", "load", "print")))
    print(f"printed IR of 100 sites / JAX's printed jaxpr: "
          f"{rows[100]['printed'] / rows[100]['jax_printed']:.2f}")
    print(f"saved file of 100 sites / of 1 site: {rows[100]['saved'] / rows[1]['saved']:.2f}")
    print("targets: growth <= 2.5 on every stage, printed <= 2.0x JAX, saved <= 3.0x one site")


if __name__ == "__main__":
    main()
