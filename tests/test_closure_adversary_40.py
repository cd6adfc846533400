"""Findings of the closure-conversion adversaries of stop 40 (issue 15), each checked
against JAX's plain unrolled iteration, JAX itself or an analytic value.

- A while-loop solver (custom_vjp or custom_jvp) whose update closes over the
  parameter and whose explicit argument is a constant: its derivative along the
  parameter is formed by forward mode, but its *output* was the primal body run
  plainly, so a second reverse pass reached the while_loop as soon as the output was
  used nonlinearly (``z**2``): ``grad(grad)`` raised "Reverse-mode differentiation
  does not work for lax.while_loop".
"""
import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from functools import partial
from jax import lax

import jaxpr_cc


# ------------------------- solver output used nonlinearly, second reverse pass
def _loop(fn, x0):
    return lax.while_loop(lambda c: jnp.abs(c[0] - c[1]) > 1e-7,
                          lambda c: (fn(c[0]), c[0]), (fn(x0), x0))[0]


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fp_vjp(fn, x0):
    return _loop(fn, x0)


_fp_vjp.defvjp(lambda fn, x0: (_fp_vjp(fn, x0), None),
               lambda fn, _, ct: (jnp.zeros_like(ct),))


@partial(jax.custom_jvp, nondiff_argnums=(0,))
def _fp_jvp(fn, x0):
    return _loop(fn, x0)


@_fp_jvp.defjvp
def _fp_jvp_rule(fn, primals, tangents):
    return _fp_jvp(fn, *primals), jnp.zeros_like(tangents[0])


def _nonlinear_in_solution(fp):
    def sol(b):
        z = fp(lambda z: 0.45 * jnp.cos(z) + b, 0.0)
        return z ** 2 + jnp.sin(z)
    return sol


def _unrolled(b):
    z = jnp.float32(0.0)
    for _ in range(200):
        z = 0.45 * jnp.cos(z) + b
    return z ** 2 + jnp.sin(z)


def _emitted(program, tmp_path, name):
    path = tmp_path / f"{name}.py"
    path.write_text(jaxpr_cc.emit_python(program))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, "sol")


@pytest.mark.heavy  # 25 s; the scan and integer-output tests below cover the class
@pytest.mark.parametrize("fp", [_fp_vjp, _fp_jvp], ids=["custom_vjp", "custom_jvp"])
def test_solver_output_used_nonlinearly_has_second_and_third_reverse_derivatives(tmp_path,
                                                                                  fp):
    sol, b = _nonlinear_in_solution(fp), jnp.float32(0.3)
    first = jax.grad(_unrolled)(b)
    second = jax.grad(jax.grad(_unrolled))(b)
    third = jax.grad(jax.grad(jax.grad(_unrolled)))(b)
    program = jaxpr_cc.trace(sol, b)
    jaxpr_cc.save(program, tmp_path / "sol.jcc")
    for fn in (jaxpr_cc.jit(sol), program, jaxpr_cc.load(tmp_path / "sol.jcc"),
               _emitted(program, tmp_path, "sol_module")):
        np.testing.assert_allclose(jax.grad(fn)(b), first, rtol=1e-4)
        np.testing.assert_allclose(jax.grad(jax.grad(fn))(b), second, rtol=1e-4)
        np.testing.assert_allclose(jax.hessian(fn)(b), second, rtol=1e-4)
    np.testing.assert_allclose(jaxpr_cc.jit(jax.grad(jax.grad(jax.grad(sol))))(b), third,
                               rtol=1e-3)
    # The gradient program, saved and emitted, differentiates once more.
    gradient = jaxpr_cc.trace(jax.grad(sol), b)
    jaxpr_cc.save(gradient, tmp_path / "grad.jcc")
    for fn in (jaxpr_cc.load(tmp_path / "grad.jcc"), _emitted(gradient, tmp_path, "grad_module")):
        np.testing.assert_allclose(jax.grad(fn)(b), second, rtol=1e-4)


