"""Programs written with the solver libraries (equinox, lineax, optimistix, diffrax).

Each is traced with jaxpr-cc and compared with JAX itself (value and gradient), then
run through the default pipeline, ``jaxpr_cc.compile`` and ``jaxpr_cc.jit``.  Saving,
loading and emitting them (the libraries' own primitives included) is checked in fresh
processes by tests/test_realworld_roundtrip.py.
"""
import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import optimistix as optx
import pytest

import jaxpr_cc
from jaxpr_cc.passes import DEFAULT_PIPELINE

A = jnp.array([[3.0, 1.0], [1.0, 2.0]])


def lineax_lu(b):
    return lx.linear_solve(lx.MatrixLinearOperator(A), b, lx.LU()).value


def lineax_cg(b):
    operator = lx.MatrixLinearOperator(A, lx.positive_semidefinite_tag)
    return lx.linear_solve(operator, b, lx.CG(rtol=1e-6, atol=1e-6)).value


def lineax_function_operator(b, w):
    operator = lx.FunctionLinearOperator(lambda v: A @ v + w * v,
                                         jax.ShapeDtypeStruct((2,), jnp.float32))
    return lx.linear_solve(operator, b, lx.QR()).value


def optimistix_newton(a):
    fn = lambda y, a: jnp.tanh(y) - a * y + 0.1  # noqa: E731
    return optx.root_find(fn, optx.Newton(1e-6, 1e-6), jnp.zeros(2), args=a).value


def optimistix_closure(a):
    # The residual closes over ``a`` instead of taking it through ``args``.
    fn = lambda y, _: jnp.tanh(y) - a * y + 0.1  # noqa: E731
    return optx.root_find(fn, optx.Newton(1e-6, 1e-6), jnp.zeros(2)).value


@eqx.filter_custom_vjp
def scaled(x, scale):
    return x * scale


@scaled.def_fwd
def _scaled_fwd(perturbed, x, scale):
    return x * scale, None


@scaled.def_bwd
def _scaled_bwd(residuals, grad, perturbed, x, scale):
    return grad * scale


def equinox_filter_custom_vjp(x):
    return scaled(x, jnp.float32(2.0)) ** 2


class Affine(eqx.Module):
    weight: jax.Array
    bias: jax.Array

    def __call__(self, x):
        return jnp.tanh(self.weight @ x + self.bias)


def equinox_module_solve(x):
    layer = Affine(jnp.array([[0.5, 0.1], [0.2, 0.3]]), jnp.array([0.1, -0.2]))
    fn = lambda y, _: layer(y) - y  # noqa: E731
    return optx.root_find(fn, optx.Newton(1e-6, 1e-6), x).value


PROGRAMS = [
    (lineax_lu, (jnp.array([1.0, -1.0]),)),
    (lineax_cg, (jnp.array([1.0, -1.0]),)),
    (lineax_function_operator, (jnp.array([1.0, -1.0]), jnp.float32(0.5))),
    (optimistix_newton, (jnp.array([0.5, 0.3]),)),
    (optimistix_closure, (jnp.array([0.5, 0.3]),)),
    (equinox_filter_custom_vjp, (jnp.array([3.0, -1.0]),)),
    (equinox_module_solve, (jnp.array([0.3, 0.1]),)),
]


def _loss(fun):
    return lambda *args: jnp.sum(fun(*args) ** 2)


@pytest.fixture(scope="module", params=PROGRAMS, ids=lambda p: p[0].__name__)
def traced(request):
    fun, args = request.param
    return fun, args, jaxpr_cc.trace(fun, *args)


def test_value_and_gradient_equal_jax(traced):
    fun, args, program = traced
    np.testing.assert_allclose(program(*args), fun(*args), rtol=1e-5, atol=1e-6)
    argnums = tuple(range(len(args)))
    got = jax.grad(_loss(program), argnums=argnums)(*args)
    want = jax.grad(_loss(fun), argnums=argnums)(*args)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)


def test_pipeline_compile_and_jit(traced):
    fun, args, program = traced
    want = fun(*args)
    optimized = jaxpr_cc.run_passes(program, DEFAULT_PIPELINE)
    np.testing.assert_allclose(optimized(*args), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(jaxpr_cc.compile(optimized)(*args), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(jaxpr_cc.jit(fun)(*args), want, rtol=1e-5, atol=1e-6)
    argnums = tuple(range(len(args)))
    for g, w in zip(jax.grad(_loss(optimized), argnums=argnums)(*args),
                    jax.grad(_loss(fun), argnums=argnums)(*args)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)


@pytest.mark.heavy
@pytest.mark.parametrize("adjoint", ["RecursiveCheckpointAdjoint", "DirectAdjoint"])
def test_diffrax_vector_field_closing_over_a_parameter(adjoint):
    import diffrax

    def f(k):
        sol = diffrax.diffeqsolve(diffrax.ODETerm(lambda t, y, args: -k * y), diffrax.Tsit5(),
                                  0.0, 1.0, 0.05, jnp.ones(2), adjoint=getattr(diffrax, adjoint)(),
                                  stepsize_controller=diffrax.ConstantStepSize())
        return jnp.sum(sol.ys[-1])

    k = jnp.float32(0.7)
    program = jaxpr_cc.trace(f, k)
    # y(1) = exp(-k) y0, so d/dk sum(y(1)) = -2 exp(-k).
    np.testing.assert_allclose(program(k), 2 * np.exp(-0.7), rtol=1e-5)
    np.testing.assert_allclose(jax.grad(program)(k), -2 * np.exp(-0.7), rtol=1e-4)
