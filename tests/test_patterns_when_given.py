"""Perturbation patterns traced when JAX first gives them.

``jaxpr_cc.jit`` traces a symbolic-zeros rule for its main pattern only (a diffrax
adjoint's bwd is a whole solve: each pattern traced up front cost seconds); every
other pattern is traced when JAX gives it, and a saved program still lists them
all.  A body traced that late must hold the custom functions it calls first-order,
with forward mode, like the bodies traced with the program.  Checked against JAX
and against analytic derivatives where JAX refuses forward mode.
"""
import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.custom_derivatives import SymbolicZero

import jaxpr_cc

X = jnp.array([0.3, -0.7, 1.1], jnp.float32)


# --------------------------------------------- a bwd that depends on the pattern
def _h_with_log(bwd_calls):
    @jax.custom_vjp
    def h(x):
        return jnp.sin(x), jnp.cos(x), x * x

    def h_fwd(x):
        return h(x.value), x.value

    def h_bwd(x, cts):
        if bwd_calls is not _UNLOGGED:
            bwd_calls.append(tuple(type(c) is SymbolicZero for c in cts))
        a, b, c = cts
        out = jnp.zeros_like(x)
        if type(a) is not SymbolicZero:
            out = out + a * jnp.cos(x)
        if type(b) is not SymbolicZero:
            out = out - b * jnp.sin(x)
        # JAX's gradient shows which cotangents it gave as symbolic zeros.
        out = out + (2 * c * x if type(c) is not SymbolicZero else 100.0)
        return (out,)

    h.defvjp(h_fwd, h_bwd, symbolic_zeros=True)
    return h


def _losses(h):
    return {
        "all": lambda x: sum(jnp.sum(o) for o in h(x)),
        "first": lambda x: jnp.sum(h(x)[0]),
        "first_two": lambda x: jnp.sum(h(x)[0] * h(x)[1]),
    }


def _three_outputs(bwd_calls=None):
    return _h_with_log(bwd_calls if bwd_calls is not None else _UNLOGGED)


_UNLOGGED: list = []  # never appended to: a rule whose closure changes after the
# call is traced late only with its main pattern (session._unchanged_since_call)


def test_a_jit_primal_call_traces_no_pattern_up_front():
    calls: list = []
    loss = jaxpr_cc.jit(_losses(_three_outputs(calls))["first"])
    np.testing.assert_allclose(loss(X), _losses(_three_outputs())["first"](X), rtol=1e-6)
    assert set(calls) <= {(False, False, False)}  # the main pattern only


@pytest.mark.parametrize("which", ["all", "first", "first_two"])
def test_jit_gradients_follow_the_pattern_jax_gives(which):
    want = jax.grad(_losses(_three_outputs())[which])(X)
    loss = jaxpr_cc.jit(_losses(_three_outputs())[which])
    np.testing.assert_allclose(loss(X), _losses(_three_outputs())[which](X), rtol=1e-6)
    np.testing.assert_allclose(jax.grad(loss)(X), want, rtol=1e-6)


def test_a_saved_jit_program_lists_the_patterns_traced_late(tmp_path):
    loss = _losses(_three_outputs())["first"]
    program = jaxpr_cc.jit(loss).program(X)
    path = tmp_path / "p.jaxprcc"
    jaxpr_cc.save(program, path)
    loaded = jaxpr_cc.load(path)
    np.testing.assert_allclose(jax.grad(loaded)(X), jax.grad(loss)(X), rtol=1e-6)


# ------------------ a fwd that calls its own function, for a pattern traced late
@jax.custom_vjp
def scaled(x, s, a, b):
    return jnp.sin(x) * s * a * b


def _scaled_fwd(x, s, a, b):
    assert not s.perturbed  # only ever differentiated with s fixed
    return scaled(x.value, s.value, a.value, b.value), (x.value, s.value, a.value, b.value)


