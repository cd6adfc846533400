"""emit_python(forward_mode=True): the module is emitted from the program a
differentiated Program call evaluates, so forward mode goes through custom_vjp
rules whose bwd is linear (checked against JAX's jacrev and float64 finite
differences), reverse mode runs the user's bwd (checked against JAX's grad), and a
reverse-only rule refuses forward mode with the Program's message.  These modules
run in this process, which has imported jaxpr_cc (see the python_source docstring)."""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxpr_cc


def _emit(program, tmp_path, **options):
    path = tmp_path / f"{program.name}.py"
    jaxpr_cc.write_python(program, path, **options)
    import importlib.util
    spec = importlib.util.spec_from_file_location(f"fm_{program.name}_{len(options)}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, program.name)


@jax.custom_vjp
def cube(x):
    return x ** 3


cube.defvjp(lambda x: (x ** 3, x), lambda x, g: (3.0 * x ** 2 * g,))


def uses_cube(x, w):
    return jnp.sum(jnp.sin(cube(x * w)))


def test_forward_mode_through_a_linear_bwd(tmp_path):
    x = jnp.array([0.3, -0.7, 1.1], jnp.float32)
    w = jnp.float32(0.9)
    program = jaxpr_cc.trace(uses_cube, x, w)
    fn = _emit(program, tmp_path, forward_mode=True)
    # grad equals JAX's grad of the original (the user's bwd runs).
    np.testing.assert_allclose(jax.grad(fn, argnums=(0, 1))(x, w)[0],
                               jax.grad(uses_cube, argnums=(0, 1))(x, w)[0], rtol=1e-6)
    # jacfwd equals JAX's jacrev of the original, and the Program's jacfwd.
    want = jax.jacrev(uses_cube)(x, w)
    np.testing.assert_allclose(jax.jacfwd(fn)(x, w), want, rtol=1e-5)
    np.testing.assert_allclose(jax.jacfwd(fn)(x, w), jax.jacfwd(program)(x, w), rtol=1e-6)
    # Hessian (forward over reverse) equals JAX's reverse-over-reverse one.
    np.testing.assert_allclose(jax.hessian(fn)(x, w), jax.jacrev(jax.jacrev(uses_cube))(x, w),
                               rtol=1e-4, atol=1e-5)


def test_off_by_default_and_off_gives_jax_error(tmp_path):
    x = jnp.array([0.3, -0.7], jnp.float32)
    program = jaxpr_cc.trace(uses_cube, x, jnp.float32(0.9))
    assert "custom_vjp" in jaxpr_cc.emit_python(program)
    assert jaxpr_cc.emit_python(program) == jaxpr_cc.emit_python(program, forward_mode=False)
    fn = _emit(program, tmp_path)
    with pytest.raises(TypeError, match="can't apply forward-mode autodiff"):
        jax.jvp(lambda x: fn(x, jnp.float32(0.9)), (x,), (x,))
    with pytest.raises(TypeError, match="forward_mode must be True or False"):
        jaxpr_cc.emit_python(program, forward_mode="yes")


@jax.custom_vjp
def clip_gradient(x):
    return x


clip_gradient.defvjp(lambda x: (x, None), lambda _, g: (jnp.clip(g, -1.0, 1.0),))


def clipped(x):
    return jnp.sum(clip_gradient(3.0 * x) ** 2)


def test_reverse_only_rule_refuses_forward_mode_like_the_program(tmp_path):
    x = jnp.array([0.1, 2.0], jnp.float32)
    program = jaxpr_cc.trace(clipped, x)
    fn = _emit(program, tmp_path, forward_mode=True)
    source = (tmp_path / f"{program.name}.py").read_text()
    # The refusal is defined in the module; jaxpr_cc is only imported (for its rules).
    imports = [line for line in source.splitlines() if "jaxpr_cc" in line
               and "jaxpr_cc_forward_mode_refused" not in line]
    assert imports == ["import jaxpr_cc.passes.vjp_to_jvp  # noqa: F401"]
    np.testing.assert_array_equal(jax.grad(fn)(x), jax.grad(clipped)(x))
    messages = []
    for g in (program, fn):
        with pytest.raises(TypeError) as info:
            jax.jvp(g, (x,), (x,))
        messages.append(str(info.value))
    assert "reverse-only rule" in messages[0] and "clip_gradient" in messages[0]
    assert messages[0] == messages[1]


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def fixed_point(f, a, x0):
    return lax.while_loop(lambda c: jnp.max(jnp.abs(c[0] - c[1])) > 1e-12,
                          lambda c: (c[1], f(a, c[1])), (x0, f(a, x0)))[1]


def _fp_fwd(f, a, x0):
    x = fixed_point(f, a, x0)
    return x, (a, x)


def _fp_bwd(f, res, g):
    a, x = res
    _, vjp_a = jax.vjp(lambda a: f(a, x), a)
    _, vjp_x = jax.vjp(lambda x: f(a, x), x)
    w = lax.while_loop(lambda c: jnp.max(jnp.abs(c[0] - c[1])) > 1e-12,
                       lambda c: (c[1], g + vjp_x(c[1])[0]), (g, g + vjp_x(g)[0]))[1]
    return vjp_a(w)[0], jnp.zeros_like(x)


fixed_point.defvjp(_fp_fwd, _fp_bwd)


def solve(a, b):
    x = fixed_point(lambda a, x: jnp.tanh(0.5 * x + a + b), a, jnp.zeros_like(a))
    return jnp.sum(x ** 2)


@pytest.mark.heavy  # the rewritten fixed point takes ~20 s to emit
def test_fixed_point_closing_over_b(tmp_path):
    """The adversary's program: jvp w.r.t. b, which the update closes over."""
    with jax.enable_x64(True):
        a = jnp.array([0.1, -0.4, 0.7])
        b = jnp.float64(0.3)
        program = jaxpr_cc.trace(solve, a, b)
        fn = _emit(program, tmp_path, forward_mode=True)
        fd_b = (solve(a, b + 1e-6) - solve(a, b - 1e-6)) / 2e-6
        hess_fd = (jax.grad(program, argnums=1)(a, b + 1e-5)
                   - jax.grad(program, argnums=1)(a, b - 1e-5)) / 2e-5
        t_b = jax.jvp(lambda b_: fn(a, b_), (b,), (1.0,))[1]
        np.testing.assert_allclose(t_b, fd_b, rtol=1e-6)
        np.testing.assert_allclose(t_b, jax.jvp(lambda b_: program(a, b_), (b,), (1.0,))[1],
                                   rtol=1e-12)
        np.testing.assert_allclose(jax.grad(fn, argnums=1)(a, b), fd_b, rtol=1e-6)
        fd_a = np.array([(solve(a + e, b) - solve(a - e, b)) / 2e-6
                         for e in 1e-6 * np.eye(3)])
        np.testing.assert_allclose(jax.jacfwd(fn)(a, b), fd_a, rtol=1e-6)
        np.testing.assert_allclose(jax.hessian(fn, argnums=1)(a, b), hess_fd, rtol=1e-5)


def test_a_fresh_process_differentiates_the_module(tmp_path):
    """The module imports jaxpr_cc itself (its linear_call rules): in a process that
    never imported it, grad and jacfwd still equal JAX's grad and jacrev."""
    import json
    import os
    import subprocess
    import sys
    x = jnp.array([0.3, -0.7, 1.1], jnp.float32)
    w = jnp.float32(0.9)
    path = tmp_path / "uses_cube_fm.py"
    jaxpr_cc.write_python(jaxpr_cc.trace(uses_cube, x, w), path, forward_mode=True)
    script = (
        "import importlib.util, json, sys\n"
        "import jax, jax.numpy as jnp\n"
        f"spec = importlib.util.spec_from_file_location('m', {str(path)!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "x = jnp.array([0.3, -0.7, 1.1], jnp.float32); w = jnp.float32(0.9)\n"
        "print(json.dumps({'grad': jax.grad(m.uses_cube)(x, w).tolist(),\n"
        "                  'jacfwd': jax.jacfwd(m.uses_cube)(x, w).tolist()}))\n")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"}, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(got["grad"], jax.grad(uses_cube)(x, w), rtol=1e-6)
    np.testing.assert_allclose(got["jacfwd"], jax.jacrev(uses_cube)(x, w), rtol=1e-5)


@jax.custom_vjp
def _sine_and_product(x, y):
    return jnp.sin(x) * y, x * y


def _sine_and_product_bwd(res, cts):
    x, y = res
    c1, c2 = (jnp.zeros_like(x) if isinstance(c, jax.custom_derivatives.SymbolicZero) else c
              for c in cts)
    return jnp.cos(x) * y * c1 + y * c2, jnp.sin(x) * c1 + x * c2


_sine_and_product.defvjp(lambda x, y: (_sine_and_product(x.value, y.value), (x.value, y.value)),
                         _sine_and_product_bwd, symbolic_zeros=True)


def test_two_calls_of_one_symbolic_zeros_rule(tmp_path):
    # The two calls share one jvp rule region: completing its patterns met the
    # linear_call inside twice (KeyError: 'pattern_rules').
    def f(x, y):
        return _sine_and_product(x, y)[0] * _sine_and_product(x, y)[1]
    args = (jnp.float32(0.7), jnp.float32(1.3))
    emitted = _emit(jaxpr_cc.trace(f, *args), tmp_path, forward_mode=True)
    want = jax.grad(f, (0, 1))(*args)
    for got in (jax.jacfwd(emitted, (0, 1))(*args), jax.grad(emitted, (0, 1))(*args)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5)


@jax.custom_vjp
def _sin_times(a, b):
    return jnp.sin(a) * b


def _sin_times_fwd(a, b):
    return _sin_times(a, b), (a, b)  # the fwd calls its own function


_sin_times.defvjp(_sin_times_fwd,
                  lambda res, g: (jnp.cos(res[0]) * res[1] * g, jnp.sin(res[0]) * g))


def test_an_explicit_rewrite_of_a_rule_whose_fwd_calls_itself_emits_forward_mode(tmp_path):
    """After ``vjp-to-jvp`` the jvp runs the fwd for the primal; the fwd's call of
    its own function was left a custom_vjp in the new rule's body, so the module
    emitted without ``forward_mode`` (the pass already ran) refused ``jax.hessian``
    (adversary, stop 30)."""
    def f(x, y):
        return jnp.sum(_sin_times(x, y) ** 2)
    x, y = jnp.array([0.3, 1.0]), jnp.array([0.2, -0.4])
    rewritten = jaxpr_cc.run_passes(jaxpr_cc.trace(f, x, y), "vjp-to-jvp")
    assert not any(eqn.prim.name == "custom_vjp_call" for _, eqn in rewritten.body.walk())
    fn = _emit(rewritten, tmp_path)
    np.testing.assert_allclose(jax.hessian(fn)(x, y), jax.jacrev(jax.grad(f))(x, y),
                               rtol=1e-5, atol=1e-6)
