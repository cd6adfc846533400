"""Shared helpers for the benchmarks in tools/: program builders and timing."""
from __future__ import annotations

import gc
import time

import jax
import jax.numpy as jnp


def straight_line(n_eqns: int):
    """A function whose jaxpr is a straight line of about ``n_eqns`` elementwise
    equations (with some fan-out, so values have several users)."""
    def f(x, y):
        a, b = x, y
        for i in range(n_eqns // 4):
            c = jnp.sin(a)
            d = c * b
            a = d + a
            b = b - c
        return a, b
    return f


def timed(fn, *args, repeat: int = 1):
    """Best wall time of ``repeat`` runs (with the GC held off), and the last result."""
    best, out = float("inf"), None
    for _ in range(repeat):
        gc.collect()
        gc.disable()
        t0 = time.perf_counter()
        try:
            out = fn(*args)
        finally:
            gc.enable()
        best = min(best, time.perf_counter() - t0)
    return best, out


EXAMPLE = (jnp.ones((4,), jnp.float32), jnp.ones((4,), jnp.float32))
