"""A fixed-point solver with an implicit-function-theorem VJP, and a caller whose
update function closes over a traced parameter.

``fixed_point`` takes its function as a non-differentiable argument, so its custom
rules cannot see values that function closes over: ``jax.grad`` of
``solve_closed_over`` fails in plain JAX.  It is the demo's program.

The iteration stops when a step moves less than ``TOLERANCE`` or after
``MAX_ITERATIONS`` steps, so it terminates for every input (a map that is not a
contraction oscillates or diverges forever otherwise); ``fixed_point_status`` says
whether it converged.  ``x = cos(b x) + b/2`` converges for b in ``B_RANGE``.
"""
from functools import partial

import jax
import jax.numpy as jnp

TOLERANCE = 1e-6
MAX_ITERATIONS = 1000
# The solver (and its adjoint iteration, which has the same rate) converges in
# float32 within a few hundred steps for every b in this range; outside it the map
# stops being a contraction near its fixed point (from about b = 1.1 and b = -2.25).
B_RANGE = (-2.0, 1.0)


def _iterate(f, a, x0):
    """(last iterate, steps taken, size of the last step)."""
    def keep_going(carry):
        steps, prev, x = carry
        return (steps < MAX_ITERATIONS) & (jnp.max(jnp.abs(prev - x)) > TOLERANCE)

    def step(carry):
        steps, _, x = carry
        return steps + 1, x, f(a, x)

    steps, prev, x = jax.lax.while_loop(keep_going, step, (0, x0, f(a, x0)))
    return x, steps, jnp.max(jnp.abs(prev - x))


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def fixed_point(f, a, x0):
    return _iterate(f, a, x0)[0]


def fixed_point_status(f, a, x0):
    """(x, steps, converged) of the same iteration, without derivative rules.  A NaN
    step (the iteration blew up) counts as not converged."""
    x, steps, last_step = _iterate(f, a, x0)
    return x, steps, last_step <= TOLERANCE


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


def _closed_over_update(b):
    def update(_, x):
        return jnp.cos(b * x) + 0.5 * b
    return update


def solve_closed_over(b):
    """Solve x = cos(b * x) + b / 2: the update closes over the traced ``b``."""
    return fixed_point(_closed_over_update(b), jnp.zeros(()), jnp.zeros(()))


def solve_closed_over_status(b):
    """(x, steps, converged) of ``solve_closed_over(b)``'s iteration."""
    return fixed_point_status(_closed_over_update(b), jnp.zeros(()), jnp.zeros(()))


def solve_closed_over_reference_grad(b):
    """d x*/d b by the implicit function theorem, written out by hand for checking:
    x = cos(b x) + b/2  =>  dx/db = (-sin(b x) x + 1/2) / (1 + sin(b x) b)."""
    x = solve_closed_over(b)
    s = jnp.sin(b * x)
    return (-s * x + 0.5) / (1.0 + s * b)


EXAMPLE_ARGS = (jnp.float32(0.7),)
