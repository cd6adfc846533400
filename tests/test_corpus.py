"""Tests for the golden program corpus and its loader.

* every required feature is covered by some program's TAGS;
* the tags are honest where that can be checked mechanically (the jaxpr
  contains the primitive / dtype / structure the tag names);
* every program runs, every claimed transformation runs, and every
  transformation among grad/jvp/vmap that is NOT claimed really fails;
* the loader reports broken files clearly.
"""

from __future__ import annotations

import functools
import re
import textwrap

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest

import jaxref
import jaxpr_cc.passes  # noqa: F401  (registers the linear_call batching rule: SUPPORTS assumes it)
from jaxpr_cc.golden import corpus
from jaxpr_cc.golden.corpus import CorpusError, TAG_VOCABULARY

PROGRAMS = corpus.load_corpus()
IDS = [p.name for p in PROGRAMS]
BY_NAME = {p.name: p for p in PROGRAMS}

# Each requirement of the corpus brief, and the tags that show it is covered.
# The union of these sets is exactly the tag vocabulary.
REQUIRED_COVERAGE = {
    "elementwise math": {"elementwise", "integer_pow", "where", "clip"},
    "dot_general / matmul / einsum with batch dims": {"dot_general", "matmul", "einsum", "batch_dims"},
    "2-D convolution, NCHW and NHWC": {"conv", "nchw", "nhwc"},
    "gather / scatter indexing": {"gather", "scatter", "dynamic_slice", "dynamic_update_slice",
                                  "take_along_axis"},
    "reductions": {"reduction", "argmax", "cumsum", "logsumexp"},
    "cond and 3-way switch": {"cond", "switch"},
    "while_loop": {"while_loop"},
    "fori_loop": {"fori_loop"},
    "scan: RNN cell, reverse, pytree carry": {"scan", "rnn", "scan_reverse", "scan_pytree_carry"},
    "nested jit with a static arg": {"nested_jit", "static_argnums"},
    "custom_jvp variants": {"custom_jvp", "custom_jvp_nondiff", "custom_jvp_defjvps",
                            "custom_jvp_in_scan"},
    "custom_vjp variants": {"custom_vjp", "custom_vjp_nondiff", "custom_vjp_fn_nondiff",
                            "custom_vjp_pytree_residuals", "custom_vjp_in_cond",
                            "custom_vjp_reused", "custom_vjp_nested"},
    "custom_gradient": {"custom_gradient"},
    "linear_call": {"linear_call"},
    "fixed point with implicit custom_vjp": {"fixed_point"},
    "checkpoint with a policy": {"checkpoint", "checkpoint_policy"},
    "stop_gradient": {"stop_gradient"},
    "effects": {"debug_print", "debug_callback"},
    "PRNG keys as arguments": {"prng", "prng_key_arg"},
    "dtypes": {"bool", "int8", "int16", "int32", "uint8", "uint32", "float16", "bfloat16",
               "float32", "complex64"},
    "integer bit ops, shifts, casts": {"bitwise", "shift", "cast"},
    "pytrees in and out": {"pytree_in", "pytree_out", "dict", "tuple", "namedtuple",
                           "nested_pytree"},
    "programs that are transformed functions": {"transformed_grad", "transformed_vmap",
                                                "transformed_hessian"},
    "model blocks": {"mlp", "softmax", "layernorm"},
    "NamedSharding over 8 devices": {"sharding", "multi_device"},
    "shard_map": {"shard_map"},
    "large closed-over constant": {"large_constant"},
    "Python scalar args (weak types)": {"python_scalar", "weak_type"},
    "keyword arguments": {"kwargs"},
}

DIFF_TRANSFORMS = ("grad", "jvp", "vmap")


# --------------------------------------------------------------------------
# corpus-level coverage
# --------------------------------------------------------------------------

def test_corpus_size():
    assert len(PROGRAMS) >= 44


