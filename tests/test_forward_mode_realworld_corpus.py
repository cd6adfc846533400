"""Forward mode through the custom_vjp rules of the real-world library corpus
(tests/realworld_corpus.py: equinox, lineax, optimistix, diffrax; issue 17).

For every corpus program that contains a ``custom_vjp`` (equinox's
``filter_custom_vjp``, diffrax's ``RecursiveCheckpointAdjoint`` and
``BacksolveAdjoint``; lineax and optimistix differentiate through custom_jvp
rules, which JAX already runs in forward mode):

- ``jax.jacfwd(jaxpr_cc.jit(f))`` equals ``jax.jacrev(jaxpr_cc.jit(f))`` (rtol 1e-4),
  and that equals JAX's own ``jax.jacrev(f)`` (float64 central differences where
  JAX refuses);
- the Hessian of ``sum(out**2)`` (``jax.hessian`` of the jitted loss: forward over
  reverse) equals float64 central differences of JAX's gradient (of the values,
  where JAX refuses the gradient) -- except for BacksolveAdjoint
  (``RULES_HESSIAN``), whose gradient is its continuous adjoint discretized, and
  whose bwd solves that adjoint with BacksolveAdjoint again: the Hessian its
  rules define is JAX's reverse over reverse with equinox's guards lifted (with
  them JAX refuses: a save-time tangent reaches ``nondifferentiable``), 14% from
  differences of the gradient at this program's 4 Euler steps, 0.4% at 128.
  jaxpr-cc gives it with the guards in place: in forward mode the save times'
  tangent, which no perturbed input reaches through the transposed bwd, is a
  symbolic zero (``jax_adapter.forward_zero``).

None of these rules has a bwd that is not linear in its cotangent, so none is
refused.  BacksolveAdjoint's bwd writes the adjoint into diffrax's save buffer,
which starts filled with inf: an affine value whose constant part is never read;
the transposition checks that at run time (see jaxpr_cc/closure/transpose.py).

The default run checks a sample (about 15 s); ``-m heavy`` checks every program.
"""
import contextlib

import diffrax
import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_cc

from realworld_corpus import (JAX_GRADIENT_RAISES, PROGRAMS, finite_difference_gradient,
                              jax_gradient, loss)

TABLE = {name: (fun, args) for name, fun, args in PROGRAMS}
# The corpus programs whose traced jaxpr holds a custom_vjp_call (the heavy test
# below checks this list against the corpus).
WITH_CUSTOM_VJP = [
    "eqx_filter_custom_vjp_pytree", "eqx_filter_custom_vjp_int_arg",
    "eqx_filter_custom_vjp_closure", "eqx_filter_closure_convert_in_custom_vjp",
    "dfx_tsit5_checkpoint_saveat", "dfx_euler_backsolve_args",
    "dfx_euler_checkpoint_closure", "dfx_mlp_vector_field",
]
# (BacksolveAdjoint's Jacobian: test_backsolve_adjoint_forward_mode_equals_the_reference.)
JACOBIAN_SAMPLE = {"eqx_filter_custom_vjp_pytree", "eqx_filter_custom_vjp_closure"}
HESSIAN_SAMPLE = {"eqx_filter_custom_vjp_pytree", "eqx_filter_custom_vjp_closure",
                  "dfx_euler_backsolve_args"}


# Programs whose Hessian reference is the one their rules define (module docstring).
RULES_HESSIAN = {"dfx_euler_backsolve_args"}
@contextlib.contextmanager
def _equinox_guards_lifted():
    """JAX's own reverse over reverse through equinox rules, with the guards that
    refuse a tangent JAX gives (diffrax's save times, perturbed as every output
    of a custom_vjp is in JAX) letting it through instead (pinned equinox)."""
    import equinox._ad as eqx_ad
    saved = eqx_ad._get_value_assert_unperturbed, eqx_ad._nondifferentiable.jvp
    eqx_ad._get_value_assert_unperturbed = lambda x: x.value
    eqx_ad._nondifferentiable.jvp = lambda msg, primals, tangents: (primals[0], tangents[0])
    try:
        yield
    finally:
        eqx_ad._get_value_assert_unperturbed, eqx_ad._nondifferentiable.jvp = saved


def _rules_hessian(fun, args, i):
    """The Hessian of ``loss(fun)`` w.r.t. argument ``i`` that the rules define:
    JAX's jacrev of jacrev in float64, equinox's guards lifted."""
    with jax.enable_x64(True), _equinox_guards_lifted():
        wide = [jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), a) for a in args]
        flat, unravel = jax.flatten_util.ravel_pytree(wide[i])

        def flat_loss(v):
            moved = list(wide)
            moved[i] = unravel(v)
            return loss(fun)(*moved)
        return np.asarray(jax.jacrev(jax.jacrev(flat_loss))(flat))


