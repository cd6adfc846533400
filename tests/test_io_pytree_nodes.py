"""Custom pytree nodes in a program's calling convention are saved as data.

An equinox Module or a ``register_pytree_node_class`` class as an argument or a
result is written as its type name, the key-path entry of each child and the
children, and its auxiliary (static) data when that is plain data (never its
class or code).  ``jaxpr_cc.load(path)`` gives a
program taking ``SavedNode``s (or the original objects) with the same leaves and key
paths; ``load(path, like=example_args)`` restores the caller's structure, checking
that it fits.  Values and gradients are compared with ``jax.jit`` of the original
function.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import zipfile

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_cc
from jaxpr_cc.io.pytrees import SavedNode


class Linear(eqx.Module):
    weight: jax.Array
    bias: jax.Array
    activation: str = eqx.field(static=True, default="tanh")

    def __call__(self, x):
        return jnp.tanh(self.weight @ x + self.bias)


class Net(eqx.Module):
    layers: tuple
    scale: jax.Array


@jax.tree_util.register_pytree_node_class
class Pair:
    def __init__(self, first, second):
        self.first, self.second = first, second

    def tree_flatten(self):
        return (self.first, self.second), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)


def make_net(seed=0, width=3):
    k1, k2, k3, k4 = jax.random.split(jax.random.key(seed), 4)
    return Net(layers=(Linear(jax.random.normal(k1, (4, width)), jax.random.normal(k2, (4,))),
                       Linear(jax.random.normal(k3, (2, 4)), jax.random.normal(k4, (2,)))),
               scale=jnp.float32(1.5))


def net_loss(net, x):
    for layer in net.layers:
        x = layer(x)
    return jnp.sum(x ** 2) * net.scale


def pair_fn(p, x):
    return Pair(p.first * x, p.second + x)


X = jnp.array([0.5, -1.0, 2.0], jnp.float32)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("pytree_nodes")
    net = make_net()
    out = {}
    for name, fun, args in [("loss", net_loss, (net, X)),
                            ("grad", jax.grad(net_loss), (net, X)),
                            ("pair", pair_fn, (Pair(jnp.ones(3), jnp.zeros(3)), X))]:
        program = jaxpr_cc.trace(fun, *args)
        path = d / f"{name}.jcc"
        jaxpr_cc.save(program, path)
        out[name] = (path, program, fun, args)
    return out


def test_saved_as_data_with_key_paths(files):
    path, *_ = files["loss"]
    doc = json.loads(zipfile.ZipFile(path).read("program.json"))
    net = doc["in_tree"]["tuple"][0]["tuple"][0]
    assert net["custom"] == "Net" and net["module"] == __name__
    assert net["keys"] == [{"attr": "layers"}, {"attr": "scale"}]
    layer = net["children"][0]["tuple"][0]
    # the static field is saved as data; equinox's MISSING sentinel as its type name
    assert layer == {"custom": "Linear", "module": __name__,
                     "keys": [{"attr": "weight"}, {"attr": "bias"}], "children": ["*", "*"],
                     "static": {"tuple": [{"object": "equinox._module._flatten._Missing"},
                                          "tanh"]}}
    pair_doc = json.loads(zipfile.ZipFile(files["pair"][0]).read("program.json"))
    assert pair_doc["out_tree"]["keys"] == [{"flat": 0}, {"flat": 1}]


def test_load_gives_saved_nodes_with_the_same_leaves_and_key_paths(files):
    path, program, fun, args = files["loss"]
    loaded = jaxpr_cc.load(path)
    leaves_with_paths = jax.tree_util.tree_flatten_with_path(args)[0]
    call_args, call_kwargs = jax.tree_util.tree_unflatten(
        loaded.in_tree, [leaf for _, leaf in leaves_with_paths])
    assert call_kwargs == {}
    node = call_args[0]
    assert isinstance(node, SavedNode) and node.type_name == f"{__name__}.Net"
    assert node.layers[0].weight is args[0].layers[0].weight
    assert node.scale is args[0].scale
    assert [p for p, _ in jax.tree_util.tree_flatten_with_path(call_args)[0]] == \
        [p for p, _ in leaves_with_paths]
    ref = jax.jit(fun)(*args)
    np.testing.assert_allclose(np.asarray(loaded(*call_args)), np.asarray(ref), rtol=1e-6)
    # the original objects fit the saved nodes too
    np.testing.assert_allclose(np.asarray(loaded(*args)), np.asarray(ref), rtol=1e-6)


def test_saving_a_loaded_program_gives_the_same_bytes(files, tmp_path):
    for path, *_ in files.values():
        loaded = jaxpr_cc.load(path)
        jaxpr_cc.save(loaded, tmp_path / "again.jcc")
        assert (tmp_path / "again.jcc").read_bytes() == path.read_bytes()
        assert str(loaded) == str(jaxpr_cc.load(tmp_path / "again.jcc"))


def test_like_restores_arguments_and_results(files):
    path, program, fun, args = files["grad"]
    restored = jaxpr_cc.load(path, like=args)
    assert restored.in_tree == program.in_tree
    out = restored(*args)
    ref = jax.jit(fun)(*args)
    assert isinstance(out, Net) and isinstance(out.layers[1], Linear)
    assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(ref)
    for a, b in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(ref)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-6, atol=1e-6)
    plain = jaxpr_cc.load(path)(*args)
    assert isinstance(plain, SavedNode)
    assert [np.asarray(v).tolist() for v in jax.tree_util.tree_leaves(plain)] == \
        [np.asarray(v).tolist() for v in jax.tree_util.tree_leaves(out)]


def test_like_with_register_pytree_node_class(files):
    path, program, fun, args = files["pair"]
    restored = jaxpr_cc.load(path, like=args)
    out = restored(*args)
    assert isinstance(out, Pair)
    ref = jax.jit(fun)(*args)
    np.testing.assert_array_equal(np.asarray(out.first), np.asarray(ref.first))
    np.testing.assert_array_equal(np.asarray(out.second), np.asarray(ref.second))
    assert isinstance(jaxpr_cc.load(path)(*args), SavedNode)


@pytest.mark.parametrize("mode", ["jit", "vmap", "grad", "compiled"])
def test_loaded_program_under_transformations(files, mode):
    path, program, fun, args = files["loss"]
    net, x = args
    restored = jaxpr_cc.load(path, like=args)
    if mode == "jit":
        got, ref = jax.jit(restored)(net, x), jax.jit(fun)(net, x)
    elif mode == "vmap":
        xs = jnp.stack([x, 2 * x, -x])
        got = jax.vmap(restored, in_axes=(None, 0))(net, xs)
        ref = jax.vmap(jax.jit(fun), in_axes=(None, 0))(net, xs)
    elif mode == "grad":
        got, ref = jax.grad(restored)(net, x), jax.jit(jax.grad(fun))(net, x)
    else:
        got, ref = jaxpr_cc.compile(restored)(net, x), jax.jit(fun)(net, x)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(ref)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=1e-6)


def test_like_that_does_not_fit_is_refused(files):
    path, program, fun, args = files["loss"]
    with pytest.raises(jaxpr_cc.LoadError, match=r"like does not fit the saved arguments: .*"
                                                 r"args\[0\]\.layers\[0\]\.weight is "
                                                 r"float32\[4,5\], but the saved program was "
                                                 r"traced with float32\[4,3\]"):
        jaxpr_cc.load(path, like=(make_net(width=5), X))
    with pytest.raises(jaxpr_cc.LoadError, match=r"like does not fit the saved arguments: "
                                                 r"args\[0\] is a tuple where the program takes "
                                                 rf"a {__name__}\.Net \(a custom pytree node"):
        jaxpr_cc.load(path, like=((1.0, 2.0), X))
    with pytest.raises(jaxpr_cc.LoadError, match=r"like does not fit .*args has 1 entries where "
                                                 r"the program takes 2"):
        jaxpr_cc.load(path, like=(args[0],))
    with pytest.raises(jaxpr_cc.LoadError, match=r"like must be a tuple of example positional "
                                                 r"arguments"):
        jaxpr_cc.load(path, like=args[0])


def test_loaded_program_refuses_wrong_leaves_and_nodes(files):
    path, program, fun, args = files["loss"]
    loaded = jaxpr_cc.load(path)
    with pytest.raises(TypeError, match=r"args\[0\]\.layers\[1\]\.bias is float32\[3\], but the "
                                        r"program was traced with float32\[2\]"):
        loaded(eqx.tree_at(lambda n: n.layers[1].bias, args[0], jnp.ones(3)), X)
    with pytest.raises(TypeError, match=r"args\[0\] is a .*Pair where the program takes a "
                                        rf"{__name__}\.Net"):
        loaded(Pair(1.0, 2.0), X)


def test_executable_with_like_restored_program(files):
    path, program, fun, args = files["pair"]
    exe = jaxpr_cc.compile(jaxpr_cc.load(path, like=args))
    out = exe(*args)
    assert isinstance(out, Pair)
    np.testing.assert_array_equal(np.asarray(out.first), np.asarray(jax.jit(fun)(*args).first))


def test_executable_of_a_loaded_program_takes_the_original_objects(files):
    path, program, fun, args = files["loss"]
    exe = jaxpr_cc.compile(jaxpr_cc.load(path))
    np.testing.assert_allclose(np.asarray(exe(*args)), np.asarray(jax.jit(fun)(*args)),
                               rtol=1e-6)
    with pytest.raises(TypeError, match=r"args\[0\] is a .*Pair where the program takes a "
                                        rf"{__name__}\.Net"):
        exe(Pair(1.0, 2.0), X)


def test_like_also_restores_namedtuples_and_plain_structures(tmp_path):
    import collections
    Point = collections.namedtuple("Point", ["x", "y"])
    program = jaxpr_cc.trace(lambda p: Point(p.y, p.x), Point(jnp.ones(2), jnp.zeros(2)))
    jaxpr_cc.save(program, tmp_path / "nt.jcc")
    restored = jaxpr_cc.load(tmp_path / "nt.jcc", like=(Point(jnp.ones(2), jnp.zeros(2)),))
    out = restored(Point(jnp.ones(2), jnp.zeros(2)))
    assert type(out) is Point
    np.testing.assert_array_equal(np.asarray(out.x), np.zeros(2))


def test_original_node_with_other_children_is_refused(tmp_path):
    class Point(eqx.Module):
        x: jax.Array
        y: jax.Array

    program = jaxpr_cc.trace(lambda p: p.x * p.y, Point(jnp.ones(2), jnp.ones(2)))
    jaxpr_cc.save(program, tmp_path / "pt.jcc")
    loaded = jaxpr_cc.load(tmp_path / "pt.jcc")

    class Point(eqx.Module):  # noqa: F811  (same name, other fields)
        x: jax.Array
        z: jax.Array

    with pytest.raises(TypeError, match=r"args\[0\] has children \['\.x', '\.z'\] where the "
                                        r"saved .*Point has \['\.x', '\.y'\]"):
        loaded(Point(jnp.ones(2), jnp.ones(2)))


def test_loaded_program_names_the_argument_that_differs(tmp_path):
    # (adversary stop 37: a Module fitting its saved node in args[0] was reported as
    # the difference when args[1]'s static data differed.)
    @functools.partial(jax.tree_util.register_dataclass, data_fields=["a"],
                       meta_fields=["scale"])
    @dataclasses.dataclass
    class Scaled:
        a: jax.Array
        scale: float

    def f(p, s):
        return p.first * s.a * s.scale

    pair = Pair(jnp.ones(2), jnp.zeros(2))
    jaxpr_cc.save(jaxpr_cc.trace(f, pair, Scaled(jnp.arange(2.0), 3.0)), tmp_path / "s.jcc")
    loaded = jaxpr_cc.load(tmp_path / "s.jcc")
    np.testing.assert_array_equal(loaded(pair, Scaled(jnp.arange(2.0), 3.0)), [0.0, 3.0])
    with pytest.raises(TypeError, match=r"f: args\[1\] is a .*Scaled with static data \(4\.0,\) "
                                        r"where the program was traced with \(3\.0,\)"):
        loaded(pair, Scaled(jnp.arange(2.0), 4.0))


def test_loaded_program_names_keyword_differences_after_a_custom_node(tmp_path):
    # (adversary stop 37: with a custom node among the positional arguments, a
    # keyword argument's missing or extra key was reported as "args differs".)
    def f(p, *, kw):
        return p.first * kw["z"]

    pair = Pair(jnp.ones(2), jnp.zeros(2))
    program = jaxpr_cc.trace(f, pair, kw={"z": jnp.ones(2)})
    jaxpr_cc.save(program, tmp_path / "k.jcc")
    loaded = jaxpr_cc.load(tmp_path / "k.jcc")
    for call in (program, loaded):
        with pytest.raises(TypeError, match=r"kwargs\['kw'\] has unexpected keys \['y'\]"):
            call(pair, kw={"z": jnp.ones(2), "y": jnp.ones(2)})
        with pytest.raises(TypeError, match=r"kwargs lacks keys \['kw'\]"):
            call(pair)


# ---------------------------------------------------------------- static data
# jax.jit compares a node's auxiliary data (equinox static fields, register_dataclass
# meta fields, tree_flatten's aux) and traces again when it differs; a program
# computes what its traced static data chose, so a call with other static data is
# refused, and a result node gets exactly the static data it was traced with.
class Act(eqx.Module):
    w: jax.Array
    b: jax.Array
    act: str = eqx.field(static=True, default="relu")

    def __call__(self, x):
        y = self.w @ x + self.b
        return jax.nn.relu(y) if self.act == "relu" else jnp.tanh(y)


@jax.tree_util.register_pytree_node_class
class Tagged:
    def __init__(self, a, tag=0):
        self.a, self.tag = a, tag

    def tree_flatten(self):
        return (self.a,), self.tag

    @classmethod
    def tree_unflatten(cls, tag, children):
        return cls(children[0], tag)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Scaled:
    x: jax.Array
    n: int = dataclasses.field(metadata=dict(static=True), default=1)


def _act(kind):
    return Act(jnp.eye(3), -0.5 * jnp.ones(3), act=kind)


def _apply(m, x):
    return m(x)


@pytest.fixture(scope="module")
def act_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("static") / "act.jcc"
    jaxpr_cc.save(jaxpr_cc.trace(_apply, _act("relu"), X), path)
    return path


def test_static_field_is_checked_after_loading(act_file):
    relu, tanh = _act("relu"), _act("tanh")
    # jax.jit traces again for the other static field and computes something else
    assert not np.allclose(jax.jit(_apply)(relu, X), jax.jit(_apply)(tanh, X))
    for program in (jaxpr_cc.load(act_file), jaxpr_cc.load(act_file, like=(relu, X)),
                    jaxpr_cc.compile(jaxpr_cc.load(act_file))):
        np.testing.assert_array_equal(np.asarray(program(relu, X)),
                                      np.asarray(jax.jit(_apply)(relu, X)))
        with pytest.raises(TypeError, match=r"args\[0\] is a .*Act with (different )?static "
                                            r"data .*tanh.*relu"):
            program(tanh, X)
    with pytest.raises(jaxpr_cc.LoadError, match=r"like does not fit the saved arguments: "
                                                 r"args\[0\] is a .*Act with static data "
                                                 r".*'tanh'.* traced with .*'relu'"):
        jaxpr_cc.load(act_file, like=(tanh, X))


def test_nested_static_field_names_its_path(act_file, tmp_path):
    class Stack(eqx.Module):
        layers: list

        def __call__(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    program = jaxpr_cc.trace(_apply, Stack([_act("relu"), _act("tanh")]), X)
    jaxpr_cc.save(program, tmp_path / "stack.jcc")
    loaded = jaxpr_cc.load(tmp_path / "stack.jcc")
    swapped = Stack([_act("tanh"), _act("relu")])
    with pytest.raises(TypeError, match=r"args\[0\]\.layers\[0\] is a .*Act with static data"):
        loaded(swapped, X)
    with pytest.raises(TypeError, match=r"args\[0\]\.layers\[0\] is a .*Act with different "
                                        r"static data"):
        program(swapped, X)


@pytest.mark.parametrize("kind", ["dataclass", "node_class"])
def test_meta_fields_and_aux_data_are_checked(kind, tmp_path):
    if kind == "dataclass":
        fun, good, bad = (lambda d: d.x * d.n), Scaled(X, 2), Scaled(X, 3)
    else:
        fun, good, bad = (lambda b: b.a * b.tag), Tagged(X, 2), Tagged(X, 3)
    jaxpr_cc.save(jaxpr_cc.trace(fun, good), tmp_path / "p.jcc")
    loaded = jaxpr_cc.load(tmp_path / "p.jcc")
    np.testing.assert_array_equal(np.asarray(loaded(good)), np.asarray(jax.jit(fun)(good)))
    assert not np.array_equal(jax.jit(fun)(bad), jax.jit(fun)(good))
    with pytest.raises(TypeError, match=r"args\[0\] is a .* with static data \(?3,?\)? where "
                                        r"the program was traced with \(?2,?\)?"):
        loaded(bad)


def test_static_data_that_is_not_data_needs_like(tmp_path):
    fun = lambda b, x: b.tag(b.a) + x  # noqa: E731  (the aux data is a function)
    arg = Tagged(X, jnp.sin)
    jaxpr_cc.save(jaxpr_cc.trace(fun, arg, X), tmp_path / "f.jcc")
    doc = json.loads(zipfile.ZipFile(tmp_path / "f.jcc").read("program.json"))
    assert doc["in_tree"]["tuple"][0]["tuple"][0]["static"] == {"opaque": "jax.numpy.sin"} \
        or "opaque" in doc["in_tree"]["tuple"][0]["tuple"][0]["static"]
    with pytest.raises(TypeError, match=r"args\[0\] is a .*Tagged whose static data .* was not "
                                        r"saved as data.*like="):
        jaxpr_cc.load(tmp_path / "f.jcc")(arg, X)
    restored = jaxpr_cc.load(tmp_path / "f.jcc", like=(arg, X))
    np.testing.assert_array_equal(np.asarray(restored(arg, X)),
                                  np.asarray(jax.jit(fun)(arg, X)))


def test_result_nodes_get_their_own_static_data(tmp_path):
    relu = _act("relu")
    cases = {
        "new static": (lambda m: Act(m.w * 2, m.b, act="tanh"), (relu,)),
        "swapped": (lambda t: (t[1], t[0]), ((relu, _act("tanh")),)),
        "aux": (lambda b: Tagged(b.a + 1, tag=7), (Tagged(X, 1),)),
        "meta": (lambda d: Scaled(d.x, d.n + 4), (Scaled(X, 2),)),
    }
    for name, (fun, args) in cases.items():
        path = tmp_path / f"{name.replace(' ', '_')}.jcc"
        jaxpr_cc.save(jaxpr_cc.trace(fun, *args), path)
        out = jaxpr_cc.load(path, like=args)(*args)
        ref = jax.jit(fun)(*args)
        assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(ref), name
        for a, b in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(ref)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert [m.act for m in jaxpr_cc.load(tmp_path / "swapped.jcc",
                                         like=cases["swapped"][1])(*cases["swapped"][1])] \
        == ["tanh", "relu"]


def test_result_static_data_that_cannot_be_rebuilt_is_refused(tmp_path):
    fun = lambda b: Tagged(b.a * 2, tag=jnp.cos)  # noqa: E731
    arg = Tagged(X, jnp.sin)
    jaxpr_cc.save(jaxpr_cc.trace(fun, arg), tmp_path / "f.jcc")
    with pytest.raises(jaxpr_cc.LoadError, match=r"cannot restore the result structure from "
                                                 r"like: .*Tagged was traced with static data"):
        jaxpr_cc.load(tmp_path / "f.jcc", like=(arg,))
    # even a like holding a node with the same type of static data is no proof
    both = (Tagged(X, jnp.sin), Tagged(X, jnp.cos))
    jaxpr_cc.save(jaxpr_cc.trace(lambda b, c: fun(b), *both), tmp_path / "g.jcc")
    # (The message said to give like a node with that static data, which like had.)
    with pytest.raises(jaxpr_cc.LoadError, match=r"was not saved as data .*, so no node of "
                                                 r"like can be checked to hold it; load without"):
        jaxpr_cc.load(tmp_path / "g.jcc", like=both)
    loaded = jaxpr_cc.load(tmp_path / "g.jcc")  # without like: SavedNodes in and out
    saved_args, _ = jax.tree_util.tree_unflatten(loaded.in_tree, [X, X])
    out = loaded(*saved_args)
    assert isinstance(out, SavedNode)
    np.testing.assert_array_equal(np.asarray(out[0]), np.asarray(jax.jit(fun)(arg).a))


class _StaticScale(eqx.Module):
    w: jax.Array
    scale: float = eqx.field(static=True)


def test_loaded_static_data_compares_as_jax_jit_does(tmp_path):
    # jax.jit compares a node's static data with ==, so 1.0, 1 and True are the same
    # trace, as for a live program; a loaded program compared the saved text and
    # refused 1 and True, saying jax.jit would trace again (adversary, stop 38).
    x = jnp.array([1.0, 2.0])
    traces = []

    def f(m, y):
        traces.append(1)
        return m.w * y / m.scale

    jitted = jax.jit(f)
    for scale in (1.0, 1, True):
        jitted(_StaticScale(x, scale), x)
    assert len(traces) == 1
    jaxpr_cc.save(jaxpr_cc.trace(f, _StaticScale(x, 1.0), x), tmp_path / "s.jcc")
    loaded = jaxpr_cc.load(tmp_path / "s.jcc")
    for scale in (1.0, 1, True):
        np.testing.assert_array_equal(loaded(_StaticScale(x, scale), x), f(_StaticScale(x, 1.0), x))
    with pytest.raises(TypeError, match=r"static data \(.*, 2\.0\) where the program was traced "
                                        r"with \(.*, 1\.0\)"):
        loaded(_StaticScale(x, 2.0), x)


def test_loaded_static_data_equal_to_a_numpy_scalar_is_accepted(tmp_path):
    # np.int64(2) == 2: jax.jit reuses its trace, the live program accepts it; the
    # loaded one refused it (second adversary, stop 38).
    class Counted(eqx.Module):
        w: jax.Array
        n: tuple = eqx.field(static=True)

    w = jnp.ones(3)
    jaxpr_cc.save(jaxpr_cc.trace(lambda m, x: jnp.sum(m.w * x) * m.n[0], Counted(w, (2, 1.0)), w),
                  tmp_path / "n.jcc")
    loaded = jaxpr_cc.load(tmp_path / "n.jcc")
    for n in ((np.int64(2), 1.0), (2.0, np.float32(1.0)), (np.int32(2), True)):
        np.testing.assert_allclose(loaded(Counted(w, n), w), 6.0)
    with pytest.raises(TypeError, match=r"static data"):
        loaded(Counted(w, (np.int64(3), 1.0)), w)
