"""Forward-mode Jacobians through ``vjp-to-jvp`` against reverse mode of the original.

A 256 -> 256 function built from custom_vjp layers (``y = tanh(W x + b)`` with a
hand-written bwd), two of them in sequence.  Prints the run time (compiled, best
of several) of ``jax.jacfwd`` of the rewritten program and of ``jax.jacrev`` of
the original function, both under ``jax.jit``, and their ratio.  The Jacobians
are checked to agree first.  Target (issue 10): jacfwd / jacrev <= 1.5.

    .venv/bin/python tools/bench_vjp_to_jvp.py [--n 256] [--repeat 50]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxpr_cc  # noqa: E402


@jax.custom_vjp
def layer(w, b, x):
    return jnp.tanh(w @ x + b)


def _layer_fwd(w, b, x):
    y = jnp.tanh(w @ x + b)
    return y, (w, x, y)


def _layer_bwd(res, ct):
    w, x, y = res
    g = ct * (1.0 - y * y)
    return jnp.outer(g, x), g, w.T @ g


layer.defvjp(_layer_fwd, _layer_bwd)


def model(params, x):
    (w1, b1), (w2, b2) = params
    return layer(w2, b2, layer(w1, b1, x))


def run_timed(fn, args, repeat: int) -> float:
    jax.block_until_ready(fn(*args))  # compile
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=256, help="input and output dimension")
    ap.add_argument("--repeat", type=int, default=50)
    opts = ap.parse_args()
    n = opts.n
    rng = np.random.default_rng(0)
    scale = 1.0 / np.sqrt(n)
    params = tuple((jnp.asarray(rng.normal(size=(n, n)) * scale, jnp.float32),
                    jnp.asarray(rng.normal(size=(n,)) * 0.1, jnp.float32)) for _ in range(2))
    x = jnp.asarray(rng.normal(size=(n,)), jnp.float32)

    program = jaxpr_cc.trace(model, params, x)
    rewritten = jaxpr_cc.run_passes(program, "vjp-to-jvp")

    jacfwd_new = jax.jit(jax.jacfwd(rewritten, argnums=1))
    jacrev_old = jax.jit(jax.jacrev(model, argnums=1))
    j_fwd, j_rev = jacfwd_new(params, x), jacrev_old(params, x)
    err = float(jnp.max(jnp.abs(j_fwd - j_rev)))
    if not np.allclose(np.asarray(j_fwd), np.asarray(j_rev), rtol=1e-4, atol=1e-5):
        raise SystemExit(f"Jacobians differ (max abs difference {err:.3g})")

    t_fwd = run_timed(jacfwd_new, (params, x), opts.repeat)
    t_rev = run_timed(jacrev_old, (params, x), opts.repeat)
    print(f"function: {n} -> {n}, two custom_vjp layers tanh(W x + b); "
          f"max |jacfwd - jacrev| = {err:.2e}")
    print(f"{'jacrev(original) ms':>20} {'jacfwd(vjp-to-jvp) ms':>22} {'ratio':>7}")
    print(f"{t_rev * 1e3:>20.3f} {t_fwd * 1e3:>22.3f} {t_fwd / t_rev:>7.3f}")
    print("target: jacfwd(vjp-to-jvp) / jacrev(original) <= 1.5")


if __name__ == "__main__":
    main()
