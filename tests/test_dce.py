"""``dce``: what it removes (counts and printed IR) and that results stay JAX's.

The printed-IR checks compare the pass's output with a trace of the same
function written without the dead code: the two must print identically.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_cc
from jaxpr_cc.jax_adapter import dce_jaxpr
from jaxpr_cc.passes.manager import PassManager, run_passes

X = jnp.linspace(-1.0, 1.0, 4, dtype=jnp.float32)
Y = jnp.float32(0.5)


def body_text(program) -> str:
    """The printed IR without the header line naming the function."""
    lines = str(program).splitlines()
    return "\n".join(line for line in lines if not line.startswith(("func @", "#")))


def dce(program):
    manager = PassManager("dce")
    out = manager.run(program)
    return out, manager.statistics[0][1]


def check_values(program, fun, *args):
    # Both sides compiled the same way (op-by-op evaluation may round differently).
    ours = jax.jit(lambda *a: program(*a))(*args)
    ref = jax.jit(fun)(*args)
    jax.tree_util.tree_map(np.testing.assert_array_equal, ours, ref)


def count_jaxpr(jaxpr) -> int:
    n = 0
    for eqn in jaxpr.eqns:
        n += 1
        for p in eqn.params.values():
            for sub in (p if isinstance(p, tuple) else (p,)):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    n += count_jaxpr(inner)
    return n


def jax_dce_count(program) -> int:
    closed = program.to_jaxpr()
    pruned, _ = dce_jaxpr(closed.jaxpr, [True] * len(closed.jaxpr.outvars), instantiate=True)
    return count_jaxpr(pruned)


# ------------------------------------------------------------ straight line
def test_straight_line_dead_code_is_removed():
    def with_dead(x, y):
        a = jnp.sin(x) * y
        dead = jnp.exp(a) + jnp.cos(x)
        dead2 = dead * 2.0
        del dead2
        return a + 1.0

    def without(x, y):
        a = jnp.sin(x) * y
        return a + 1.0

    prog = jaxpr_cc.trace(with_dead, X, Y)
    out, stats = dce(prog)
    assert stats == {"equations-removed": 4}
    assert out.num_equations() == prog.num_equations() - 4
    assert body_text(out) == body_text(jaxpr_cc.trace(without, X, Y))
    check_values(out, with_dead, X, Y)


def test_unused_top_level_constant_and_param_are_removed():
    table = np.arange(4.0, dtype=np.float32)

    def f(x):
        unused = x * table
        del unused
        return x + 1.0

    prog = jaxpr_cc.trace(f, X)
    assert len(prog.body.constvars) == 1
    out, stats = dce(prog)
    assert stats == {"equations-removed": 1, "constants-removed": 1}
    assert out.body.constvars == []

    hoisted = run_passes(prog, "hoist-consts")
    assert len(hoisted.params) == 1
    out, stats = dce(hoisted)
    assert stats == {"equations-removed": 1, "params-removed": 1}
    assert out.params == () and len(out.body.invars) == 1
    check_values(out, f, X)


# ---------------------------------------------------------------- calls
def test_jit_loses_unused_results_and_operands():
    def inner(a, b, c):
        return a * 2.0, jnp.sin(b) + c, c - 1.0

    def inner_used(a):
        return a * 2.0

    inner.__name__ = inner_used.__name__ = "inner"

    def with_dead(x, y):
        p, q, r = jax.jit(inner)(x, x + 1.0, y)
        return p

    def without(x, y):
        _ = x + 1.0
        return jax.jit(inner_used)(x)

    prog = jaxpr_cc.trace(with_dead, X, Y)
    out, stats = dce(prog)
    assert stats == {"equations-removed": 4, "results-removed": 2, "operands-removed": 2}
    jit = next(e for e in out.body.equations if e.prim.name == "jit")
    assert len(jit.inputs) == 1 and len(jit.outputs) == 1
    assert jit.params["in_shardings"] == jit.params["in_shardings"][:1]
    assert len(jit.params["donated_invars"]) == 1 and len(jit.params["out_layouts"]) == 1
    ref = jaxpr_cc.run_passes(jaxpr_cc.trace(without, X, Y), "dce")
    assert body_text(out) == body_text(ref)
    check_values(out, with_dead, X, Y)


def test_unused_call_is_removed_entirely():
    def f(x):
        dead = jax.jit(lambda a: jnp.exp(a) * 3.0)(x)
        del dead
        return x * 2.0

    prog = jaxpr_cc.trace(f, X)
    out, stats = dce(prog)
    assert stats == {"equations-removed": 3}  # the jit and its two equations
    assert [e.prim.name for e in out.body.equations] == ["mul"]


# ------------------------------------------------------------------ cond
def test_cond_loses_unused_branch_outputs_and_operands():
    def with_dead(x, y):
        def yes(a, b):
            return a * 2.0, jnp.exp(b)

        def no(a, b):
            return a - 1.0, jnp.log(b)

        r, _ = jax.lax.cond(y > 0, yes, no, x, y)
        return r

    def without(x, y):
        return jax.lax.cond(y > 0, lambda a: a * 2.0, lambda a: a - 1.0, x)

    prog = jaxpr_cc.trace(with_dead, X, Y)
    out, stats = dce(prog)
    assert stats == {"equations-removed": 2, "results-removed": 1, "operands-removed": 1}
    assert body_text(out) == body_text(jaxpr_cc.trace(without, X, Y))
    check_values(out, with_dead, X, Y)
    check_values(out, with_dead, X, -Y)


# ----------------------------------------------------------------- loops
def test_while_drops_dead_loop_carried_values():
    def with_dead(x, y):
        def cond(c):
            return c[0] < 5

        def body(c):
            i, a, junk, junk2 = c
            return i + 1, a * y + 1.0, junk * 2.0 + a, jnp.sin(junk2)

        return jax.lax.while_loop(cond, body, (0, x, x, x))[1]

    def without(x, y):
        def cond(c):
            return c[0] < 5

        def body(c):
            i, a = c
            return i + 1, a * y + 1.0

        return jax.lax.while_loop(cond, body, (0, x))[1]

    prog = jaxpr_cc.trace(with_dead, X, Y)
    out, stats = dce(prog)
    assert stats == {"equations-removed": 3, "loop-carries-removed": 2}  # mul, add, sin
    assert body_text(out) == body_text(jaxpr_cc.trace(without, X, Y))
    check_values(out, with_dead, X, Y)
    # JAX's dce_jaxpr keeps the whole loop.
    assert out.num_equations() < jax_dce_count(prog)


def test_while_fixpoint_keeps_values_feeding_live_carries():
    def f(x):
        def body(c):
            i, a, b, c_, dead = c
            # a <- b <- c_ <- c_: all live because a is returned; dead feeds only itself.
            return i + 1, a + b, b * c_, c_ + 1.0, dead * a

        out = jax.lax.while_loop(lambda c: c[0] < 3, body, (0, x, x, x, x))
        return out[1]

    prog = jaxpr_cc.trace(f, X)
    out, stats = dce(prog)
    assert stats == {"equations-removed": 1, "loop-carries-removed": 1}
    loop = next(e for e in out.body.equations if e.prim.name == "while")
    assert len(loop.outputs) == 4
    check_values(out, f, X)


def test_while_keeps_carries_the_condition_reads():
    def f(x):
        def body(c):
            i, limit, a = c
            return i + 1, limit, a * 2.0

        return jax.lax.while_loop(lambda c: c[0] < c[1], body, (0, 3, x))[2]

    prog = jaxpr_cc.trace(f, X)
    out, stats = dce(prog)
    assert stats == {}
    check_values(out, f, X)


def test_scan_drops_dead_carries_stacked_outputs_consts_and_xs():
    w = np.float32(3.0)

    def with_dead(x, ys):
        def step(carry, inputs):
            a, junk = carry
            y, z = inputs
            return (a * y + 1.0, junk * w + z), (a * 2.0, jnp.sin(junk))

        (a, _), (stacked, _) = jax.lax.scan(step, (x, x), (ys, ys * 2.0))
        return a, stacked

    def without(x, ys):
        def step(a, y):
            return a * y + 1.0, a * 2.0

        _ = ys * 2.0
        return jax.lax.scan(step, x, ys)

    ys = jnp.stack([X, X + 1.0, X * 3.0])
    prog = jaxpr_cc.trace(with_dead, X, ys)
    out, stats = dce(prog)
    assert stats == {"equations-removed": 4, "loop-carries-removed": 1, "results-removed": 1,
                     "operands-removed": 1}
    ref = run_passes(jaxpr_cc.trace(without, X, ys), "dce")
    assert body_text(out) == body_text(ref)
    check_values(out, with_dead, X, ys)
    assert out.num_equations() <= jax_dce_count(prog)


def test_unused_loop_is_removed_entirely():
    def f(x):
        jax.lax.fori_loop(0, 4, lambda i, a: a * 2.0, x)
        return x + 1.0

    prog = jaxpr_cc.trace(f, X)
    out, stats = dce(prog)
    assert [e.prim.name for e in out.body.equations] == ["add"]
    assert stats["equations-removed"] == prog.num_equations() - 1


def test_nested_regions_are_pruned_recursively():
    def f(x, y):
        def branch(a):
            def body(c):
                i, v, junk = c
                return i + 1, v + 1.0, junk * v
            return jax.jit(lambda v: (jax.lax.while_loop(lambda c: c[0] < 2, body, (0, v, v))[1],
                                      jnp.exp(v)))(a)[0]

        return jax.lax.cond(y > 0, branch, lambda a: a * 2.0, x)

    prog = jaxpr_cc.trace(f, X, Y)
    out, stats = dce(prog)
    assert stats == {"equations-removed": 2, "loop-carries-removed": 1, "results-removed": 1}
    check_values(out, f, X, Y)
    assert out.num_equations() < jax_dce_count(prog)


# --------------------------------------------------------------- effects
def test_effects_and_callbacks_are_never_removed():
    def f(x):
        jax.debug.print("x={x}", x=x)
        dead = jax.jit(lambda a: (jax.debug.print("inner {a}", a=a), a * 2.0)[1])(x)
        del dead
        cb = jax.pure_callback(lambda a: np.asarray(a) * 2, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
        del cb
        unused = jnp.exp(x)
        del unused
        return x + 1.0

    prog = jaxpr_cc.trace(f, X)
    out, stats = dce(prog)
    names = [e.prim.name for e in out.body.equations]
    assert names == ["debug_print", "jit", "pure_callback", "add"]
    jit = out.body.equations[1]
    assert jit.outputs == [] and [e.prim.name for e in jit.params["jaxpr"].equations] == ["debug_print"]
    assert stats == {"equations-removed": 2, "results-removed": 1}
    check_values(out, f, X)


def test_loop_with_effects_is_kept():
    def f(x):
        def body(i, a):
            jax.debug.print("i={i}", i=i)
            return a * 2.0
        jax.lax.fori_loop(0, 2, body, x)
        return x

    prog = jaxpr_cc.trace(f, X)
    out, stats = dce(prog)
    assert any(e.prim.name in ("scan", "while") for e in out.body.equations)
    loop = next(e for e in out.body.equations if e.prim.name in ("scan", "while"))
    printed = str(out)
    assert "debug_print" in printed and "mul" not in printed  # the dead a * 2.0 is gone
    assert loop.outputs == [] or all(o.aval.dtype == jnp.int32 for o in loop.outputs)
    check_values(out, f, X)


# ----------------------------------------------------------- custom rules
@jax.custom_jvp
def _softplus(x):
    return jnp.log1p(jnp.exp(x))


@_softplus.defjvp
def _softplus_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return _softplus(x), t * jax.nn.sigmoid(x)


@jax.custom_vjp
def _clip_grad(x):
    return x


_clip_grad.defvjp(lambda x: (x, None), lambda _, g: (jnp.clip(g, -0.1, 0.1),))


def test_custom_rule_equations_keep_their_signature():
    def f(x):
        a = _softplus(x)
        dead = _softplus(x * 3.0)
        dead2 = _clip_grad(x + 2.0)
        del dead, dead2
        return _clip_grad(a) * 2.0

    prog = jaxpr_cc.trace(f, X)
    custom_before = [e for e in prog.body.equations if e.prim.name.startswith("custom_")]
    out, stats = dce(prog)
    custom_after = [e for e in out.body.equations if e.prim.name.startswith("custom_")]
    assert [e.prim.name for e in custom_after] == ["custom_jvp_call", "custom_vjp_call"]
    assert len(custom_before) == 4
    for eqn in custom_after:  # signature kept, regions unchanged
        original = next(e for e in prog.body.equations if e.prim.name == eqn.prim.name)
        assert len(eqn.inputs) == len(original.inputs) and len(eqn.outputs) == len(original.outputs)
        for (_, _, new), (_, _, old) in zip(eqn.regions(), original.regions()):
            assert len(new.invars) == len(old.invars) and len(new.outvars) == len(old.outvars)
    assert stats["equations-removed"] >= 4
    check_values(out, f, X)
    g = jax.grad(lambda x: jnp.sum(out(x)))(X)
    np.testing.assert_allclose(g, jax.grad(lambda x: jnp.sum(f(x)))(X), rtol=1e-6)


# ------------------------------------------------------------ reference
@pytest.mark.parametrize("fun", [
    lambda x: jax.lax.scan(lambda c, v: (c + v, (c * v, jnp.sin(c))), x[0], x)[1][0],
    lambda x: jax.lax.cond(x[0] > 0, lambda a: (a, a * 2), lambda a: (a + 1, a), x)[0],
    lambda x: jax.jit(lambda a: (a, jnp.exp(a), jnp.cos(a)))(x)[2],
])
def test_never_keeps_more_than_jax_dce(fun):
    prog = jaxpr_cc.trace(fun, X)
    out, _ = dce(prog)
    assert out.num_equations() <= jax_dce_count(prog)
    check_values(out, fun, X)


def test_call_whose_result_only_reaches_a_dropped_output():
    # The outer body returns inner's second result, which nothing outside reads:
    # dce drops it from inner before the outer signature shrinks.
    @jax.jit
    def inner(x):
        return jnp.sin(x), jnp.cos(x), x * 3.0

    @jax.jit
    def outer(x):
        a, b, _ = inner(x)
        return a, b

    def f(x):
        return outer(x)[0]

    x = jnp.float32(0.4)
    optimized = jaxpr_cc.run_passes(jaxpr_cc.trace(f, x), "dce", verify_each=True)
    np.testing.assert_allclose(optimized(x), f(x))
    assert optimized.num_equations() < jaxpr_cc.trace(f, x).num_equations()
