"""Unit tests of the graph IR: use-def API, ordering, verifier, printer."""
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_cc
from jaxpr_cc.ir.equation import Equation
from jaxpr_cc.ir.region import IRError
from jaxpr_cc.ir.value import Value
from jaxpr_cc.ir.verifier import VerificationError


def _chain(x, y):
    a = jnp.sin(x)
    b = a * y
    c = b + a
    return c, jnp.cos(c)


@pytest.fixture
def prog():
    return jaxpr_cc.trace(_chain, jnp.arange(3.0), 2.0)


def _eqn(program, name):
    return next(e for e in program.body.equations if e.prim.name == name)


def test_producer_and_users(prog):
    body = prog.body
    sin = _eqn(prog, "sin")
    a = sin.outputs[0]
    assert body.producer(a) is sin
    users = body.users(a)
    assert sorted(u.prim.name for u, _ in users) == ["add", "mul"]
    x = prog.arg_values[0]
    assert body.producer(x) is body.entry
    assert [(u.prim.name, pos) for u, pos in body.users(x)] == [("sin", 0)]
    # a region output is used by the exit sentinel at the output's position
    add = _eqn(prog, "add")
    assert (body.exit, 0) in body.users(add.outputs[0])


def test_replace_all_uses_with_rewires_graph_and_values(prog):
    body = prog.body
    sin = _eqn(prog, "sin")
    x = prog.arg_values[0]
    moved = body.replace_all_uses_with(sin.outputs[0], x)
    assert moved == 2
    assert body.users(sin.outputs[0]) == []
    body.erase(sin)
    prog.verify()
    xs, y = jnp.arange(3.0), 2.0
    expect = (xs * y + xs, jnp.cos(xs * y + xs))
    out = prog(xs, y)
    np.testing.assert_array_equal(out[0], expect[0])
    np.testing.assert_array_equal(out[1], expect[1])


def test_erase_refuses_used_equation(prog):
    with pytest.raises(IRError, match="still used"):
        prog.body.erase(_eqn(prog, "sin"))


def test_insert_keeps_valid_order_and_semantics(prog):
    body = prog.body
    mul = _eqn(prog, "mul")
    # insert `neg` of mul's result right after mul and route the add through it
    neg_out = Value(mul.outputs[0].aval)
    neg = Equation(jax.lax.neg_p, [mul.outputs[0]], [neg_out], {})
    body.insert_after(mul, neg)
    add = _eqn(prog, "add")
    body.set_operand(add, 0, neg_out)
    assert body.order_is_valid()
    prog.verify()
    xs, y = jnp.arange(3.0), 2.0
    np.testing.assert_array_equal(prog(xs, y)[0], -(jnp.sin(xs) * y) + jnp.sin(xs))


def test_topo_order_repairs_invalid_order_deterministically(prog):
    body = prog.body
    eqns = body.equations
    body._order = dict.fromkeys(reversed(eqns))  # deliberately invalid
    assert not body.order_is_valid()
    order = body.topo_order()
    assert order == body.topo_order()  # deterministic
    position = {e: i for i, e in enumerate(order)}
    for e in order:  # valid: every operand defined earlier
        for a in e.inputs:
            if isinstance(a, Value) and a.producer is not body.entry:
                assert position[a.producer] < position[e]
    # ties are broken by the current (reversed) order: y's convert now comes first
    assert order[0].prim.name == "convert_element_type"
    body.sort()
    assert body.order_is_valid() and body.topo_order() == order  # stable once valid
    prog.verify()


def test_verifier_names_equation_and_value(prog):
    body = prog.body
    add = _eqn(prog, "add")
    stray = Value(add.inputs[0].aval, None, 0, "stray")
    add.inputs[1] = stray  # bypass the API: no edge, no definition
    with pytest.raises(VerificationError, match=r"equation #\d+ \(add\).*operand 1.*stray"):
        prog.verify()


def test_verifier_catches_type_errors(prog):
    body = prog.body
    mul = _eqn(prog, "mul")
    wrong = body.add_input(jax.core.ShapedArray((5,), jnp.float32), name="wrong")
    body.set_operand(mul, 0, wrong)
    prog.in_tree = jax.tree_util.tree_structure(((0, 0, 0), {}))
    with pytest.raises(VerificationError, match="type error"):
        prog.verify()


