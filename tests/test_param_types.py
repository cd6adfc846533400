"""Every parameter type JAX 0.10.2 puts in a jaxpr can be saved, loaded and emitted.

* The primitives JAX registers are enumerated (every ``Primitive`` object in the
  modules of ``jax._src``, accelerator back ends aside); each is either exercised by
  a program here (tests/param_type_programs.py and the corpus) or listed below with
  the reason it cannot be put in a CPU program through JAX's public API.  A JAX
  upgrade that adds a primitive fails this test until it is classified.
* The parameter values of every equation of those programs (nested regions and
  jaxprs held in parameters included) are taken apart down to their leaf types;
  each leaf type has a save codec and a Python spelling (or, for regions, jaxprs and
  checkpoint policies, an emission rule, proved by the round trips below).
* Each program is saved, loaded and emitted; the loaded program and the emitted
  module give JAX's values bit for bit.
"""
from __future__ import annotations

import enum

import jax
import numpy as np
import pytest

import jaxpr_cc
from jaxpr_cc import jax_adapter as jx
from jaxpr_cc.backends.python_spelling import SpellingError, param_source
from jaxpr_cc.golden.corpus import load_corpus
from jaxpr_cc.io.param_codecs import codec_for
from jaxpr_cc.ir.region import Region
from param_type_programs import PROGRAMS

CORPUS = load_corpus(skip_unavailable=True)

# Registered primitives no CPU program can hold through JAX's public API, by reason.
NOT_EXERCISED = {
    "accelerator or Pallas kernels only": {
        "cudnn_fusion", "custom_fusion", "dma_start", "dma_wait", "get_barrier_semaphore",
        "masked_load", "masked_swap", "matmul_acc_lhs", "matmul_pop", "matmul_push_rhs",
        "multiple_of", "num_programs", "pallas_call", "program_id", "run_scoped",
        "semaphore_read", "semaphore_signal", "semaphore_wait", "tpu_custom_call", "core_map",
        "delay", "dot_product_attention_bwd", "dot_product_attention_bwd_wrapper",
        "dot_product_attention_fp8_bwd", "dot_product_attention_fp8_bwd_wrapper",
        "dot_product_attention_fp8_fwd", "dot_product_attention_fp8_fwd_wrapper",
        "dot_product_attention_fwd", "dot_product_attention_fwd_wrapper", "scaled_matmul",
        "scaled_matmul_wrapper", "scaled_dot", "cholesky_update", "stochastic_round",
        "get_global", "fusible", "with_memory_space_constraint", "pin", "unpin", "roll",
    },
    "async halves of collectives (scheduler internals)": {
        "all_gather_done", "all_gather_start", "all_to_all_done", "all_to_all_start",
        "pbroadcast_done", "pbroadcast_start", "ppermute_done", "ppermute_start", "psum_done",
        "psum_start", "psum_invariant_start", "reduce_scatter_done", "reduce_scatter_start",
        "unreduced_psum_start", "unreduced_reduce_scatter_start", "all_gather_reduced_start",
    },
    "mutable state, refs and boxes (not in a pure traced program)": {
        "accum_grad_in_ref", "addupdate", "box_get", "box_set", "empty_ref", "free_ref",
        "freeze", "get", "new_box", "new_ref", "run_state", "swap", "new_log", "log_extend",
        "log_read",
    },
    "internal to AD, lowering or other transformations": {
        "add_dependency", "call", "call_hi_primitive", "call_hi_primitive_linearized",
        "create_linear", "custom_lin", "custom_vjp_call_jaxpr", "custom_jvp_call_jaxpr",
        "dce_sink", "dim_as_value", "dimension_size", "empty", "empty2", "eval_jaxpr",
        "from_edtype", "to_edtype", "iota_2x32_shape", "jaxpr_call", "mpmd_map",
        "pack_dtype", "unpack_dtype", "pack_elementwise", "unpack_elementwise", "remat_opt",
        "shape_assertion", "stage", "tie", "trace_value", "unreachable", "zeros_like",
        "custom_partitioning", "call_exported", "check",
        "xla_metadata_value", "compute_on", "eq_to", "le_to", "lt_to",
        "reduced_vary_cast_p", "vary_unreduced_cast_p", "pbroadcast", "preduced",
        "unreduced_psum", "unreduced_reduce_scatter", "all_gather_invariant",
        "all_gather_reduced", "prng_join", "prng_random_bits", "prng_seed", "prng_split",
        "philox2x32", "philox4x32", "threefry4x32", "random_clone", "copy",
        "select_and_gather_add", "layout_constraint", "inspect_sharding", "shard_alike",
        "broadcast_to", "bitcast", "symmetric_product", "psend", "precv", "after_all",
        "create_token", "closed_call", "select_and_scatter", "reciprocal", "mulhi",
        # what qr lowers to on CPU; no public function binds them
        "geqrf", "geqp3",
        # pmap-era collective (shard_map binds psum_invariant)
        "psum",
    },
    # Public, but need an explicitly sharded mesh / per-device ragged offsets: not yet
    # exercised here (their parameters are meshes, shardings and ints, all covered).
    "not yet exercised": {"reshard", "ragged_all_to_all"},
    "Python callbacks (hold a Python function, not data)": {
        "pure_callback", "io_callback", "buffer_callback", "ffi_call",
        # its batching rule (emitted: tests/test_emit_python_adversary_38.py)
        "custom_vmap_call",
    },
}