def _params(sample):
    return [pytest.param(name, id=name, marks=[] if name in sample else [pytest.mark.heavy])
            for name in WITH_CUSTOM_VJP]


def _assert_trees_close(got, want, rtol, atol):
    got_leaves, want_leaves = jax.tree.leaves(got), jax.tree.leaves(want)
    assert len(got_leaves) == len(want_leaves)
    for g, w in zip(got_leaves, want_leaves):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=rtol, atol=atol)


def _differentiable(args):
    """Positions of the arguments whose leaves are all floating point."""
    return [i for i, a in enumerate(args)
            if all(jnp.issubdtype(jnp.result_type(leaf), jnp.floating)
                   for leaf in jax.tree.leaves(a))]


@pytest.mark.parametrize("name", _params(JACOBIAN_SAMPLE))
def test_jacfwd_of_jit_equals_jacrev(name):
    fun, args = TABLE[name]
    jf = jaxpr_cc.jit(fun)
    for i in _differentiable(args):
        rev = jax.jacrev(jf, argnums=i)(*args)
        _assert_trees_close(jax.jacfwd(jf, argnums=i)(*args), rev, rtol=1e-4, atol=1e-6)
        if name not in JAX_GRADIENT_RAISES:
            _assert_trees_close(rev, jax.jacrev(fun, argnums=i)(*args), rtol=1e-5, atol=1e-6)
    if name in JAX_GRADIENT_RAISES:
        # JAX refuses; the gradient of sum(out**2) from forward mode equals
        # float64 central differences.
        with pytest.raises(Exception):
            jax_gradient(fun, args)
        jl = jaxpr_cc.jit(loss(fun))
        fwd_grad = [jax.jacfwd(jl, argnums=i)(*args) for i in range(len(args))]
        _assert_trees_close(fwd_grad, list(finite_difference_gradient(fun, args)),
                            rtol=1e-4, atol=1e-4)


def _fd_of_gradient(jax_refuses, fun, args, i, eps=1e-4):
    """The Hessian of ``loss(fun)`` with respect to argument ``i`` (a flat square
    matrix over its leaves), by float64 central differences of JAX's gradient, or
    of values where JAX refuses the gradient."""
    with jax.enable_x64(True):
        def widen(leaf):
            leaf = jnp.asarray(leaf)
            return leaf.astype(jnp.float64) if jnp.issubdtype(leaf.dtype, jnp.floating) else leaf

        wide = [jax.tree.map(widen, a) for a in args]
        flat, unravel = jax.flatten_util.ravel_pytree(wide[i])

        def flat_loss(v):
            moved = list(wide)
            moved[i] = unravel(v)
            return loss(fun)(*moved)

        if jax_refuses:
            value = jax.jit(flat_loss)
            grad = lambda v: np.array([(value(v + eps * e) - value(v - eps * e)) / (2 * eps)
                                       for e in np.eye(v.size)])
        else:
            grad = jax.jit(jax.grad(flat_loss))
        cols = [(np.asarray(grad(flat + eps * e)) - np.asarray(grad(flat - eps * e))) / (2 * eps)
                for e in np.eye(flat.size)]
        return np.stack(cols, axis=1)


@pytest.mark.parametrize("name", _params(HESSIAN_SAMPLE))
def test_hessian_of_jit_equals_float64_differences_of_the_gradient(name):
    fun, args = TABLE[name]
    jl = jaxpr_cc.jit(loss(fun))
    for i in _differentiable(args):
        flat, unravel = jax.flatten_util.ravel_pytree(args[i])

        def flat_loss(v, i=i, unravel=unravel):
            moved = list(args)
            moved[i] = unravel(v)
            return jl(*moved)

        h = np.asarray(jax.hessian(flat_loss)(flat))
        if name in RULES_HESSIAN:
            with pytest.raises(RuntimeError, match="Unexpected tangent"):  # equinox's guards
                jax.jacrev(jax.jacrev(loss(fun), argnums=i))(*args)
            np.testing.assert_allclose(h, _rules_hessian(fun, args, i), rtol=1e-4, atol=1e-6)
            continue
        want = _fd_of_gradient(name in JAX_GRADIENT_RAISES, fun, args, i)
        np.testing.assert_allclose(h, want, rtol=2e-3, atol=2e-3)


def _backsolve_closing_over(k):
    # BacksolveAdjoint whose vector field closes over k (JAX refuses its gradient:
    # the rule cannot see k).
    term = diffrax.ODETerm(lambda t, y, args: -k * y)
    sol = diffrax.diffeqsolve(term, diffrax.Heun(), 0.0, 0.5, 0.125, jnp.ones(2),
                              stepsize_controller=diffrax.ConstantStepSize(),
                              adjoint=diffrax.BacksolveAdjoint(),
                              saveat=diffrax.SaveAt(t1=True))
    return sol.ys[-1]