def test_verifier_catches_dangling_node(prog):
    body = prog.body
    sin = _eqn(prog, "sin")
    del body._order[sin]
    with pytest.raises(VerificationError):
        prog.verify()


def test_regions_are_nested_and_walked():
    def f(x):
        y = jax.lax.cond(x.sum() > 0, lambda v: v * 2, lambda v: v - 1, x)
        return jax.lax.scan(lambda c, v: (c + v, c * v), 0.0, y)

    p = jaxpr_cc.trace(f, jnp.arange(4.0))
    names = [e.prim.name for _, e in p.body.walk()]
    assert "cond" in names and "scan" in names
    assert "mul" in names and "sub" in names  # from inside the regions
    cond = _eqn(p, "cond")
    assert [(k, i) for k, i, _ in cond.regions()] == [("branches", 0), ("branches", 1)]
    assert len(list(p.body.regions())) == 4


def test_trace_keeps_pytrees_and_names():
    def f(params, x, *, scale):
        return {"y": params["w"] @ x * scale, "aux": (x.sum(), params["b"])}

    params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(2)}
    x = jnp.arange(3.0)
    p = jaxpr_cc.trace(f, params, x, scale=2.0)
    assert [v.name for v in p.arg_values] == ["params.b", "params.w", "x", "scale"]
    out = p(params, x, scale=3.0)
    ref = f(params, x, scale=3.0)
    assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(ref)
    jax.tree_util.tree_map(np.testing.assert_array_equal, out, ref)
    with pytest.raises(TypeError, match="structure"):
        p(params, x)


def test_trace_accepts_shape_dtype_structs_and_scalars():
    def f(x, n):
        return x * n
    p = jaxpr_cc.trace(f, jax.ShapeDtypeStruct((4,), jnp.float16), 3)
    assert "f16[4]" in str(p)
    np.testing.assert_array_equal(p(jnp.ones(4, jnp.float16), 3), jnp.ones(4, jnp.float16) * 3)


def test_printer_shows_large_constants_as_hash():
    big = np.arange(100, dtype=np.float32)

    def f(x):
        return x + big.sum() + jnp.asarray(big)[:3]

    text = str(jaxpr_cc.trace(f, jnp.ones(3)))
    assert "sha256:" in text and "f32[100]" in text
    assert "0x" not in text


def test_printing_is_deterministic_across_processes():
    script = textwrap.dedent("""
        import jax, jax.numpy as jnp, jaxpr_cc
        from jaxpr_cc.examples import fixed_point as ex
        def g(x, y):
            z = jax.lax.cond(x.sum() > 0, lambda a: a * 2, lambda a: a - 1, x)
            w = jax.jit(lambda a: a + 1)(z)
            return {"b": y * w, "a": ex.newton_sqrt(y)}, jax.lax.scan(lambda c, a: (c + a, c), 0., x)
        print(jaxpr_cc.trace(g, jnp.ones(3), 2.0))
    """)
    outs = []
    for seed in ("1", "2"):
        env = {"PYTHONHASHSEED": seed}
        import os
        env = {**os.environ, **env}
        outs.append(subprocess.run([sys.executable, "-c", script], capture_output=True,
                                   text=True, check=True, env=env).stdout)
    assert outs[0] == outs[1]
    assert "custom_vjp_call" in outs[0]


def test_from_jaxpr_without_trees_behaves_like_jaxpr_as_fun():
    cj = jax.make_jaxpr(lambda a, b: (a * b, a - b))(1.0, 2.0)
    p = jaxpr_cc.Program.from_jaxpr(cj)
    out = p(3.0, 4.0)
    assert isinstance(out, list) and [float(v) for v in out] == [12.0, -1.0]


def test_copy_is_deep(prog):
    dup = prog.copy()
    dup.body.replace_all_uses_with(_eqn(dup, "sin").outputs[0], dup.arg_values[0])
    assert str(prog) != str(dup)
    prog.verify()
    dup.verify()