def test_names_are_numbered_and_unique():
    numbers = []
    for p in PROGRAMS:
        m = re.fullmatch(r"(\d\d)_[a-z0-9_]+", p.name)
        assert m, f"{p.name}: expected NN_short_name.py"
        numbers.append(int(m.group(1)))
    assert numbers == list(range(1, len(PROGRAMS) + 1))


def test_coverage_map_matches_vocabulary():
    assert set().union(*REQUIRED_COVERAGE.values()) == set(TAG_VOCABULARY)


@pytest.mark.parametrize("requirement", sorted(REQUIRED_COVERAGE))
def test_requirement_covered(requirement):
    used = set().union(*(p.tags for p in PROGRAMS))
    missing = REQUIRED_COVERAGE[requirement] - used
    assert not missing, f"{requirement}: no program tagged {sorted(missing)}"


def _with_tag(tag):
    return [p for p in PROGRAMS if tag in p.tags]


def test_specific_combinations():
    # fori_loop with a static trip count is differentiable (it becomes a scan)
    assert any("grad" in p.supports for p in _with_tag("fori_loop"))
    # a while_loop with a data-dependent trip count is not
    assert any("grad" not in p.supports and "jvp" in p.supports for p in _with_tag("while_loop"))
    # custom_vjp never supports jvp
    for p in _with_tag("custom_vjp") + _with_tag("custom_gradient"):
        assert "jvp" not in p.supports, p.name
    fixed = _with_tag("fixed_point")
    assert fixed and all("grad" in p.supports and "jvp" not in p.supports for p in fixed)
    assert all(p.devices == 8 for p in _with_tag("multi_device"))
    assert all(p.devices == 8 for p in _with_tag("shard_map") + _with_tag("sharding"))
    assert any(p.kwargs for p in PROGRAMS)


# --------------------------------------------------------------------------
# per-program contract
# --------------------------------------------------------------------------

@pytest.mark.parametrize("prog", PROGRAMS, ids=IDS)
def test_contract(prog):
    doc = (prog.module.__doc__ or "").strip()
    assert doc and "\n" not in doc, "module docstring must be one line"
    assert prog.tags, "TAGS must not be empty"
    assert len(set(prog.tags)) == len(prog.tags), "duplicate tags"
    for leaf in jax.tree_util.tree_leaves((prog.args, prog.kwargs)):
        assert not isinstance(leaf, jax.ShapeDtypeStruct)
        assert all(d <= 64 for d in np.shape(leaf)), f"array too large: {np.shape(leaf)}"
    if "grad" in prog.supports:
        assert prog.grad_argnums, "grad claimed but no differentiable arguments"


@pytest.mark.parametrize("prog", PROGRAMS, ids=IDS)
def test_example_args_deterministic(prog):
    again = prog.module.example_args()
    jaxref.assert_trees_equal(prog.args, again)
    if hasattr(prog.module, "example_kwargs"):
        assert prog.module.example_kwargs() == prog.kwargs


# --------------------------------------------------------------------------
# tags are honest: inspect the jaxpr
# --------------------------------------------------------------------------

def _subjaxprs(params):
    for val in params.values():
        for x in val if isinstance(val, (tuple, list)) else (val,):
            if isinstance(x, (jax.extend.core.ClosedJaxpr, jax.extend.core.Jaxpr)):
                yield x


def _walk(jaxpr, ancestors=()):
    """Yield (eqn, ancestor primitive names) for every equation, recursively."""
    if isinstance(jaxpr, jax.extend.core.ClosedJaxpr):
        jaxpr = jaxpr.jaxpr
    for eqn in jaxpr.eqns:
        yield eqn, ancestors
        for sub in _subjaxprs(eqn.params):
            yield from _walk(sub, ancestors + (eqn.primitive.name,))