def _programs():
    """(name, function, args) of every program here and every corpus program."""
    out = [(name, f, args, {}) for name, (f, args) in PROGRAMS.items()]
    out += [(p.name, p.fun, p.args, p.kwargs) for p in CORPUS]
    return out


def _walk(region: Region):
    """Every equation of ``region``, inside nested regions and in jaxprs held by
    parameters (custom_linear_solve) too."""
    for _, eqn in region.walk():
        yield eqn.prim.name, eqn.params
        for value in eqn.params.values():
            yield from _walk_jaxprs(value)


def _walk_jaxprs(value):
    if isinstance(value, (jx.ClosedJaxpr, jx.Jaxpr)):
        jaxpr = value.jaxpr if isinstance(value, jx.ClosedJaxpr) else value
        for e in jaxpr.eqns:
            yield e.primitive.name, e.params
            for v in e.params.values():
                yield from _walk_jaxprs(v)
    elif isinstance(value, tuple):
        for v in value:
            yield from _walk_jaxprs(v)


# Leaf types emitted by a rule rather than a generic spelling (the round trips below
# prove those): regions, jaxprs (custom_linear_solve) and checkpoint policies.
_RULE_SPELLED = (Region, jx.ClosedJaxpr, jx.Jaxpr)


def _leaves(value):
    """The leaf values of a parameter: containers are taken apart."""
    if isinstance(value, (list, tuple, frozenset, set)) and not hasattr(value, "_fields") \
            or type(value).__name__ == "_LinearSolveTuple":
        for v in value:
            yield from _leaves(v)
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(k)
            yield from _leaves(v)
    else:
        yield value


@pytest.fixture(scope="module")
def traced():
    table = {}
    for name, f, args, kwargs in _programs():
        try:
            table[name] = jaxpr_cc.trace(f, *args, **kwargs)
        except Exception as e:  # the corpus's known frontend limits; ours must trace
            assert name not in PROGRAMS, f"{name}: {type(e).__name__}: {e}"
    return table


def test_every_registered_primitive_is_exercised_or_classified(traced):
    registered = set(jx.registered_primitives())
    exercised = {name for program in traced.values() for name, _ in _walk(program.body)}
    classified = set().union(*NOT_EXERCISED.values())
    unknown = registered - exercised - classified
    assert unknown == set(), f"primitives neither exercised nor classified: {sorted(unknown)}"
    stale = classified & exercised
    assert stale == set(), f"classified as not exercised but exercised: {sorted(stale)}"
    assert len(exercised & registered) >= 150


