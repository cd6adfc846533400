"""Symbolic-zeros custom rules called under ``jax.vmap`` inside the traced
function, closing over a batched value (adversary, stop 33).

JAX stages the vmapped rule in its own form, and materializing it traces the
rule for every perturbation pattern.  A pattern other than the one traced at the
call reads the batched value of a ``vmap`` that has ended: ``jaxpr_cc.trace``
raised ``ClosureConversionError`` for programs JAX evaluates and differentiates.
Such a pattern now runs the main rule (as one whose state changed since the
call does), and a rule's main trace perturbs only what the program can move.
References: JAX's value and analytic derivatives.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.custom_derivatives import SymbolicZero

import jaxpr_cc

XS = np.array([0.3, 0.6, 0.9], np.float32)
W = np.float32(0.7)


def _dense(t, x):
    return jnp.zeros_like(x) if isinstance(t, SymbolicZero) else t


def _vmapped_jvp_program(b_moved_factor: float):
    """``sum(vmap(f)(w, xs))`` for a symbolic-zeros custom_jvp ``f(a, b) =
    sin(a xi) b`` closing over the batched ``xi``, whose tangent is multiplied by
    ``b_moved_factor`` when ``b``'s tangent is not a symbolic zero."""
    def program(w, xs):
        def per(w, xi):
            @jax.custom_jvp
            def f(a, b):
                return jnp.sin(a * xi) * b

            def f_jvp(p, t):
                (a, b), (ta, tb) = p, t
                k = 1.0 if isinstance(tb, SymbolicZero) else b_moved_factor
                ta, tb = _dense(ta, a), _dense(tb, b)
                return f(a, b), (jnp.cos(a * xi) * xi * b * ta + jnp.sin(a * xi) * tb) * k

            f.defjvp(f_jvp, symbolic_zeros=True)
            return f(w, xi)
        return jnp.sum(jax.vmap(per, (None, 0))(w, xs))
    return program


_jvp_program = _vmapped_jvp_program(1.0)


def _vjp_program(w, xs):
    def per(w, xi):
        @jax.custom_vjp
        def f(a):
            return jnp.sin(a * xi)

        f.defvjp(lambda a: (f(a.value), a.value),
                 lambda a, g: (g * jnp.cos(a * xi) * xi,), symbolic_zeros=True)
        return f(w)
    return jnp.sum(jax.vmap(per, (None, 0))(w, xs))


def _per_example_grads(w, xs):
    def loss(w, xi):
        @jax.custom_vjp
        def f(a, b):
            return jnp.sin(a * xi) * b

        def fwd(a, b):
            return f(a.value, b.value), (a.value, b.value)

        def bwd(r, g):
            a, b = r
            return g * jnp.cos(a * xi) * xi * b, g * jnp.sin(a * xi)

        f.defvjp(fwd, bwd, symbolic_zeros=True)
        return f(w, xi) + f(w * 2.0, 3.0)
    return jnp.sum(jax.vmap(jax.grad(loss), (None, 0))(w, xs))


@pytest.mark.parametrize("program, reference, grad_reference", [
    (_jvp_program, lambda w, xs: np.sum(np.sin(w * xs) * xs),
     lambda w, xs: np.sum(np.cos(w * xs) * xs * xs)),
    (_vjp_program, lambda w, xs: np.sum(np.sin(w * xs)),
     lambda w, xs: np.sum(np.cos(w * xs) * xs)),
    (_per_example_grads,
     lambda w, xs: np.sum(np.cos(w * xs) * xs * xs + 6.0 * np.cos(2 * w * xs) * xs), None),
], ids=["custom_jvp", "custom_vjp", "per_example_grads"])
def test_vmapped_symbolic_zero_rules(program, reference, grad_reference):
    w, xs = np.float64(W), XS.astype(np.float64)
    np.testing.assert_allclose(jax.jit(program)(W, XS), reference(w, xs), rtol=1e-5)
    traced = jaxpr_cc.trace(program, W, XS)
    for ours in (traced, jaxpr_cc.jit(program)):
        np.testing.assert_allclose(ours(W, XS), reference(w, xs), rtol=1e-5)
    if grad_reference is not None:
        np.testing.assert_allclose(jax.grad(traced)(W, XS), grad_reference(w, xs), rtol=1e-5)


def _pattern_dependent_vjp(w, xs):
    """bwd doubles when ``b`` is perturbed; ``b = xi`` never is (data)."""
    def per(w, xi):
        @jax.custom_vjp
        def f(a, b):
            return jnp.sin(a * xi) * b

        def fwd(a, b):
            return f(a.value, b.value), (a.value, b.value, b.perturbed)

        def bwd(r, g):
            a, b, pb = r
            return (g * jnp.cos(a * xi) * xi * b * (2.0 if pb else 1.0), g * jnp.sin(a * xi))

        f.defvjp(fwd, bwd, symbolic_zeros=True)
        return f(w, xi)
    return jnp.sum(jax.vmap(per, (None, 0))(w, xs))


# The jvp doubles when ``b``'s tangent is not a symbolic zero.
_pattern_dependent_jvp = _vmapped_jvp_program(2.0)


