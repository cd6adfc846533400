"""A custom_vjp's bwd that reads a variable rebound after the call (adversary,
stop 33).

JAX traces bwd when it differentiates, after the function that called it has
returned, so a bwd reading a loop variable or a name assigned again sees its
final value; jaxpr-cc traced bwd at the call.  References: ``jax.grad`` and
``jax.jit(jax.grad)`` of the same function (both give the late value).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_cc


def _loop_variable(x):
    out = 0.0
    for i in range(3):
        @jax.custom_vjp
        def f(a):
            return a * i

        f.defvjp(lambda a: (f(a), None), lambda r, g: (g * i,))
        out = out + f(x)
    return out


def _global_rebound(x):
    global SCALE
    SCALE = 2.0
    y = _scaled(x)
    SCALE = 5.0
    return y


SCALE = 1.0


@jax.custom_vjp
def _scaled(a):
    return a * SCALE


_scaled.defvjp(lambda a: (a * SCALE, None), lambda r, g: (g * SCALE,))


def _loop_variable_under_vmap(x):
    out = 0.0
    for i in range(3):
        @jax.custom_vjp
        def f(a):
            return a * i

        f.defvjp(lambda a: (f(a), None), lambda r, g: (g * i,))
        out = out + jax.vmap(f)(jnp.stack([x, x])).sum()
    return out


@pytest.mark.parametrize("program", [_loop_variable, _global_rebound, _loop_variable_under_vmap])
def test_bwd_reads_the_value_when_jax_runs_it(program):
    x = np.float32(1.5)
    want = jax.grad(program)(x)
    np.testing.assert_allclose(jax.jit(jax.grad(program))(x), want)
    assert float(want) in (6.0, 5.0, 12.0)  # the late value, not the value at the call
    for ours in (jaxpr_cc.trace(program, x), jaxpr_cc.jit(program)):
        np.testing.assert_allclose(ours(x), program(x))
        np.testing.assert_allclose(jax.grad(ours)(x), want)


def test_a_bwd_reading_a_traced_value_rebound_after_the_call_is_refused():
    """JAX's bwd reads ``s = 3 c``, computed after the call: a first-order rule
    cannot take it, so differentiating raises one line instead of giving the
    value at the call."""
    def program(x, c):
        s = c

        @jax.custom_vjp
        def f(a):
            return a * s

        f.defvjp(lambda a: (f(a), None), lambda r, g: (g * s,))
        y = f(x)
        s = c * 3
        return y

    args = (np.float32(1.5), np.float32(2.0))
    assert float(jax.grad(program)(*args)) == 6.0
    ours = jaxpr_cc.trace(program, *args)
    np.testing.assert_allclose(ours(*args), 3.0)
    with pytest.raises(Exception, match="rebound after the call to a traced value"):
        jax.grad(ours)(*args)


def test_the_late_bwd_is_what_is_saved_and_emitted(tmp_path):
    import importlib.util
    x = np.float32(1.5)
    want = jax.grad(_loop_variable)(x)
    program = jaxpr_cc.trace(_loop_variable, x)
    jaxpr_cc.save(program, tmp_path / "p.jcc")
    np.testing.assert_allclose(jax.grad(jaxpr_cc.load(tmp_path / "p.jcc"))(x), want)
    jaxpr_cc.write_python(program, tmp_path / "emitted.py")
    spec = importlib.util.spec_from_file_location("emitted_late", tmp_path / "emitted.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    np.testing.assert_allclose(jax.grad(module._loop_variable)(x), want)


STATE = [1.0]


@jax.custom_vjp
def _reads_state(a):
    return a * 2.0


_reads_state.defvjp(lambda a: (_reads_state(a), None), lambda r, g: (g * STATE[0],))


def _scan_body(c, _):
    return _reads_state(c), None


def _branch(a):
    return _reads_state(a)


CACHED_BODIES = {"scan": lambda x: jax.lax.scan(_scan_body, x, None, length=2)[0],
                 "cond": lambda x: jax.lax.cond(x > 0, _branch, _branch, x)}


@pytest.mark.parametrize("kind", sorted(CACHED_BODIES))
def test_a_body_jax_cached_in_one_program_is_not_another_programs(kind):
    """Two programs run a module-level scan body (or cond branches) calling a
    custom_vjp whose bwd reads a global each sets before the call: JAX's cache of
    the body handed the first program's rule to the second (adversary, stop 33).
    Reference: ``jax.grad`` of each program."""
    def program(value):
        def run(x):
            STATE[0] = value
            return CACHED_BODIES[kind](x)
        return run

    x = np.float32(1.5)
    for value in (2.0, 3.0):
        want = jax.grad(program(value))(x)
        np.testing.assert_allclose(jax.grad(jaxpr_cc.trace(program(value), x))(x), want)