# Parameters an emission rule consumes (it writes the public call that stages them):
# for these the proof of a spelling is that the program holding them is emitted.
RULE_PARAMS = {("debug_callback", "effect"), ("debug_callback", "callback"),
               ("debug_print", "in_tree"), ("jit", "in_shardings"), ("jit", "out_shardings"),
               ("composite", "attributes")}
# A debug callback's function is code, not data: such programs emit (the function is
# imported by name) but are refused by save with a one-line SaveError.
CODE_PARAMS = {("debug_callback", "callback")}


def test_every_param_type_has_a_codec_and_a_spelling(traced):
    examples: dict[tuple, tuple[str, str, object, str]] = {}
    for program_name, program in traced.items():
        for prim, params in _walk(program.body):
            for key, value in params.items():
                for leaf in _leaves(value):
                    by_rule = (prim, key) in RULE_PARAMS
                    examples.setdefault((type(leaf), by_rule), (prim, key, leaf, program_name))
    no_codec, no_spelling = [], []
    json_native = (type(None), bool, int, float, str)
    to_emit: set[str] = set()
    for (t, by_rule), (prim, key, leaf, program_name) in sorted(
            examples.items(), key=lambda kv: (kv[0][0].__qualname__, kv[0][1])):
        if t not in json_native and (prim, key) not in CODE_PARAMS and codec_for(leaf) is None:
            no_codec.append(f"{prim}.{key}: {t.__module__}.{t.__qualname__}")
        if by_rule or isinstance(leaf, _RULE_SPELLED) or (
                callable(leaf) and not isinstance(leaf, (type, enum.Enum, jx.Primitive))):
            to_emit.add(program_name)
            continue
        try:
            param_source(leaf)
        except SpellingError as e:
            no_spelling.append(f"{prim}.{key}: {t.__module__}.{t.__qualname__} ({e})")
    for program_name in sorted(to_emit):
        jaxpr_cc.emit_python(traced[program_name])  # raises PythonEmitError if unspelled
    assert no_codec == [], "\n".join(no_codec)
    assert no_spelling == [], "\n".join(no_spelling)
    assert len(examples) >= 30  # a broad enumeration, not a handful


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_save_load_and_emit_reproduce_jax(name, traced, tmp_path):
    f, args = PROGRAMS[name]
    program = traced[name]
    # Each side compiled whole by jax.jit (one compilation, not one per operation).
    want = jax.jit(f)(*args)
    path = tmp_path / f"{name}.jcc"
    jaxpr_cc.save(program, path)
    loaded = jaxpr_cc.load(path)
    _assert_same(want, jax.jit(loaded)(*args))
    namespace: dict = {}
    exec(compile(jaxpr_cc.emit_python(program), f"<emitted {name}>", "exec"), namespace)
    _assert_same(want, jax.jit(namespace[program.name])(*args))


def _assert_same(want, got):
    w_leaves, g_leaves = jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(got)
    assert len(w_leaves) == len(g_leaves)
    for w, g in zip(w_leaves, g_leaves):
        w, g = np.asarray(w), np.asarray(g)
        assert w.dtype == g.dtype and w.shape == g.shape
        np.testing.assert_array_equal(g, w)


def test_prng_impl_goes_by_its_registered_name(traced):
    source = jaxpr_cc.emit_python(traced["prng"])
    for name in ("threefry2x32", "rbg", "unsafe_rbg"):
        assert f"impl={name!r}" in source
    assert "'fry'" not in source


