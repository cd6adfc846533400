"""Custom-rule programs whose rules close over values, or are deliberately
non-mathematical so tests can tell the user's rule from JAX's own derivative."""
from functools import partial

import jax
import jax.numpy as jnp

from jaxpr_cc.examples.fixed_point import fixed_point


# -- rules that are not derivatives: only the user's rule can produce these -------
@jax.custom_vjp
def sin_bwd_times_3(x):
    return jnp.sin(x)


sin_bwd_times_3.defvjp(lambda x: (jnp.sin(x), None), lambda _, ct: (3.0 * ct,))


@jax.custom_jvp
def cube_tangent_7(x):
    return x ** 3


@cube_tangent_7.defjvp
def _cube_jvp(primals, tangents):
    (x,), _ = primals, tangents
    return x ** 3, jnp.full_like(x, 7.0)


def scale_transpose_5(x):
    """Identity whose custom transpose multiplies by 5."""
    return jax.custom_derivatives.linear_call(lambda _, v: v, lambda _, ct: 5.0 * ct, (), x)


@jax.custom_gradient
def square_grad_10x(x):
    return x ** 2, lambda g: (10.0 * g * x,)


# -- the tutorial's Newton square root, with the update closing over `a` ------------
def newton_sqrt_closed_over(a):
    return fixed_point(lambda _, x: 0.5 * (x + a / x), jnp.zeros(()), a)


# -- an ODE integrator with an adjoint backward pass --------------------------------
N_STEPS = 200


def _rk4(f, y0, t1, n):
    h = t1 / n

    def step(i, y):
        t = i * h
        k1 = f(y, t)
        k2 = f(y + 0.5 * h * k1, t + 0.5 * h)
        k3 = f(y + 0.5 * h * k2, t + 0.5 * h)
        k4 = f(y + h * k3, t + h)
        return y + h / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)

    return jax.lax.fori_loop(0, n, step, y0)


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def odeint(f, y0, t1):
    return _rk4(f, y0, t1, N_STEPS)


def _odeint_fwd(f, y0, t1):
    y1 = odeint(f, y0, t1)
    return y1, (y1, t1)


def _odeint_bwd(f, res, y1_bar):
    """Integrate state and adjoint backwards from t1 to 0 (the adjoint method)."""
    y1, t1 = res

    def aug(state, s):
        y, a = state
        t = t1 - s
        dy, vjp_y = jax.vjp(lambda y_: f(y_, t), y)
        (da,) = vjp_y(a)
        return (-dy, da)

    def aug_flat(z, s):
        y, a = z
        dy, da = aug((y, a), s)
        return jnp.stack([dy, da])

    z1 = _rk4(aug_flat, jnp.stack([y1, y1_bar]), t1, N_STEPS)
    a0 = z1[1]
    t1_bar = jnp.sum(y1_bar * f(y1, t1))
    return a0, t1_bar


odeint.defvjp(_odeint_fwd, _odeint_bwd)


def decay_final_state(k, y0=2.0):
    """y' = -k y from y(0)=y0 to t=1: y(1) = y0 exp(-k); the field closes over k."""
    return odeint(lambda y, t: -k * y, jnp.asarray(y0, jnp.float32), jnp.float32(1.0))
