"""Nested equinox checkpointed while loops (diffrax's Runge-Kutta solvers under
RecursiveCheckpointAdjoint: the stage loop inside the step loop) differentiated
through jaxpr_cc.trace / jaxpr_cc.jit, compared with JAX on the same function.

Two faults made these gradients wrong:

* A rebuilt custom_vjp carried which fwd ran in its residuals' pytree.  JAX stages a
  custom_vjp equation once (equinox's closure conversion), memoizes its fwd per
  perturbation pattern, and hands bwd the residual tree of the pattern traced last:
  with patterns A, B, A the third call ran A's fwd and B's bwd.
* The known-zero analysis of a rule's tangent took a linear_call whose linear
  operands mix zero and non-zero values for a linear map of the zeros alone, so a
  tangent the inner loop feeds from a closed-over value was returned as a zero.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_cc

eqx = pytest.importorskip("equinox")


@pytest.fixture(autouse=True)
def _x64():
    with jax.enable_x64(True):
        yield


def _nested_loops(n_steps: int):
    """Heun's method written as equinox's nested checkpointed loops (the ck4 case)."""
    h = 0.5

    def step(p, x):
        def body(c):
            i, ks = c
            xi = x + h * jnp.where(i == 0, 0.0, ks[0])
            return i + 1, ks.at[i].set(-p * xi)
        _, ks = eqx.internal.while_loop(lambda c: c[0] < 2, body, (0, jnp.zeros((2, 1))),
                                        max_steps=2, kind="checkpointed",
                                        buffers=lambda c: c[1])
        return x + h / 2 * (ks[0] + ks[1])

    def F(p):
        def body(c):
            k, x = c
            return k + 1, step(p, x)
        return eqx.internal.while_loop(lambda c: c[0] < n_steps, body, (0, jnp.array([1.0])),
                                       max_steps=4096, kind="checkpointed")[1]
    return F


def _check(F, p0):
    want = jax.jacrev(F)(p0)
    np.testing.assert_allclose(jax.jacrev(jaxpr_cc.trace(F, p0))(p0), want, rtol=1e-12)
    np.testing.assert_allclose(jax.jacrev(jaxpr_cc.jit(F))(p0), want, rtol=1e-12)
    return want


@pytest.mark.parametrize("n_steps", [2, pytest.param(1, marks=pytest.mark.heavy)])
def test_nested_checkpointed_loops_match_jax(n_steps):
    p0 = jnp.array([0.5])
    want = _check(_nested_loops(n_steps), p0)
    # Analytic: x_N = g**N with g = 1 - p h + (p h)**2 / 2, h = 0.5.
    p, h = 0.5, 0.5
    g = 1 - p * h + (p * h) ** 2 / 2
    np.testing.assert_allclose(want.ravel(), [n_steps * g ** (n_steps - 1) * (-h + p * h * h)],
                               rtol=1e-12)


# Each case traces diffrax's solve twice (trace, jit) and JAX's once: only the
# smallest runs by default.
@pytest.mark.parametrize("solver_name,n_steps", [
    pytest.param("Heun", 2, marks=pytest.mark.heavy),  # ~25 s; ck4 covers the mechanism by default
    pytest.param("Heun", 3, marks=pytest.mark.heavy),
    pytest.param("Tsit5", 2, marks=pytest.mark.heavy),
    pytest.param("Tsit5", 4, marks=pytest.mark.heavy),
])
def test_diffrax_recursive_checkpoint_adjoint(solver_name, n_steps):
    diffrax = pytest.importorskip("diffrax")
    solver = getattr(diffrax, solver_name)()

    def F(p):
        term = diffrax.ODETerm(lambda t, y, a: -a * y)
        return diffrax.diffeqsolve(term, solver, 0.0, 1.0, 1.0 / n_steps, jnp.array([1.0]),
                                   args=p, adjoint=diffrax.RecursiveCheckpointAdjoint()).ys[-1]
    _check(F, jnp.array([0.5]))


def _mul():
    @jax.custom_vjp
    def mul(a, b):
        return a * b

    def fwd(a, b):
        return mul(a.value, b.value), (a.value, b.value)

    def bwd(res, ct):
        a, b = res
        return ct * b, ct * a
    mul.defvjp(fwd, bwd, symbolic_zeros=True)
    return mul


def test_staged_rule_differentiated_with_patterns_a_b_a():
    """A rule staged once by make_jaxpr inside the traced function, then
    differentiated with both inputs, one, then both again: the third gradient
    needs the first pattern's bwd."""
    mul = _mul()

    def F(x, p):
        staged = jax.make_jaxpr(lambda a, b: mul(a, b))(x, p)

        def h(a, b):
            return jax.core.eval_jaxpr(staged.jaxpr, staged.consts, a, b)[0]
        both = jax.grad(h, argnums=(0, 1))(x, p)
        first = jax.grad(h, argnums=0)(x, p)
        again = jax.grad(h, argnums=(0, 1))(x, p)
        return jnp.stack([both[0], both[1], first, again[0], again[1]])
    x, p = jnp.float64(2.0), jnp.float64(3.0)
    want = F(x, p)
    np.testing.assert_allclose(want, [3.0, 2.0, 3.0, 3.0, 2.0])
    np.testing.assert_allclose(jaxpr_cc.trace(F, x, p)(x, p), want)
    np.testing.assert_allclose(jaxpr_cc.jit(F)(x, p), want)