# ------------------------------------------------------- vmapped lineax solve
def _vmapped_solve(rhs):
    import lineax as lx

    def one(b):
        matrix = jnp.array([[2.0, 0.5], [0.5, 3.0]]) * b[0]
        return lx.linear_solve(lx.MatrixLinearOperator(matrix), b).value
    return jax.vmap(one)(rhs)


def test_vmapped_lineax_solve_saves_and_emits(tmp_path):
    """equinox's ``vprim`` (a library primitive under vmap) carries JAX's
    ``no_axis_name`` marker, a bare object(): it is saved and spelled by name, and the
    library primitive it batches by its library's name."""
    rhs = jnp.array([[1.0, 2.0], [3.0, -4.0], [0.5, 0.25]])
    want, want_jac = _vmapped_solve(rhs), jax.jacrev(_vmapped_solve)(rhs)
    program = jaxpr_cc.trace(_vmapped_solve, rhs)
    assert "<no_axis_name>" in str(program)
    jaxpr_cc.save(program, tmp_path / "p.jcc")
    loaded = jaxpr_cc.load(tmp_path / "p.jcc")
    assert str(loaded) == str(program)
    path = tmp_path / "solve_module.py"
    path.write_text(jaxpr_cc.emit_python(program))
    spec = importlib.util.spec_from_file_location("solve_module", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for fn in (loaded, jaxpr_cc.compile(loaded), module._vmapped_solve):
        np.testing.assert_allclose(fn(rhs), want, rtol=1e-6)
    for fn in (loaded, module._vmapped_solve):
        np.testing.assert_allclose(jax.jacrev(fn)(rhs), want_jac, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(jax.jacfwd(fn)(rhs), want_jac, rtol=1e-5, atol=1e-7)


# ------------------------- emitted forward_only around a body with a custom_vjp
def test_emitted_gradient_program_through_a_solver_calling_a_custom_vjp(tmp_path):
    """The gradient program of a while-loop solver whose update calls a custom_vjp
    holds ``forward_only`` columns; emitting their jvp met the inner rule batched by
    JAX (a linear_call whose transpose is a JAX thunk) and refused the program."""
    @jax.custom_vjp
    def inner(y):
        return jnp.sin(y)
    inner.defvjp(lambda y: (jnp.sin(y), jnp.cos(y)), lambda c, g: (c * g,))

    def f(k):
        @jax.custom_vjp
        def solve(y0):
            return lax.while_loop(lambda c: c[0] < 5,
                                  lambda c: (c[0] + 1, c[1] - 0.1 * k * inner(c[1])), (0, y0))[1]
        solve.defvjp(lambda y0: (solve(y0), None), lambda _, g: (0.0 * g,))
        return jnp.sum(solve(jnp.linspace(0.5, 1.5, 3)) ** 2)

    def unrolled(k):
        y = jnp.linspace(0.5, 1.5, 3)
        for _ in range(5):
            y = y - 0.1 * k * jnp.sin(y)
        return jnp.sum(y ** 2)

    k = jnp.float32(0.7)
    gradient = jaxpr_cc.trace(jax.grad(f), k)
    path = tmp_path / "grad_module.py"
    path.write_text(jaxpr_cc.emit_python(gradient))
    spec = importlib.util.spec_from_file_location("grad_module", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    np.testing.assert_allclose(module.f(k), jax.grad(unrolled)(k), rtol=1e-5)
    np.testing.assert_allclose(jax.grad(module.f)(k), jax.grad(jax.grad(unrolled))(k), rtol=1e-4)


# ------------------------------------------ the same solver in a scan, int outputs
def _solver_in_scan(fp):
    xs = jnp.array([1.0, 2.0, 0.5])

    def sol(b):
        def body(c, x):
            # The update reads b (loop-invariant) and x (per step): JAX's scan
            # linearization splits a call reading both out of the primal scan.
            z = fp(lambda z: 0.45 * jnp.cos(z) + b * x, 0.0)
            return c + z * z, None
        return lax.scan(body, jnp.float32(0.0), xs)[0]

    def unrolled(b):
        c = jnp.float32(0.0)
        for x in (1.0, 2.0, 0.5):
            z = jnp.float32(0.0)
            for _ in range(200):
                z = 0.45 * jnp.cos(z) + b * x
            c = c + z * z
        return c
    return sol, unrolled


@pytest.mark.parametrize("fp", [_fp_vjp, _fp_jvp], ids=["custom_vjp", "custom_jvp"])
def test_solver_in_a_scan_reading_the_step_has_a_second_reverse_derivative(tmp_path, fp):
    """The primal scan JAX's linearization builds dropped the solver's forward-mode
    rule (partial evaluation inlines a custom_jvp reading a loop-varying value), so
    the second reverse pass met the while_loop.  (An emitted module runs under JAX's
    own partial evaluation, which still drops it: documented in docs/closure.md.)"""
    sol, unrolled = _solver_in_scan(fp)
    b = jnp.float32(0.3)
    program = jaxpr_cc.trace(sol, b)
    jaxpr_cc.save(program, tmp_path / "sol.jcc")
    second = jax.grad(jax.grad(unrolled))(b)
    for fn in (program, jaxpr_cc.jit(sol), jaxpr_cc.load(tmp_path / "sol.jcc")):
        np.testing.assert_allclose(jax.grad(fn)(b), jax.grad(unrolled)(b), rtol=1e-4)
        np.testing.assert_allclose(jax.grad(jax.grad(fn))(b), second, rtol=1e-4)


def _counting_loop(fn, x0):
    def body(c):
        z, zp, i = c
        return fn(z), z, i + 1
    z, _, count = lax.while_loop(lambda c: jnp.abs(c[0] - c[1]) > 1e-7, body,
                                 (x0 + 1.0, x0, 0))
    return z, count


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _counted_vjp(fn, x0):
    return _counting_loop(fn, x0)


_counted_vjp.defvjp(lambda fn, x0: (_counted_vjp(fn, x0), None),
                    lambda fn, _, ct: (jnp.zeros_like(ct[0]),))


@partial(jax.custom_jvp, nondiff_argnums=(0,))
def _counted_jvp(fn, x0):
    return _counting_loop(fn, x0)


@_counted_jvp.defjvp
def _counted_jvp_rule(fn, primals, tangents):
    z, count = _counted_jvp(fn, *primals)
    return (z, count), (jnp.zeros_like(z), np.zeros((), jax.dtypes.float0))


@pytest.mark.parametrize("fp", [_counted_vjp, _counted_jvp], ids=["custom_vjp", "custom_jvp"])
def test_solver_with_an_integer_output_has_a_second_reverse_derivative(tmp_path, fp):
    """An iteration count beside the solution: the solution's forward-mode rule
    covers the inexact outputs only (it was not used at all, so grad(grad) met the
    while_loop)."""
    def sol(b):
        z, count = fp(lambda z: 0.45 * jnp.cos(z) + b, 0.0)
        return z ** 2 + 0.0 * count

    def unrolled(b):
        z = jnp.float32(0.0)
        for _ in range(200):
            z = 0.45 * jnp.cos(z) + b
        return z ** 2
    b = jnp.float32(0.3)
    program = jaxpr_cc.trace(sol, b)
    jaxpr_cc.save(program, tmp_path / "sol.jcc")
    second = jax.grad(jax.grad(unrolled))(b)
    for fn in (program, jaxpr_cc.jit(sol), jaxpr_cc.load(tmp_path / "sol.jcc"),
               _emitted(program, tmp_path, "sol_module")):
        np.testing.assert_allclose(jax.grad(jax.grad(fn))(b), second, rtol=1e-4)
        np.testing.assert_allclose(jax.jacfwd(jax.grad(fn))(b), second, rtol=1e-4)
