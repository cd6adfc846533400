"""``canonicalize`` cost against JAX's own tracing, and against brainstate's optimizer.

1. A straight-line program of about N equations (``bench_common.straight_line``,
   where there is nothing to remove, and a variant with four removable equations
   in every eight):
   ``jax.make_jaxpr`` time, then ``canonicalize`` time on the traced Program and
   its ratio to the make_jaxpr time (target: <= 0.3); brainstate's
   ``optimize_jaxpr`` on the same jaxpr, and how many times faster ours is
   (target: >= 3).  CPU time and wall time are both shown; the targets are read
   on CPU time, which a machine shared with other work does not distort (every
   step timed is single-threaded Python).
2. The program corpus: equations each optimizer removes (counted in JAX's form,
   nested jaxprs included), starting from the same jaxpr (the one ``jaxpr_cc.trace``
   gives).  brainstate's result is checked: if it dropped an equation with effects
   (a ``jax.debug.print``, a callback) it is marked INVALID and not a reference.
   Target: ours removes at least as much on every program where brainstate's
   result is valid.

brainstate is an optional benchmark dependency (``pip install -e .[bench]``); without
it only ours is measured.

    .venv/bin/python tools/bench_canonicalize.py [--n 100000] [--no-corpus]
"""
from __future__ import annotations

import argparse
import functools
import gc
import os
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
sys.path.insert(0, os.path.dirname(__file__))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jaxpr_cc  # noqa: E402
from bench_common import EXAMPLE, straight_line  # noqa: E402
from jaxpr_cc.passes.base import PassContext  # noqa: E402
from jaxpr_cc.passes.canonicalize import Canonicalize  # noqa: E402


def brainstate_optimizer():
    try:
        from brainstate.transform import optimize_jaxpr
    except ImportError:
        return None
    return optimize_jaxpr


def count_equations(jaxpr) -> int:
    n = 0
    for eqn in jaxpr.eqns:
        n += 1
        for p in eqn.params.values():
            for sub in (p if isinstance(p, tuple) else (p,)):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    n += count_equations(inner)
    return n


def count_effects(jaxpr) -> int:
    n = 0
    for eqn in jaxpr.eqns:
        n += bool(eqn.effects)
        for p in eqn.params.values():
            for sub in (p if isinstance(p, tuple) else (p,)):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    n += count_effects(inner)
    return n


def canonicalize(program):
    ctx = PassContext()
    out = Canonicalize().run(program, ctx)
    return out, ctx.stats


# --------------------------------------------------------------------------- 1. scale
def timed_both(fn, repeat: int = 1):
    """Best ``(cpu seconds, wall seconds)`` of ``repeat`` runs (GC held off), and the
    last result.  Every timed step is single-threaded Python, so CPU time is the
    measure that holds on a machine shared with other work; wall time is shown too."""
    best_cpu = best_wall = float("inf")
    out = None
    for _ in range(repeat):
        gc.collect()
        gc.disable()
        c0, w0 = time.process_time(), time.perf_counter()
        try:
            out = fn()
        finally:
            gc.enable()
        best_cpu = min(best_cpu, time.process_time() - c0)
        best_wall = min(best_wall, time.perf_counter() - w0)
    return (best_cpu, best_wall), out


def _row(label: str, t, ref=None, note: str = "") -> str:
    text = f"  {label:<38} cpu {t[0]:8.3f} s  wall {t[1]:8.3f} s"
    if ref is not None:
        text += f"   / make_jaxpr: cpu {t[0] / ref[0]:6.3f}  wall {t[1] / ref[1]:6.3f}"
    return text + (f"   {note}" if note else "")


