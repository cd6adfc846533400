"""IR build and emit cost against JAX's own tracing.

Prints, for a straight-line program of N and 2N equations: ``jax.make_jaxpr`` time,
``Program.from_jaxpr`` time, ``Program.to_jaxpr`` time, and their ratios to the
trace time; then how each scales from N to 2N.
Targets (issue 3): build + emit <= 0.25 x trace time; t(2N)/t(N) <= 2.2.

    .venv/bin/python tools/bench_ir.py [--n 100000]
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import jax  # noqa: E402

import jaxpr_cc  # noqa: E402
from bench_common import EXAMPLE, straight_line, timed  # noqa: E402


def measure(n: int) -> dict:
    f = straight_line(n)
    t_trace, closed = timed(lambda: jax.make_jaxpr(f)(*EXAMPLE))
    n_eqns = len(closed.jaxpr.eqns)
    t_build, program = timed(lambda: jaxpr_cc.Program.from_jaxpr(closed), repeat=3)
    t_emit, _ = timed(program.to_jaxpr, repeat=3)
    return dict(n=n_eqns, trace=t_trace, build=t_build, emit=t_emit)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000, help="equations in the smaller program")
    opts = ap.parse_args()
    rows = [measure(opts.n), measure(2 * opts.n)]
    print(f"{'eqns':>8} {'make_jaxpr s':>13} {'from_jaxpr s':>13} {'to_jaxpr s':>11} "
          f"{'build/trace':>12} {'emit/trace':>11} {'(build+emit)/trace':>19}")
    for r in rows:
        both = (r["build"] + r["emit"]) / r["trace"]
        print(f"{r['n']:>8} {r['trace']:>13.3f} {r['build']:>13.3f} {r['emit']:>11.3f} "
              f"{r['build'] / r['trace']:>12.3f} {r['emit'] / r['trace']:>11.3f} {both:>19.3f}")
    small, big = rows
    print(f"scaling N->2N: make_jaxpr x{big['trace'] / small['trace']:.2f}, "
          f"from_jaxpr x{big['build'] / small['build']:.2f}, "
          f"to_jaxpr x{big['emit'] / small['emit']:.2f}, "
          f"build+emit x{(big['build'] + big['emit']) / (small['build'] + small['emit']):.2f}")
    print("targets: (build+emit)/trace <= 0.25, scaling <= 2.2")


if __name__ == "__main__":
    main()