def _scaled_bwd(res, ct):
    x, s, a, b = res
    return (jnp.cos(x) * s * a * b * ct, jnp.zeros_like(s),
            jnp.sum(jnp.sin(x) * s * b * ct), jnp.sum(jnp.sin(x) * s * a * ct))


scaled.defvjp(_scaled_fwd, _scaled_bwd, symbolic_zeros=True)

S, A, B = jnp.float32(1.5), jnp.float32(0.8), jnp.float32(1.2)


def _scaled_loss(x, s, a, b):
    return jnp.sum(scaled(x, s, a, b) ** 2)


def _analytic_hessian(x):
    # d2/dx2 of sum((k sin x)^2) = diag(2 k^2 cos 2x), k = s a b
    k = S * A * B
    return np.diag(np.asarray(2 * k * k * jnp.cos(2 * x)))


@pytest.mark.parametrize("entry", ["jit", "trace"])
def test_hessian_through_a_fwd_pattern_traced_late(entry):
    # Four perturbable inputs: more than the patterns traced up front, so the
    # pattern "only x perturbed" is traced when JAX gives it, and the fwd traced
    # then calls ``scaled`` itself, which forward mode must see as a custom_jvp.
    with pytest.raises(TypeError, match="custom_vjp"):
        jax.hessian(_scaled_loss)(X, S, A, B)  # JAX refuses forward mode
    fn = (jaxpr_cc.jit(_scaled_loss) if entry == "jit"
          else jaxpr_cc.trace(_scaled_loss, X, S, A, B))
    np.testing.assert_allclose(jax.grad(fn)(X, S, A, B), jax.grad(_scaled_loss)(X, S, A, B),
                               rtol=1e-6)
    np.testing.assert_allclose(jax.hessian(fn)(X, S, A, B), _analytic_hessian(X),
                               rtol=1e-4, atol=1e-4)


# ------------------------------ adv29b: late bodies in emitted and jitted programs
def _marked_pair():
    @jax.custom_vjp
    def pair(x, y):
        return jnp.sin(x) * y, x * y

    def fwd(x, y):
        flags = jnp.array([float(x.perturbed), float(y.perturbed)])  # a constant of fwd
        return pair(x.value, y.value), (x.value, y.value, flags)

    def bwd(res, cts):
        x, y, flags = res
        a, b = cts
        za, zb = type(a) is SymbolicZero, type(b) is SymbolicZero
        a = 0.0 if za else a
        b = 0.0 if zb else b
        # JAX's gradient shows that the second cotangent was a symbolic zero.
        return (jnp.cos(x) * y * a + y * b + (5.0 if zb else 0.0) * flags[0],
                jnp.sin(x) * a + x * b)

    pair.defvjp(fwd, bwd, symbolic_zeros=True)
    return pair


def _first_output(x, y):
    return _marked_pair()(x, y)[0]


XS, YS = jnp.float32(0.3), jnp.float32(1.2)


@pytest.mark.parametrize("argnums", [0, 1, (0, 1)])
def test_a_fwd_constant_made_from_the_pattern_is_kept(argnums):
    want = jax.grad(_first_output, argnums=argnums)(XS, YS)
    got = jax.grad(jaxpr_cc.jit(_first_output), argnums=argnums)(XS, YS)
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("entry", ["jit", "trace"])
def test_an_emitted_forward_mode_module_runs_the_patterns_traced_late(entry, tmp_path):
    program = (jaxpr_cc.jit(_first_output).program(XS, YS) if entry == "jit"
               else jaxpr_cc.trace(_first_output, XS, YS))
    path = tmp_path / "late.py"
    jaxpr_cc.write_python(program, path, forward_mode=True)
    spec = importlib.util.spec_from_file_location("late_emitted", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    emitted = getattr(module, program.name)
    np.testing.assert_allclose(jax.grad(emitted)(XS, YS), jax.grad(_first_output)(XS, YS),
                               rtol=1e-6)
