"""``copy-propagation``: what it reads through (printed IR and counts), what it must
never read through, and that results stay JAX's bit for bit under ``jax.jit``."""
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxpr_cc
from jaxpr_cc.passes.manager import PassManager

X = jnp.asarray([np.nan, -0.0, 1e-45, 2.5], jnp.float32)
Y = jnp.asarray([np.inf, 0.0, -1e-45, -3.0], jnp.float32)


def body_text(program) -> str:
    return "\n".join(line for line in str(program).splitlines()
                     if not line.startswith(("func @", "#")))


def propagate(program, then_dce: bool = True):
    manager = PassManager("copy-propagation,dce" if then_dce else "copy-propagation")
    out = manager.run(program)
    return out, manager.statistics[0][1]


def bits(a) -> np.ndarray:
    a = np.array(a)
    if np.issubdtype(a.dtype, np.inexact):
        a[np.isnan(a)] = np.nan
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def check_values(program, fun, *args):
    ours = jax.jit(lambda *a: program(*a))(*args)
    ref = jax.jit(fun)(*args)
    for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(ref)):
        assert a.dtype == b.dtype and a.shape == b.shape and a.weak_type == b.weak_type
        np.testing.assert_array_equal(bits(a), bits(b))


def names(program) -> list[str]:
    return [e.prim.name for e in program.body.equations]


def test_copies_and_placement_free_device_puts_are_read_through():
    def f(x, y):
        a = jnp.copy(jnp.copy(x))        # a chain of copies
        b = jax.device_put(y)            # no device: just "this value"
        return a * b, jnp.copy(a)

    program = jaxpr_cc.trace(f, X, Y)
    assert names(program).count("copy") == 3 and "device_put" in names(program)
    out, stats = propagate(program, then_dce=False)
    assert stats == {"equations-removed": 4, "values-forwarded": 4}
    assert body_text(out) == body_text(jaxpr_cc.trace(lambda x, y: (x * y, x), X, Y))
    check_values(out, f, X, Y)


def test_device_put_to_a_device_is_kept():
    def f(x):
        return jax.device_put(x, jax.devices()[0]) * 2.0

    program = jaxpr_cc.trace(f, X)
    out, stats = propagate(program)
    assert stats == {} and "device_put" in names(out)


def test_weak_to_strong_conversions_are_read_through_where_types_stay():
    def f(x, s, t):
        # s and t are weakly typed Python floats; JAX converts them to strong f32.
        return x * s + t, s * t, s

    program = jaxpr_cc.trace(f, X, 0.5, 2.0)
    before = names(program).count("convert_element_type")
    out, stats = propagate(program)
    after = names(out).count("convert_element_type")
    # x * s and (...) + t stay strongly typed either way: read through.
    assert stats.get("values-forwarded", 0) >= 2 and after < before
    # every result keeps its exact type (weak type included)
    assert [v.aval for v in out.body.outvars] == [v.aval for v in program.body.outvars]
    check_values(out, f, X, 0.5, 2.0)


def test_wrappers_that_pass_values_along():
    one = 1.0

    # JAX itself forwards what a cond, loop or scan passes through as it traces;
    # after simplify removes the ``* 1.0`` these pass values through too.
    def f(x, y):
        a, b = jax.jit(lambda u, v: (u, u * v))(x, y)                          # jit: 1st is u
        c, d = lax.cond(y[0] > 0, lambda u, v: (u * one, u + v), lambda u, v: (u, v), x, y)
        _, e = lax.while_loop(lambda s: s[0] < 3, lambda s: (s[0] + 1, s[1] * one), (0, x))
        (g, _), ys = lax.scan(lambda s, v: ((s[0] * one, s[1] + v), v), (y, x[0]), x)
        return a + b + c + d + e + g + ys

    program = jaxpr_cc.trace(f, X, Y)
    manager = PassManager("simplify,copy-propagation,dce")
    out = manager.run(program)
    assert manager.statistics[1][1] == {"values-forwarded": 4}
    # the loops read through are gone: nothing else needed them
    assert "while" not in names(out) and "scan" not in names(out)
    check_values(out, f, X, Y)
    check_values(out, f, X, -Y)


def test_literal_results_of_calls_are_forwarded():
    def f(x):
        a, b = jax.jit(lambda u: (u * 2.0, jnp.float32(7.0)))(x)
        return a + b

    program = jaxpr_cc.trace(f, X)
    out, stats = propagate(program)
    assert stats == {"values-forwarded": 1}
    add = [e for e in out.body.equations if e.prim.name == "add"][0]
    assert float(np.asarray(add.inputs[1].val)) == 7.0
    check_values(out, f, X)


def test_identity_custom_rules_are_not_read_through():
    @jax.custom_vjp
    def clip_gradient(x):
        return x

    clip_gradient.defvjp(lambda x: (x, None), lambda _, g: (jnp.clip(g, -0.5, 0.5),))

    def f(x):
        return jnp.sum(clip_gradient(x) * 3.0)

    program = jaxpr_cc.trace(f, X)
    out, stats = propagate(program)
    custom = next(e for e in out.body.equations if e.prim.name == "custom_vjp_call")
    mul = next(e for e in out.body.equations if e.prim.name == "mul")
    assert mul.inputs[0] is custom.outputs[0]
    x = jnp.arange(4.0, dtype=jnp.float32)
    np.testing.assert_array_equal(jax.grad(lambda a: out(a))(x), jax.grad(f)(x))
    np.testing.assert_array_equal(jax.grad(f)(x), np.full(4, 0.5, np.float32))


def test_resharding_jits_and_shard_maps_are_not_read_through():
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:2]), ("d",))
    sharding = NamedSharding(mesh, P("d"))

    def f(x):
        a = jax.jit(lambda u: u, out_shardings=sharding)(x)
        b = jax.shard_map(lambda u: u, mesh=mesh, in_specs=P("d"), out_specs=P("d"))(x)
        return a, b

    program = jaxpr_cc.trace(f, X)
    out, stats = propagate(program)
    assert stats == {}
    assert names(out) == names(program)


def test_effects_inside_forwarding_wrappers_stay(capfd):
    def f(x):
        def body(u):
            jax.debug.print("saw {u}", u=u[3])
            return u
        return jax.jit(body)(x) * 2.0

    program = jaxpr_cc.trace(f, X)
    out, stats = propagate(program)
    assert stats == {"values-forwarded": 1}
    assert "jit" in names(out)   # kept for its effect
    capfd.readouterr()
    jax.block_until_ready(out(X))
    jax.effects_barrier()
    assert capfd.readouterr().out == "saw 2.5\n"


def test_nested_regions_are_propagated_inside():
    def f(x, y):
        return lax.cond(y[0] > 0, lambda u: jnp.copy(u) * 2.0, lambda u: -jnp.copy(jnp.copy(u)), x)

    program = jaxpr_cc.trace(f, X, Y)
    out, stats = propagate(program)
    assert stats == {"equations-removed": 3, "values-forwarded": 3}
    assert not any(e.prim.name == "copy" for _, e in out.body.walk())
    check_values(out, f, X, Y)
    check_values(out, f, X, -Y)
