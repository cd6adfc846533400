"""``hoist-consts``: constants become bound parameters; programs keep their calling
convention and JAX's results; new values need no recompilation."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_cc
from jaxpr_cc.passes.manager import PassManager, run_passes

X = jnp.linspace(-1.0, 1.0, 4, dtype=jnp.float32)
TABLE = np.array([0.5, -1.5, 2.0, 3.25], dtype=np.float32)
SAME_BYTES = TABLE.copy()               # equal content, distinct object
OTHER = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)


def hoist(program, pipeline="hoist-consts"):
    manager = PassManager(pipeline)
    out = manager.run(program)
    return out, manager.statistics[0][1]


def nested_consts(program) -> int:
    return sum(len(r.constvars) for r in program.body.regions()) - len(program.body.constvars)


def assert_same(a, b):
    jax.tree_util.tree_map(np.testing.assert_array_equal, a, b)


def test_top_level_constants_become_params():
    def f(x):
        return jnp.sin(x * TABLE) + OTHER

    prog = jaxpr_cc.trace(f, X)
    assert len(prog.body.constvars) == 2
    out, stats = hoist(prog)
    assert stats == {"constants-hoisted": 2, "params-added": 2,
                     "bytes-hoisted": TABLE.nbytes + OTHER.nbytes}
    assert out.body.constvars == [] and len(out.params) == 2
    assert [v.aval.shape for v in out.body.invars] == [(4,), (4,), (4,)]
    assert "# bound params: 2" in str(out)
    assert_same(out(X), f(X))                     # the original calling convention
    assert_same(jax.jit(lambda x: out(x))(X), jax.jit(f)(X))
    np.testing.assert_allclose(jax.grad(lambda x: out(x).sum())(X),
                               jax.grad(lambda x: f(x).sum())(X), rtol=1e-6)


def test_nested_constants_are_threaded_through_every_kind_of_region():
    def f(x, p):
        a = jax.jit(lambda v: v * TABLE)(x)
        b = jax.lax.cond(p > 0, lambda v: jax.jit(lambda u: u + OTHER)(v), lambda v: v, x)
        c = jax.lax.while_loop(lambda s: s[0] < 3,
                               lambda s: (s[0] + 1, jax.jit(lambda u: u * SAME_BYTES)(s[1])), (0, x))[1]
        d = jax.lax.scan(lambda s, v: (s + jax.jit(lambda u: u - OTHER)(v), s), x, jnp.stack([x, x]))[0]
        e = jax.lax.while_loop(lambda s: jax.jit(lambda u: (u * TABLE).sum())(s) < 100.0,
                               lambda s: s * 2.0 + 1.0, x)
        return a + b + c + d + e

    prog = jaxpr_cc.trace(f, X, jnp.float32(1.0))
    assert nested_consts(prog) == 5
    out, stats = hoist(prog)
    assert nested_consts(out) == 0 and out.body.constvars == []
    # TABLE and SAME_BYTES have the same bytes: two parameters, not three.
    assert len(out.params) == 2 and stats["params-added"] == 2
    assert stats["constants-hoisted"] == 5 + len(prog.body.constvars)
    assert stats["constants-deduplicated"] == stats["constants-hoisted"] - 2
    for p in (jnp.float32(1.0), jnp.float32(-1.0)):
        assert_same(jax.jit(lambda x, p: out(x, p))(X, p), jax.jit(f)(X, p))
    loop = next(e for e in out.body.equations if e.prim.name == "while")
    assert loop.params["body_nconsts"] == 1 and len(loop.inputs) == 3
    scan = next(e for e in out.body.equations if e.prim.name == "scan")
    assert scan.params["num_consts"] == 1


def test_dedupe_options_and_min_bytes():
    def f(x):
        return x * TABLE + x * SAME_BYTES + x * TABLE.astype(np.int32) + x * np.float32(2.5)

    prog = jaxpr_cc.trace(f, X)
    n_consts = len(prog.body.constvars)
    out, stats = hoist(prog)
    assert len(out.params) == 2  # TABLE (and its copy), the int32 version
    assert stats["constants-deduplicated"] == n_consts - 2

    out, stats = hoist(prog, "hoist-consts{dedupe=false}")
    assert len(out.params) == n_consts and "constants-deduplicated" not in stats

    out, stats = hoist(prog, f"hoist-consts{{min-bytes={TABLE.nbytes + 1}}}")
    assert out.params == () and stats == {}
    assert_same(out(X), f(X))


def test_literals_are_hoisted_on_request():
    def f(x):
        return x * 2.5 + 1.0 + jnp.float32(2.5) * jnp.sin(x)

    prog = jaxpr_cc.trace(f, X)
    out, stats = hoist(prog, "hoist-consts{literals=true}")
    assert stats["literals-hoisted"] == stats["constants-hoisted"] >= 3
    assert len(out.params) == 2  # 2.5 (used twice) and 1.0
    assert not any(type(a).__name__ == "Literal" for e in out.body.equations for a in e.inputs)
    assert_same(jax.jit(lambda x: out(x))(X), jax.jit(f)(X))

    out, stats = hoist(prog, "hoist-consts{literals=true min-bytes=8}")
    assert out.params == () and stats == {}


def test_with_params_rebinds_without_changing_the_body():
    def f(x):
        return jnp.tanh(x @ np.eye(4, dtype=np.float32) * TABLE)

    out, _ = hoist(jaxpr_cc.trace(f, X))
    n = len(out.params)
    new = [np.asarray(p) * 2 for p in out.params]
    rebound = out.with_params(*new)
    assert rebound.body is out.body and out.params[0] is not rebound.params[0]
    scaled = TABLE * 2

    def g(x):
        return jnp.tanh(x @ (2 * np.eye(4, dtype=np.float32)) * scaled)

    np.testing.assert_allclose(rebound(X), g(X), rtol=1e-6)
    with pytest.raises(ValueError, match=rf"with_params got 1 values for {n} hoisted parameters"):
        out.with_params(new[0])
    bad = [np.zeros((3,), np.float32) if p.shape == (4,) else p for p in new]
    with pytest.raises(ValueError, match=r"hoisted parameter \d .* is float32\[4\], got float32\[3\]"):
        out.with_params(*bad)
    bad = [np.asarray(p, np.float64) for p in new]
    with pytest.raises(ValueError, match=r"got float64"):
        out.with_params(*bad)


def test_compiled_program_takes_params_as_arguments():
    traces = []

    def f(x):
        return jnp.sum(jnp.sin(x * TABLE))

    out, _ = hoist(jaxpr_cc.trace(f, X))

    def flat(params, x):
        traces.append(1)  # counts retracing (and so recompilation)
        return out.with_params(*params)(x)

    compiled = jax.jit(flat)
    first = compiled(out.params, X)
    assert_same(first, jax.jit(f)(X))
    second = compiled((np.asarray(out.params[0]) + 1.0,), X)
    assert len(traces) == 1
    np.testing.assert_allclose(second, np.sum(np.sin(np.asarray(X) * (TABLE + 1.0))), rtol=1e-6)
    # The lowered module holds no copy of the constant.
    text = jax.jit(flat).lower(out.params, X).as_text()
    assert "3.25" not in text and "dense<[5.000000e-01" not in text


def test_first_order_custom_rules_receive_constants_as_operands():
    body = jax.jit(lambda v: jnp.sin(v) + TABLE)

    @jax.custom_vjp
    def g(x):
        return body(x)

    g.defvjp(lambda x: (body(x), x), lambda r, ct: (jax.jit(lambda v: v * OTHER)(ct) * jnp.cos(r),))

    prog = jaxpr_cc.trace(lambda x: g(x) * 2.0, X)
    # The rules are regions, but the jits inside them carry constants: that is
    # the only thing keeping the program from being first-order.
    assert nested_consts(prog) > 0 and not prog.is_first_order()
    out, stats = hoist(prog)
    assert nested_consts(out) == 0 and "constants-left-nested" not in stats
    assert out.is_first_order()
    assert len(out.params) == 2
    call = next(e for e in out.body.equations if e.prim.name == "custom_vjp_call")
    assert call.params["num_consts"] == 2
    assert_same(out(X), g(X) * 2.0)
    np.testing.assert_allclose(jax.grad(lambda x: out(x).sum())(X),
                               jax.grad(lambda x: (g(x) * 2.0).sum())(X), rtol=1e-6)


def test_constants_inside_a_recursive_rule_stay_and_are_reported():
    # g's fwd calls g: its rule is a cycle, and threading a new operand through it
    # would have to thread it through its own inner call too.  The constants stay.
    @jax.custom_vjp
    def g(x):
        return jax.jit(lambda v: jnp.sin(v) + TABLE)(x)

    g.defvjp(lambda x: (g(x), x), lambda r, ct: (jax.jit(lambda v: v * OTHER)(ct) * jnp.cos(r),))
    prog = jaxpr_cc.trace(lambda x: g(x) * 2.0, X)
    out, stats = hoist(prog)
    assert stats.get("constants-left-nested", 0) > 0
    assert_same(out(X), g(X) * 2.0)
    np.testing.assert_allclose(jax.grad(lambda x: out(x).sum())(X),
                               jax.grad(lambda x: (g(x) * 2.0).sum())(X), rtol=1e-6)


def test_constants_of_opaque_custom_rules_stay_and_are_reported():
    @jax.custom_jvp
    def f(x):
        return jax.jit(lambda v: v * TABLE)(x)

    f.defjvp(lambda p, t: (f(p[0]), t[0] * TABLE))
    # JAX's own form: the rule is a Python callable the pass cannot rewrite.
    closed = jax.make_jaxpr(f)(X)
    prog = jaxpr_cc.Program.from_jaxpr(closed)
    assert not prog.is_first_order()
    inner = nested_consts(prog)
    assert inner >= 1
    out, stats = hoist(prog)
    assert stats["constants-left-nested"] == inner
    assert nested_consts(out) == inner
    assert_same(out(X), [f(X)])


def test_running_twice_adds_nothing_and_keeps_existing_params():
    def f(x):
        return x * TABLE

    once = run_passes(jaxpr_cc.trace(f, X), "hoist-consts")
    manager = PassManager("hoist-consts")
    twice = manager.run(once)
    assert manager.statistics == [("hoist-consts", {})]
    assert len(twice.params) == 1 and twice.params[0] is once.params[0]