@pytest.mark.parametrize("program", [_pattern_dependent_vjp, _pattern_dependent_jvp],
                         ids=["custom_vjp", "custom_jvp"])
def test_a_pattern_dependent_rule_sees_the_pattern_jax_gives(program):
    """Differentiating with respect to ``w`` only, JAX perturbs ``a`` and not ``b``:
    the rule's pattern-dependent factor is 1.  The vmapped rule's other patterns
    are traced while the vmap is live (after it, the main rule ran for them:
    factor 2; adversary, stop 33).  Reference: the analytic derivative."""
    want = np.sum(np.cos(np.float64(W) * XS.astype(np.float64)) * XS.astype(np.float64) ** 2)
    for ours in (jaxpr_cc.trace(program, W, XS), jaxpr_cc.jit(program)):
        np.testing.assert_allclose(jax.grad(ours)(W, XS), want, rtol=1e-5)
    np.testing.assert_allclose(jaxpr_cc.jit(jax.grad(program))(W, XS), want, rtol=1e-5)


def _three_input_rule(c, n_out):
    """A symbolic-zeros custom_vjp of three inputs and ``n_out`` outputs closing
    over ``c``: 3 x 7 or 7 x 7 (fwd x cotangent) patterns, beyond the old budget
    of 16 traced with the program."""
    @jax.custom_vjp
    def f(x, y, z):
        return (x * y * c, x + z, y * z)[:n_out]

    def fwd(x, y, z):
        return f(x.value, y.value, z.value), (x.value, y.value, z.value)

    def bwd(r, cts):
        x, y, z = r
        cts = [jnp.zeros_like(x) if isinstance(t, SymbolicZero) else t for t in cts]
        cts += [jnp.zeros_like(x)] * (3 - len(cts))
        a, b, d = cts
        return (a * y * c + b, a * x * c + d * z, b + d * y)

    f.defvjp(fwd, bwd, symbolic_zeros=True)
    return f


@pytest.mark.parametrize("argnums", [(0, 1), (0, 1, 2)], ids=str)
@pytest.mark.parametrize("n_out", [2, 3])
def test_a_three_input_rule_under_vmap_gets_every_pattern_while_the_vmap_lives(n_out, argnums):
    """Adversary (stop 35): only output 0 of a 3-input, 2-output rule is used;
    the cotangent pattern (True, False) of a fwd family was beyond the budget,
    traced late after the vmap had ended: ClosureConversionError, where the same
    rule with ``c`` as an argument gives (9, 3)."""
    def program(x, y, z, cs):
        return jax.vmap(lambda c: _three_input_rule(c, n_out)(x, y, z)[0])(cs).sum()

    def explicit(x, y, z, cs):
        return jnp.sum(cs * x * y)     # output 0, with c an argument

    args = (0.5, 1.5, 2.5, jnp.asarray(XS))
    want = jax.grad(explicit, argnums)(*args)
    for fn in (jaxpr_cc.jit(program), jaxpr_cc.trace(program, *args)):
        got = jax.grad(fn, argnums)(*args)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)


@pytest.mark.heavy  # about 6 minutes: tracing the vmapped rule's forward-mode columns
def test_vmap_of_a_diffrax_backsolve_whose_vector_field_closes_over_the_batched_parameter():
    # diffrax's BacksolveAdjoint (an equinox filter_custom_vjp, symbolic zeros)
    # under vmap, its vector field closing over each lane's k: materializing the
    # staged rule traced a pattern the program was not traced for, reading the
    # ended vmap's k (adversary, stop 40: "closes over a value of a trace that has
    # ended").  It now takes the patterns the rule was traced for.  The rule never
    # sees k: its derivative is formed in forward mode through the primal, the
    # discrete solve (docs/closure.md).  Reference: JAX, with k passed as the
    # solve's args, differentiating the discrete solve (RecursiveCheckpointAdjoint).
    import diffrax

    def solve(k, closed):
        vector_field = ((lambda t, y, args: -k * y) if closed else
                        (lambda t, y, args: -args * y))
        adjoint = diffrax.BacksolveAdjoint() if closed else diffrax.RecursiveCheckpointAdjoint()
        sol = diffrax.diffeqsolve(diffrax.ODETerm(vector_field), diffrax.Heun(), 0.0, 0.5,
                                  0.125, jnp.ones(2), args=None if closed else k,
                                  stepsize_controller=diffrax.ConstantStepSize(),
                                  adjoint=adjoint, saveat=diffrax.SaveAt(t1=True))
        return jnp.sum(sol.ys[-1])

    ks = jnp.array([0.5, 0.7], jnp.float32)
    program = jaxpr_cc.trace(lambda ks: jax.vmap(lambda k: solve(k, True))(ks), ks)
    reference = jax.vmap(lambda k: solve(k, False))
    np.testing.assert_allclose(program(ks), reference(ks), rtol=1e-6)
    np.testing.assert_allclose(jax.grad(lambda ks: jnp.sum(program(ks)))(ks),
                               jax.grad(lambda ks: jnp.sum(reference(ks)))(ks), rtol=1e-5)
