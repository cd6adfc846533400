"""``simplify``: every rule of the table fires (printed IR), inexact rules only
with ``fast-math``, results stay bit-for-bit those of the original program under
``jax.jit`` (special values included), custom rules stay consistent, effects stay."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxpr_cc
from jaxpr_cc.passes.manager import PassManager
from jaxpr_cc.passes.simplify_rules import SIMPLIFY_RULES, rule_names

F32_SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 1.17549435e-38,
                        3.4028235e38, 1.0, -1.0, 2.5], np.float32)
I32_SPECIAL = np.array([0, 1, -1, 2**31 - 1, -2**31, 7, -8, 255], np.int32)
X = jnp.asarray(F32_SPECIAL[:4])
Y = jnp.asarray(F32_SPECIAL[4:8])
I = jnp.asarray(I32_SPECIAL[:4])
J = jnp.asarray(I32_SPECIAL[4:])
B = jnp.asarray([True, False, True, False])
I8 = jnp.asarray([-128, 0, 1, 127], jnp.int8)


def body_text(program) -> str:
    return "\n".join(line for line in str(program).splitlines()
                     if not line.startswith(("func @", "#")))


def simplify(program, **options):
    """``simplify`` then ``dce`` (so forwarded equations' dead producers are gone);
    returns the program and simplify's statistics."""
    opts = " ".join(f"{k.replace('_', '-')}={'true' if v else 'false'}" for k, v in options.items())
    manager = PassManager(f"simplify{{{opts}}},dce" if opts else "simplify,dce")
    out = manager.run(program)
    return out, manager.statistics[0][1]


def bits(a) -> np.ndarray:
    """Bytes of an array, NaNs canonicalized (XLA need not keep a NaN's payload)."""
    a = np.asarray(a)
    if np.issubdtype(a.dtype, np.inexact) or a.dtype.kind == "V":
        a = a.copy()
        nan = np.isnan(a.astype(np.float32) if a.dtype.kind == "V" else a)
        a[nan] = np.nan
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def assert_bitwise(a, b, where=""):
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb, where
    for x, y in zip(la, lb):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and x.shape == y.shape, where
        np.testing.assert_array_equal(bits(x), bits(y), err_msg=f"{where}: {x!r} vs {y!r}")


def check_values(program, fun, *args):
    """The simplified program and the original function, each under its own jit."""
    assert_bitwise(jax.jit(lambda *a: program(*a))(*args), jax.jit(fun)(*args), "values")


def bind(prim, *args, **params):
    return prim.bind(*args, **params)


class Staged:
    """A one-equation program ``prim[params](x)`` built directly in the IR: JAX's
    tracing drops some no-op equations as they are staged, so ``prim.bind`` cannot
    produce them.  ``__call__`` evaluates it the way JAX does (reference values)."""

    def __init__(self, prim, **params):
        self.prim, self.params = prim, params

    def program(self, *args):
        from jaxpr_cc.ir.equation import Equation
        from jaxpr_cc.ir.value import Value
        program = jaxpr_cc.trace(lambda x, *rest: x, *args)
        body = program.body
        x = body.invars[0]
        out = Value(x.aval)
        body.append(Equation(self.prim, [x], [out], dict(self.params)))
        body.set_outvars([out])
        program.verify()
        return program


def traced(fun, *args):
    return fun.program(*args) if isinstance(fun, Staged) else jaxpr_cc.trace(fun, *args)


def reference(fun, program):
    """The original function, or for a Staged program the program itself (run by JAX)."""
    return (lambda *a: program(*a)) if isinstance(fun, Staged) else fun


# (rule, function, what it simplifies to, arguments).  Every exact rule of the table
# appears at least once; the expected program is traced from Python and printed.
EXACT_CASES = [
    ("mul-one", lambda x: x * jnp.float32(1.0), lambda x: x, (X,)),
    ("mul-one", lambda i: jnp.int32(1) * i, lambda i: i, (I,)),
    ("add-neg-zero", lambda x: x + jnp.float32(-0.0), lambda x: x, (X,)),
    ("add-neg-zero", lambda x, y: jnp.full((4,), -0.0, jnp.float32) + x, lambda x, y: x, (X, Y)),
    ("add-zero-int", lambda i: i + 0, lambda i: i, (I,)),
    ("sub-zero", lambda x: x - jnp.float32(0.0), lambda x: x, (X,)),
    ("sub-zero", lambda i: i - 0, lambda i: i, (I,)),
    ("sub-self-int", lambda i: i - i, lambda i: jnp.zeros_like(i), (I,)),
    ("sub-from-zero-int", lambda i: jnp.int32(0) - i, lambda i: -i, (I,)),
    ("mul-zero-int", lambda i: i * 0, lambda i: jnp.zeros_like(i), (I,)),
    ("mul-minus-one-int", lambda i: i * -1, lambda i: -i, (I,)),
    ("div-one", lambda x: x / jnp.float32(1.0), lambda x: x, (X,)),
    ("div-one", lambda i: lax.div(i, jnp.int32(1)), lambda i: i, (I,)),
    ("rem-one-int", lambda i: lax.rem(i, jnp.int32(1)), lambda i: jnp.zeros_like(i), (I,)),
    ("neg-neg", lambda x: -(-x), lambda x: x, (X,)),
    ("neg-neg", lambda i: -(-(-(-i))), lambda i: i, (I,)),
    ("not-not", lambda b: ~~b, lambda b: b, (B,)),
    ("and-all-ones", lambda i: i & -1, lambda i: i, (I,)),
    ("and-all-ones", lambda b: b & True, lambda b: b, (B,)),
    ("and-zero", lambda i: i & 0, lambda i: jnp.zeros_like(i), (I,)),
    ("and-self", lambda i: i & i, lambda i: i, (I,)),
    ("or-zero", lambda i: i | 0, lambda i: i, (I,)),
    ("or-all-ones", lambda i: i | -1, lambda i: jnp.full_like(i, -1), (I,)),
    ("or-self", lambda b: b | b, lambda b: b, (B,)),
    ("xor-zero", lambda i: i ^ 0, lambda i: i, (I,)),
    ("xor-self", lambda i: i ^ i, lambda i: jnp.zeros_like(i), (I,)),
    ("shift-by-zero", lambda i: i << 0, lambda i: i, (I,)),
    ("shift-by-zero", lambda i: lax.shift_right_logical(i, jnp.int32(0)), lambda i: i, (I,)),
    ("shift-by-zero", lambda i: lax.shift_right_arithmetic(i, jnp.int32(0)), lambda i: i, (I,)),
    ("max-self", lambda i: jnp.maximum(i, i), lambda i: i, (I,)),
    ("min-self", lambda i: jnp.minimum(i, i), lambda i: i, (I,)),
    ("max-lowest", lambda i: jnp.maximum(i, jnp.int32(-2**31)), lambda i: i, (I,)),
    ("max-lowest", lambda b: jnp.maximum(b, False), lambda b: b, (B,)),
    ("min-highest", lambda i: jnp.minimum(i, jnp.int32(2**31 - 1)), lambda i: i, (I,)),
    ("abs-sign", lambda i: jnp.abs(jnp.abs(i)), lambda i: jnp.abs(i), (I,)),
    ("abs-sign", lambda i: jnp.abs(-i), lambda i: jnp.abs(i), (I,)),
    ("integer-pow-trivial", lambda x: lax.integer_pow(x, 1), lambda x: x, (X,)),
    ("integer-pow-trivial", lambda x: lax.integer_pow(x, 0), lambda x: jnp.ones_like(x), (X,)),
    ("noop-convert", Staged(lax.convert_element_type_p, new_dtype=np.dtype(np.float32),
                            weak_type=False, sharding=None), lambda x: x, (X,)),
    ("convert-roundtrip-int", lambda a: a.astype(jnp.int32).astype(jnp.int8), lambda a: a, (I8,)),
    ("noop-reshape", lambda x: bind(lax.reshape_p, x, new_sizes=(4,), dimensions=None, sharding=None),
     lambda x: x, (X,)),
    ("reshape-reshape", lambda x: x.reshape(2, 2).reshape(4), lambda x: x, (X,)),
    ("reshape-reshape", lambda x: x.reshape(2, 2).reshape(1, 4), lambda x: x.reshape(1, 4), (X,)),
    ("noop-squeeze", lambda x: bind(lax.squeeze_p, x, dimensions=()), lambda x: x, (X,)),
    ("noop-transpose", lambda x: bind(lax.transpose_p, x, permutation=(0,)), lambda x: x, (X,)),
    ("transpose-transpose", lambda x: x.reshape(2, 2).T.T, lambda x: x.reshape(2, 2), (X,)),
    ("noop-broadcast", Staged(lax.broadcast_in_dim_p, shape=(4,), broadcast_dimensions=(0,),
                              sharding=None), lambda x: x, (X,)),
    ("noop-rev", lambda x: bind(lax.rev_p, x, dimensions=()), lambda x: x, (X,)),
    ("noop-slice", lambda x: bind(lax.slice_p, x, start_indices=(0,), limit_indices=(4,), strides=None),
     lambda x: x, (X,)),
    ("noop-pad", lambda x: lax.pad(x, jnp.float32(0.0), [(0, 0, 0)]), lambda x: x, (X,)),
    ("full-dynamic-slice", lambda x, k: lax.dynamic_slice(x, (k,), (4,)), lambda x, k: x,
     (X, jnp.int32(2))),
    ("full-dynamic-update-slice", lambda x, y, k: lax.dynamic_update_slice(x, y, (k,)),
     lambda x, y, k: y, (X, Y, jnp.int32(3))),
    ("single-concatenate", lambda x: bind(lax.concatenate_p, x, dimension=0), lambda x: x, (X,)),
    ("noop-reduce-precision", lambda x: lax.reduce_precision(x, 8, 23), lambda x: x, (X,)),
    ("real-of-complex", lambda x, y: jnp.real(lax.complex(x, y)), lambda x, y: x, (X, Y)),
    ("imag-of-complex", lambda x, y: jnp.imag(lax.complex(x, y)), lambda x, y: y, (X, Y)),
    ("select-constant-predicate", lambda x, y: lax.select_n(True, x, y), lambda x, y: y, (X, Y)),
    ("select-constant-predicate", lambda x, y: lax.select_n(jnp.full((4,), 0, jnp.int32), x, y),
     lambda x, y: x, (X, Y)),
    ("select-same-cases", lambda b, x: lax.select_n(b, x, x), lambda b, x: x, (B, X)),
    ("cond-constant-index", lambda x: lax.cond(True, lambda a: jnp.sin(a) * 2.0, jnp.cos, x),
     lambda x: jnp.sin(x) * 2.0, (X,)),
    ("cond-constant-index", lambda x: lax.cond(False, jnp.sin, lambda a: jnp.cos(a) + a, x),
     lambda x: jnp.cos(x) + x, (X,)),
    ("while-false", lambda x: lax.while_loop(lambda c: c[0] < 0, lambda c: (c[0] + 1, c[1] * 2.0),
                                             (0, x))[1], lambda x: x, (X,)),
    ("while-false", lambda x: lax.while_loop(lambda c: False, lambda c: c * 2.0, x), lambda x: x, (X,)),
]

INEXACT_CASES = [
    ("add-zero-float", lambda x: x + jnp.float32(0.0), lambda x: x, (X,)),
    ("add-zero-float", lambda x: x + jnp.zeros_like(x), lambda x: x, (X,)),
    ("sub-neg-zero-float", lambda x: x - jnp.float32(-0.0), lambda x: x, (X,)),
    ("sub-self-float", lambda x: x - x, lambda x: jnp.zeros_like(x), (X,)),
    ("sub-from-zero-float", lambda x: jnp.float32(-0.0) - x, lambda x: -x, (X,)),
    ("mul-zero-float", lambda x: x * jnp.float32(0.0), lambda x: jnp.zeros_like(x), (X,)),
    ("mul-minus-one-float", lambda x: x * jnp.float32(-1.0), lambda x: -x, (X,)),
    ("div-self", lambda x: x / x, lambda x: jnp.ones_like(x), (X,)),
]

# What each inexact rule gets wrong, computed with numpy (IEEE arithmetic): the
# input, the original expression and the rewritten one.
INEXACT_WITNESS = {
    "add-zero-float": (np.float32(-0.0), lambda x: x + np.float32(0.0), lambda x: x),
    "sub-neg-zero-float": (np.float32(-0.0), lambda x: x - np.float32(-0.0), lambda x: x),
    "sub-self-float": (np.float32(np.inf), lambda x: x - x, lambda x: np.float32(0.0)),
    "sub-from-zero-float": (np.float32(1e-45), None, None),   # denormal flush: see below
    "mul-zero-float": (np.float32(np.nan), lambda x: x * np.float32(0.0), lambda x: np.float32(0.0)),
    "mul-minus-one-float": (np.float32(1e-45), None, None),   # denormal flush: see below
    "div-self": (np.float32(0.0), lambda x: x / x, lambda x: np.float32(1.0)),
}


def _case_id(case):
    return case[0]


@pytest.mark.parametrize("case", EXACT_CASES, ids=_case_id)
def test_exact_rule_fires(case):
    rule, fun, expected, args = case
    program = traced(fun, *args)
    out, stats = simplify(program)
    assert stats.get(rule, 0) >= 1, stats
    assert body_text(out) == body_text(jaxpr_cc.trace(expected, *args))
    check_values(out, reference(fun, program), *args)


@pytest.mark.parametrize("case", INEXACT_CASES, ids=_case_id)
def test_inexact_rule_needs_fast_math(case):
    rule, fun, expected, args = case
    program = jaxpr_cc.trace(fun, *args)
    kept, stats = simplify(program)
    assert rule not in stats
    assert body_text(kept) == body_text(PassManager("dce").run(program))
    check_values(kept, fun, *args)
    fast, stats = simplify(program, fast_math=True)
    assert stats.get(rule, 0) >= 1, stats
    assert body_text(fast) == body_text(jaxpr_cc.trace(expected, *args))


@pytest.mark.parametrize("rule", sorted(INEXACT_WITNESS))
def test_inexact_rules_are_wrong_somewhere(rule):
    x, original, rewritten = INEXACT_WITNESS[rule]
    if original is not None:
        with np.errstate(all="ignore"):
            assert bits(np.asarray(original(x))).tobytes() != bits(np.asarray(rewritten(x))).tobytes()
        return
    # XLA's CPU arithmetic flushes denormal results to zero; negation does not.
    fun = {"sub-from-zero-float": lambda a: jnp.float32(-0.0) - a,
           "mul-minus-one-float": lambda a: a * jnp.float32(-1.0)}[rule]
    a = jnp.asarray([x])
    assert bits(jax.jit(fun)(a)).tobytes() != bits(jax.jit(lambda v: -v)(a)).tobytes()


def test_every_rule_of_the_table_is_tested():
    tested = {c[0] for c in EXACT_CASES} | {c[0] for c in INEXACT_CASES} | {"inline-call"}
    assert set(rule_names()) == tested
    assert set(rule_names(exact=False)) == {c[0] for c in INEXACT_CASES}
    # the table is keyed by primitive name
    assert all(isinstance(k, str) and rules for k, rules in SIMPLIFY_RULES.items())


def test_rules_keep_types_exact():
    # s * ones(4) is s broadcast, not s: the identity holds per element only.
    def f(s):
        return s * jnp.ones((4,), jnp.float32), jnp.full((4,), 1, jnp.int32) * s.astype(jnp.int32)

    program = jaxpr_cc.trace(f, jnp.float32(3.0))
    out, stats = simplify(program)
    assert stats == {}
    assert [v.aval for v in out.body.outvars] == [v.aval for v in program.body.outvars]


def test_abs_of_negated_unsigned_is_kept():
    # -x wraps around for unsigned x, and abs is the identity there: abs(-1) = 255.
    def f(u):
        return jnp.abs(-u)

    u = jnp.asarray([0, 1, 128, 255], jnp.uint8)
    program = jaxpr_cc.trace(f, u)
    out, stats = simplify(program)
    assert stats == {}
    check_values(out, f, u)


def test_float_identities_that_change_derivatives_are_left_alone():
    # max(x, -inf), max(x, x), abs(-x), abs(abs(x)) equal x / abs(x) in value, but
    # not in JAX's derivative: max's is 0 at NaN (every comparison is false) where
    # x's is 1; abs's is ``t if u >= 0 else -t``, which sees -x at x = 0 as -0.0 >= 0.
    def f(x):
        return jnp.maximum(x, -jnp.inf) + jnp.minimum(x, x) + jnp.abs(-x) + jnp.abs(jnp.abs(x))

    program = jaxpr_cc.trace(f, X)
    out, stats = simplify(program)
    assert stats == {}

    def g(x):
        return x + x + jnp.abs(x) + jnp.abs(x)

    at = jnp.asarray([np.nan, 0.0, 1.0], jnp.float32)
    assert bits(jax.grad(lambda a: f(a).sum())(at)).tobytes() != \
        bits(jax.grad(lambda a: g(a).sum())(at)).tobytes()


def test_identities_do_not_fire_on_other_constants():
    def f(x, i):
        return (x * jnp.float32(1.0000001), x + jnp.float32(0.0), x - jnp.float32(-0.0),
                i + 1, i & 1, i * 2, jnp.maximum(x, jnp.float32(-3.4e38)))

    program = jaxpr_cc.trace(f, X, I)
    out, stats = simplify(program)
    assert stats == {}
    assert body_text(out) == body_text(program)


def test_inline_calls_is_an_option():
    def f(x):
        return jax.jit(lambda a: jnp.sin(a) * 2.0)(x) + 1.0

    program = jaxpr_cc.trace(f, X)
    kept, stats = simplify(program)
    assert "inline-call" not in stats and any(e.prim.name == "jit" for e in kept.body.equations)
    inlined, stats = simplify(program, inline_calls=True)
    assert stats["inline-call"] == 1
    assert body_text(inlined) == body_text(jaxpr_cc.trace(lambda x: jnp.sin(x) * 2.0 + 1.0, X))
    check_values(inlined, f, X)


def test_jit_with_shardings_is_not_inlined():
    from jax.sharding import SingleDeviceSharding

    sharding = SingleDeviceSharding(jax.devices()[0])

    def f(x):
        return jax.jit(lambda a: a * 2.0, out_shardings=sharding)(x)

    program = jaxpr_cc.trace(f, X)
    out, stats = simplify(program, inline_calls=True)
    assert "inline-call" not in stats


def test_rules_apply_inside_regions_and_chains_collapse_in_one_run():
    def f(x, y):
        def body(c, v):
            return -(-(-(-(c * jnp.float32(1.0))))) + v, c
        return lax.scan(body, y[0], x)

    def g(x, y):
        return lax.scan(lambda c, v: (c + v, c), y[0], x)

    program = jaxpr_cc.trace(f, X, Y)
    out, stats = simplify(program)
    assert stats == {"mul-one": 1, "neg-neg": 2}
    assert body_text(out) == body_text(jaxpr_cc.trace(g, X, Y))
    check_values(out, f, X, Y)


def test_custom_rules_are_simplified_inside_consistently():
    @jax.custom_vjp
    def clip_grad(x):
        return (x * jnp.float32(1.0)) / jnp.float32(1.0)

    def fwd(x):
        return clip_grad(x), (x + jnp.float32(-0.0),)

    def bwd(res, g):
        (x,) = res
        return (jnp.clip(g * jnp.float32(1.0), -1.0, 1.0) * -(-jnp.cos(x)),)

    clip_grad.defvjp(fwd, bwd)

    @jax.custom_jvp
    def soft(x):
        return jnp.logaddexp(x, 0.0) * jnp.float32(1.0)

    soft.defjvps(lambda t, ans, x: t * jax.nn.sigmoid(x) / jnp.float32(1.0))

    def f(x):
        return jnp.sum(clip_grad(x * 3.0) + soft(x))

    def g(x):
        return soft(x) * 2.0

    x = jnp.linspace(-2.0, 2.0, 4, dtype=jnp.float32)
    program = jaxpr_cc.trace(f, x)
    out, stats = simplify(program)
    assert stats.get("mul-one", 0) >= 3 and stats.get("div-one", 0) >= 2 and stats.get("neg-neg", 0) >= 1
    # nothing left to simplify anywhere, rule regions included
    for region in out.body.regions():
        for eqn in region.equations:
            if eqn.prim.name in ("mul", "div"):
                assert not any(getattr(a, "val", None) is not None and np.asarray(a.val) == 1.0
                               for a in eqn.inputs), eqn
    out.verify()
    check_values(out, f, x)
    assert_bitwise(jax.jit(jax.grad(lambda a: out(a)))(x), jax.jit(jax.grad(f))(x), "grad")
    out_g, stats = simplify(jaxpr_cc.trace(g, x))
    assert stats.get("mul-one", 0) >= 1 and stats.get("div-one", 0) >= 1
    assert_bitwise(jax.jit(lambda a, t: jax.jvp(lambda v: out_g(v), (a,), (t,)))(x, x),
                   jax.jit(lambda a, t: jax.jvp(g, (a,), (t,)))(x, x), "jvp")


def test_identity_primal_with_custom_gradient_is_kept():
    @jax.custom_vjp
    def scale_grad(x):
        return x

    scale_grad.defvjp(lambda x: (x, None), lambda _, g: (g * 0.5,))

    def f(x):
        return jnp.sum(scale_grad(x) * jnp.float32(1.0))

    x = jnp.arange(4.0, dtype=jnp.float32)
    out = PassManager("simplify,copy-propagation,dce").run(jaxpr_cc.trace(f, x))
    assert any(e.prim.name == "custom_vjp_call" for e in out.body.equations)
    np.testing.assert_array_equal(jax.grad(lambda a: out(a))(x), np.full(4, 0.5, np.float32))


def test_effects_survive(capfd):
    def f(x):
        def branch(a):
            jax.debug.print("in branch {a}", a=a[0], ordered=True)
            return a * jnp.float32(1.0)

        y = lax.cond(True, branch, lambda a: a, x)
        jax.debug.print("after {y}", y=-(-y[0]), ordered=True)
        z = lax.while_loop(lambda c: False, lambda c: c, y)   # never runs
        return z + jnp.float32(-0.0)

    program = jaxpr_cc.trace(f, X)
    out, stats = simplify(program)
    assert stats.get("cond-constant-index") == 1 and stats.get("while-false") == 1
    names = [e.prim.name for e in out.body.equations]
    assert names.count("debug_print") == 2 and "cond" not in names and "while" not in names
    capfd.readouterr()
    jax.block_until_ready(out(X))
    jax.effects_barrier()
    printed = capfd.readouterr().out
    jax.block_until_ready(f(X))
    jax.effects_barrier()
    assert printed == capfd.readouterr().out
    assert printed.index("in branch") < printed.index("after")


def test_while_whose_condition_is_not_constant_stays():
    def f(x, n):
        return lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] * 2.0), (0, x))[1]

    program = jaxpr_cc.trace(f, X, 3)
    out, stats = simplify(program)
    assert "while-false" not in stats
    assert any(e.prim.name == "while" for e in out.body.equations)


def test_simplify_is_deterministic():
    def f(x, i):
        return lax.cond(True, lambda a: -(-a) * jnp.float32(1.0), jnp.sin, x), i ^ 0

    program = jaxpr_cc.trace(f, X, I)
    texts = {str(simplify(program)[0]) for _ in range(3)}
    assert len(texts) == 1
