"""Fixed-point solver (while_loop) with an implicit-function custom_vjp; Newton square root."""
from functools import partial

import jax
import jax.numpy as jnp
from jax import lax

TAGS = ("fixed_point", "custom_vjp", "custom_vjp_nondiff", "custom_vjp_fn_nondiff", "while_loop", "float32")
SUPPORTS = ("grad", "vmap", "jit")

_TOL = 1e-6
_MAX_ITERS = 100


def _iterate_to_convergence(step, x0):
    """Apply `step` until successive iterates agree to _TOL (or _MAX_ITERS)."""

    def not_converged(state):
        k, previous, current = state
        gap = jnp.max(jnp.abs(current - previous))
        return (gap > _TOL * (1.0 + jnp.max(jnp.abs(current)))) & (k < _MAX_ITERS)

    def advance(state):
        k, _, current = state
        return k + 1, current, step(current)

    _, _, result = lax.while_loop(not_converged, advance, (0, x0, step(x0)))
    return result


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def fixed_point(f, a, x_guess):
    """Solve x = f(a, x) by plain iteration starting from x_guess."""
    return _iterate_to_convergence(lambda x: f(a, x), x_guess)


def _fixed_point_fwd(f, a, x_guess):
    x_star = fixed_point(f, a, x_guess)
    return x_star, (a, x_star)


def _fixed_point_bwd(f, residuals, x_star_bar):
    a, x_star = residuals
    # Adjoint equation: u = x_star_bar + (df/dx)^T u, itself a fixed point in u.
    _, pull_x = jax.vjp(lambda x: f(a, x), x_star)
    u = _iterate_to_convergence(lambda w: x_star_bar + pull_x(w)[0], x_star_bar)
    _, pull_a = jax.vjp(lambda aa: f(aa, x_star), a)
    (a_bar,) = pull_a(u)
    return a_bar, jnp.zeros_like(x_star)


fixed_point.defvjp(_fixed_point_fwd, _fixed_point_bwd)


def _newton_update(a, x):
    return 0.5 * (x + a / x)


def newton_sqrt(a):
    return fixed_point(_newton_update, a, a)


def fun(a):
    root = newton_sqrt(a)
    return root, jnp.sum(root * a)


def example_args():
    return (jnp.array([0.5, 2.0, 9.0, 30.0], jnp.float32),)
