"""Saved-program save/load cost against JAX's own tracing.

Builds a straight-line program of about N equations, times ``jax.make_jaxpr`` on it,
then ``jaxpr_cc.save`` and ``jaxpr_cc.load`` (with and without the type check), and
prints load time as a ratio of the make_jaxpr time measured in the same run.
Target (issue 6): load / make_jaxpr <= 0.5 for N >= 100,000.

    .venv/bin/python tools/bench_io.py [--n 100000]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))

import jax  # noqa: E402

import jaxpr_cc  # noqa: E402
from bench_common import EXAMPLE, straight_line, timed  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000, help="equations in the program")
    ap.add_argument("--repeat", type=int, default=3, help="best of this many loads")
    opts = ap.parse_args()

    f = straight_line(opts.n)
    t_trace, closed = timed(lambda: jax.make_jaxpr(f)(*EXAMPLE))
    program = jaxpr_cc.Program.from_jaxpr(closed)
    n_eqns = program.num_equations()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "program.jcc")
        t_save, _ = timed(lambda: jaxpr_cc.save(program, path), repeat=opts.repeat)
        size = os.path.getsize(path)
        t_load, loaded = timed(lambda: jaxpr_cc.load(path), repeat=opts.repeat)
        t_load_nocheck, _ = timed(lambda: jaxpr_cc.load(path, check_types=False),
                                  repeat=opts.repeat)
    same = str(loaded) == str(program)
    print(f"program: {n_eqns} equations, file {size / 1e6:.1f} MB, loaded program prints "
          f"{'identically' if same else 'DIFFERENTLY'}")
    print(f"{'step':<28} {'seconds':>9} {'/ make_jaxpr':>13}")
    for label, t in (("jax.make_jaxpr (reference)", t_trace), ("jaxpr_cc.save", t_save),
                     ("jaxpr_cc.load", t_load),
                     ("jaxpr_cc.load(check_types=False)", t_load_nocheck)):
        print(f"{label:<28} {t:>9.3f} {t / t_trace:>13.3f}")
    print(f"target: load / make_jaxpr <= 0.5 -> {'met' if t_load / t_trace <= 0.5 else 'NOT met'}")


if __name__ == "__main__":
    main()
