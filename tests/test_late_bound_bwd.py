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
from jax.custom_derivatives import SymbolicZero

import jaxpr_cc


def _loop_variable_program(apply):
    """A custom_vjp defined in a loop whose bwd reads the loop variable, each
    applied to ``x`` by ``apply(f, x)``."""
    def program(x):
        out = 0.0
        for i in range(3):
            @jax.custom_vjp
            def f(a):
                return a * i

            f.defvjp(lambda a: (f(a), None), lambda r, g: (g * i,))
            out = out + apply(f, x)
        return out
    return program


_loop_variable = _loop_variable_program(lambda f, x: f(x))
_loop_variable_under_vmap = _loop_variable_program(
    lambda f, x: jax.vmap(f)(jnp.stack([x, x])).sum())


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
    np.testing.assert_allclose(jax.grad(module.program)(x), want)


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


# Adversary, stop 33 (second round): the late bwd where it reaches through other
# rules, recursion, a large state, a bwd that raised at the call, and the rule
# cache through a custom function's rules.  References: ``jax.grad`` of each.
LATE = [1.0]
BIG_TABLE = [float(i) for i in range(5000)]  # past the fingerprint's walk limit


@jax.custom_vjp
def _inner(a):
    return a * 2.0


_inner.defvjp(lambda a: (_inner(a), None), lambda r, g: (g * LATE[0],))


@jax.custom_vjp
def _outer(a):
    return a * 3.0


_outer.defvjp(lambda a: (_outer(a), a), lambda r, g: (jax.grad(_inner)(r) * g,))


@jax.custom_vjp
def _big(a):
    return a * BIG_TABLE[1]


_big.defvjp(lambda a: (_big(a), None), lambda r, g: (g * LATE[0] * BIG_TABLE[1],))


def _bwd_ready(r, g):
    if LATE[0] < 3.0:
        raise RuntimeError("bwd used before the program finished setting up")
    return (g * LATE[0],)


@jax.custom_vjp
def _guarded(a):
    return a * 2.0


_guarded.defvjp(lambda a: (_guarded(a), None), _bwd_ready)


@jax.custom_jvp
def _tangent_reads_late(a):
    return a * 2.0


_tangent_reads_late.defjvp(lambda p, t: (_tangent_reads_late(p[0]), t[0] * LATE[0]))


@jax.custom_vjp
def _through_custom_jvp(a):
    return jax.grad(_tangent_reads_late)(a) * a


_through_custom_jvp.defvjp(lambda a: (_through_custom_jvp(a), None),
                           lambda r, g: (jax.grad(_tangent_reads_late)(1.0) * g,))


def _late_program(call, times=(1,)):
    def program(x):
        LATE[0] = 2.0
        y = call(x)
        LATE[0] = 5.0  # rebound after the call: JAX's bwds read 5
        return y
    return program


def _called_twice(x):
    LATE[0] = 2.0
    y = _through_custom_jvp(x)
    LATE[0] = 5.0
    return y + _through_custom_jvp(x)


@pytest.mark.parametrize("name, program, order", [
    ("a bwd taking the grad of another rule", _late_program(_outer), 1),
    ("a state too large to fingerprint", _late_program(_big), 1),
    ("a bwd that raised at the call", _late_program(_guarded), 1),
    ("second order through the fwd's recursive call", _late_program(lambda x: _inner(x) * x), 2),
    ("reuse through a custom_jvp's rule", _called_twice, 1),
])
def test_the_late_bwd_everywhere_jax_reads_it(name, program, order):
    x = np.float32(1.5)

    def derivative(f):
        for _ in range(order):
            f = jax.grad(f)
        return f
    want = derivative(program)(x)
    ours = jaxpr_cc.trace(program, x)
    np.testing.assert_allclose(ours(x), program(x))
    np.testing.assert_allclose(derivative(ours)(x), want)


def test_an_emitted_recursive_rule_with_a_late_bwd(tmp_path):
    """A fwd calling its own function and a late bwd: the emitted module returned
    residual names of another function (NameError)."""
    import importlib.util

    @jax.custom_vjp
    def f(a, c):
        return a * c

    f.defvjp(lambda a, c: (f(a, c), (a, c)),
             lambda r, g: (g * r[1] * LATE[0], g * r[0] * LATE[0]))

    def program(x, c):
        LATE[0] = 2.0
        y = f(x, c)
        LATE[0] = 5.0
        return y

    args = (np.float32(1.5), np.float32(3.0))
    want = jax.grad(program, (0, 1))(*args)
    jaxpr_cc.write_python(jaxpr_cc.trace(program, *args), tmp_path / "late_rec.py")
    spec = importlib.util.spec_from_file_location("late_rec", tmp_path / "late_rec.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    np.testing.assert_allclose(jax.grad(module.program, (0, 1))(*args), want)


@jax.custom_vjp
def _two_outputs(a):
    return a * 2.0, jnp.log(a)


def _two_outputs_bwd(a, cts):
    g1, g2 = cts
    out = g1 * LATE[0]
    # A rule may differ for a symbolic zero (and stay linear).
    return (out + g1 * 1000.0 if isinstance(g2, SymbolicZero) else out + g2 * 100.0,)


_two_outputs.defvjp(lambda a: (_two_outputs(a.value), a.value), _two_outputs_bwd,
                    symbolic_zeros=True)


@jax.custom_vjp
def _perturbed_flag(a, c):
    return a * c


_perturbed_flag.defvjp(
    lambda a, c: (_perturbed_flag(a.value, c.value), (c.value, 1.0 if c.perturbed else 0.0)),
    lambda res, g: (g * res[0] * LATE[0] + 1000.0 * res[1] * g, g * LATE[0]),
    symbolic_zeros=True)


def test_a_symbolic_zeros_rule_keeps_its_patterns_when_its_bwd_is_late():
    """The late bwd of a symbolic-zeros rule is traced for each pattern it had:
    the dropped output's SymbolicZero cotangent, and the fwd of "c not perturbed"
    (without them the main rule ran: 5 for 1005, 1015 for 15; adversary, stop 33).
    References: ``jax.grad``."""
    def drops_second(x):
        LATE[0] = 2.0
        y, _ = _two_outputs(x)
        LATE[0] = 5.0
        return y

    def with_data(x, c):
        LATE[0] = 2.0
        y = _perturbed_flag(x, c)
        LATE[0] = 5.0
        return y

    x, c = np.float32(1.5), np.float32(3.0)
    np.testing.assert_allclose(jax.grad(jaxpr_cc.trace(drops_second, x))(x),
                               jax.grad(drops_second)(x))
    np.testing.assert_allclose(jax.grad(jaxpr_cc.trace(with_data, x, c))(x, c),
                               jax.grad(with_data)(x, c))
