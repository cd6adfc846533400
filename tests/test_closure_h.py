"""Symbolic-zeros rules see JAX's perturbation pattern wherever it is decided late.

A rule defined with ``symbolic_zeros=True`` is handed a ``SymbolicZero`` (or
``perturbed=False``) for every input JAX does not differentiate.  Which inputs
those are is decided when the program is differentiated, so a rule with more than
three perturbable inputs, a rule nested in another rule's body or primal, and a
rule JAX staged under ``vmap`` are traced for a pattern when JAX first gives it
(``rules.PatternRules``, docs/closure.md).  The rules here compute ``0 * inf`` (NaN)
when handed a dense zero where JAX gives a symbolic one, or refuse a pattern JAX
never gives, so a rule run for the wrong pattern shows.  References: JAX running
the same function (its gradient where JAX refuses forward mode through a
custom_vjp).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.custom_derivatives import SymbolicZero

import jaxpr_cc
from jaxref import assert_trees_equal

# The last input sits where sqrt's derivative is infinite: a dense zero tangent for
# it gives 0 / 0.
ARGS = tuple(jnp.float32(v) for v in (1.0, 4.0, 9.0, 0.0))


def sqrt_sum_jvp(n):
    """``f(x_1..x_n) = sum k * sqrt(x_k)`` whose rule skips unperturbed inputs."""
    @jax.custom_jvp
    def f(*xs):
        return sum(jnp.sqrt(x) * (k + 1) for k, x in enumerate(xs))

    def f_jvp(primals, tangents):
        out = f(*primals)
        t = jnp.zeros_like(out)
        for k, (x, tx) in enumerate(zip(primals, tangents)):
            if type(tx) is not SymbolicZero:
                t = t + (k + 1) * tx / (2 * jnp.sqrt(x))
        return out, t

    f.defjvp(f_jvp, symbolic_zeros=True)
    return f


def sqrt_sum_vjp(n, refuse_all=False):
    """The same as a custom_vjp whose bwd folds ``1/sqrt(x_k)`` of every perturbed
    input into the first input's cotangent (times 0): a dense rule gives NaN there.
    ``refuse_all``: fwd raises when every input is perturbed (JAX never asks here)."""
    @jax.custom_vjp
    def f(*xs):
        return sum(jnp.sqrt(x) * (k + 1) for k, x in enumerate(xs))

    def fwd(*xs):
        perturbed = tuple(x.perturbed for x in xs)
        if refuse_all and all(perturbed):
            raise ValueError("this rule is never differentiated w.r.t. every input")
        values = tuple(x.value for x in xs)
        return f(*values), (values, perturbed)

    def bwd(res, ct):
        xs, perturbed = res
        guard = ct * sum(0.0 * (1.0 / jnp.sqrt(x)) for x, p in zip(xs, perturbed) if p)
        return tuple((k + 1) * ct / (2 * jnp.sqrt(x)) + (guard if k == 0 else 0.0) if p else None
                     for k, (x, p) in enumerate(zip(xs, perturbed)))

    f.defvjp(fwd, bwd, symbolic_zeros=True)
    return f


def _candidates(fun, *args):
    program = jaxpr_cc.trace(fun, *args)
    return {"jit": jaxpr_cc.jit(fun),
            "pipeline": jaxpr_cc.run_passes(program, jaxpr_cc.DEFAULT_PIPELINE)}


def _check(name, got, want):
    try:
        assert_trees_equal(got, want, exact=False, rtol=1e-5, atol=1e-6)
    except AssertionError as e:
        raise AssertionError(f"{name}: {e}") from None


def _compare(fun, derivatives, *args):
    want = derivatives(fun)
    assert all(np.all(np.isfinite(np.asarray(v))) for v in jax.tree.leaves(want)), want
    for name, candidate in _candidates(fun, *args).items():
        _check(name, derivatives(candidate), want)


# ---------------------------------------------------------------- many inputs
def test_jvp_rule_with_four_inputs():
    f = sqrt_sum_jvp(4)

    def program(a, b, c, d):
        return f(a, b, c, d) * 2.0

    def derivatives(g):
        a, b, c, d = ARGS
        return {"jvp a": jax.jvp(lambda a: g(a, b, c, d), (a,), (jnp.float32(1.0),)),
                "jvp b,c": jax.jvp(lambda b, c: g(a, b, c, d), (b, c),
                                   (jnp.float32(1.0), jnp.float32(-2.0))),
                "grad a,b": jax.grad(g, (0, 1))(*ARGS),
                "jacfwd a": jax.jacfwd(g)(*ARGS),
                "vmap jvp a": jax.vmap(lambda a: jax.jvp(lambda a: g(a, b, c, d), (a,),
                                                         (jnp.float32(1.0),))[1])(
                    jnp.array([1.0, 2.0], jnp.float32)),
                "hessian a": jax.jacfwd(jax.grad(g))(*ARGS),
                "jvp of grad a,b": jax.jvp(lambda a: jax.grad(g, 1)(a, b, c, d), (a,),
                                           (jnp.float32(1.0),))}
    _compare(program, derivatives, *ARGS)


def test_vjp_rule_with_four_inputs():
    f = sqrt_sum_vjp(4)

    def program(a, b, c, d):
        return f(a, b, c, d) * 2.0

    def derivatives(g, jax_reference=False):
        a, b, c, d = ARGS
        out = {"grad a": jax.grad(g)(*ARGS), "grad a,b,c": jax.grad(g, (0, 1, 2))(*ARGS),
               "vmap grad a": jax.vmap(jax.grad(g), (0, None, None, None))(
                   jnp.array([1.0, 2.0], jnp.float32), b, c, d),
               "grad grad a": jax.grad(jax.grad(g))(*ARGS)}
        # JAX has no forward mode through a custom_vjp: its gradient is the reference.
        out["jvp a"] = out["grad a"] if jax_reference else \
            jax.jvp(lambda a: g(a, b, c, d), (a,), (jnp.float32(1.0),))[1]
        return out

    want = derivatives(program, jax_reference=True)
    for name, candidate in _candidates(program, *ARGS).items():
        _check(name, derivatives(candidate), want)


def test_vjp_rule_refusing_the_all_perturbed_pattern():
    f = sqrt_sum_vjp(4, refuse_all=True)

    def program(a, b, c, d):
        return f(a, b, c, d)

    def derivatives(g):
        return {"grad a": jax.grad(g)(*ARGS), "grad b,c": jax.grad(g, (1, 2))(*ARGS)}
    _compare(program, derivatives, *ARGS)
    with pytest.raises(Exception, match="never differentiated w.r.t. every input"):
        jax.grad(jaxpr_cc.jit(program), (0, 1, 2, 3))(*ARGS)


def test_staged_jvp_rule_with_four_inputs_under_vmap():
    """JAX stages a custom_jvp called under vmap itself; the closure-convert pass
    materializes it, with its patterns made when first given."""
    f = sqrt_sum_jvp(4)

    def program(a, b, c, d):
        return jnp.sum(jax.vmap(f, in_axes=(0, None, None, None))(a, b, c, d))

    a = jnp.array([1.0, 2.0], jnp.float32)
    _, b, c, d = ARGS

    def derivatives(g):
        return {"jvp a": jax.jvp(lambda a: g(a, b, c, d), (a,), (jnp.ones_like(a),)),
                "grad a": jax.grad(g)(a, b, c, d)}
    _compare(program, derivatives, a, b, c, d)


# ---------------------------------------------------------------------- nested
def test_jvp_rule_nested_in_a_custom_vjp_bwd():
    inner = sqrt_sum_jvp(2)

    @jax.custom_vjp
    def g(a, b):
        return a * b

    def g_fwd(a, b):
        return a * b, (a, b)

    def g_bwd(res, ct):
        a, b = res
        return ct * inner(a, b), ct * a

    g.defvjp(g_fwd, g_bwd)

    def program(a, b):
        return g(a, b) * 3.0

    def derivatives(h):
        return {"jvp of grad": jax.jvp(lambda a: jax.grad(h)(a, jnp.float32(0.0)),
                                       (jnp.float32(1.0),), (jnp.float32(1.0),)),
                "grad grad": jax.grad(jax.grad(h))(jnp.float32(1.0), jnp.float32(0.0))}
    _compare(program, derivatives, jnp.float32(1.0), jnp.float32(0.0))


def test_vjp_rule_nested_in_a_custom_vjp_bwd():
    inner = sqrt_sum_vjp(2)

    @jax.custom_vjp
    def g(a, b):
        return a * b

    def g_fwd(a, b):
        return a * b, (a, b)

    def g_bwd(res, ct):
        a, b = res
        return ct * inner(a, b), ct * a

    g.defvjp(g_fwd, g_bwd)

    def program(a, b):
        return g(a, b) * 3.0

    def derivatives(h):
        return {"grad grad": jax.grad(jax.grad(h))(jnp.float32(1.0), jnp.float32(0.0)),
                "vmap grad grad": jax.vmap(jax.grad(jax.grad(h)), (0, None))(
                    jnp.array([1.0, 4.0], jnp.float32), jnp.float32(0.0))}
    _compare(program, derivatives, jnp.float32(1.0), jnp.float32(0.0))


def test_jvp_rule_nested_in_a_custom_vjp_fwd():
    """The inner rule is in the outer custom_vjp's fwd: forward-over-reverse
    differentiates that fwd with only ``a`` perturbed.  (Its primal calls another
    function, so that the fwd's call is not a call made outside any rule.)"""
    inner = sqrt_sum_jvp(2)

    @jax.custom_vjp
    def g(a, b):
        return jnp.sqrt(a) + 2.0 * jnp.sqrt(b)

    def g_fwd(a, b):
        return inner(a, b), (a, b)

    def g_bwd(res, ct):
        a, b = res
        return ct * 0.5 / jnp.sqrt(a), ct * jnp.where(b > 0, 1.0 / jnp.sqrt(b), 0.0)

    g.defvjp(g_fwd, g_bwd)

    def program(a, b):
        return g(a, b) * g(a, b)

    def derivatives(h):
        return {"jvp of grad": jax.jvp(lambda a: jax.grad(h)(a, jnp.float32(0.0)),
                                       (jnp.float32(1.0),), (jnp.float32(1.0),))}
    _compare(program, derivatives, jnp.float32(1.0), jnp.float32(0.0))


def test_jvp_rule_nested_in_a_custom_jvp_rule():
    """A symbolic-zeros outer rule passes its symbolic zeros on to the inner one."""
    inner = sqrt_sum_jvp(2)

    @jax.custom_jvp
    def outer(a, b):
        return inner(a, b)

    def outer_jvp(primals, tangents):
        hot = [k for k, t in enumerate(tangents) if type(t) is not SymbolicZero]

        def along(*values):
            args = list(primals)
            for k, v in zip(hot, values):
                args[k] = v
            return inner(*args)
        y, t = jax.jvp(along, tuple(primals[k] for k in hot), tuple(tangents[k] for k in hot))
        return y, 2.0 * t

    outer.defjvp(outer_jvp, symbolic_zeros=True)

    def program(a, b, c):
        return outer(a, b) + outer(b, c)

    args = (jnp.float32(1.0), jnp.float32(0.0), jnp.float32(4.0))

    def derivatives(h):
        return {"jvp a": jax.jvp(lambda a: h(a, *args[1:]), (args[0],), (jnp.float32(1.0),)),
                "grad a,c": jax.grad(h, (0, 2))(*args)}
    _compare(program, derivatives, *args)


# ------------------------------------------------------------------- reuse
def test_rule_reading_a_cell_rebound_after_the_call_runs_its_main_rule():
    """A pattern traced when JAX gives it would read a cell the program rebound after
    the call: the main rule (traced at the call) runs instead, which here equals JAX
    since this rule does not depend on which inputs are perturbed."""
    cell = [1.0]

    @jax.custom_jvp
    def f(a, b, c, d):
        return (a + b + c + d) * cell[0]

    def f_jvp(primals, tangents):
        dense = [jnp.zeros_like(p) if type(t) is SymbolicZero else t
                 for p, t in zip(primals, tangents)]
        return f(*primals), sum(dense) * cell[0]

    f.defjvp(f_jvp, symbolic_zeros=True)

    def program(a, b, c, d):
        cell[0] = 2.0
        first = f(a, b, c, d)
        cell[0] = 5.0
        return first + f(d, c, b, a)

    args = tuple(jnp.float32(v) for v in (1.0, 2.0, 3.0, 4.0))

    def derivatives(h):
        return {"jvp a": jax.jvp(lambda a: h(a, *args[1:]), (args[0],), (jnp.float32(1.0),)),
                "grad": jax.grad(h, (0, 1, 2, 3))(*args)}
    _compare(program, derivatives, *args)


# ------------------------------------------------ emit after explicit vjp-to-jvp
def _two_output_rule():
    """A custom_vjp of two outputs whose bwd scales the second output's term by 3
    when the first output's cotangent is a symbolic zero (its output unused)."""
    @jax.custom_vjp
    def f(a, b):
        return jnp.sin(a) * b, a * b

    def fwd(a, b):
        return f(a.value, b.value), (a.value, b.value)

    def bwd(res, cts):
        a, b = res
        c1, c2 = cts
        ga, gb = jnp.zeros_like(a), jnp.zeros_like(b)
        if type(c1) is not SymbolicZero:
            ga, gb = ga + jnp.cos(a) * b * c1, gb + jnp.sin(a) * c1
        k = 3.0 if type(c1) is SymbolicZero else 1.0
        if type(c2) is not SymbolicZero:
            ga, gb = ga + k * b * c2, gb + a * c2
        return ga, gb

    f.defvjp(fwd, bwd, symbolic_zeros=True)
    return f


_EMIT_CHECK = """
import importlib.util, json, sys
import jax, jax.numpy as jnp
spec = importlib.util.spec_from_file_location("emitted_module", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
assert "jaxpr_cc" not in sys.modules
fn = getattr(module, sys.argv[2])
a, b = jnp.float32(0.3), jnp.float32(1.5)
print(json.dumps({"grad": [float(v) for v in jax.grad(fn, (0, 1))(a, b)],
                  "jvp": float(jax.jvp(lambda a: fn(a, b), (a,), (jnp.float32(1.0),))[1])}))
"""


@pytest.mark.parametrize("which", [0, 1, 2], ids=["both outputs", "first", "second"])
def test_emitted_module_after_vjp_to_jvp_picks_the_cotangent_pattern(which, tmp_path):
    import json
    import subprocess
    import sys
    f = _two_output_rule()

    def program(a, b):
        y1, y2 = f(a, b)
        return (y1 * 2.0 + y2, y1, y2)[which]

    a, b = jnp.float32(0.3), jnp.float32(1.5)
    rewritten = jaxpr_cc.run_passes(jaxpr_cc.trace(program, a, b), "vjp-to-jvp")
    path = tmp_path / "emitted_program.py"
    jaxpr_cc.write_python(rewritten, path)
    # Run where jaxpr-cc is not imported: the module's own helper picks the transpose.
    done = subprocess.run([sys.executable, "-c", _EMIT_CHECK, str(path), rewritten.name],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    want_grad = [float(v) for v in jax.grad(program, (0, 1))(a, b)]
    np.testing.assert_allclose(got["grad"], want_grad, rtol=1e-5)
    np.testing.assert_allclose([float(v) for v in jax.grad(rewritten, (0, 1))(a, b)], want_grad,
                               rtol=1e-5)
    # Forward mode runs the transpose of bwd with every cotangent present, as the
    # Program does (JAX has no forward mode through a custom_vjp to compare with).
    np.testing.assert_allclose(
        got["jvp"], float(jax.jvp(lambda a: rewritten(a, b), (a,), (jnp.float32(1.0),))[1]),
        rtol=1e-5)


_WEIGHTS = np.array([1.0, 2.0, 3.0, 4.0], np.float32)


@pytest.mark.parametrize("kind", ["jvp", "vjp"])
def test_pattern_reading_an_array_the_main_rule_does_not(kind):
    """Only the pattern with ``d`` unperturbed reads ``_WEIGHTS`` (an array, so a
    constant of the body rather than a literal): it is a constant of the body made
    for that pattern."""
    if kind == "jvp":
        @jax.custom_jvp
        def f(a, b, c, d):
            return a * b * c * d

        def f_jvp(primals, tangents):
            a, b, c, d = primals
            dense = [jnp.zeros_like(p) if type(t) is SymbolicZero else t
                     for p, t in zip(primals, tangents)]
            t = dense[0] * b * c * d + a * dense[1] * c * d + a * b * dense[2] * d \
                + a * b * c * dense[3]
            if type(tangents[3]) is SymbolicZero:
                t = t * jnp.sum(jnp.asarray(_WEIGHTS))
            return f(*primals), t
        f.defjvp(f_jvp, symbolic_zeros=True)
    else:
        @jax.custom_vjp
        def f(a, b, c, d):
            return a * b * c * d

        def fwd(*xs):
            values = tuple(x.value for x in xs)
            return f(*values), (values, xs[3].perturbed)

        def bwd(res, ct):
            (a, b, c, d), d_perturbed = res
            scale = 1.0 if d_perturbed else jnp.sum(jnp.asarray(_WEIGHTS))
            return (ct * b * c * d * scale, ct * a * c * d * scale, ct * a * b * d * scale,
                    ct * a * b * c)
        f.defvjp(fwd, bwd, symbolic_zeros=True)

    def program(a, b, c, d):
        return f(a, b, c, d)

    args = tuple(jnp.float32(v) for v in (1.0, 2.0, 3.0, 4.0))

    def derivatives(h):
        out = {"grad a,b": jax.grad(h, (0, 1))(*args), "grad": jax.grad(h, (0, 1, 2, 3))(*args)}
        if kind == "jvp":
            out["jvp a"] = jax.jvp(lambda a: h(a, *args[1:]), (args[0],), (jnp.float32(1.0),))
        return out
    if kind == "jvp":
        _compare(program, derivatives, *args)
        return
    # A custom_vjp's bwd is transposed for forward mode (vjp-to-jvp, which jaxpr_cc.jit
    # runs), which needs every value it reads as an input: refused in one line.
    with pytest.raises(Exception, match="does not read otherwise; pass that value"):
        jax.grad(jaxpr_cc.jit(program), (0, 1))(*args)
    # Kept as a custom_vjp (the program's jaxpr), the pattern's rule holds the array.
    closed = jaxpr_cc.trace(program, *args).to_jaxpr()
    from jaxpr_cc.jax_adapter import eval_jaxpr

    def as_jaxpr(*xs):
        return eval_jaxpr(closed.jaxpr, closed.consts, *xs)[0]
    _check("as jaxpr", derivatives(as_jaxpr), derivatives(program))
