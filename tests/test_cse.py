"""``cse``: what it merges (counts and printed IR), what it must never merge, and
that results stay JAX's (bit for bit)."""
import jax
import jax.numpy as jnp
import numpy as np

import jaxpr_cc
from jaxpr_cc.passes.manager import PassManager

X = jnp.linspace(-1.0, 1.0, 4, dtype=jnp.float32)
Y = jnp.float32(0.5)


def body_text(program) -> str:
    lines = str(program).splitlines()
    return "\n".join(line for line in lines if not line.startswith(("func @", "#")))


def cse(program):
    manager = PassManager("cse")
    out = manager.run(program)
    return out, manager.statistics[0][1]


def check_values(program, fun, *args):
    # Both sides compiled the same way (op-by-op evaluation may round differently).
    ours = jax.jit(lambda *a: program(*a))(*args)
    ref = jax.jit(fun)(*args)
    for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(ref)):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(np.asarray(a).reshape(-1).view(np.uint8),
                                      np.asarray(b).reshape(-1).view(np.uint8))


def test_duplicates_and_chains_of_duplicates_merge():
    def dup(x, y):
        a = jnp.sin(x) * y + 1.0
        b = jnp.sin(x) * y + 1.0      # a chain of three duplicates
        c = jnp.cos(a) + jnp.cos(b)   # the cos equations become duplicates after merging
        return c, a - b

    def single(x, y):
        a = jnp.sin(x) * y + 1.0
        ca = jnp.cos(a)
        return ca + ca, a - a

    prog = jaxpr_cc.trace(dup, X, Y)
    out, stats = cse(prog)
    assert stats == {"equations-merged": 4}
    assert out.num_equations() == prog.num_equations() - 4
    assert body_text(out) == body_text(jaxpr_cc.trace(single, X, Y))
    check_values(out, dup, X, Y)


def test_different_parameters_literals_or_types_do_not_merge():
    def f(x):
        return (jnp.sum(x, axis=0), jnp.sum(x.reshape(2, 2), axis=1),
                x + 0.0, x + (-0.0),                 # differ only in the sign bit of a literal
                x ** 2, x ** 3,                      # integer_pow y=2 vs y=3
                x.astype(jnp.int32), x.astype(jnp.int16),
                x * 2.0, x * 2.0)                    # the only duplicate

    prog = jaxpr_cc.trace(f, X)
    out, stats = cse(prog)
    assert stats == {"equations-merged": 1}
    muls = [e for e in out.body.equations if e.prim.name == "mul"]
    assert len(muls) == 1
    zeros = jnp.array([-0.0, 0.0, 1.0, -1.0], jnp.float32)
    check_values(out, f, zeros)


def test_merging_inside_regions_and_of_whole_regions():
    def dup(x, y):
        def branch(a):
            return jnp.exp(a) + jnp.exp(a)

        r1 = jax.lax.cond(y > 0, branch, lambda a: a, x)
        r2 = jax.lax.cond(y > 0, branch, lambda a: a, x)   # identical cond: merged whole
        s1 = jax.lax.scan(lambda c, v: (c + v * 2.0, c), 0.0, x)
        s2 = jax.lax.scan(lambda c, v: (c + v * 2.0, c), 0.0, x)
        s3 = jax.lax.scan(lambda c, v: (c + v * 3.0, c), 0.0, x)  # different body: kept
        return r1 + r2, s1, s2, s3

    def single(x, y):
        def branch(a):
            e = jnp.exp(a)
            return e + e

        r = jax.lax.cond(y > 0, branch, lambda a: a, x)
        s = jax.lax.scan(lambda c, v: (c + v * 2.0, c), 0.0, x)
        s3 = jax.lax.scan(lambda c, v: (c + v * 3.0, c), 0.0, x)
        return r + r, s, s, s3

    prog = jaxpr_cc.trace(dup, X, Y)
    out, stats = cse(prog)
    names = [e.prim.name for e in out.body.equations]
    assert names.count("cond") == 1 and names.count("scan") == 2
    assert body_text(out) == body_text(jaxpr_cc.run_passes(jaxpr_cc.trace(single, X, Y), "cse"))
    # exp in branch 0 (one function: JAX traced `branch` once and both conds call
    # it), the second cond, the second scan's two operand-preparing equations and the
    # second scan itself.
    assert stats == {"equations-merged": 5}
    check_values(out, dup, X, Y)
    check_values(out, dup, X, -Y)


def test_values_do_not_cross_regions():
    def f(x, y):
        outer = jnp.sin(x)
        inner = jax.lax.cond(y > 0, lambda a: jnp.sin(a), lambda a: a, x)
        return outer + inner

    prog = jaxpr_cc.trace(f, X, Y)
    out, stats = cse(prog)
    assert stats == {}
    assert body_text(out) == body_text(prog)


def test_effectful_random_and_callback_equations_never_merge():
    def f(x, key):
        jax.debug.print("x={x}", x=x)
        jax.debug.print("x={x}", x=x)
        r1 = jax.random.bits(key, (4,))
        r2 = jax.random.bits(key, (4,))
        n1 = jax.random.normal(key, (4,))   # a jit whose body draws random bits
        n2 = jax.random.normal(key, (4,))
        spec = jax.ShapeDtypeStruct(x.shape, x.dtype)
        c1 = jax.pure_callback(lambda a: np.asarray(a) + 1, spec, x)
        c2 = jax.pure_callback(lambda a: np.asarray(a) + 1, spec, x)
        return r1, r2, n1 + n2, c1 + c2

    key = jax.random.key(0)
    prog = jaxpr_cc.trace(f, X, key)
    out, stats = cse(prog)
    names = [e.prim.name for e in out.body.equations]
    assert names.count("debug_print") == 2
    assert names.count("random_bits") == 2
    assert names.count("pure_callback") == 2
    assert names.count("jit") == [e.prim.name for e in prog.body.equations].count("jit")
    # random_wrap / random_unwrap / key_data plumbing may merge, nothing else
    merged_names = {e.prim.name for e in prog.body.equations} - set(names)
    assert merged_names <= {"random_unwrap", "random_wrap"}
    ours = out(X, key)
    ref = f(X, key)
    jax.tree_util.tree_map(np.testing.assert_array_equal, ours, ref)
    del stats


def test_cse_is_deterministic():
    def f(x):
        outs = [jnp.tanh(x * 2.0) for _ in range(3)]
        return sum(outs)

    prog = jaxpr_cc.trace(f, X)
    texts = {str(cse(prog)[0]) for _ in range(3)}
    assert len(texts) == 1
