"""``constant-fold``: what folds (printed IR, counts), into what form, what never
folds, and that folded values are bit for bit what ``jax.jit`` of the original
function computes and what a run of it op by op computes."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxpr_cc
from jaxpr_cc.passes.manager import PassManager

X = jnp.asarray([np.nan, -0.0, 1e-45, 2.5], jnp.float32)
ARG = np.linspace(-30.0, 30.0, 4096, dtype=np.float32)   # 16 KiB


def body_text(program) -> str:
    return "\n".join(line for line in str(program).splitlines()
                     if not line.startswith(("func @", "#")))


def fold(program, pipeline="constant-fold,dce"):
    manager = PassManager(pipeline)
    out = manager.run(program)
    return out, manager.statistics[0][1]


def bits(a) -> np.ndarray:
    a = np.array(a)
    if np.issubdtype(a.dtype, np.inexact):
        a[np.isnan(a)] = np.nan
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def check_values(program, fun, *args):
    """Each side under its own ``jax.jit`` (XLA folds constants there too)."""
    ours = jax.jit(lambda *a: program(*a))(*args)
    ref = jax.jit(fun)(*args)
    la, lb = jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(ref)
    assert len(la) == len(lb)
    for a, b in zip(la, lb):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(bits(a), bits(b))


def test_scalar_chains_become_literals():
    def f(x):
        c = jnp.sin(jnp.float32(2.0)) * 3.0 + jnp.float32(1e-45)
        return x * c

    program = jaxpr_cc.trace(f, X)
    out, stats = fold(program)
    assert stats["equations-folded"] == 3
    (mul,) = out.body.equations
    value = np.asarray(mul.inputs[1].val)
    # the literal holds exactly what the jitted original computes for the constant
    assert bits(value).tobytes() == bits(jax.jit(lambda: jnp.sin(jnp.float32(2.0)) * 3.0
                                                 + jnp.float32(1e-45))()).tobytes()
    check_values(out, f, X)


def test_arrays_the_kernels_compute_differently_stay_computed():
    # XLA folds constant subexpressions with its own evaluator, which rounds
    # transcendental functions differently from its CPU kernels: a jitted run of
    # the original uses the evaluator's values, a run op by op (Program.__call__)
    # the kernels'.  No folded constant leaves both unchanged, so none is made.
    def f(x):
        return x[0] + jnp.tanh(jnp.sin(ARG) * 1.5) * jnp.exp(jnp.asarray(ARG) / 8.0)

    kernel = jax.jit(lambda a: jnp.tanh(jnp.sin(a) * 1.5) * jnp.exp(a / 8.0))(ARG)
    evaluator = jax.jit(lambda: jnp.tanh(jnp.sin(ARG) * 1.5) * jnp.exp(jnp.asarray(ARG) / 8.0))()
    assert (bits(kernel) != bits(evaluator)).any()  # the premise
    program = jaxpr_cc.trace(f, X)
    out, stats = fold(program)
    assert [e.prim.name for e in out.body.equations].count("tanh") == 1  # left computed
    assert stats["not-folded (jitted and op-by-op runs differ)"] >= 1
    check_values(out, f, X)
    for a, b in zip(jax.tree_util.tree_leaves(out(X)), jax.tree_util.tree_leaves(program(X))):
        np.testing.assert_array_equal(bits(a), bits(b))


def test_arrays_both_runs_agree_on_are_folded():
    def f(x):
        return x[0] + jnp.asarray(ARG) * 1.5 - jnp.float32(2.0)

    program = jaxpr_cc.trace(f, X)
    out, stats = fold(program)
    assert stats["constants-created"] == 1
    check_values(out, f, X)
    for a, b in zip(jax.tree_util.tree_leaves(out(X)), jax.tree_util.tree_leaves(program(X))):
        np.testing.assert_array_equal(bits(a), bits(b))


def test_arrays_of_one_value_become_splats():
    def f(x):
        big = jnp.full((512, 1024), 2.0, jnp.float32) * 3.0 - 1.0   # 2 MiB, over max-bytes
        small = jnp.ones((4,), jnp.float32) * jnp.float32(-0.0)
        return x + small, big.sum()

    program = jaxpr_cc.trace(f, X)
    out, stats = fold(program)
    # only the small splat folds: the big one is over the default 1 MiB cap
    assert stats == {"equations-folded": 1, "splats-created": 1}
    assert "broadcast_in_dim[broadcast_dimensions=(), shape=(4,), sharding=None] -0.0:f32[]" in str(out)
    check_values(out, f, X)
    out, stats = fold(program, "constant-fold{max-bytes=4194304},dce")
    # now the sum of the big splat folds too, into a literal; nothing of it is left
    assert stats["literals-created"] == 1 and stats["splats-created"] == 1
    assert "return %1, 2621440.0:f32[]" in str(out) and "512" not in str(out)
    assert not out.body.consts
    check_values(out, f, X)


def test_max_bytes_caps_what_is_materialized():
    def f(x):
        return x[0] * (jnp.asarray(ARG) * 2.0)

    program = jaxpr_cc.trace(f, X)
    out, stats = fold(program, "constant-fold{max-bytes=1024}")
    assert stats == {}
    out, stats = fold(program, "constant-fold{max-bytes=16384}")
    assert stats["constants-created"] == 1 and stats["bytes-materialized"] == ARG.nbytes
    check_values(out, f, X)
    with pytest.raises(ValueError, match="max-bytes must be >= 0"):
        PassManager("constant-fold{max-bytes=-1}")


def test_integer_and_special_value_folding_is_bitwise():
    imax, imin = jnp.int32(2**31 - 1), jnp.int32(-2**31)

    def f(i):
        ints = (imax + 1, imin // jnp.int32(-1), lax.rem(imin, jnp.int32(-1)),
                lax.div(imax, jnp.int32(-7)), lax.shift_left(imax, jnp.int32(40)),
                lax.shift_right_arithmetic(imin, jnp.int32(33)), jnp.uint8(250) + jnp.uint8(10),
                jnp.int8(-128) * jnp.int8(-1))
        floats = (jnp.float32(np.inf) - jnp.float32(np.inf), jnp.float32(-0.0) * jnp.float32(3.0),
                  jnp.float32(1e-45) * jnp.float32(0.5), jnp.float32(1e-45) / jnp.float32(2.0),
                  jnp.float32(3.4e38) * jnp.float32(10.0), jnp.sqrt(jnp.float32(-1.0)),
                  jnp.bfloat16(1.0) / jnp.bfloat16(3.0), jnp.float16(65504.0) + jnp.float16(32.0),
                  jnp.log(jnp.float32(0.0)), jnp.float32(-0.0) + jnp.float32(-0.0))
        return tuple(v + i.astype(v.dtype) for v in ints + floats)

    i = jnp.int32(0)
    program = jaxpr_cc.trace(f, i)
    out, stats = fold(program)
    assert stats["equations-folded"] >= 18
    check_values(out, f, i)


def test_integer_division_by_zero_folds_the_run_time_way():
    # XLA's compile-time evaluator crashes the process on a constant integer
    # division by zero (so a jitted program with one crashes too); its kernels
    # return -1 (x / 0) and x (x % 0).  Such divisions are folded by running the
    # kernel, so none is left for the evaluator -- including ones that only become
    # constant because a literal operand reached a region.
    def f(i):
        a = lax.div(jnp.int32(7), jnp.int32(0)) + lax.rem(jnp.int32(7), jnp.int32(0) * 3)
        b = jax.jit(lambda u, v: u // v)(jnp.int32(9), jnp.int32(0))     # inside a call
        c = lax.div(jnp.uint8(200), jnp.uint8(0)) + jnp.uint8(1)
        return a + b + i, c

    i = jnp.int32(1)
    program = jaxpr_cc.trace(f, i)
    eager = f(i)                              # op by op: kernels only
    out, stats = fold(program)
    assert stats["divisions-by-zero-folded"] >= 4
    assert not any(e.prim.name in ("div", "rem") for _, e in out.body.walk())
    whole = PassManager("canonicalize").run(program)
    assert [e.prim.name for e in whole.body.equations] == ["add"]
    for a, b in zip(jax.jit(lambda v: whole(v))(i), eager):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(jax.jit(lambda v: out(v))(i), eager):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(out(i), eager):
        np.testing.assert_array_equal(a, b)


def test_scalar_constants_become_literals_and_reach_nested_regions():
    scale = jnp.float32(3.0)   # closed over: a constant of the program, not a literal

    def f(x):
        y = jax.jit(lambda a, s: a * (s + 1.0))(x, scale)
        z = lax.cond(x[3] > 0, lambda a, s: a * jnp.exp(s), lambda a, s: a - s, x, scale)
        w = lax.fori_loop(0, 3, lambda k, c: c * jnp.sin(scale), x)
        return y + z + w

    program = jaxpr_cc.trace(f, X)
    out, stats = fold(program)
    assert stats["literals-created"] >= 1 and stats["operands-propagated"] >= 3
    assert not out.body.consts   # the scalar constant became a literal
    # inside the regions, the constant expressions folded
    prims = [e.prim.name for _, e in out.body.walk()]
    assert "exp" not in prims and "sin" not in prims
    check_values(out, f, X)
    check_values(out, f, -X)


def test_nested_regions_get_no_constants():
    def f(x):
        def branch(a):
            return a + jnp.sin(jnp.arange(4.0, dtype=jnp.float32) + 1.0) + jnp.zeros(4) * 2.0
        return lax.cond(x[3] > 0, branch, lambda a: a, x)

    program = jaxpr_cc.trace(f, X)
    assert program.is_first_order()
    out, stats = fold(program)
    assert out.is_first_order()
    assert all(not r.constvars for r in out.body.regions())
    # the splat folded inside the branch; the non-splat array stays computed there
    assert stats.get("splats-created") == 1
    prims = [e.prim.name for _, e in out.body.walk()]
    assert "sin" in prims
    check_values(out, f, X)


def test_effects_callbacks_random_bits_and_custom_rules_never_fold(capfd):
    @jax.custom_jvp
    def softplus(x):
        return jnp.logaddexp(x, 0.0)

    softplus.defjvps(lambda t, ans, x: t * jax.nn.sigmoid(x))

    def f(x):
        c = jnp.float32(2.0) + 1.0
        jax.debug.print("c={c}", c=c)
        spec = jax.ShapeDtypeStruct((), jnp.float32)
        cb = jax.pure_callback(lambda v: np.float32(v) * 2, spec, c)
        r = jax.random.normal(jax.random.key(0), (4,))
        s = softplus(jnp.float32(1.5))
        return x * cb + r + s

    program = jaxpr_cc.trace(f, X)
    out, stats = fold(program)
    assert stats.get("equations-folded", 0) >= 1     # the add before the print
    prims = [e.prim.name for _, e in out.body.walk()]
    for name in ("debug_print", "pure_callback", "random_bits", "custom_jvp_call"):
        assert name in prims, name
    capfd.readouterr()
    jax.block_until_ready(out(X))
    jax.effects_barrier()
    assert capfd.readouterr().out == "c=3.0\n"
    check_values(out, f, X)


def test_hoisted_parameters_are_not_constants():
    def f(x):
        return x * (jnp.asarray(ARG[:4]) * 2.0)

    program = PassManager("hoist-consts").run(jaxpr_cc.trace(f, X))
    assert len(program.params) == 1
    out, stats = fold(program)
    assert stats == {}
    assert body_text(out) == body_text(program)


def test_custom_rule_regions_fold_consistently():
    @jax.custom_jvp
    def f_custom(x):
        return x * jnp.sin(jnp.float32(0.5)) + jnp.cos(jnp.float32(0.25))

    f_custom.defjvps(lambda t, ans, x: t * jnp.sin(jnp.float32(0.5)) * jnp.exp(jnp.float32(0.0)))

    @jax.custom_vjp
    def g_custom(x):
        return x * jnp.tanh(jnp.float32(1.0))

    g_custom.defvjp(lambda x: (g_custom(x), x), lambda x, ct: (ct * jnp.tanh(jnp.float32(1.0)) * 2.0,))

    def f(x):
        return jnp.sum(f_custom(x) * g_custom(x))

    x = jnp.linspace(-1.0, 1.0, 4, dtype=jnp.float32)
    program = jaxpr_cc.trace(f, x)
    out, stats = fold(program)
    assert stats["equations-folded"] >= 6
    prims = [e.prim.name for _, e in out.body.walk()]
    assert not {"sin", "cos", "tanh", "exp"} & set(prims)
    assert "custom_jvp_call" in prims and "custom_vjp_call" in prims
    check_values(out, f, x)
    np.testing.assert_array_equal(bits(jax.jit(jax.grad(lambda a: out(a)))(x)),
                                  bits(jax.jit(jax.grad(f))(x)))

    # jvp is defined for the custom_jvp part alone (a custom_vjp function has none)
    def h(v):
        return jnp.sum(f_custom(v))

    single, _ = fold(jaxpr_cc.trace(h, x))
    tangents = jnp.ones_like(x)
    np.testing.assert_array_equal(
        bits(jax.jit(lambda a, t: jax.jvp(lambda v: single(v), (a,), (t,)))(x, tangents)[1]),
        bits(jax.jit(lambda a, t: jax.jvp(h, (a,), (t,)))(x, tangents)[1]))


def test_whole_calls_fold_but_loops_do_not():
    def f(x):
        a = jax.jit(lambda u: jnp.sin(u) * 2.0)(jnp.float32(0.5))           # folds whole
        b = lax.fori_loop(0, 3, lambda k, c: c * 2.0, jnp.float32(1.0))       # a loop: kept
        return x * a + b

    program = jaxpr_cc.trace(f, X)
    out, stats = fold(program)
    prims = [e.prim.name for e in out.body.equations]
    assert "jit" not in prims and ("while" in prims or "scan" in prims)
    check_values(out, f, X)


def test_constant_fold_is_deterministic():
    def f(x):
        return x * jnp.sin(ARG[:4]) + jnp.float32(2.0) ** 3

    program = jaxpr_cc.trace(f, X)
    texts = {str(fold(program)[0]) for _ in range(3)}
    assert len(texts) == 1