def _dtypes(jaxpr):
    out = set()
    if isinstance(jaxpr, jax.extend.core.ClosedJaxpr):
        jaxpr = jaxpr.jaxpr
    for v in list(jaxpr.invars) + list(jaxpr.constvars) + list(jaxpr.outvars):
        out.add(str(v.aval.dtype))
    for eqn, _ in _walk(jaxpr):
        for v in list(eqn.invars) + list(eqn.outvars):
            if hasattr(v, "aval"):
                out.add(str(v.aval.dtype))
    return out


def _containers(tree, depth=0, found=None):
    """Set of container kinds in a pytree; 'nested' if a container holds one."""
    found = set() if found is None else found
    kind = None
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        kind = "namedtuple"
    elif isinstance(tree, tuple):
        kind = "tuple"
    elif isinstance(tree, list):
        kind = "list"
    elif isinstance(tree, dict):
        kind = "dict"
    if kind is None:
        return found
    found.add(kind)
    if depth >= 1:
        found.add("nested")
    children = tree.values() if isinstance(tree, dict) else tree
    for child in children:
        _containers(child, depth + 1, found)
    return found


def _has_prim(prims, *names):
    return any(n in prims for n in names)


@functools.lru_cache(maxsize=None)
def _analysis(name):
    prog = BY_NAME[name]
    f = functools.partial(prog.fun, **prog.kwargs)
    closed = jax.make_jaxpr(f)(*prog.args)
    eqns = list(_walk(closed))
    out_shape = jax.eval_shape(f, *prog.args)
    return prog, closed, eqns, out_shape


_PRIM_TAGS = {
    "integer_pow": ("integer_pow",),
    "where": ("select_n",),
    "dot_general": ("dot_general",),
    "matmul": ("dot_general",),
    "einsum": ("dot_general",),
    "conv": ("conv_general_dilated",),
    "gather": ("gather", "dynamic_slice"),
    "take_along_axis": ("gather",),
    "dynamic_slice": ("dynamic_slice",),
    "dynamic_update_slice": ("dynamic_update_slice",),
    "argmax": ("argmax",),
    "cumsum": ("cumsum",),
    "cond": ("cond",),
    "switch": ("cond",),
    "while_loop": ("while",),
    "fori_loop": ("scan", "while"),
    "scan": ("scan",),
    "rnn": ("scan",),
    "nested_jit": ("jit", "pjit"),
    "custom_jvp": ("custom_jvp_call",),
    "custom_jvp_nondiff": ("custom_jvp_call",),
    "custom_jvp_defjvps": ("custom_jvp_call",),
    "custom_vjp": ("custom_vjp_call",),
    "custom_vjp_nondiff": ("custom_vjp_call",),
    "custom_vjp_fn_nondiff": ("custom_vjp_call",),
    "custom_vjp_pytree_residuals": ("custom_vjp_call",),
    "custom_vjp_nested": ("custom_vjp_call",),
    "custom_gradient": ("custom_vjp_call",),
    "linear_call": ("linear_call",),
    "checkpoint": ("remat2", "checkpoint", "remat"),
    "checkpoint_policy": ("remat2", "checkpoint", "remat"),
    "stop_gradient": ("stop_gradient",),
    "debug_print": ("debug_print", "debug_callback"),
    "debug_callback": ("debug_callback",),
    "prng": ("random_bits", "random_split", "random_fold_in", "threefry2x32"),
    "bitwise": ("and", "or", "xor", "not"),
    "shift": ("shift_left", "shift_right_logical", "shift_right_arithmetic"),
    "cast": ("convert_element_type", "bitcast_convert_type"),
    "shard_map": ("shard_map",),
    "fixed_point": ("while",),
}

_DTYPE_TAGS = {"bool", "int8", "int16", "int32", "uint8", "uint32", "float16", "bfloat16",
               "float32", "complex64"}


