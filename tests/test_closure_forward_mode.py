"""Derivatives with respect to closed-over values formed by forward mode.

A rule whose primal runs a ``while_loop`` cannot be reversed, so the derivative with
respect to a value it closes over is formed by forward mode.  References: the same
computation unrolled in plain JAX (reverse mode works there), or closed forms.
"""
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxpr_cc

STEPS = 20


def contraction_solver(a):
    """z <- z/2 + a sin(z), STEPS times, in a while_loop; the rule closes over ``a``."""
    @jax.custom_vjp
    def solve(x):
        def body(c):
            i, z = c
            return i + 1, z * 0.5 + a * jnp.sin(z)
        return lax.while_loop(lambda c: c[0] < STEPS, body, (0, x))[1]

    solve.defvjp(lambda x: (solve(x), None), lambda _, ct: (jnp.zeros_like(ct),))
    return solve


def unrolled(a, x):
    z = x
    for _ in range(STEPS):
        z = z * 0.5 + a * jnp.sin(z)
    return z


def test_complex_closed_over_gradient_keeps_imaginary_part():
    a = jnp.array([0.3 + 0.2j, -0.1 + 0.4j], jnp.complex64)
    x = jnp.array([1.0 + 0.5j, 0.2 - 0.3j], jnp.complex64)

    def loss(solve):
        def f(a, x):
            z = solve(a, x)
            return jnp.real(jnp.sum(z * jnp.conj(z))) + jnp.sum(jnp.imag(z))
        return f

    program = jaxpr_cc.trace(loss(lambda a, x: contraction_solver(a)(x)), a, x)
    want = jax.grad(loss(unrolled))(a, x)
    np.testing.assert_allclose(jax.grad(program)(a, x), want, rtol=2e-4, atol=1e-6)


def test_complex_output_cotangent_pairing():
    a = jnp.array([0.3 + 0.2j, -0.1 + 0.4j], jnp.complex64)
    x = jnp.array([1.0 + 0.5j, 0.2 - 0.3j], jnp.complex64)
    ct = jnp.array([0.7 - 0.2j, 0.1 + 0.9j], jnp.complex64)
    program = jaxpr_cc.trace(lambda a, x: contraction_solver(a)(x), a, x)
    got = jax.vjp(lambda a: program(a, x), a)[1](ct)[0]
    want = jax.vjp(lambda a: unrolled(a, x), a)[1](ct)[0]
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=1e-6)


def test_x64_accumulates_in_float64():
    with jax.enable_x64(True):
        a = jnp.array([0.3, 0.123456789], jnp.float64)
        x = jnp.array([1.0, 2.0], jnp.float64)
        loss = lambda a, x: jnp.sum(contraction_solver(a)(x) ** 2)  # noqa: E731
        program = jaxpr_cc.trace(loss, a, x)
        got = jax.grad(program)(a, x)
        want = jax.grad(lambda a, x: jnp.sum(unrolled(a, x) ** 2))(a, x)
        assert got.dtype == jnp.float64
        np.testing.assert_allclose(got, want, rtol=1e-12)


def newton_sqrt(a, x, steps=40):
    """sqrt(a x) by Newton in a while_loop: a custom_jvp whose primal closes over a."""
    @jax.custom_jvp
    def root(y):
        def body(c):
            i, z = c
            return i + 1, 0.5 * (z + y * a / z)
        return lax.while_loop(lambda c: c[0] < steps, body, (0, jnp.ones_like(y)))[1]

    @root.defjvp
    def _(primals, tangents):
        (y,), (ty,) = primals, tangents
        z = root(y)
        return z, ty * a / (2 * z)

    return root(x)


def test_custom_jvp_while_solver_has_reverse_and_second_derivatives():
    a = jnp.array([2.0, 0.5])
    x = jnp.array([1.5, 3.0])
    loss = lambda a, x: jnp.sum(newton_sqrt(a, x) ** 3)  # noqa: E731
    exact = lambda a, x: jnp.sum(jnp.sqrt(x * a) ** 3)  # noqa: E731
    program = jaxpr_cc.trace(loss, a, x)
    for g, w in zip(jax.grad(program, argnums=(0, 1))(a, x), jax.grad(exact, argnums=(0, 1))(a, x)):
        np.testing.assert_allclose(g, w, rtol=1e-5)
    np.testing.assert_allclose(jax.hessian(program)(a, x), jax.hessian(exact)(a, x), rtol=1e-4,
                               atol=1e-6)
    t = (jnp.ones(2), jnp.ones(2))
    np.testing.assert_allclose(jax.jvp(program, (a, x), t)[1], jax.jvp(exact, (a, x), t)[1],
                               rtol=1e-5)


def test_emitted_python_forms_the_same_complex_closed_over_gradient(tmp_path):
    import importlib.util

    a = jnp.array([0.3 + 0.2j, -0.1 + 0.4j], jnp.complex64)
    x = jnp.array([1.0 + 0.5j, 0.2 - 0.3j], jnp.complex64)

    def loss(a, x):
        z = contraction_solver(a)(x)
        return jnp.real(jnp.sum(z * jnp.conj(z))) + jnp.sum(jnp.imag(z))

    program = jaxpr_cc.trace(loss, a, x)
    path = tmp_path / "emitted_loss.py"
    jaxpr_cc.write_python(program, path)
    spec = importlib.util.spec_from_file_location("emitted_loss", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    emitted = getattr(module, program.name)

    def reference(a, x):
        z = unrolled(a, x)
        return jnp.real(jnp.sum(z * jnp.conj(z))) + jnp.sum(jnp.imag(z))

    np.testing.assert_allclose(jax.grad(emitted)(a, x), jax.grad(reference)(a, x),
                               rtol=2e-4, atol=1e-6)