def test_unregistered_names_are_refused_on_load():
    from jaxpr_cc.io.errors import FormatError
    from jaxpr_cc.io.param_codecs import ParamDecoder
    decoder = ParamDecoder(None, None, None, None)
    with pytest.raises(FormatError, match="unknown PRNG implementation 'nope'"):
        decoder.decode({"$t": "prng_impl", "v": "nope"})
    with pytest.raises(FormatError, match="ArrayCopySemantics has no member 'SOMETIMES'"):
        decoder.decode({"$t": "enum", "v": ["ArrayCopySemantics", "SOMETIMES"]})




def test_every_registered_param_type_has_all_four_aspects():
    # One registry (ir.param_types) holds, for each parameter type, its printing, its
    # save/load encoding, its Python spelling and its CSE key; a type that cannot be
    # saved or spelled says why.
    import jaxpr_cc.backends.python_spelling  # noqa: F401 (registers spellings)
    import jaxpr_cc.io.param_codecs  # noqa: F401 (registers codecs)
    from jaxpr_cc.ir import param_types
    missing = {f"{t.__module__}.{t.__qualname__}": e.missing()
               for t, e in param_types.entries().items() if e.missing()}
    assert missing == {}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_printed_params_and_cse_keys_survive_save_and_load(name, traced, tmp_path):
    """Every parameter prints, saves, loads and keys through its registry entry: the
    loaded program prints byte for byte as the original, and each of its equations
    has the CSE key of the original's."""
    from jaxpr_cc.ir.printer import format_param, print_program
    from jaxpr_cc.ir.structural_key import KeyMaker
    program = traced[name]
    path = tmp_path / f"{name}.jcc"
    jaxpr_cc.save(program, path)
    loaded = jaxpr_cc.load(path)
    original_eqns = [e for _, e in program.body.walk()]
    loaded_eqns = [e for _, e in loaded.body.walk()]
    assert [e.prim.name for e in loaded_eqns] == [e.prim.name for e in original_eqns]
    # JAX jaxprs held as parameters (custom_linear_solve) print through JAX's printer,
    # which names a shared sub-jaxpr once per object, and key by identity; those are
    # compared by the value round trips above instead.
    holds_jaxpr = lambda v: any(isinstance(x, (jx.Jaxpr, jx.ClosedJaxpr))  # noqa: E731
                                for x in _leaves(v))
    if not any(holds_jaxpr(v) for e in original_eqns for v in e.params.values()):
        assert print_program(loaded) == print_program(program)
    keys_a, keys_b = KeyMaker(), KeyMaker()
    for a, b in zip(original_eqns, loaded_eqns):
        for k, value in a.params.items():
            if holds_jaxpr(value):
                continue
            text = format_param(value)
            assert " at 0x" not in text
            assert format_param(b.params[k]) == text, (a.prim.name, k)
            assert keys_a.value(value) == keys_b.value(b.params[k]), (a.prim.name, k)


def test_user_reducers_differentiate_after_save_load_and_emit(tmp_path):
    # (adversary stop 37: lax.reduce with a user reducer could not be saved or emitted;
    # JAX's own jacfwd and grad are the reference.)
    def f(x):
        return jax.lax.reduce(x * x, 0.0, lambda a, b: a + 1.5 * b, (0,)) * x

    x = np.array([0.5, -1.5, 2.0], np.float32)
    program = jaxpr_cc.trace(f, x)
    jaxpr_cc.save(program, tmp_path / "r.jcc")
    loaded = jaxpr_cc.load(tmp_path / "r.jcc")
    namespace: dict = {}
    exec(compile(jaxpr_cc.emit_python(program), "<emitted>", "exec"), namespace)
    emitted = namespace[program.name]
    want_jac = jax.jacfwd(f)(x)
    want_grad = jax.grad(lambda v: f(v)[1])(x)
    for g in (program, loaded, emitted, jax.jit(loaded)):
        np.testing.assert_allclose(np.asarray(jax.jacfwd(g)(x)), np.asarray(want_jac), rtol=1e-6)
        np.testing.assert_allclose(np.asarray(jax.grad(lambda v: g(v)[1])(x)),
                                   np.asarray(want_grad), rtol=1e-6)