def _tag_holds(tag, name):
    prog, closed, eqns, out_shape = _analysis(name)
    prims = {e.primitive.name for e, _ in eqns}
    if tag in _PRIM_TAGS:
        if not _has_prim(prims, *_PRIM_TAGS[tag]):
            return False
    if tag in _DTYPE_TAGS:
        return tag in _dtypes(closed)
    if tag == "reduction":
        return any(p.startswith("reduce_") or p in ("argmax", "argmin", "cumsum") for p in prims)
    if tag == "scatter":
        return any(p.startswith("scatter") for p in prims)
    if tag == "scan_reverse":
        return any(e.primitive.name == "scan" and e.params.get("reverse") for e, _ in eqns)
    if tag == "scan_pytree_carry":
        return any(e.primitive.name == "scan" and e.params["num_carry"] > 1 for e, _ in eqns)
    if tag == "custom_jvp_in_scan":
        return any(e.primitive.name == "custom_jvp_call" and "scan" in anc for e, anc in eqns)
    if tag == "custom_vjp_in_cond":
        return any(e.primitive.name == "custom_vjp_call" and "cond" in anc for e, anc in eqns)
    if tag == "custom_vjp_reused":
        return sum(e.primitive.name == "custom_vjp_call" for e, _ in eqns) >= 2
    if tag == "batch_dims":
        return any(e.primitive.name == "dot_general" and e.params["dimension_numbers"][1][0]
                   for e, _ in eqns)
    if tag in ("nchw", "nhwc"):
        # lhs_spec = (batch dim, feature dim, spatial dims...): NCHW -> (0, 1, ..), NHWC -> (0, 3, ..)
        want = (0, 1) if tag == "nchw" else (0, 3)
        return any(e.primitive.name == "conv_general_dilated"
                   and tuple(e.params["dimension_numbers"].lhs_spec[:2]) == want
                   for e, _ in eqns)
    if tag == "sharding":
        if "sharding_constraint" in prims:
            return True
        return any(e.primitive.name in ("jit", "pjit") and any(
            isinstance(s, jax.sharding.NamedSharding)
            for s in tuple(e.params.get("in_shardings", ())) + tuple(e.params.get("out_shardings", ())))
            for e, _ in eqns)
    if tag == "multi_device":
        return prog.devices > 1
    if tag == "prng_key_arg":
        return any(jax.dtypes.issubdtype(getattr(l, "dtype", np.float32), jax.dtypes.extended)
                   for l in jax.tree_util.tree_leaves(prog.args))
    if tag == "python_scalar":
        return any(isinstance(l, (bool, int, float, complex))
                   for l in jax.tree_util.tree_leaves((prog.args, prog.kwargs)))
    if tag == "weak_type":
        return any(getattr(v.aval, "weak_type", False) for v in closed.jaxpr.invars)
    if tag == "kwargs":
        return bool(prog.kwargs)
    if tag == "large_constant":
        return any(np.size(c) >= 64 * 64 for c in closed.consts)
    if tag == "pytree_in":
        return any(_containers(a) for a in prog.args)
    if tag == "pytree_out":
        return bool(_containers(out_shape))
    if tag in ("dict", "tuple", "namedtuple"):
        # A bare tuple of several results is just how a function returns
        # multiple outputs, so only containers in args or inside outputs count.
        kinds = set().union(*(_containers(a) for a in prog.args))
        outs = out_shape if type(out_shape) in (tuple, list) else (out_shape,)
        kinds |= set().union(*(_containers(o) for o in outs))
        return tag in kinds
    if tag == "nested_pytree":
        return "nested" in set().union(*(_containers(a) for a in prog.args), _containers(out_shape))
    return True  # not mechanically checkable (e.g. "mlp", "elementwise")


@pytest.mark.parametrize("prog", PROGRAMS, ids=IDS)
def test_tags_are_honest(prog):
    wrong = [t for t in prog.tags if not _tag_holds(t, prog.name)]
    assert not wrong, f"tags not reflected in the program's jaxpr/args: {wrong}"


# --------------------------------------------------------------------------
# programs run; SUPPORTS is exactly right
# --------------------------------------------------------------------------

