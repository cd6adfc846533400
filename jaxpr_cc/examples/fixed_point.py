"""A fixed-point solver with an implicit-function-theorem VJP, and a caller whose
update function closes over a traced parameter.

``fixed_point`` takes its function as a non-differentiable argument, so its custom
rules cannot see values that function closes over: ``jax.grad`` of
``solve_closed_over`` fails in plain JAX.  It is the demo's program.
"""
from functools import partial

import jax
import jax.numpy as jnp


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def fixed_point(f, a, x0):
    def keep_going(carry):
        prev, x = carry
        return jnp.max(jnp.abs(prev - x)) > 1e-6

    def step(carry):
        _, x = carry
        return x, f(a, x)

    _, x_star = jax.lax.while_loop(keep_going, step, (x0, f(a, x0)))
    return x_star


def _fixed_point_fwd(f, a, x0):
    x_star = fixed_point(f, a, x0)
    return x_star, (a, x_star)


def _fixed_point_bwd(f, residuals, x_star_bar):
    a, x_star = residuals
    _, vjp_a = jax.vjp(lambda a_: f(a_, x_star), a)
    _, vjp_x = jax.vjp(lambda x_: f(a, x_), x_star)
    # w = x_star_bar + w A, solved by iterating the adjoint map to its fixed point.
    w = fixed_point(lambda _, u: x_star_bar + vjp_x(u)[0], a, x_star_bar)
    (a_bar,) = vjp_a(w)
    return a_bar, jnp.zeros_like(x_star)


fixed_point.defvjp(_fixed_point_fwd, _fixed_point_bwd)


def newton_sqrt(a):
    """sqrt(a) by Newton's iteration; ``a`` is an explicit argument of the solver."""
    return fixed_point(lambda a_, x: 0.5 * (x + a_ / x), a, a)


def solve_closed_over(b):
    """Solve x = cos(b * x) + b / 2: the update closes over the traced ``b``."""
    def update(_, x):
        return jnp.cos(b * x) + 0.5 * b
    return fixed_point(update, jnp.zeros(()), jnp.zeros(()))


def solve_closed_over_reference_grad(b):
    """d x*/d b by the implicit function theorem, written out by hand for checking:
    x = cos(b x) + b/2  =>  dx/db = (-sin(b x) x + 1/2) / (1 + sin(b x) b)."""
    x = solve_closed_over(b)
    s = jnp.sin(b * x)
    return (-s * x + 0.5) / (1.0 + s * b)


EXAMPLE_ARGS = (jnp.float32(0.7),)
