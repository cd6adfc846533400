"""Programs whose custom rules close over traced values, for the emitted-Python tests.

Each entry of ``PROGRAMS`` gives the JAX function, example arguments, whether plain
``jax.grad`` works on it, and a float64 NumPy reference of the same function (used
for finite-difference gradients where JAX raises).  Imported by the tests and by
their fresh worker process (never by jaxpr_cc).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.ode import odeint

from jaxpr_cc.examples.fixed_point import solve_closed_over


@dataclasses.dataclass(frozen=True)
class ClosureProgram:
    name: str
    fun: Callable
    args: tuple
    jax_grad_works: bool
    reference: Callable  # float64 NumPy version of ``fun`` (scalar output)
    options: dict = dataclasses.field(default_factory=dict)  # jaxpr_cc.trace options


def _fixed_point_reference(b):
    x = 0.0
    for _ in range(10_000):
        new = np.cos(b * x) + 0.5 * b
        if abs(new - x) < 1e-15:
            break
        x = new
    return new


def ode_decay(k, y0):
    """odeint whose vector field closes over ``k``."""
    def field(y, t):
        return -k * y + jnp.sin(t)
    return jnp.sum(odeint(field, y0, jnp.array([0.0, 0.5, 1.0]))[-1])


def _ode_reference(k, y0):
    # y' = -k y + sin t has y(t) = e^{-kt} y0 + int_0^t e^{-k(t-s)} sin s ds.
    t = 1.0
    forced = (k * np.sin(t) - np.cos(t) + np.exp(-k * t)) / (k * k + 1.0)
    return float(np.sum(np.exp(-k * t) * np.asarray(y0, np.float64) + forced))


def scaled_clip(w, x):
    """A custom_vjp defined inside the function, closing over the traced ``w``."""
    @jax.custom_vjp
    def f(v):
        return jnp.tanh(w * v)

    def fwd(v):
        y = jnp.tanh(w * v)
        return y, (y,)

    def bwd(res, ct):
        (y,) = res
        return (ct * w * (1.0 - y * y),)

    f.defvjp(fwd, bwd)
    return jnp.sum(f(x) * x)


def _scaled_clip_reference(w, x):
    x = np.asarray(x, np.float64)
    return float(np.sum(np.tanh(w * x) * x))


def softplus_scaled(w, x):
    """A custom_jvp defined inside the function, closing over the traced ``w``."""
    @jax.custom_jvp
    def f(v):
        return jnp.logaddexp(w * v, 0.0)

    @f.defjvp
    def f_jvp(primals, tangents):
        (v,), (t,) = primals, tangents
        return f(v), jax.nn.sigmoid(w * v) * w * t

    return jnp.sum(f(x) ** 2)


def _softplus_scaled_reference(w, x):
    x = np.asarray(x, np.float64)
    return float(np.sum(np.logaddexp(w * x, 0.0) ** 2))


def _sum_reference(ref):
    return lambda *a: float(np.sum(ref(*a)))


X3 = np.array([0.3, -1.2, 0.8], np.float32)

PROGRAMS = [
    ClosureProgram("fixed_point_closure", solve_closed_over, (np.float32(0.7),), False,
                   _fixed_point_reference),
    ClosureProgram("odeint_closure", ode_decay, (np.float32(0.8), np.array([1.0, 2.0], np.float32)),
                   True, _ode_reference),
    ClosureProgram("custom_vjp_closure", scaled_clip, (np.float32(1.3), X3), False,
                   _scaled_clip_reference),
    ClosureProgram("custom_vjp_closure_forward", scaled_clip, (np.float32(1.3), X3), False,
                   _scaled_clip_reference, {"closed_over": "forward"}),
    ClosureProgram("custom_jvp_closure", softplus_scaled, (np.float32(0.6), X3), False,
                   _softplus_scaled_reference),
]


def finite_difference_grad(reference, args, eps=1e-6):
    """Central float64 differences of ``reference`` w.r.t. every argument."""
    args = [np.asarray(a, np.float64) for a in args]
    grads = []
    for i, a in enumerate(args):
        g = np.zeros_like(a)
        for idx in np.ndindex(a.shape):
            hi = [x.copy() for x in args]
            lo = [x.copy() for x in args]
            hi[i][idx] += eps
            lo[i][idx] -= eps
            g[idx] = (reference(*hi) - reference(*lo)) / (2 * eps)
        grads.append(g)
    return grads
