"""Closure-conversion tracing cost against JAX's own tracing.

A program with N calls of the same custom_vjp function (whose rules close over a
traced parameter).  Prints ``jax.make_jaxpr`` time, ``jaxpr_cc.trace`` time (rules
materialized once and reused, IR built) and their ratio.
Target (issue 15): trace <= 1.3 x make_jaxpr at N = 1,000, with rules reused only when
the fingerprint of what they read is unchanged.

    .venv/bin/python tools/bench_closure.py [--n 1000]
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jaxpr_cc  # noqa: E402
from bench_common import timed  # noqa: E402


@jax.custom_vjp
def smooth_clip(x, scale):
    return jnp.tanh(x / scale) * scale


def _fwd(x, scale):
    t = jnp.tanh(x / scale)
    return t * scale, (t, scale)


def _bwd(res, ct):
    t, scale = res
    return ct * (1 - t ** 2), jnp.sum(ct * (t - (1 - t ** 2) * jnp.arctanh(jnp.clip(t, -0.999, 0.999))))


smooth_clip.defvjp(_fwd, _bwd)


def make_program(n: int):
    def f(x, scale):
        for _ in range(n):
            x = smooth_clip(x, scale) + 0.1
        return x
    return f


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000, help="calls of the custom_vjp function")
    ap.add_argument("--repeat", type=int, default=7)
    opts = ap.parse_args()
    args = (jnp.ones((8,), jnp.float32), jnp.float32(2.0))
    # A fresh function per run: JAX caches traces of the same function object.
    jax.make_jaxpr(make_program(2))(*args)
    jaxpr_cc.trace(make_program(2), *args)
    # Rounds alternate the two, so that a slow phase of a shared machine hits both.
    t_jax = t_ours = float("inf")
    for _ in range(opts.repeat):
        t, _ = timed(lambda: jax.make_jaxpr(make_program(opts.n))(*args))
        t_jax = min(t_jax, t)
        t, prog = timed(lambda: jaxpr_cc.trace(make_program(opts.n), *args))
        t_ours = min(t_ours, t)
    print(f"custom_vjp calls      {opts.n}")
    print(f"jax.make_jaxpr        {t_jax:.3f} s")
    print(f"jaxpr_cc.trace        {t_ours:.3f} s   ({prog.num_equations()} equations, first-order: "
          f"{prog.is_first_order()})")
    print(f"ratio trace/make_jaxpr {t_ours / t_jax:.2f}   (target <= 1.3)")


if __name__ == "__main__":
    main()