def straight_line_with_work(n_eqns: int):
    """``bench_common.straight_line`` with something to canonicalize in every step:
    a multiplication by one, a double negation and a duplicate ``sin`` (eight
    equations per step, four of them removable)."""
    def f(x, y):
        a, b = x, y
        for _ in range(n_eqns // 8):
            c = jnp.sin(a)
            d = (c * jnp.float32(1.0)) * b
            e = jnp.sin(a)
            a = d + a
            b = -(-(b - e))
        return a, b
    return f


def scale(n: int, optimize_jaxpr, make=straight_line, label="straight-line program") -> None:
    f = make(n)
    t_trace, closed = timed_both(lambda: jax.make_jaxpr(f)(*EXAMPLE))
    n_eqns = len(closed.jaxpr.eqns)
    t_build, program = timed_both(lambda: jaxpr_cc.Program.from_jaxpr(closed))
    copies = [program.copy() for _ in range(3)]
    t_ours, (out, stats) = timed_both(lambda: canonicalize(copies.pop()), repeat=3)
    t_emit, _ = timed_both(out.to_jaxpr)
    t_e2e = (t_build[0] + t_ours[0] + t_emit[0], t_build[1] + t_ours[1] + t_emit[1])
    removed = n_eqns - out.num_equations()
    print(f"{label}: {n_eqns} equations, canonicalize removes {removed} in {stats['rounds']} round(s)")
    print(_row("jax.make_jaxpr", t_trace))
    print(_row("canonicalize (Program, in place)", t_ours, t_trace, "(target <= 0.3)"))
    print(_row("from_jaxpr + canonicalize + to_jaxpr", t_e2e, t_trace))
    if optimize_jaxpr is None:
        print("  brainstate not installed: pip install -e .[bench] to compare")
        return
    t_bs, theirs = timed_both(lambda: optimize_jaxpr(closed), repeat=2)
    print(_row("brainstate optimize_jaxpr", t_bs, t_trace,
               f"(removes {n_eqns - len(theirs.jaxpr.eqns)})"))
    print(f"  speed-up over brainstate: canonicalize cpu x{t_bs[0] / t_ours[0]:.1f} "
          f"(wall x{t_bs[1] / t_ours[1]:.1f}; target >= 3); end to end cpu x{t_bs[0] / t_e2e[0]:.1f} "
          f"(wall x{t_bs[1] / t_e2e[1]:.1f})")


# --------------------------------------------------------------------------- 2. corpus
def corpus(optimize_jaxpr) -> None:
    from jaxpr_cc.golden.corpus import load_corpus
    rows = []
    t_ours_total = t_bs_total = 0.0
    for prog in load_corpus(skip_unavailable=True):
        program = jaxpr_cc.trace(functools.partial(prog.fun, **prog.kwargs), *prog.args)
        closed = program.to_jaxpr()
        before = count_equations(closed.jaxpr)
        t0 = time.perf_counter()
        out, _ = canonicalize(program.copy())
        t_ours_total += time.perf_counter() - t0
        ours = before - count_equations(out.to_jaxpr().jaxpr)
        row = [prog.name, before, ours, None, ""]
        if optimize_jaxpr is not None:
            t0 = time.perf_counter()
            try:
                theirs_jaxpr = optimize_jaxpr(closed)
            except Exception as e:  # noqa: BLE001 -- report, do not stop the benchmark
                row[4] = f"brainstate failed: {type(e).__name__}"
            else:
                t_bs_total += time.perf_counter() - t0
                row[3] = before - count_equations(theirs_jaxpr.jaxpr)
                dropped = count_effects(closed.jaxpr) - count_effects(theirs_jaxpr.jaxpr)
                if dropped > 0:
                    row[4] = f"brainstate INVALID: dropped {dropped} effectful equation(s)"
                elif ours >= row[3]:
                    row[4] = "ok"
                else:
                    row[4] = "brainstate removes more"
        rows.append(row)
    width = max(len(r[0]) for r in rows)
    print("\ncorpus: equations removed (JAX form, nested jaxprs counted)")
    print(f"  {'program':<{width}} {'eqns':>6} {'ours':>6} {'brainstate':>11}  verdict")
    for name, before, ours, theirs, verdict in rows:
        theirs_s = "-" if theirs is None else str(theirs)
        print(f"  {name:<{width}} {before:>6} {ours:>6} {theirs_s:>11}  {verdict}")
    total_before = sum(r[1] for r in rows)
    total_ours = sum(r[2] for r in rows)
    print(f"  {'total':<{width}} {total_before:>6} {total_ours:>6} "
          f"{sum(r[3] or 0 for r in rows):>11}")
    if optimize_jaxpr is not None:
        valid = [r for r in rows if r[4] in ("ok", "brainstate removes more")]
        worse = [r[0] for r in rows if r[4] == "brainstate removes more"]
        invalid = [r[0] for r in rows if r[4].startswith("brainstate INVALID")]
        print(f"  ours removes at least as much on {len(valid) - len(worse)}/{len(valid)} programs "
              f"where brainstate's result is valid (target: all)"
              + (f"; brainstate removes more on: {', '.join(worse)}" if worse else ""))
        print(f"  brainstate dropped effects on {len(invalid)} program(s): {', '.join(invalid) or '-'}")
        print(f"  corpus time: canonicalize {t_ours_total:.2f} s, brainstate {t_bs_total:.2f} s "
              f"(ours includes compiling constant folds with XLA)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000, help="equations in the straight-line program")
    ap.add_argument("--no-corpus", action="store_true", help="skip the corpus comparison")
    opts = ap.parse_args()
    optimize_jaxpr = brainstate_optimizer()
    scale(opts.n, optimize_jaxpr)
    scale(opts.n, optimize_jaxpr, straight_line_with_work,
          "\nstraight-line program with identities, double negations and duplicates")
    if not opts.no_corpus:
        corpus(optimize_jaxpr)


if __name__ == "__main__":
    main()