@pytest.mark.parametrize("prog", PROGRAMS, ids=IDS)
def test_value_and_jit(prog):
    # with jit=True, "value" is jax.jit(fun)(*args): this also checks "jit".
    assert "jit" in prog.supports, "every corpus program is expected to be jittable"
    out = jaxref.reference_results(prog, transforms=("value",))["value"]
    assert jax.tree_util.tree_leaves(out), "program returns no arrays"


_PAIRS = [(p, t) for p in PROGRAMS for t in DIFF_TRANSFORMS]


@pytest.mark.parametrize("prog,transform", _PAIRS, ids=[f"{p.name}-{t}" for p, t in _PAIRS])
def test_supports_is_exact(prog, transform):
    if transform in prog.supports:
        result = jaxref.apply_transform(prog, transform)
        if transform == "grad":
            assert len(result) == len(prog.grad_argnums)
        if transform == "jvp":
            primal, tangent = result
            assert jax.tree_util.tree_structure(primal) == jax.tree_util.tree_structure(tangent)
    else:
        # JAX rejects these with TypeError (custom_vjp under jvp, integer
        # inputs to grad), ValueError (reverse-mode through while_loop) or
        # NotImplementedError (missing batching rule).
        with pytest.raises((TypeError, ValueError, NotImplementedError)):
            jaxref.apply_transform(prog, transform)


def test_reference_results_keys():
    prog = BY_NAME[IDS[0]]
    res = jaxref.reference_results(prog)
    assert set(res) == {"value"} | (set(DIFF_TRANSFORMS) & prog.supports)
    # a different implementation of the same function gives identical results
    again = jaxref.reference_results(prog, fn=lambda *a, **k: prog.fun(*a, **k))
    jaxref.assert_trees_equal(res, again)


# --------------------------------------------------------------------------
# jaxref helpers
# --------------------------------------------------------------------------

def test_assert_trees_equal_basics():
    a = {"x": jnp.array([1.0, jnp.nan], jnp.float32), "k": jax.random.key(3)}
    jaxref.assert_trees_equal(a, {"x": jnp.array([1.0, jnp.nan], jnp.float32),
                                  "k": jax.random.key(3)})
    with pytest.raises(AssertionError, match="PRNG|key"):
        jaxref.assert_trees_equal(a, {"x": a["x"], "k": jax.random.key(4)})
    with pytest.raises(AssertionError, match="dtype"):
        jaxref.assert_trees_equal(jnp.ones(2, jnp.float32), jnp.ones(2, jnp.float16))
    with pytest.raises(AssertionError, match="structure"):
        jaxref.assert_trees_equal((1.0,), [1.0])
    b = jnp.array([1.0, 2.0], jnp.bfloat16)
    jaxref.assert_trees_equal(b, jnp.array([1.0, 2.0], jnp.bfloat16))
    with pytest.raises(AssertionError, match="bitwise"):
        jaxref.assert_trees_equal(b, b + jnp.bfloat16(0.0078125))
    jaxref.assert_trees_equal(b, b + jnp.bfloat16(0.0078125), exact=False, rtol=1e-2)
    z = jnp.array([1 + 2j], jnp.complex64)
    with pytest.raises(AssertionError):
        jaxref.assert_trees_equal(z, z + 1e-3j)


def test_tangents_and_batching_helpers():
    args = (jnp.ones((2,), jnp.float32), jnp.int32(3), 0.5, 2, jax.random.key(0),
            {"m": jnp.array([True, False])})
    tans = jaxref.tangents_like(args)
    assert tans[0].dtype == jnp.float32
    for t in (tans[1], tans[3], tans[4], tans[5]["m"]):
        assert t.dtype == jax.dtypes.float0
    batched = jaxref.batch_args(args)
    axes = jaxref.batch_in_axes(args)
    assert batched[0].shape == (2, 2) and batched[4].shape == (2,)
    assert batched[2] == 0.5 and axes[2] is None and axes[0] == 0
    assert not np.array_equal(batched[0][0], batched[0][1])
    assert float(jaxref.scalarize(lambda x: (x, x.astype(jnp.complex64) * 1j, 3))(args[0])) == 2.0