def test_backsolve_adjoint_forward_mode_equals_the_reference():
    # JAX refuses forward mode through BacksolveAdjoint's custom_vjp; jaxpr-cc
    # transposes its bwd (a backward ODE solve writing into an inf-filled buffer).
    fun, (k,) = TABLE["dfx_euler_backsolve_args"]
    with pytest.raises(TypeError, match="custom_vjp"):
        jax.jacfwd(fun)(k)
    fwd = jax.jacfwd(jaxpr_cc.jit(fun))(k)
    np.testing.assert_allclose(np.asarray(fwd), np.asarray(jax.jacrev(fun)(k)), rtol=1e-4)
    # (That is the derivative of BacksolveAdjoint's continuous adjoint, which
    # differs from differences of this coarse Euler solve by O(dt): the closure
    # test below compares a Heun solve with the analytic derivative.)


@pytest.mark.heavy
def test_backsolve_adjoint_closing_over_the_parameter_forward_mode():
    # The parameter reaches the vector field through a closure: JAX refuses
    # reverse and forward mode; jaxpr-cc's forward mode equals its reverse mode
    # and the analytic derivative of y(0.5) = exp(-0.5 k), d/dk = -0.5 exp(-0.5 k)
    # (Heun with dt = 0.125: a few 1e-3 off).
    k = jnp.float32(0.7)
    with pytest.raises(Exception):
        jax.jacfwd(_backsolve_closing_over)(k)
    jf = jaxpr_cc.jit(_backsolve_closing_over)
    fwd = jax.jacfwd(jf)(k)
    np.testing.assert_allclose(np.asarray(fwd), np.asarray(jax.jacrev(jf)(k)), rtol=1e-4)
    np.testing.assert_allclose(np.asarray(fwd), -0.5 * np.exp(-0.35) * np.ones(2), rtol=1e-2)


@pytest.mark.heavy
def test_the_list_of_programs_with_custom_vjp_is_the_corpus():
    found = [name for name, fun, args in PROGRAMS
             if "custom_vjp_call" in str(jaxpr_cc.trace(fun, *args))]
    assert found == WITH_CUSTOM_VJP


# Heun in the default run (about 20 s); Euler and Tsit5 under -m heavy.
@pytest.mark.parametrize("solver", [pytest.param(diffrax.Euler(), marks=pytest.mark.heavy),
                                    diffrax.Heun(),
                                    pytest.param(diffrax.Tsit5(), marks=pytest.mark.heavy)],
                         ids=["euler", "heun", "tsit5"])
def test_backsolve_adjoint_forward_mode_with_a_runge_kutta_tableau(solver):
    """A solver's Butcher tableau is held in the bwd as array literals: the
    transposition's trace lifted them to constants, and so did batching the
    linear rule, so forward mode was refused for every solver but Euler (and
    then for Euler too, once the tableau-free path changed; adversary, stop 32).
    Reference: JAX's jacrev (it runs the user's bwd)."""
    def f(k):
        term = diffrax.ODETerm(lambda t, y, k: -k * y + jnp.sin(t))
        sol = diffrax.diffeqsolve(term, solver, 0.0, 0.5, 0.125, jnp.array([1.0, 0.5]), args=k,
                                  stepsize_controller=diffrax.ConstantStepSize(),
                                  adjoint=diffrax.BacksolveAdjoint(),
                                  saveat=diffrax.SaveAt(t1=True))
        return sol.ys[-1]

    k = jnp.float32(0.7)
    np.testing.assert_allclose(np.asarray(jax.jacfwd(jaxpr_cc.jit(f))(k)),
                               np.asarray(jax.jacrev(f)(k)), rtol=1e-4)


def _euler_backsolve(dt):
    def f(k):
        term = diffrax.ODETerm(lambda t, y, k: -k * y + jnp.sin(t))
        sol = diffrax.diffeqsolve(term, diffrax.Euler(), 0.0, 0.5, dt, jnp.ones(2), args=k,
                                  stepsize_controller=diffrax.ConstantStepSize(),
                                  adjoint=diffrax.BacksolveAdjoint(),
                                  saveat=diffrax.SaveAt(t1=True))
        return jnp.sum(sol.ys[-1] ** 2)
    return f


def test_backsolve_adjoint_forward_mode_past_64_steps():
    # The transposition's affine check ran every loop of the bwd at most 64 steps;
    # the backward solve cut short reported "maximum number of solver steps", so
    # forward mode through any BacksolveAdjoint of more than 64 steps raised.
    # Reference: JAX's reverse mode (it runs the user's bwd).
    f = _euler_backsolve(0.5 / 80)
    k = jnp.float32(0.7)
    np.testing.assert_allclose(jax.jacfwd(jaxpr_cc.jit(f))(k), jax.grad(f)(k), rtol=1e-4)