# --------------------------------------------------------------------------
# loader
# --------------------------------------------------------------------------

def _write(tmp_path, name, body):
    path = tmp_path / name
    path.write_text(body)
    return path


GOOD = textwrap.dedent('''
    """A tiny valid program."""
    import jax
    import jax.numpy as jnp

    TAGS = ("elementwise", "float32")
    SUPPORTS = ("grad", "jvp", "vmap", "jit")

    def fun(x, n, s, k):
        return jnp.sin(x) * n * s

    def example_args():
        return (jnp.ones((3,), jnp.float32), jnp.int32(2), 0.5,
                {"a": jnp.ones(2), "b": jnp.zeros(2, jnp.int32)})
''')


def test_load_program_fields(tmp_path):
    prog = corpus.load_program(_write(tmp_path, "01_good.py", GOOD))
    assert prog.name == "01_good"
    assert prog.module.__name__ == "jaxpr_cc_corpus.01_good"
    assert prog.supports == frozenset({"grad", "jvp", "vmap", "jit"})
    assert prog.devices == 1 and prog.kwargs == {}
    assert prog.grad_argnums == (0, 2)   # float array and Python float; not int / mixed dict


def test_load_program_import_error_names_file(tmp_path):
    path = _write(tmp_path, "02_broken.py", "import jax\nraise RuntimeError('boom')\n")
    with pytest.raises(CorpusError, match=r"02_broken\.py.*boom"):
        corpus.load_program(path)
    path = _write(tmp_path, "03_syntax.py", "def fun(:\n")
    with pytest.raises(CorpusError, match=r"03_syntax\.py"):
        corpus.load_program(path)


@pytest.mark.parametrize("replace,match", [
    (("def fun(", "def not_fun("), "fun"),
    (('"elementwise"', '"no_such_tag"'), "no_such_tag"),
    (('"jvp"', '"pmap"'), "pmap"),
    (("return (jnp.ones", "return [jnp.ones"), "tuple"),
])
def test_load_program_contract_errors(tmp_path, replace, match):
    src = GOOD.replace(*replace)
    if replace[0] == "return (jnp.ones":
        src = src.replace("jnp.zeros(2, jnp.int32)})", "jnp.zeros(2, jnp.int32)}]")
    path = _write(tmp_path, "04_bad.py", src)
    with pytest.raises(CorpusError, match=match) as info:
        corpus.load_program(path)
    assert "04_bad.py" in str(info.value)


def test_load_corpus_devices_and_override(tmp_path, monkeypatch):
    _write(tmp_path, "02_b.py", GOOD)
    _write(tmp_path, "01_a.py", GOOD)
    _write(tmp_path, "_helper.py", "raise RuntimeError('not a program')\n")
    monkeypatch.setenv("JAXPR_CC_CORPUS", str(tmp_path))
    assert corpus.corpus_dir() == tmp_path.resolve()
    assert [p.name for p in corpus.load_corpus()] == ["01_a", "02_b"]
    _write(tmp_path, "03_big.py", GOOD + f"\nDEVICES = {len(jax.devices()) + 1}\n")
    with pytest.raises(CorpusError, match=r"03_big\.py.*devices"):
        corpus.load_corpus(tmp_path)
    assert [p.name for p in corpus.load_corpus(tmp_path, skip_unavailable=True)] == ["01_a", "02_b"]


def test_corpus_dir_default(monkeypatch):
    monkeypatch.delenv("JAXPR_CC_CORPUS", raising=False)
    assert corpus.corpus_dir() == (
        __import__("pathlib").Path(__file__).resolve().parents[1] / "golden" / "programs")
