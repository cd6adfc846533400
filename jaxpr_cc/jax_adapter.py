"""The one module that touches JAX internals (``jax._src``).

JAX's internal APIs move quickly (``ClosedJaxpr`` is being folded into ``Jaxpr``
upstream, constants are moving into invars), so every other module of jaxpr-cc
imports what it needs of JAX's internals from here.  A JAX upgrade should touch
this file and nothing else.  The names exported here are deliberately plain
re-exports or tiny wrappers, each with the reason it is needed.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import os
import threading
import types
import weakref
from typing import Any, Callable, Sequence

import jax
from jax._src import core as _core
from jax._src import linear_util as _lu
from jax._src import source_info_util as _source_info_util
from jax._src.interpreters import partial_eval as _pe

JAX_VERSION = jax.__version__

# --- core jaxpr data structures --------------------------------------------
Var = _core.Var
Literal = _core.Literal
DropVar = _core.DropVar
Jaxpr = _core.Jaxpr
ClosedJaxpr = _core.ClosedJaxpr
JaxprEqn = _core.JaxprEqn
Primitive = _core.Primitive
ShapedArray = _core.ShapedArray
AbstractValue = _core.AbstractValue
JaxprTypeError = _core.JaxprTypeError
# JAX's wrapper of a Python function (staged custom-rule callables are these).
WrappedFun = _lu.WrappedFun
DebugInfo = _lu.DebugInfo
no_effects = _core.no_effects

new_jaxpr_eqn = _core.new_jaxpr_eqn
eval_jaxpr = _core.eval_jaxpr
jaxpr_as_fun = _core.jaxpr_as_fun  # removed from public jax.core in 0.10
check_jaxpr = _core.check_jaxpr
new_source_info = _source_info_util.new_source_info


_BASE_IS_HIGH = _core.Primitive.is_high


def _eqn_is_high(eqn) -> bool:
    prim, params = eqn.primitive, eqn.params
    if getattr(prim.is_high, "__func__", None) is _BASE_IS_HIGH:  # only nested jaxprs
        return any(type(v) in (Jaxpr, ClosedJaxpr) and v.is_high for v in params.values())
    return bool(prim.is_high(*[v.aval for v in eqn.invars], **params))


def jaxpr_from_parts(constvars, invars, outvars, eqns, effects, debug_info) -> Jaxpr:
    """A Jaxpr, marked high-level when an equation is (JAX's experimental
    ``custom_vjp3`` stages a high-level primitive; jit must lower it first)."""
    high = any(map(_eqn_is_high, eqns))
    return Jaxpr(constvars, invars, outvars, eqns, effects, debug_info, is_high=high)


def get_aval(x: Any) -> AbstractValue:
    return jax.typeof(x)


def make_debug_info(name: str, n_in: int, n_out: int,
                    arg_names: Sequence[str] | None = None) -> DebugInfo:
    """A DebugInfo for a jaxpr we build ourselves.

    JAX asserts (under ``jax_enable_checks``) that arg_names/result_paths match the
    jaxpr's arity, so names are only given when their count is right.
    """
    names = tuple(arg_names) if arg_names is not None and len(arg_names) == n_in else None
    return DebugInfo("jaxpr_cc", name, names, None)


def fit_debug_info(dbg: DebugInfo | None, n_in: int, n_out: int) -> DebugInfo:
    """Keep ``dbg`` where it still describes a jaxpr of this arity, else drop the parts
    that no longer fit (passes add and remove inputs and outputs)."""
    if dbg is None:
        return make_debug_info("jaxpr_cc", n_in, n_out)
    arg_names = dbg.arg_names
    if arg_names is not None and len(arg_names) != n_in:
        arg_names = None
    result_paths = dbg.result_paths
    if isinstance(result_paths, tuple) and len(result_paths) != n_out:
        result_paths = None
    elif result_paths is not None and not isinstance(result_paths, tuple):
        result_paths = None
    if arg_names is dbg.arg_names and result_paths is dbg.result_paths:
        return dbg
    return dbg._replace(arg_names=arg_names, result_paths=result_paths)


def dce_jaxpr(jaxpr: Jaxpr, used_outputs: Sequence[bool], instantiate=False):
    """JAX's own dead-code elimination (also the reference our ``dce`` pass is
    tested against).  ``instantiate=True`` keeps every input."""
    return _pe.dce_jaxpr(jaxpr, list(used_outputs), instantiate=instantiate)


def is_effectful(eqn_effects) -> bool:
    return bool(eqn_effects)


def primitives_registry(extra_modules: Sequence[str] = ()) -> dict[str, list[Primitive]]:
    """Every Primitive object JAX defines at module level, by name.

    Imports a fixed list of JAX's own modules (never a name read from a file), then
    walks every loaded ``jax`` and ``jaxpr_cc`` module for ``Primitive`` objects.  A
    name maps to a list so that callers can detect names two distinct primitives
    share.  ``extra_modules`` are further modules of JAX (or of jaxpr-cc) to import
    first.
    """
    import importlib
    import sys
    for modname in _PRIMITIVE_MODULES + tuple(extra_modules):
        try:
            importlib.import_module(modname)
        except ImportError:  # optional parts of JAX (e.g. GPU-only) may be absent
            continue
    registry: dict[str, list[Primitive]] = {}
    for modname in sorted(sys.modules):
        if not (modname == "jax" or modname.startswith(("jax.", "jaxpr_cc."))):
            continue
        mod = sys.modules.get(modname)
        namespace = getattr(mod, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for value in list(namespace.values()):
            if isinstance(value, Primitive):
                found = registry.setdefault(value.name, [])
                if not any(p is value for p in found):
                    found.append(value)
    return registry


# Modules of JAX that define primitives.  ``import jax`` already loads most of them;
# the rest are listed so that a fresh process knows every primitive a saved
# program may use, independently of what the saving process happened to import.
_PRIMITIVE_MODULES = (
    "jax", "jax.numpy", "jax.lax", "jax.random", "jax.scipy.special", "jax.nn",
    "jax._src.ad_checkpoint", "jax._src.ad_util", "jax._src.buffer_callback",
    "jax._src.callback", "jax._src.compute_on", "jax._src.custom_derivatives",
    "jax._src.custom_transpose", "jax._src.debugging", "jax._src.dispatch",
    "jax._src.pjit", "jax._src.random.prng", "jax._src.shard_alike",
    "jax._src.shard_map", "jax._src.xla_metadata", "jax._src.lax.control_flow",
    "jax._src.lax.linalg", "jax._src.lax.fft", "jax._src.lax.ann",
    "jax._src.lax.special", "jax._src.lax.parallel", "jax._src.state.primitives",
)

# Modules imported only when a name is not found among the above (heavier imports).
PRIMITIVE_MODULES_SECOND_TIER = ("jax.experimental.sparse",)


# --- saved-program format (jaxpr_cc/io) -------------------------------------
# The reader and writer of saved programs need to rebuild JAX's own objects from
# plain data: literals, equation contexts, name stacks, meshes, PRNG key types,
# effects.  Each name below is a re-export or a constructor wrapper, kept here so
# that a JAX upgrade that moves them touches this file only.
from jax._src import literals as _literals  # noqa: E402
from jax._src import mesh as _mesh  # noqa: E402
from jax._src import named_sharding as _named_sharding  # noqa: E402

TypedNdArray = _literals.TypedNdArray
TypedInt = _literals.TypedInt
TypedFloat = _literals.TypedFloat
TypedComplex = _literals.TypedComplex
JaxprEqnContext = _core.JaxprEqnContext
SourceInfo = _source_info_util.SourceInfo
NameStack = _source_info_util.NameStack
NameScope = _source_info_util.Scope
NameTransform = _source_info_util.Transform
AbstractToken = _core.AbstractToken
abstract_token = _core.abstract_token
MemorySpace = _core.MemorySpace
ManualAxisType = _core.ManualAxisType
AbstractDevice = _mesh.AbstractDevice
UnspecifiedValue = _named_sharding.UnspecifiedValue
UNSPECIFIED = _named_sharding.UNSPECIFIED
NamedAxisEffect = _core.NamedAxisEffect
GenericEffect = _core.GenericEffect
InternalMutableArrayEffect = _core.InternalMutableArrayEffect
JaxprInputEffect = _core.effects.JaxprInputEffect
Effect = _core.effects.Effect
ExtendedDType = _core.dtypes.ExtendedDType


def make_eqn_context(compute_type, threefry_partitionable: bool, abstract_mesh,
                     remove_size_one_mesh_axis: bool, xla_metadata) -> JaxprEqnContext:
    """A ``JaxprEqnContext`` with the given fields.

    The public constructor reads the fields from the current configuration; the
    loader needs the recorded ones.  Contexts are interned, so equal fields give
    the very object JAX itself would use."""
    return _core.JaxprEqnContext._create(compute_type, threefry_partitionable, abstract_mesh,
                                         remove_size_one_mesh_axis, xla_metadata)


def eqn_context_fields(ctx: JaxprEqnContext) -> tuple:
    """``(compute_type, threefry_partitionable, abstract_mesh,
    remove_size_one_mesh_axis, xla_metadata)`` of an equation context."""
    return (ctx.compute_type, ctx.threefry_partitionable, ctx.cur_abstract_mesh,
            ctx.remove_size_one_mesh_axis, ctx.xla_metadata)


def make_source_info(name_stack) -> SourceInfo:
    """Source info without a Python traceback (tracebacks are process-local)."""
    return _source_info_util.SourceInfo(None, name_stack)


def prng_impls() -> dict:
    """JAX's registered PRNG implementations by name (``threefry2x32``, ...)."""
    from jax._src.random import prng
    return dict(prng.prngs)


def key_dtype(impl_name: str):
    """The extended dtype of key arrays of the named PRNG implementation."""
    from jax._src.random import prng
    return prng.KeyTy(prng.prngs[impl_name])


def key_dtype_impl_name(dtype) -> str | None:
    """The PRNG implementation name of a key dtype, or None for other dtypes."""
    from jax._src.random import prng
    if isinstance(dtype, prng.KeyTy):
        return dtype._impl.name
    return None


def weak_device_array(host_array):
    """A committed-nowhere ``jax.Array`` with ``weak_type=True`` holding ``host_array``
    (the public constructors always make strongly typed arrays)."""
    from jax._src.lax import lax as _lax
    return _lax._convert_element_type(host_array, host_array.dtype, weak_type=True)


def weakly_typed(x):
    """``x`` (traced or not) as a weakly typed value of the same dtype, as a Python
    scalar result of ``jax.jit`` is."""
    from jax._src.lax import lax as _lax
    return _lax._convert_element_type(x, x.dtype, weak_type=True)


def lowered_out_weak_types(lowered) -> list[bool]:
    """Which results of a ``jax.jit(...).lower(...)`` are weakly typed (its public
    ``out_info`` drops weak types)."""
    return [bool(a.weak_type) for a in lowered._lowering.compile_args["global_out_avals"]]


def known_effects() -> dict[str, Any]:
    """JAX's singleton effect objects, by a stable name used in saved programs."""
    from jax._src import callback, debugging
    from jax._src.lax import lax as _lax
    from jax._src.lax import parallel as _parallel
    table = {
        "debug": debugging.debug_effect,
        "ordered_debug": debugging.ordered_debug_effect,
        "io": callback._IOEffect,
        "ordered_io": callback._OrderedIOEffect,
        "internal_mutable_array": _core.internal_mutable_array_effect,
        "no_dce": _lax.no_dce_effect,
    }
    single_side = getattr(_parallel, "single_side_collective_effect", None)
    if single_side is not None:
        table["single_side_collective"] = single_side
    return table


def ref_effect_types() -> dict[str, type]:
    """Effects on mutable-array inputs (``Read``/``Write``/``Accum``), by name."""
    from jax._src.state import types as _state_types
    return {"read": _state_types.ReadEffect, "write": _state_types.WriteEffect,
            "accum": _state_types.AccumEffect}


def param_enum_types() -> tuple[type, ...]:
    """Enum classes that appear as equation parameters."""
    from jax._src.lax import lax as _lax
    classes = [jax.lax.Precision, jax.lax.RoundingMethod, jax.lax.FftType,
               jax.lax.GatherScatterMode, jax.lax.DotAlgorithmPreset,
               jax.lax.RandomAlgorithm, jax.lax.AccuracyMode, jax.sharding.AxisType,
               _core.MemorySpace]
    for name in ("RaggedDotMode", "PaddingType"):
        cls = getattr(_lax, name, None)
        if cls is not None:
            classes.append(cls)
    import jax.lax.linalg as _linalg
    for name in ("EigImplementation", "EighImplementation", "SvdAlgorithm"):
        cls = getattr(_linalg, name, None)
        if cls is not None:
            classes.append(cls)
    return tuple(classes)


def dots_saveable_type() -> type:
    """The class of the ``dots_saveable`` family of remat policies."""
    from jax._src import ad_checkpoint
    return ad_checkpoint.DotsSaveable


def named_policy_types() -> dict[type, tuple[str, str]]:
    """Remat policies made from checkpoint names: class -> (the
    ``jax.checkpoint_policies`` factory that makes one from names, the field that
    holds them)."""
    from jax._src import ad_checkpoint
    return {ad_checkpoint.SaveOnlyTheseNames: ("save_only_these_names", "saveable_names"),
            ad_checkpoint.SaveAnyNamesButThese: ("save_any_names_but_these", "names")}


# --- effects and jit parameters (used by jaxpr_cc/passes) ---------------------
# JAX's own DCE treats some effects as removable (reads, named-axis collectives,
# internal mutable arrays); the passes classify effects the same way so that our
# dce never keeps less than pe.dce_jaxpr would, and never drops what it keeps.
from jax._src import effects as _pass_effects  # noqa: E402
from jax._src import sharding_impls as _pass_sharding_impls  # noqa: E402

#: The ``in_shardings`` entry of a jit operand with no sharding request; passes
#: that add operands to a ``jit`` equation (hoist-consts) use it.
UNSPECIFIED_SHARDING = _pass_sharding_impls.UNSPECIFIED


def is_removable_effect(effect) -> bool:
    """True when JAX's DCE may drop an equation whose only effects are like this one."""
    return _pe.dceable_effects.contains(effect)


def is_named_axis_effect(effect) -> bool:
    """A collective's dependence on a named mesh/vmap axis: not a side effect."""
    return isinstance(effect, _core.NamedAxisEffect)


def is_input_effect(effect) -> bool:
    """An effect that names one of the equation's inputs by position (state refs):
    changing the equation's operand list would make it point at the wrong input."""
    return isinstance(effect, _pass_effects.JaxprInputEffect)


# --- tracing helpers for closure conversion ----------------------------------
from jax._src import api_util as _api_util  # noqa: E402
from jax._src import custom_derivatives as _cd  # noqa: E402

custom_vjp_call_p = _cd.custom_vjp_call_p
custom_jvp_call_p = _cd.custom_jvp_call_p
linear_call_p = _cd.linear_call_p
typeof = _core.typeof
Tracer = _core.Tracer


def resolve_kwargs(fun, args, kwargs) -> tuple:
    """Keyword arguments -> positional, following ``fun``'s signature (as JAX's
    custom_vjp/custom_jvp do before binding)."""
    if not kwargs and _takes_exactly(fun, len(args)):
        # What binding would give (no keyword, no default to fill), without
        # building the signature: a program calling one rule 1,000 times pays
        # it 1,000 times.
        return tuple(args)
    return tuple(_api_util.resolve_kwargs(fun, args, kwargs))


def _takes_exactly(fun, n: int) -> bool:
    """``fun`` is a plain function of exactly ``n`` positional parameters (no
    ``*args``, keyword-only parameters, or signature of another function)."""
    code = getattr(fun, "__code__", None)
    if not isinstance(fun, types.FunctionType) or code is None or \
            "__wrapped__" in fun.__dict__ or "__signature__" in fun.__dict__:
        return False
    return (code.co_argcount == n and code.co_kwonlyargcount == 0
            and not code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS))


def trace_flat(fun, in_avals, name: str = "rule"):
    """Trace ``fun(*flat_args) -> flat outputs`` at ``in_avals`` to a jaxpr whose
    closed-over values (constants, and tracers of enclosing live traces) are lifted
    to leading invars.  Returns ``(jaxpr, consts, out_avals)``.

    This is what ``jax.make_jaxpr`` does, minus the ShapeDtypeStruct round trip and
    plus the constvar->invar conversion closure conversion needs.
    """
    dbg = _lu.DebugInfo("jaxpr_cc", name, None, None)
    wrapped = _lu.wrap_init(fun, debug_info=dbg)
    jaxpr, out_avals, consts = _pe.trace_to_jaxpr_dynamic(wrapped, list(in_avals))
    return _pe.convert_constvars_jaxpr(jaxpr), list(consts), list(out_avals)


def bind_linear_call(operands, *, callee: ClosedJaxpr, transpose_thunk, num_callee_consts: int,
                     num_res: int):
    """Bind ``linear_call`` with a transpose thunk of our own.

    The thunk protocol is tiny (``thunk() -> (ClosedJaxpr, consts)``); building the
    equation directly lets us tag the thunk so the IR can recognise its rule.
    """
    return linear_call_p.bind(*operands, callee=callee, transpose_thunk=transpose_thunk,
                              num_callee_consts=num_callee_consts, num_res=num_res)


def call_fwd_jaxpr_thunk(thunk, nonzeros):
    """JAX's staged custom_vjp fwd thunk -> (fwd jaxpr, consts)."""
    return thunk.call_wrapped(*nonzeros)


def call_wrapped(fun, *args):
    """Call a ``linear_util.WrappedFun`` (JAX's staged custom-rule callables), with
    tangents known zero in forward mode left dense (``forward_zero`` below)."""
    with _FORWARD_ZERO_DENSE(True):
        return fun.call_wrapped(*args)


def wrapped_fun_target(fun):
    """The user's Python function inside a ``linear_util.WrappedFun`` (or ``fun``)."""
    return getattr(fun, "f", fun)


def wrapped_fun_label(fun) -> tuple[str, str] | None:
    """``(name, "file.py:line")`` of the function a ``WrappedFun`` was traced for,
    from JAX's debug info, when its target is a thunk of JAX's own (a staged rule's
    memoized tracer) rather than the user's function; else None."""
    target = wrapped_fun_target(fun)
    if not getattr(target, "__module__", "").startswith("jax._src"):
        return None
    src = getattr(getattr(fun, "debug_info", None), "func_src_info", None)
    if not src or " at " not in src:
        return None
    name, _, where = src.rpartition(" at ")
    path, _, line = where.rpartition(":")
    return name, f"{os.path.basename(path)}:{line}"


def is_symbolic_zero(x) -> bool:
    """Is ``x`` a symbolic zero JAX passes between rules (its internal ``ad.Zero``,
    a ``SymbolicZero``, or None from a bwd)?"""
    from jax._src.interpreters import ad as _ad
    from jax.custom_derivatives import SymbolicZero
    return x is None or isinstance(x, (_ad.Zero, SymbolicZero))


def instantiate_zero(x, aval):
    """JAX's internal symbolic ``ad.Zero`` (what staged bwd rules return for zero
    cotangents) -> a dense zero array; anything else unchanged."""
    from jax._src.interpreters import ad as _ad
    import jax.numpy as jnp
    import numpy as np
    if isinstance(x, _ad.Zero):
        if jnp.issubdtype(aval.dtype, jax.dtypes.float0):
            return np.zeros(aval.shape, jax.dtypes.float0)
        return jnp.zeros(aval.shape, aval.dtype)
    return x


def to_cotangent_aval(aval):
    return aval.to_ct_aval()


UnexpectedTracerError = jax.errors.UnexpectedTracerError
# What JAX's staged custom_vjp fwd raises when asked to perturb a value the rule's
# primal closed over (JAX lifted it into the re-bound call's leading arguments).
from jax._src.interpreters.ad import CustomVJPException  # noqa: E402


def maybe_perturbed(x) -> bool:
    """JAX's heuristic for "this closed-over value may carry a tangent" (the values
    ``jax.closure_convert`` hoists)."""
    return _cd._maybe_perturbed(x)


def debug_callback_parts(flat_callback: Any):
    """``(user_callback, in_tree, static_args)`` of the ``callback`` parameter that
    ``jax.debug.callback`` stages, or None for anything else.

    JAX wraps the user's function in a closure over those three names
    (``jax/_src/debugging.py``: ``_flat_callback``); the Python source backend needs
    the user's function back to spell the call.
    """
    code = getattr(flat_callback, "__code__", None)
    cells = getattr(flat_callback, "__closure__", None)
    if code is None or cells is None or code.co_name != "_flat_callback":
        return None
    env = dict(zip(code.co_freevars, (c.cell_contents for c in cells)))
    if not {"callback", "in_tree", "static_args"} <= set(env):
        return None
    return env["callback"], env["in_tree"], env["static_args"]


def is_ordered_effect(effect: Any) -> bool:
    """True for the effect ``jax.debug.callback(..., ordered=True)`` stages."""
    from jax._src import debugging as _debugging
    return effect is _debugging.ordered_debug_effect


# --- XLA executables (backends/xla.py) ----------------------------------------
from jax._src import sharding_impls as _xla_sharding_impls  # noqa: E402


def compiled_fast_call(compiled):
    """The C++ dispatcher behind a ``jax.stages.Compiled`` (what ``Compiled.__call__``
    forwards to), or ``compiled`` itself when XLA gives it none (executables with
    host callbacks or unordered effects).  Calling it directly saves the Python
    frame of ``Compiled.__call__`` on every call of an Executable.
    """
    call = getattr(compiled, "_call", None)
    if call is None:
        call = compiled._executable.create_cpp_call(compiled._params)
        if call is None:
            return compiled
        compiled._call = call
    return call


def named_sharding_from_hlo(sharding, mesh, ndim: int):
    """The NamedSharding over ``mesh`` equivalent to ``sharding`` (of an array of
    rank ``ndim``): a compiler-chosen one (XLA reports propagated input shardings
    as ``GSPMDSharding``), or a NamedSharding on another mesh over the same
    devices (a 1-D ``('d',)`` mesh and a 2-D ``('x', 'y')`` one); None when it
    has no equivalent on ``mesh``.

    Saving a multi-device executable needs every sharding as a NamedSharding:
    that is what ``jax.export`` serializes and what can be rebuilt by device id.
    """
    if not isinstance(sharding, _xla_sharding_impls.GSPMDSharding):
        try:
            sharding = _xla_sharding_impls.GSPMDSharding(
                sharding._device_assignment, sharding._to_xla_hlo_sharding(ndim),
                memory_kind=sharding.memory_kind)
        except (AttributeError, ValueError, TypeError, AssertionError):
            return None
    try:
        return _xla_sharding_impls._gspmd_to_named_sharding_via_mesh(sharding, mesh)
    except (ValueError, TypeError, AssertionError):
        return None


def find_tagged_function(staged, attr: str, budget: int = 100_000):
    """The function carrying attribute ``attr`` inside a staged custom-rule callable.

    JAX stages a ``custom_jvp`` rule as a memoized thunk (``jvp_jaxpr_fun``) whose
    closure holds the ``WrappedFun`` of the user's rule, so the rule is a few closure
    cells away rather than at ``.f``; every re-binding of the equation (``eval_jaxpr``,
    DCE, transposition, each pass that re-traces a body) wraps it in another thunk, so
    the depth grows with the pipeline.  Searched breadth-first through ``.f`` and
    closure cells, each object once, at most ``budget`` objects.
    """
    frontier, seen = [staged], set()
    while frontier and len(seen) < budget:
        nxt = []
        for obj in frontier:
            if obj is None or id(obj) in seen:
                continue
            seen.add(id(obj))
            if hasattr(obj, attr):
                return obj
            inner = getattr(obj, "f", None)
            if inner is not None:
                nxt.append(inner)
            for cell in getattr(obj, "__closure__", None) or ():
                try:
                    nxt.append(cell.cell_contents)
                except ValueError:
                    continue
        frontier = nxt
    return None


# --- linear_call: batching, and AD rules that accept perturbed residuals ------
# (used by passes/vjp_to_jvp.py, whose custom_jvp rules produce their tangents
# with ``linear_call(callee=transpose of bwd, transpose=bwd)``)
#
# JAX 0.10.2 registers no batching rule for ``linear_call`` (``jax.jacfwd`` =
# vmap of jvp fails), its jvp rule asserts that the residual operands carry no
# tangent (second derivatives perturb them), and its transpose rule asserts that
# every linear operand is being transposed (a custom_jvp rule instantiates the
# zero tangent of an argument that is not differentiated as a known constant).
# The rules below are generalizations: where JAX's own rules apply they delegate
# to them unchanged.
from jax._src.interpreters import ad as _lc_ad  # noqa: E402
from jax._src.interpreters import batching as _lc_batching  # noqa: E402

_JAX_LINEAR_CALL_JVP = _lc_ad.primitive_jvps.get(linear_call_p)
_JAX_LINEAR_CALL_TRANSPOSE = _lc_ad.primitive_transposes.get(linear_call_p)


class _BatchedTransposeThunk:
    """The transpose of a batched ``linear_call``: the original transpose jaxpr,
    batched like the callee (residuals at their axes, cotangents at the callee's
    output axes, the linear inputs' cotangents at those inputs' axes), built on
    first use and kept.  A batched map is block diagonal, so this is exactly the
    transpose of the batched callee."""

    def __init__(self, thunk, axis_data, res_axes, out_axes, lin_axes):
        self._thunk = thunk
        self._axis_data = axis_data
        self._res_axes = tuple(res_axes)
        self._out_axes = tuple(out_axes)
        self._lin_axes = tuple(lin_axes)
        self._built = None

    def __call__(self):
        if self._built is None:
            transpose, t_consts = self._thunk()
            in_axes = [None] * len(t_consts) + list(self._res_axes) + list(self._out_axes)
            batched, _ = _lc_batching.batch_jaxpr_axes(transpose, self._axis_data, in_axes,
                                                       list(self._lin_axes))
            self._built = (_literal_consts(batched), t_consts)
        return self._built

    def for_cotangents(self, pattern):
        """The batched thunk of the transpose picked for these nonzero cotangents
        (see ``_linear_call_transpose``), or this one."""
        pick = getattr(self._thunk, "for_cotangents", None)
        chosen = pick(pattern) if pick is not None else self._thunk
        if chosen is self._thunk:
            return self
        return _BatchedTransposeThunk(chosen, self._axis_data, self._res_axes, self._out_axes,
                                      self._lin_axes)


def _linear_call_batcher(axis_data, args, dims, *, callee, transpose_thunk, num_callee_consts,
                         num_res):
    n_lead = num_callee_consts + num_res
    params = dict(num_callee_consts=num_callee_consts, num_res=num_res)
    if all(d is None for d in dims):
        outs = linear_call_p.bind(*args, callee=callee, transpose_thunk=transpose_thunk, **params)
        return outs, [None] * len(outs)
    ops, in_axes = [], []
    for i, (x, d) in enumerate(zip(args, dims)):
        if d is None and i >= n_lead:
            # Unbatched linear operands are broadcast so that every linear input of
            # the batched callee is batched: its transpose then returns batched
            # cotangents for all of them (the broadcast's own transpose sums them).
            x = _lc_batching.broadcast(x, axis_data.size, 0, axis_data.explicit_mesh_axis)
            d = 0
        ops.append(x)
        in_axes.append(d)
    # Operands stay where they are batched and results come out where the callee
    # puts them (a matrix-vector product batches its vector's axis last): no
    # transposes around the call that the plain code's batching would not have.
    batched_callee, out_axes = _lc_batching.batch_jaxpr2(callee, axis_data, tuple(in_axes))
    if any(a is None for a in out_axes):
        out_axes = tuple(0 if a is None else a for a in out_axes)
        batched_callee, _ = _lc_batching.batch_jaxpr_axes(callee, axis_data, in_axes, out_axes)
    thunk = _BatchedTransposeThunk(transpose_thunk, axis_data, in_axes[num_callee_consts:n_lead],
                                   out_axes, in_axes[n_lead:])
    outs = linear_call_p.bind(*ops, callee=_literal_consts(batched_callee), transpose_thunk=thunk,
                              **params)
    return outs, list(out_axes)


def vectors_as_rhs(jaxpr):
    """``jaxpr`` with each ``dot_general`` whose lhs has no free dimensions (a
    vector contracted whole: ``t @ W.T``, as JAX's transposes write ``W.T @ g``)
    written with its operands swapped (``W`` against ``t``): the same result,
    element for element and in the same layout.  A swapped matrix that is a
    ``transpose`` with one free dimension is read through it (the dimension
    numbers permuted), as plain code's ``W @ t`` reads ``W``.  Batched, the
    vector's batch axis is then a free dimension of the rhs and the product is
    the one plain code's forward mode forms, which XLA lays out alike (a
    ``jacfwd`` through it needs no transpose of its result)."""
    producer = {}
    eqns = []
    for eqn in jaxpr.eqns:
        if eqn.primitive is jax.lax.dot_general_p:
            (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
            lhs, rhs = eqn.invars
            lhs_free = len(lhs.aval.shape) - len(lc) - len(lb)
            rhs_free = len(rhs.aval.shape) - len(rc) - len(rb)
            if lhs_free == 0 and rhs_free > 0 and not isinstance(lhs, Literal):
                matrix, mc, mb = rhs, tuple(rc), tuple(rb)
                made = producer.get(matrix) if not isinstance(matrix, Literal) else None
                if made is not None and made.primitive is jax.lax.transpose_p and rhs_free == 1:
                    perm = made.params["permutation"]
                    matrix, mc, mb = (made.invars[0], tuple(perm[d] for d in mc),
                                      tuple(perm[d] for d in mb))
                params = dict(eqn.params, dimension_numbers=((mc, lc), (mb, lb)))
                precision = params.get("precision")
                if isinstance(precision, tuple):
                    params["precision"] = precision[::-1]
                eqn = eqn.replace(invars=[matrix, lhs], params=params)
        for var in eqn.outvars:
            producer[var] = eqn
        eqns.append(eqn)
    out = jaxpr.replace(eqns=eqns)
    # A transpose read through is dead now.
    return dce_jaxpr(out, [True] * len(out.outvars), instantiate=True)[0]


def _literal_consts(closed: ClosedJaxpr) -> ClosedJaxpr:
    """``closed`` with no constants: a bound linear_call's callee takes its
    constants as operands, and JAX evaluates it without ``closed.consts``.
    Batching a callee that holds array literals (a Runge-Kutta tableau) lifts
    them to constants; they become literals again."""
    if not closed.consts:
        return closed
    inlined = inline_host_consts(jaxpr_consts_as_inputs(closed.jaxpr), closed.consts)
    if inlined is None:
        raise ValueError(f"a linear_call callee holds {len(closed.consts)} traced constants")
    return ClosedJaxpr(inlined, [])


def _linear_call_jvp(primals, tangents, *, callee, transpose_thunk, num_callee_consts, num_res):
    params = dict(callee=callee, transpose_thunk=transpose_thunk,
                  num_callee_consts=num_callee_consts, num_res=num_res)
    n_lead = num_callee_consts + num_res
    hot = [i for i, t in enumerate(tangents[:n_lead]) if type(t) is not _lc_ad.Zero]
    if not hot:
        # JAX's rule binds the linear tangents as given: a symbolic zero among them
        # is not a value linear_call takes (jacfwd of jacfwd through a custom_vjp).
        lin_t = tangents[n_lead:]
        if all(type(t) is _lc_ad.Zero for t in lin_t):
            outs = linear_call_p.bind(*primals, **params)
            return outs, [_lc_ad.Zero.from_primal_value(o) for o in outs]
        tangents = [*tangents[:n_lead], *map(_lc_ad.instantiate_zeros, lin_t)]
        return _JAX_LINEAR_CALL_JVP(primals, tangents, **params)
    # d/ds callee(res(s), lin(s)) = callee(res, dlin) + (d callee / d res)(res, lin) . dres:
    # the second term differentiates the callee's jaxpr like any other code.
    outs = linear_call_p.bind(*primals, **params)
    lead, lin = list(primals[:n_lead]), list(primals[n_lead:])

    def through_residuals(*hot_values):
        full = list(lead)
        for i, v in zip(hot, hot_values):
            full[i] = v
        return _core.eval_jaxpr(callee.jaxpr, callee.consts, *full, *lin)

    lin_t = tangents[n_lead:]
    if any(type(t) is not _lc_ad.Zero for t in lin_t) and not refuses_forward_mode(callee):
        # Both: one linear_call of the joint derivative (so the callee's work is
        # done once for both tangents, as plain code's jvp would), transposed by
        # the custom transpose for the linear operands (issue 17).
        lin_t = [_lc_ad.instantiate_zeros(t) for t in lin_t]
        return outs, _joint_tangent(callee, transpose_thunk, lead, lin, hot,
                                    [tangents[i] for i in hot], lin_t)
    if _needs_own_residual_transpose(callee):
        t_out = _residual_tangent(callee, lead, lin, hot, [tangents[i] for i in hot])
    else:
        _, t_out = jax.jvp(through_residuals, tuple(lead[i] for i in hot),
                           tuple(tangents[i] for i in hot))
    t_out = list(t_out)
    if any(type(t) is not _lc_ad.Zero for t in lin_t):
        lin_t = [_lc_ad.instantiate_zeros(t) for t in lin_t]
        t_lin = linear_call_p.bind(*lead, *lin_t, **params)
        t_out = [a + b for a, b in zip(t_out, t_lin)]
    return outs, t_out


def _joint_tangent(callee, transpose_thunk, lead, lin, hot, hot_t, lin_t):
    """``d callee(lead, lin)`` along ``(hot_t, lin_t)`` as one ``linear_call``
    with residuals ``(lead, lin)``: its callee is the joint jvp, its transpose
    gives the linear operands the custom transpose's cotangents and the
    perturbed residuals their vjp."""
    n_lead, n_lin, n_hot = len(lead), len(lin), len(hot)

    def at(lead_, hot_values):
        full = list(lead_)
        for i, v in zip(hot, hot_values):
            full[i] = v
        return full

    def joint(*ops):
        lead_, lin_ = ops[:n_lead], ops[n_lead:n_lead + n_lin]
        th, lt = ops[n_lead + n_lin:n_lead + n_lin + n_hot], ops[n_lead + n_lin + n_hot:]

        def f(hv, lv):
            return _core.eval_jaxpr(callee.jaxpr, callee.consts, *at(lead_, hv), *lv)
        _, t = jax.jvp(f, (tuple(lead_[i] for i in hot), tuple(lin_)), (tuple(th), tuple(lt)))
        return list(t)

    def joint_transpose(*ops):
        lead_, lin_ = ops[:n_lead], ops[n_lead:n_lead + n_lin]
        cts = ops[n_lead + n_lin:]
        transpose, t_consts = transpose_thunk()
        res = lead_[len(lead_) - (len(transpose.in_avals) - len(t_consts) - len(cts)):]
        ct_lin = _core.eval_jaxpr(transpose.jaxpr, transpose.consts, *t_consts, *res, *cts)

        if _needs_own_residual_transpose(callee):
            return [*_residual_vjp(callee, lead_, lin_, hot, list(cts)), *ct_lin]

        def f(*hv):
            return _core.eval_jaxpr(callee.jaxpr, callee.consts, *at(lead_, hv), *lin_)
        _, vjp = jax.vjp(f, *(lead_[i] for i in hot))
        return [*vjp(list(cts)), *ct_lin]

    in_avals = [_core.typeof(x) for x in (*lead, *lin, *hot_t, *lin_t)]
    ct_avals = [to_cotangent_aval(a) for a in callee.out_avals]
    # trace_flat puts captured constants first: they are the callees' consts.
    joint_jaxpr, joint_consts, _ = trace_flat(joint, in_avals, "joint_tangent")
    res_avals = in_avals[:n_lead + n_lin]

    def thunk():
        jaxpr, consts, _ = trace_flat(joint_transpose, [*res_avals, *ct_avals],
                                      "joint_tangent_transpose")
        return ClosedJaxpr(jaxpr, []), consts

    return list(linear_call_p.bind(*joint_consts, *lead, *lin, *hot_t, *lin_t,
                                   callee=ClosedJaxpr(joint_jaxpr, []), transpose_thunk=thunk,
                                   num_callee_consts=len(joint_consts),
                                   num_res=n_lead + n_lin))


def _linear_call_transpose(cts, *args, callee, transpose_thunk, num_callee_consts, num_res):
    params = dict(callee=callee, transpose_thunk=transpose_thunk,
                  num_callee_consts=num_callee_consts, num_res=num_res)
    n_lead = num_callee_consts + num_res
    pick = getattr(transpose_thunk, "for_cotangents", None)
    if pick is not None:
        # A symbolic-zeros custom_vjp's bwd traced per pattern of output cotangents
        # (vjp-to-jvp): the one for the outputs whose cotangent is a symbolic zero here.
        transpose_thunk = pick(tuple(type(ct) is not _lc_ad.Zero for ct in cts))
        params["transpose_thunk"] = transpose_thunk
    lin = args[n_lead:]
    known = [not _lc_ad.is_undefined_primal(x) for x in lin]
    if refuses_forward_mode(callee):
        return _reverse_only_transpose(cts, args, known, transpose_thunk, n_lead, num_res)
    if not any(known):
        return _transpose_linear_call(cts, *args, **params)
    # A known linear operand only adds a constant to the result: it gets no
    # cotangent, the others get the custom transpose's.
    lin = [_lc_ad.UndefinedPrimal(_core.typeof(x)) if k else x for x, k in zip(lin, known)]
    out = _transpose_linear_call(cts, *args[:n_lead], *lin, **params)
    return list(out[:n_lead]) + [None if k else c for c, k in zip(out[n_lead:], known)]


# (issue 17) A linear_call whose transpose thunk can name its swapped rule
# (``thunk.swapped()``, jaxpr-cc's first-order rules) transposes to a linear_call
# that is again one of those rules, not to one with JAX's anonymous thunk: a
# transposition stored in a program (a transposed while_loop) stays first-order.
def _transpose_linear_call(cts, *args, callee, transpose_thunk, num_callee_consts, num_res):
    swapped = getattr(transpose_thunk, "swapped", None)
    if swapped is None or num_callee_consts:
        return _JAX_LINEAR_CALL_TRANSPOSE(cts, *args, callee=callee,
                                          transpose_thunk=transpose_thunk,
                                          num_callee_consts=num_callee_consts, num_res=num_res)
    transpose, t_consts = transpose_thunk()
    res = args[:num_res]
    cts_avals = transpose.in_avals[len(t_consts) + num_res:]
    cts = [_lc_ad.instantiate_zeros(ct) if type(ct) is _lc_ad.Zero else ct for ct in cts]
    cts = [ct if ct is not None else jax.numpy.zeros(a.shape, a.dtype)
           for ct, a in zip(cts, cts_avals)]
    if t_consts:
        return _JAX_LINEAR_CALL_TRANSPOSE(cts, *args, callee=callee,
                                          transpose_thunk=transpose_thunk,
                                          num_callee_consts=num_callee_consts, num_res=num_res)
    out = linear_call_p.bind(*res, *cts, callee=transpose, transpose_thunk=swapped(),
                             num_callee_consts=0, num_res=num_res)
    return [None] * num_res + _symbolic_where_marked(out, transpose_thunk)


def _symbolic_where_marked(cts, transpose_thunk) -> list:
    """The transpose's cotangents, None (a symbolic zero) for each one the user's
    rule returned as a symbolic zero (jaxpr-cc's thunks know which)."""
    marks = getattr(transpose_thunk, "symbolic_outputs", None)
    zeros = marks() if marks is not None else ()
    if not zeros:
        return list(cts)
    return [None if z else c for c, z in zip(cts, zeros)]


# --- (h17h) linear_call: reverse mode along perturbed residuals of a callee
# with a while_loop ----------------------------------------------------------
# The tangent a linear_call gets from its perturbed residuals is the jvp of its
# callee.  When that callee holds a while_loop (vjp-to-jvp's tangent map of a bwd
# that solves an adjoint by iteration: the transposed iteration), JAX cannot
# reverse that jvp ("Reverse-mode differentiation does not work for
# lax.while_loop"), so ``jax.grad(jax.jacfwd(f))`` failed.  That jvp is linear
# in the residuals' tangents and its loop is counted (its stopping test reads
# primal carries only), which jaxpr-cc's own transposition handles: it is bound
# as a linear_call whose transpose is that transposition, registered here by
# ``jaxpr_cc.passes`` (the adapter sits below the passes).
_LINEAR_JAXPR_TRANSPOSER: list = [None]


def set_linear_jaxpr_transposer(transpose) -> None:
    """``transpose(closed, linear_mask) -> ClosedJaxpr`` (see
    ``jaxpr_cc.closure.transpose.transpose_linear``), used for the residual
    tangents of linear_calls whose callee holds a while_loop."""
    _LINEAR_JAXPR_TRANSPOSER[0] = transpose


def _jaxpr_has_while(jaxpr) -> bool:
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "while":
            return True
        for v in eqn.params.values():
            for x in (v if isinstance(v, (tuple, list)) else (v,)):
                sub = x.jaxpr if isinstance(x, ClosedJaxpr) else x
                if isinstance(sub, _core.Jaxpr) and _jaxpr_has_while(sub):
                    return True
    return False


def _needs_own_residual_transpose(callee) -> bool:
    return _LINEAR_JAXPR_TRANSPOSER[0] is not None and _jaxpr_has_while(callee.jaxpr)


def _residual_jvp_jaxpr(callee, lead_avals, lin_avals, hot):
    """``(lead, lin, hot_t) -> d callee(lead, lin) . hot_t`` (captured constants
    first) and those constants."""
    n_lead, n_lin = len(lead_avals), len(lin_avals)

    def jvp_res(*ops):
        lead_, lin_, hot_t = ops[:n_lead], ops[n_lead:n_lead + n_lin], ops[n_lead + n_lin:]

        def f(*hv):
            full = list(lead_)
            for i, v in zip(hot, hv):
                full[i] = v
            return _core.eval_jaxpr(callee.jaxpr, callee.consts, *full, *lin_)
        _, t = jax.jvp(f, tuple(lead_[i] for i in hot), tuple(hot_t))
        return list(t)

    hot_avals = [lead_avals[i].to_tangent_aval() for i in hot]
    jaxpr, consts, _ = trace_flat(jvp_res, [*lead_avals, *lin_avals, *hot_avals],
                                  "residual_tangent")
    return jaxpr, consts


def _residual_tangent(callee, lead, lin, hot, hot_t):
    """The residual term of ``_linear_call_jvp`` as a linear_call in ``hot_t``
    (residuals: the constants, ``lead``, ``lin``) transposed by jaxpr-cc."""
    hot_t = [_lc_ad.instantiate_zeros(t) for t in hot_t]
    lead_avals = [_core.typeof(x) for x in lead]
    lin_avals = [_core.typeof(x) for x in lin]
    jaxpr, consts = _residual_jvp_jaxpr(callee, lead_avals, lin_avals, hot)
    n_res = len(consts) + len(lead) + len(lin)
    closed = ClosedJaxpr(jaxpr, [])

    def thunk():
        transposed = _LINEAR_JAXPR_TRANSPOSER[0](closed, [False] * n_res + [True] * len(hot))
        return transposed, []

    return list(linear_call_p.bind(*consts, *lead, *lin, *hot_t, callee=closed,
                                   transpose_thunk=thunk, num_callee_consts=0, num_res=n_res))


def _residual_vjp(callee, lead, lin, hot, cts):
    """Cotangents of the perturbed residuals ``hot`` of ``callee(lead, lin)``,
    by jaxpr-cc's transposition of its jvp (JAX's vjp cannot reverse its loop)."""
    lead_avals = [_core.typeof(x) for x in lead]
    lin_avals = [_core.typeof(x) for x in lin]
    jaxpr, consts = _residual_jvp_jaxpr(callee, lead_avals, lin_avals, hot)
    n_res = len(consts) + len(lead) + len(lin)
    transposed = _LINEAR_JAXPR_TRANSPOSER[0](ClosedJaxpr(jaxpr, []),
                                             [False] * n_res + [True] * len(hot))
    cts = [_lc_ad.instantiate_zeros(ct) for ct in cts]
    return _core.eval_jaxpr(transposed.jaxpr, (), *consts, *lead, *lin, *cts)


# --- a custom_jvp call batched while it is staged ------------------------------
# vmap of a custom_jvp call whose results are staged into a jaxpr (vmap under jit,
# or jaxpr-cc batching a linear_call's callee) gives each result the batching of
# the primal function; the jvp rule, run when the staged jaxpr is differentiated,
# batches its results as its tangents are batched.  A rule whose tangent reads a
# batched input the primal result does not (``t_y = 0 * t_x``; vjp-to-jvp's
# transposed bwd of an ODE adjoint, which couples every output) then returns a
# batched primal where the staged equation has an unbatched one, and the jaxpr
# no longer type-checks (JAX 0.10.2: ``jax.jvp(jax.jit(jax.vmap(g)))`` fails so).
# Here such a result of a jaxpr-cc rule is staged batched, as the rule's jvp
# batches it, and the jvp's results are laid out as the staged ones (an abstract
# trace of the jvp when the call is staged, only for a call with an unbatched
# result and a batched input).  A user's rule is batched as JAX batches it: its
# jvp is not run before JAX runs it, and ``vmap(..., out_axes=None)`` of it works.
_STAGED_CUSTOM_JVP_BATCHING = _lc_batching.BatchTrace.process_custom_jvp_call


_PROBING_JVP = threading.local()
#: The attribute jaxpr-cc sets on the jvp function of every custom_jvp it builds
#: (``closure.rules``): a staged rule holding one is jaxpr-cc's.
OWNED_RULE = "_jaxpr_cc_owned"


def _batched_custom_jvp_call(self, prim, fun, jvp, tracers, /, *, symbolic_zeros):
    # (A jvp rule that calls its own function -- most do -- is probed as JAX
    # batches it: the probe only asks how the rule batches its results.)
    if not isinstance(self.parent_trace, _pe.DynamicJaxprTrace) or \
            getattr(_PROBING_JVP, "active", False):
        return _STAGED_CUSTOM_JVP_BATCHING(self, prim, fun, jvp, tracers,
                                           symbolic_zeros=symbolic_zeros)
    in_vals, in_dims = zip(*map(self.to_batch_info, tracers)) if tracers else ((), ())
    axis_data, tag = self.axis_data, self.tag
    staged = _StagedDims()  # the results' batch dims, set when fun is staged (in bind)
    fun_b, fun_dims = _lc_batching.batch_subtrace(fun, tag, axis_data, in_dims)
    fun_b = _lu.transformation2(_widened_results)(fun_b, fun_dims, jvp, tag, axis_data,
                                tuple(in_dims), staged)
    jvp_b, jvp_dims = _lc_batching.batch_custom_jvp_subtrace(jvp, tag, axis_data, in_dims)
    jvp_b = _lu.transformation2(_staged_layout)(jvp_b, jvp_dims, axis_data, staged)
    avals = tuple(_core.typeof(x) for x in in_vals)
    out_vals = prim.bind_with_trace(self.parent_trace, tuple(in_vals), avals,
                                    dict(subfuns=(fun_b, jvp_b), symbolic_zeros=symbolic_zeros))
    src = _source_info_util.current()
    return [_lc_batching.BatchTracer(self, v, d, src) for v, d in zip(out_vals, staged.dims)]


class _StagedDims:
    __slots__ = ("dims",)  # (hashed by identity: it is a WrappedFun's static argument)

    def __init__(self):
        self.dims: list = []


def _widened_results(f, fun_dims, jvp, tag, axis_data, in_dims, staged, *args):
    outs = f(*args)
    dims = list(fun_dims())
    if any(d is None for d in dims) and any(d is not None for d in in_dims) and \
            find_tagged_function(jvp, OWNED_RULE) is not None:
        # Which results the jvp batches, every tangent batched as its primal: traced
        # abstractly, only when some result is unbatched.
        probe, probe_dims = _lc_batching.batch_custom_jvp_subtrace(jvp, tag, axis_data,
                                                                   in_dims)
        probe = _lu.transformation2(_dense_results)(probe)
        avals = [_core.typeof(a) for a in args]
        _PROBING_JVP.active = True
        try:
            # (Staging: a tangent zero in forward mode only is batched as its value.)
            with _staging():
                _pe.trace_to_jaxpr_dynamic(probe, [*avals,
                                                   *(a.to_tangent_aval() for a in avals)])
            widened = [0 if d is None and j is not None else d
                       for d, j in zip(dims, probe_dims())]
        except Exception:  # noqa: BLE001 -- a rule that refuses a tangent (equinox's
            # nondifferentiable) raises when JAX differentiates, not here
            widened = dims
        finally:
            _PROBING_JVP.active = False
            for store in jvp.stores:
                if store:
                    store.reset()
        outs = [_lc_batching.matchaxis(axis_data, d, w, o)
                for d, w, o in zip(dims, widened, outs)]
        dims = widened
    staged.dims = dims
    return outs


def _dense_results(f, *args):
    """(A symbolic-zeros rule's SymbolicZero results, as zeros: the probe only
    traces.)"""
    from jax.custom_derivatives import SymbolicZero
    return [_lc_ad.instantiate_zeros(_lc_ad.Zero(o.aval)) if type(o) is SymbolicZero else o
            for o in f(*args)]


def _staged_layout(f, jvp_dims, axis_data, staged, *args):
    outs = f(*args)
    n = len(outs) // 2
    dims = jvp_dims()
    primals = [_lc_batching.matchaxis(axis_data, d, s, o)
               for d, s, o in zip(dims, staged.dims, outs[:n])]
    tangents = [_lc_batching._matchaxis_symzeros(axis_data, d, s, o)
                for d, s, o in zip(dims, staged.dims, outs[n:])]
    return [*primals, *tangents]


# JAX's partial evaluation (``JaxprTrace``) inlines a custom_jvp call that reads an
# unknown value, dropping its rule ("partial evaluation only builds linear
# functions").  A scan linearized inside ``grad(grad(...))`` is split that way:
# ``_scan_known_hoisting`` partially evaluates the primal body into loop-invariant
# and loop-varying parts, so a call reading both is inlined into the primal scan,
# which the next order then differentiates through the call's primal body.  For
# jaxpr-cc's ``forward_only`` rules that body is a while_loop, which reverse mode
# cannot differentiate (the rule exists to avoid exactly that): their calls are
# staged as they are, as equations of the unknown part.  A user's rule is inlined
# as JAX inlines it.
#: The attribute on the jvp of a custom_jvp that partial evaluation keeps.
KEPT_IN_PARTIAL_EVAL = "_jaxpr_cc_kept_in_partial_eval"
_PARTIAL_EVAL_CUSTOM_JVP = _pe.JaxprTrace.process_custom_jvp_call


def _partial_eval_custom_jvp_call(self, prim, fun, jvp, tracers, /, *, symbolic_zeros):
    tracers = [self.to_jaxpr_tracer(t) for t in tracers]
    if all(t.is_known() for t in tracers) or \
            find_tagged_function(jvp, KEPT_IN_PARTIAL_EVAL) is None:
        return _PARTIAL_EVAL_CUSTOM_JVP(self, prim, fun, jvp, tracers,
                                        symbolic_zeros=symbolic_zeros)
    tracers = [self.instantiate_const(t) for t in tracers]
    # The equation as JAX stages it (its jvp a memoized thunk), then recorded here.
    def staged_call(*xs):
        return prim.bind(*xs, subfuns=(fun, jvp), symbolic_zeros=symbolic_zeros)
    jaxpr, _, consts = _pe.trace_to_jaxpr_dynamic(
        _lu.wrap_init(staged_call, debug_info=fun.debug_info), [t.aval for t in tracers])
    (eqn,) = jaxpr.eqns
    env = dict(zip(jaxpr.invars, tracers))
    env.update((v, self.instantiate_const(self.to_jaxpr_tracer(c)))
               for v, c in zip(jaxpr.constvars, consts))
    in_tracers = [self.instantiate_const(self.new_const(a.val)) if isinstance(a, _core.Literal)
                  else env[a] for a in eqn.invars]
    out_tracers = [_pe.JaxprTracer(self, _pe.PartialVal.unknown(v.aval), None)
                   for v in eqn.outvars]
    recipe = _pe.new_eqn_recipe(self, in_tracers, out_tracers, prim, eqn.params, eqn.effects,
                                _source_info_util.current())
    for t in out_tracers:
        t.recipe = recipe
    by_var = dict(zip(eqn.outvars, out_tracers))
    return [by_var[v] for v in jaxpr.outvars]


def register_linear_call_batching() -> None:
    """Register the ``linear_call`` rules above with JAX (idempotent): a batching
    rule, a jvp rule that accepts perturbed residuals, and a transpose rule that
    accepts known linear operands; and the batching of staged custom_jvp calls
    (``_batched_custom_jvp_call``), which their jvp through a linear_call meets; and
    the partial evaluation of ``forward_only`` calls (``_partial_eval_custom_jvp_call``)."""
    _lc_batching.fancy_primitive_batchers[linear_call_p] = _linear_call_batcher
    _lc_ad.primitive_jvps[linear_call_p] = _linear_call_jvp
    _lc_ad.primitive_transposes[linear_call_p] = _linear_call_transpose
    _lc_batching.BatchTrace.process_custom_jvp_call = _batched_custom_jvp_call
    _pe.JaxprTrace.process_custom_jvp_call = _partial_eval_custom_jvp_call


def has_transpose_rule(prim) -> bool:
    """True when JAX can transpose ``prim`` with respect to some operand."""
    return prim in _lc_ad.primitive_transposes or prim in _lc_ad.fancy_transposes


def is_bilinear(prim) -> bool:
    """True for primitives JAX registers as bilinear (``mul``, ``dot_general``,
    convolutions): linear in each operand separately, not in both at once."""
    rule = _lc_ad.primitive_transposes.get(prim)
    return getattr(rule, "func", None) is _lc_ad.bilinear_transpose


from jax._src import traceback_util as _traceback_util  # noqa: E402


def hide_frames_of(path: str) -> None:
    """Leave frames of code under ``path`` out of tracebacks of errors raised while
    tracing and out of equations' source locations, as JAX does for its own
    (``JAX_TRACEBACK_FILTERING=off`` shows them again): errors and debug info then
    point at the user's code, as with jax.jit."""
    _traceback_util.register_exclusion(path)
    _source_info_util.register_exclusion(path)


def source_summary(source_info) -> str:
    """``file.py:line (function)`` of the user code an equation was traced from."""
    if source_info is None:
        return ""
    return _source_info_util.summarize(source_info)


# --- forward mode refused by a reverse-only rule (passes/vjp_to_jvp.py) --------
# A custom_vjp rule whose bwd is not linear in its cotangent has no forward-mode
# derivative.  vjp-to-jvp keeps such a rule reverse-only: its tangent is
# ``linear_call(callee=refusal, transpose=bwd)``, where the refusal is this
# primitive.  Staging it is fine (reverse mode transposes the linear_call and never
# runs the callee); evaluating or compiling it -- forward mode -- raises ``message``.
# Params are plain data (a string, shapes, dtypes) so that programs holding it can
# be saved.
forward_mode_refused_p = Primitive("jaxpr_cc_forward_mode_refused")
forward_mode_refused_p.multiple_results = True


class ForwardModeRefusedError(TypeError):
    """Forward-mode differentiation reached a rule that only has a reverse mode."""


def _refused_avals(out_shapes, out_dtypes, out_varying=()):
    # ``out_varying``: per output, the manual mesh axes it varies over inside
    # shard_map (check_vma); absent in programs saved before it existed.
    from jax._src import config as _config
    varying = list(out_varying or ()) + [()] * (len(out_shapes) - len(out_varying or ()))
    avals = []
    for s, d, v in zip(out_shapes, out_dtypes, varying):
        if v and _config._check_vma.value:
            sharding = jax.sharding.NamedSharding(jax.sharding.get_abstract_mesh(),
                                                  jax.sharding.PartitionSpec(*[None] * len(s)))
            avals.append(ShapedArray(tuple(s), d, sharding=sharding,
                                     manual_axis_type=_core.ManualAxisType(varying=frozenset(v))))
        else:
            avals.append(ShapedArray(tuple(s), d))
    return avals


def _refused_raise(*_, message, **__):
    raise ForwardModeRefusedError(message)


def _refused_lowering(ctx, *_, message, **__):
    raise ForwardModeRefusedError(message)


def _refused_batcher(args, dims, *, message, out_shapes, out_dtypes, **rest):
    size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
    shapes = tuple((size,) + tuple(s) for s in out_shapes)
    outs = forward_mode_refused_p.bind(*args, message=message, out_shapes=shapes,
                                       out_dtypes=out_dtypes, **rest)
    return outs, [0] * len(outs)


def _refused_jvp(primals, tangents, **params):
    outs = forward_mode_refused_p.bind(*primals, **params)
    dense = [_lc_ad.instantiate_zeros(t) for t in tangents]
    return outs, forward_mode_refused_p.bind(*dense, **params)


def _register_forward_mode_refused() -> None:
    from jax._src.interpreters import mlir as _mlir
    forward_mode_refused_p.def_impl(_refused_raise)
    forward_mode_refused_p.def_abstract_eval(
        lambda *_, out_shapes, out_dtypes, out_varying=(), **__:
        _refused_avals(out_shapes, out_dtypes, out_varying))
    _mlir.register_lowering(forward_mode_refused_p, _refused_lowering)
    _lc_batching.primitive_batchers[forward_mode_refused_p] = _refused_batcher
    _lc_ad.primitive_jvps[forward_mode_refused_p] = _refused_jvp


_register_forward_mode_refused()


def refuse_forward_mode(operands, out_avals, message: str):
    """Outputs of ``out_avals`` that raise ``message`` when evaluated or compiled."""
    import numpy as _np
    varying = tuple(tuple(sorted(getattr(getattr(a, "manual_axis_type", None), "varying", ()),
                                 key=str)) for a in out_avals)
    extra = {"out_varying": varying} if any(varying) else {}
    return forward_mode_refused_p.bind(
        *operands, message=str(message), out_shapes=tuple(tuple(a.shape) for a in out_avals),
        out_dtypes=tuple(_np.dtype(a.dtype) for a in out_avals), **extra)


def refuses_forward_mode(callee) -> bool:
    """True for a ``linear_call`` callee standing in for a rule that has no
    forward mode (it raises when evaluated)."""
    return any(e.primitive is forward_mode_refused_p for e in callee.jaxpr.eqns)


def _reverse_only_transpose(cts, args, known, transpose_thunk, n_lead: int, num_res: int):
    """The transpose of a reverse-only rule's ``linear_call``: its bwd applied as a
    plain function (JAX's own transpose would bind another ``linear_call`` that
    treats bwd as linear, so that differentiating the gradient would transpose or
    push tangents through bwd as if it were linear -- wrong for a nonlinear bwd).
    Outer transformations then differentiate bwd like any code, as they do the
    bwd of a custom_vjp."""
    transpose, t_consts = transpose_thunk()
    res = args[n_lead - num_res:n_lead]
    cts = [_lc_ad.instantiate_zeros(ct) for ct in cts]
    out = _core.eval_jaxpr(transpose.jaxpr, transpose.consts, *t_consts, *res, *cts)
    out = _symbolic_where_marked(out, transpose_thunk)
    return [None] * n_lead + [None if k else c for c, k in zip(out, known)]


# ------------------------------------------------- zero in forward mode only
# A custom_vjp rewritten for forward mode (vjp-to-jvp) has tangent outputs that no
# perturbed input reaches through its transposed bwd (diffrax's save times, whose
# cotangent the bwd never reads): zeros.  In forward mode they should be symbolic
# zeros, so that a rule downstream that refuses any tangent (equinox's
# ``nondifferentiable``) is not given one.  In reverse mode they must stay as they
# are: the rule's tangent is transposed by the user's bwd, which must get the
# cotangents JAX gives it (a dense one for an output the program reads, also when
# the bwd sends it nowhere).  One traced jvp rule serves both modes (JAX stages a
# custom_jvp rule once per pattern of zero inputs, and linearizes it as it runs it
# forward), so the mode cannot be decided when the rule is traced.
# ``forward_zero_p`` defers it: an identity on the tangent, staged into the rule,
# that decides where the staged rule is run (``lift_jvp``'s evaluation of it): as
# a symbolic zero in forward mode, as the value itself when JAX is linearizing --
# the rule run by ``linearize_from_jvp`` (the current trace is its partial-eval
# trace), or any primitive linearized through its jvp (``fallback_linearize_rule``:
# checkpoint, custom_linear_solve, shard_map...).  While a staged rule is being
# traced (JAX's memoized thunk, or a batched copy of it) it stays an equation, so a
# memoized trace never holds a decision.  Compiled or evaluated outside a rule, it
# is the identity: the dense zero it was before.  jaxpr-cc's own reading of a
# staged rule (``call_wrapped``) takes the value itself: what it converts is then
# the rule as it was before, with no decision and no such equation in the IR.
_FZ_STATE = threading.local()
# Where the zeros stay dense: a JAX user context, so part of the key of JAX's
# tracing caches.  Reverse mode through a primitive linearized by its jvp rule
# (checkpoint) runs that rule, which traces its body's jvp with ``ad.jvp_jaxpr``,
# a cache forward mode fills too: keyed on this, reverse mode never reuses a body
# traced (and decided) for forward mode.
_FORWARD_ZERO_DENSE = jax.make_user_context(default_value=False)


@contextlib.contextmanager
def _staging():
    """A staged rule is being traced here: ``forward_zero`` stays an equation."""
    _FZ_STATE.staging = getattr(_FZ_STATE, "staging", 0) + 1
    try:
        yield
    finally:
        _FZ_STATE.staging -= 1


class _ForwardZeroPrimitive(Primitive):
    def bind(self, *args, **params):
        if getattr(_FZ_STATE, "staging", 0):
            return super().bind(*args, **params)
        (x,) = args
        if _FORWARD_ZERO_DENSE.value or isinstance(_core.trace_ctx.trace, _pe.JaxprTrace):
            return x
        from jax.custom_derivatives import SymbolicZero
        return SymbolicZero(_core.typeof(x).to_tangent_aval())


forward_zero_p = _ForwardZeroPrimitive("jaxpr_cc_forward_zero")


def _forward_zero_batcher(args, dims):
    return forward_zero_p.bind(*args), dims[0]


def _forward_zero_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    if type(t) is _lc_ad.Zero:
        return forward_zero_p.bind(x), t
    return forward_zero_p.bind(x), forward_zero_p.bind(t)


def _staging_thunk(jvp_jaxpr_fun: WrappedFun) -> WrappedFun:
    """``jvp_jaxpr_fun`` (a staged rule's memoized trace), called as staging (a
    closure over it, so that ``find_tagged_function`` finds the rule inside)."""
    def thunk(*in_zeros):
        with _staging():
            return jvp_jaxpr_fun.call_wrapped(*in_zeros)
    return _lu.wrap_init(thunk, debug_info=jvp_jaxpr_fun.debug_info)


def _register_forward_zero() -> None:
    from jax._src import checkify as _checkify
    from jax._src.interpreters import mlir as _mlir
    forward_zero_p.def_impl(lambda x: x)
    forward_zero_p.def_abstract_eval(lambda aval: aval)
    _mlir.register_lowering(forward_zero_p, lambda ctx, x: [x])
    _lc_batching.primitive_batchers[forward_zero_p] = _forward_zero_batcher
    _lc_ad.primitive_jvps[forward_zero_p] = _forward_zero_jvp
    _lc_ad.primitive_transposes[forward_zero_p] = lambda ct, x: [ct]
    # The two ways JAX runs a staged custom_jvp rule (the plain one, and checkify's
    # with its error values), and the one way it linearizes a primitive through its
    # jvp rule: looked up as module globals where they are called.
    jax_lift_jvp, jax_checkify_lift_jvp = _cd.lift_jvp, _checkify.lift_jvp
    jax_fallback = _lc_ad.fallback_linearize_rule
    _cd.lift_jvp = lambda n, fun: jax_lift_jvp(n, _staging_thunk(fun))
    _checkify.lift_jvp = lambda e, n, fun: jax_checkify_lift_jvp(e, n, _staging_thunk(fun))

    def fallback_linearize_rule(*args, **params):
        with _FORWARD_ZERO_DENSE(True):
            return jax_fallback(*args, **params)
    _lc_ad.fallback_linearize_rule = fallback_linearize_rule


_register_forward_zero()


def forward_zero(tangent):
    """``tangent``, known to be zero in forward mode: a symbolic zero where a
    staged rule runs forward, the value itself where JAX linearizes (above)."""
    return forward_zero_p.bind(tangent)


# ---------------------------------------------------------------- perturbation
# Which arguments of a custom function JAX could ever perturb: a leaf that does not
# depend on any input of the traces it belongs to (a constant, or the output of
# stop_gradient or of a primitive whose derivative JAX defines as zero) is never
# given a tangent, so a rule defined with symbolic_zeros=True sees a SymbolicZero for
# it.  The walk follows a staged tracer's producing equation back to its frame's
# inputs; anything it cannot see through counts as perturbable.
from jax._src import ad_util as _pt_ad_util  # noqa: E402
from jax._src.interpreters import ad as _pt_ad  # noqa: E402
from jax._src.interpreters import batching as _pt_batching  # noqa: E402
import functools as _pt_functools  # noqa: E402


def _zero_derivative(prim) -> bool:
    if prim is _pt_ad_util.stop_gradient_p:
        return True
    rule = _pt_ad.primitive_jvps.get(prim)
    return isinstance(rule, _pt_functools.partial) and rule.func is _pt_ad.zero_jvp


class PerturbationOracle:
    """``oracle(x)``: can JAX's AD ever give ``x`` a tangent?  Memoized per tracer."""

    def __init__(self):
        self._memo: dict[int, bool] = {}
        # The memo is keyed by id: an entry lives as long as its tracer (a weak
        # reference drops it), so an id reused later is not mistaken for it, and no
        # tracer is kept alive past its trace (jax.check_tracer_leaks reports any).
        self._refs: dict[int, Any] = {}
        self._keep: list = []  # tracers that take no weak reference

    def __call__(self, x) -> bool:
        if not isinstance(x, _core.Tracer):
            return False  # a concrete value: a constant of every trace
        key = id(x)
        if key not in self._memo:
            try:
                self._refs[key] = weakref.ref(x, functools.partial(self._forget, key))
            except TypeError:
                self._keep.append(x)
            self._memo[key] = self._walk(x)
        return self._memo[key]

    def _forget(self, key: int, _ref) -> None:
        self._memo.pop(key, None)
        self._refs.pop(key, None)

    def _walk(self, root) -> bool:
        stack, seen = [root], set()
        while stack:
            t = stack.pop()
            if id(t) in seen:
                continue
            seen.add(id(t))
            known = self._memo.get(id(t))
            if known is not None:
                if known:
                    return True
                continue
            if not isinstance(t, _core.Tracer):
                continue
            if isinstance(t, _pt_ad.JVPTracer):
                if type(t.tangent) is not _pt_ad.Zero:
                    return True
                stack.append(t.primal)
            elif isinstance(t, _pt_batching.BatchTracer):
                stack.append(t.val)
            elif isinstance(t, _pe.DynamicJaxprTracer):
                eqn = t.parent
                if eqn is None:
                    frame = t._trace.frame
                    if any(t.val is v for v in frame.invars):
                        return True
                    # A constant of its frame: a concrete value, or a tracer of an
                    # enclosing trace the frame closes over (a cond branch or loop
                    # body reading an outer value), which is perturbed as that is.
                    outer = (frame.constvar_to_val.get(t.val)
                             if isinstance(t.val, _core.Var) else None)
                    if isinstance(outer, _core.Tracer):
                        stack.append(outer)
                    continue
                if _zero_derivative(eqn.primitive):
                    continue
                stack.extend(eqn.in_tracers)
            else:
                return True  # a tracer we cannot see through
        return False


def is_jit_reentry_error(error: BaseException) -> bool:
    """Is ``error`` (or its cause) jax.jit refusing to be re-entered while its trace
    is in progress?  JAX says so only in the message text."""
    while error is not None:
        if isinstance(error, RecursionError) and str(error).startswith("Recursively calling"):
            return True
        error = error.__cause__ or error.__context__
    return False


def evaluated_eagerly(args) -> bool:
    """Would JAX evaluate a custom function called on ``args`` now rather than stage
    it: under eager evaluation, or inside ``jax.ensure_compile_time_eval`` (JAX's
    staging trace folds calls whose inputs are all concrete)?"""
    if isinstance(_core.trace_ctx.trace, _core.EvalTrace):
        return True
    from jax._src import config as _config
    leaves = jax.tree_util.tree_leaves(args)
    return bool(_config.eager_constant_folding.value) and \
        not any(isinstance(x, _core.Tracer) for x in leaves)


def inside_autodiff() -> bool:
    """Is the innermost active trace one of JAX's AD traces (jvp, linearize)?  Such
    a trace runs a custom function's rules at once, while enclosing traces live."""
    return isinstance(_core.trace_ctx.trace, (_pt_ad.JVPTrace, _pt_ad.LinearizeTrace))


def composite_attributes(attributes) -> dict:
    """``lax.composite``'s keyword attributes from its ``attributes`` param
    (``(key, leaves, treedef)`` per keyword; arrays held as ``HashableArray``)."""
    held = hashable_array_type()
    return {key: treedef.unflatten([x.val if isinstance(x, held) else x
                                    for x in leaves])
            for key, leaves, treedef in attributes}


def is_autodiff_tracer(x) -> bool:
    return isinstance(x, (_pt_ad.JVPTracer, _pt_ad.LinearizeTracer))


def gather_fill_value(params: dict):
    """The value a ``gather`` equation gives out-of-bounds indices, or None when its
    mode gives none (clip, promise in bounds); None as JAX's fill means NaN for
    inexact operands."""
    if params.get("mode") is not jax.lax.GatherScatterMode.FILL_OR_DROP:
        return None
    fill = params.get("fill_value")
    return float("nan") if fill is None else fill


def gather_as(params: dict, operand, indices, fill_value):
    """The gather an equation with ``params`` does, of ``operand``, filling
    out-of-bounds indices with ``fill_value``."""
    return jax.lax.gather(operand, indices, dimension_numbers=params["dimension_numbers"],
                          slice_sizes=params["slice_sizes"],
                          unique_indices=params["unique_indices"],
                          indices_are_sorted=params["indices_are_sorted"],
                          mode=params["mode"], fill_value=fill_value)


def is_transformation_tracer(x) -> bool:
    """A tracer of a transformation the program applies inside itself (``jax.vmap``,
    ``jax.jvp``...), not of a staging trace: its trace ends before the program's."""
    return isinstance(x, _core.Tracer) and not isinstance(x, _pe.DynamicJaxprTracer)


def _refused_transpose(cts, *args, message, **_):
    raise ForwardModeRefusedError(message)


# A refused derivative raises in reverse mode too, where JAX transposes it.
_pt_ad.primitive_transposes[forward_mode_refused_p] = _refused_transpose
# --- calling-convention checks (ir/calling_convention.py) --------------------
def is_batch_tracer(x) -> bool:
    """Whether ``x`` is a ``jax.vmap`` tracer (whose type is the per-example type)."""
    from jax._src.interpreters import batching as _batching
    return isinstance(x, _batching.BatchTracer)
# --- jaxpr_cc.jit as a drop-in for jax.jit (jit_function.py, tools/run_jax_tests.py)
def jit_resolved_argnums(jitted) -> tuple:
    """``(static_argnums, static_argnames, donate_argnums, donate_argnames)`` of a
    ``jax.jit`` object, as JAX resolved them against the function's signature (a name
    given only by position gets its name and vice versa, negatives normalized).
    ``jaxpr_cc.jit`` splits static from dynamic arguments exactly as JAX did."""
    info = jitted._jit_info
    return (tuple(info.static_argnums), tuple(info.static_argnames),
            tuple(info.donate_argnums), tuple(info.donate_argnames))


def jit_defining_modules() -> tuple:
    """The modules whose ``jit`` attribute is the public ``jax.jit``: ``jax`` and the
    internal ``jax._src.api`` (JAX's own tests call ``api.jit``)."""
    from jax._src import api as _api
    return (jax, _api)


def trace_context() -> tuple:
    """What JAX's own tracing caches key on besides the function and its argument
    types: the named axes in scope (vmap/shard_map axis names and sizes), the mesh
    context and every configuration option that changes tracing (x64, matmul
    precision...).  ``jaxpr_cc.jit`` keys its programs on it too."""
    from jax._src import config as _config
    return _config.trace_context()
# --- evaluating one equation (passes/fixed_point_match.py) ----------------------
def eval_equation(eqn, invals) -> list:
    """The outputs of ``eqn`` applied to ``invals`` (under any active trace)."""
    params = eqn.primitive.get_bind_params(eqn.params)
    out = eqn.primitive.bind(*invals, **params)
    return list(out) if eqn.primitive.multiple_results else [out]


def eval_equation_per_operand(eqn, invals) -> list:
    """``eval_equation`` of a primitive whose result i is operand i
    (``device_put``, ``optimization_barrier``), bound once per operand: JAX's
    partial evaluation makes every result of one bind unknown when one operand
    is, which a transposition would read as a linear value (CG's ``device_put``
    of ``(b, x0)``).  Per-operand params (tuples as long as the operands) are
    sliced."""
    n = len(invals)
    outs = []
    for i, x in enumerate(invals):
        params = {k: (v[i:i + 1] if isinstance(v, tuple) and len(v) == n else v)
                  for k, v in eqn.params.items()}
        outs.extend(eqn.primitive.bind(x, **eqn.primitive.get_bind_params(params)))
    return outs
# ---------------------------------------------------------------------------
# Param types of every primitive (issue 16): PRNG implementations by registered
# name, device_put copy semantics, custom_linear_solve's named tuples, and the
# registry of primitives JAX defines.
# ---------------------------------------------------------------------------
# JAX's own marker objects (bare ``object()`` instances) that reach equation
# parameters, by name, with where they live (for emitted modules): equinox's
# ``vprim`` carries ``core.no_axis_name`` as the axis name of a vmap that named none.
JAX_SENTINELS = {"no_axis_name": ("jax._src.core", "no_axis_name", _core.no_axis_name)}


def jax_sentinel_name(value) -> str | None:
    """The name of ``value`` among :data:`JAX_SENTINELS`, or None."""
    return next((name for name, (_, _, obj) in JAX_SENTINELS.items() if obj is value), None)


def prng_impl_type() -> type:
    """The class of ``random_seed`` / ``random_wrap``'s ``impl`` parameter."""
    from jax._src.random import prng
    return prng.PRNGImpl


def prng_impl_by_name(name: str):
    """The registered PRNG implementation called ``name`` (``threefry2x32``, ``rbg``...),
    or None."""
    return prng_impls().get(name)


def array_copy_semantics_type() -> type:
    """The enum of ``device_put``'s ``copy_semantics`` parameter."""
    from jax._src import dispatch
    return dispatch.ArrayCopySemantics


#: The public ``jax.*`` modules a bare ``import jax`` loads (JAX 0.10.2, measured in a
#: fresh process; tests/test_emit_python_adversary_38.py checks it).  An emitted module
#: imports any other ``jax`` module it names (``jax.ad_checkpoint``), which would
#: otherwise be missing in a process that never imported it.
MODULES_IMPORT_JAX_LOADS = frozenset({
    "jax.api_util", "jax.core", "jax.custom_batching", "jax.custom_derivatives", "jax.debug",
    "jax.distributed", "jax.dlpack", "jax.dtypes", "jax.errors", "jax.experimental",
    "jax.experimental.compilation_cache", "jax.experimental.compilation_cache.compilation_cache",
    "jax.export", "jax.ffi", "jax.image", "jax.interpreters", "jax.interpreters.ad",
    "jax.interpreters.batching", "jax.interpreters.mlir", "jax.interpreters.partial_eval",
    "jax.interpreters.pxla", "jax.interpreters.xla", "jax.lax", "jax.lax.linalg", "jax.lib",
    "jax.monitoring", "jax.nn", "jax.nn.initializers", "jax.numpy", "jax.numpy.fft",
    "jax.numpy.linalg", "jax.ops", "jax.profiler", "jax.random", "jax.ref", "jax.scipy",
    "jax.sharding", "jax.stages", "jax.tree", "jax.tree_util", "jax.typing", "jax.version",
})


def is_made_checkpoint_policy(fn) -> bool:
    """A checkpoint policy a ``jax.checkpoint_policies`` factory made as a closure
    (``save_from_both_policies``, the offloading ones)."""
    return getattr(fn, "__module__", None) == "jax._src.ad_checkpoint" and "<locals>" in \
        getattr(fn, "__qualname__", "")


def host_callback_parts(callback):
    """``(function, in_tree)`` of a ``pure_callback`` / ``io_callback`` equation's
    ``callback`` param (JAX's flattening wrapper of the user's function), or None."""
    from jax._src.callback import _FlatCallback
    if not isinstance(callback, _FlatCallback):
        return None
    return callback.callback_func, callback.in_tree


def custom_vmap_rule_type() -> type:
    """What ``custom_vmap_call``'s ``rule`` param holds for a user's rule."""
    from jax._src.custom_batching import ClosedRule
    return ClosedRule


def custom_vmap_rule_function(rule):
    """The user's batching function of a ``custom_vmap_call``'s ``rule``, or None for
    a rule JAX derived (the jvp of a custom_vmap)."""
    return rule.rule if isinstance(rule, custom_vmap_rule_type()) else None


def hashable_array_type() -> type:
    """The read-only array wrapper ``lax.composite`` keeps an array attribute in."""
    from jax._src.hashable_array import HashableArray
    return HashableArray


def linear_solve_tuple_type() -> type:
    """The named tuple of ``custom_linear_solve``'s ``const_lengths`` and ``jaxprs``."""
    from jax._src.lax.control_flow import solves
    return solves._LinearSolveTuple


_SKIPPED_PRIMITIVE_MODULES = ("mosaic", "pallas", "tpu", "gpu", "cuda", "rocm", "triton",
                              "test", "mlir.dialects", "tools")


def registered_primitives() -> dict[str, str]:
    """Every primitive JAX 0.10.2 defines, by name -> the module defining it: the
    modules of ``jax._src`` are imported (except accelerator back ends, which
    register primitives only their own hardware can run) and searched for
    ``Primitive`` objects."""
    import importlib
    import pkgutil
    import sys
    import jax._src
    for info in pkgutil.walk_packages(jax._src.__path__, "jax._src."):
        if any(part in info.name for part in _SKIPPED_PRIMITIVE_MODULES):
            continue
        try:
            importlib.import_module(info.name)
        except Exception:  # optional dependencies (e.g. a missing GPU plugin)
            continue
    found: dict[str, str] = {}
    for name, module in list(sys.modules.items()):
        # Only jax._src: what else is imported (jax.experimental, jaxpr_cc itself)
        # depends on which code ran before, and the answer must not.
        if not name.startswith("jax._src."):
            continue
        for value in list(vars(module).values()):
            if isinstance(value, _core.Primitive):
                found.setdefault(value.name, name)
    return found


def inline_host_consts(jaxpr: Jaxpr, consts) -> "Jaxpr | None":
    """``jaxpr`` (whose leading invars are ``consts``, as ``trace_flat`` makes it)
    with those invars replaced by literals of their values (typed host arrays, as
    JAX stages array literals), when every constant is a concrete array (no
    tracer); None otherwise.  Constants a trace picked up from a jaxpr's own
    array literals (a Runge-Kutta tableau) go back to being literals."""
    if any(isinstance(c, _core.Tracer) for c in consts):
        return None
    import numpy as _np
    n = len(consts)
    literal = {}
    for v, c in zip(jaxpr.invars[:n], consts):
        host = _np.asarray(c)
        if host.dtype != v.aval.dtype or host.shape != v.aval.shape:
            return None
        literal[v] = Literal(TypedNdArray(host, v.aval), v.aval)
    eqns = [e.replace(invars=[literal.get(a, a) if isinstance(a, Var) else a
                              for a in e.invars]) for e in jaxpr.eqns]
    outvars = [literal.get(a, a) if isinstance(a, Var) else a for a in jaxpr.outvars]
    dbg = jaxpr.debug_info
    if dbg is not None and dbg.arg_names is not None and len(dbg.arg_names) == len(jaxpr.invars):
        dbg = dbg._replace(arg_names=dbg.arg_names[n:])
    return jaxpr_from_parts([], jaxpr.invars[n:], outvars, eqns, jaxpr.effects, dbg)


# ---------------------------------------------------------------------------
# Jaxprs a library holds as parameter data (lineax's closure-converted operators):
# emitted as a Python function over (constants, inputs) and staged again.
def jaxpr_consts_as_inputs(jaxpr: Jaxpr) -> Jaxpr:
    """``jaxpr`` with its constvars turned into leading invars."""
    dbg = jaxpr.debug_info
    if dbg is not None and dbg.arg_names is not None:
        dbg = dbg._replace(arg_names=(*[None] * len(jaxpr.constvars), *dbg.arg_names))
    return Jaxpr([], [*jaxpr.constvars, *jaxpr.invars], jaxpr.outvars, jaxpr.eqns,
                 jaxpr.effects, dbg)


# ---------------------------------------------------------------------------
# --- jaxpr_cc.jit inside shard_map, and jax.clear_caches (jit_function.py) ---
def manual_axis_type_of(aval) -> Any:
    """The varying/unreduced/reduced manual axes of ``aval`` (a value's type inside
    ``shard_map`` with check_vma), as ``jax.ShapeDtypeStruct``'s
    ``manual_axis_type`` takes them; None when it has none."""
    mat = getattr(aval, "manual_axis_type", None)
    if mat is None or mat.empty:
        return None
    return mat


def on_clear_caches(clear: "Callable[[], None]") -> Any:
    """Make ``jax.clear_caches()`` call ``clear``: JAX clears every cache registered
    with its cache registry (held weakly), so the caller keeps the returned handle
    alive as long as ``clear`` should be called."""
    from jax._src import util as _util

    class _ClearHook:
        __slots__ = ("__weakref__",)

        def cache_clear(self) -> None:
            clear()
    hook = _ClearHook()
    _util.register_cache(hook, "jaxpr_cc.jit traced programs")
    return hook


# ---------------------------------------------------------------------------
# --- tracing inside a shard_map body (passes/vjp_to_jvp.py) -------------------
# Collectives whose transpose depends on whether their operand is replicated
# across the axes (psum of a replicated value is not a sum of distinct values):
# inside shard_map(check_vma=False) JAX has no types to tell, so it guesses.
REPLICATION_DEPENDENT_COLLECTIVES = frozenset({
    "psum", "pmax", "pmin", "psum_invariant", "all_gather", "all_gather_invariant",
    "reduce_scatter", "all_to_all", "pbroadcast"})


def unchecked_replication(prim_name: str, params: dict) -> bool:
    """Is this a shard_map whose body JAX traced without varying-axes types?"""
    return prim_name == "shard_map" and not params.get("check_vma", True)


def region_trace_context(prim_name: str, params: dict):
    """The context JAX traces the body of an equation in, for a pass that traces
    new functions over values of that body: for ``shard_map``, its manual axes in
    the axis environment, the mesh with those axes Manual, and its check_vma (so
    new equations carry the varying-manual-axes types of the body's values);
    no context for any other primitive."""
    import contextlib
    if prim_name != "shard_map" or "mesh" not in params:
        return contextlib.nullcontext()
    from jax._src import config as _config
    from jax._src import shard_map as _shard_map
    mesh = params["mesh"]
    manual = frozenset(params.get("newly_manual_axes", ()))
    stack = contextlib.ExitStack()
    stack.enter_context(_shard_map._extend_axis_env(mesh, manual))
    stack.enter_context(jax.sharding.use_abstract_mesh(_shard_map._as_manual_mesh(mesh, manual)))
    stack.enter_context(_config._check_vma(bool(params.get("check_vma", True))))
    return stack


# ---------------------------------------------------------------------------
# --- sharded programs, adversary round d (closure/rules.py, ir/program.py) ---
def zeros_of_type(aval) -> Any:
    """An array of zeros of ``aval``'s shape and dtype that, inside ``shard_map``
    with check_vma, varies over the same manual axes as ``aval``: a zero tangent or
    cotangent a re-bound rule makes must have the type JAX's own would have (a
    traced rule body checks its operands' varying axes when it is evaluated)."""
    import jax.numpy as jnp
    import numpy as np
    if aval.dtype == jax.dtypes.float0:
        return np.zeros(aval.shape, jax.dtypes.float0)
    zeros = jnp.zeros(aval.shape, aval.dtype)
    mat = getattr(aval, "manual_axis_type", None)
    want = tuple(sorted(getattr(mat, "varying", ()) or ()))
    if not want:
        return zeros
    have = getattr(getattr(jax.typeof(zeros), "manual_axis_type", None), "varying", frozenset())
    missing = tuple(a for a in want if a not in have)
    return jax.lax.pcast(zeros, missing, to="varying") if missing else zeros


# While a Program is evaluated (Program.__call__), an eager shard_map body that
# meets a custom_vjp re-bound by jaxpr-cc (always with symbolic_zeros=True, so its
# rules learn which operands are perturbed) runs it as JAX runs one without
# symbolic zeros.  JAX's eager shard_map trace runs only the primal function of a
# custom_vjp and drops fwd and bwd (autodiff happens in traces above it, which
# take symbolic zeros), so the flag changes nothing there; JAX 0.10.2 refuses it
# only because it is not implemented.  Outside Program evaluation JAX's behaviour
# is unchanged.
import contextvars as _contextvars

_EVALUATING_PROGRAM = _contextvars.ContextVar("jaxpr_cc_evaluating_program", default=False)


def _install_eager_shard_map_custom_vjp() -> None:
    from jax._src import shard_map as _sm
    original = _sm.ShardMapTrace.process_custom_vjp_call
    if getattr(original, "_jaxpr_cc_original", None) is not None:
        return

    def process_custom_vjp_call(self, prim, fun, fwd, bwd, tracers, /, *, out_trees,
                                symbolic_zeros):
        if symbolic_zeros and _EVALUATING_PROGRAM.get():
            symbolic_zeros = False  # only `fun` runs here: see above
        return original(self, prim, fun, fwd, bwd, tracers, out_trees=out_trees,
                        symbolic_zeros=symbolic_zeros)

    process_custom_vjp_call._jaxpr_cc_original = original
    _sm.ShardMapTrace.process_custom_vjp_call = process_custom_vjp_call


class evaluating_program:
    """Context of a Program's evaluation (see above)."""

    def __enter__(self):
        _install_eager_shard_map_custom_vjp()
        self._token = _EVALUATING_PROGRAM.set(True)
        return self

    def __exit__(self, *exc):
        _EVALUATING_PROGRAM.reset(self._token)
        return False


# ---------------------------------------------------------------------------
# Closure conversion, issue 15 (h15d): JAX's own checks on custom-function calls
# ---------------------------------------------------------------------------
def check_custom_vjp_nondiff_args(args, nondiff_argnums) -> None:
    """Raise JAX's UnexpectedTracerError (its exact text) when a tracer is passed
    in a ``nondiff_argnums`` position of a custom_vjp call, as ``custom_vjp.__call__``
    does before anything else."""
    for i in nondiff_argnums:
        _cd._check_for_tracers(args[i])


# --- symbolic zeros for staged rules (closure/staged_rules: a staged symbolic-zeros
# custom_vjp's bwd traced with the cotangents JAX would pass as symbolic zeros) ---
def symbolic_zero(aval):
    """The ``SymbolicZero`` JAX hands a symbolic-zeros rule for a zero of ``aval``."""
    from jax.custom_derivatives import SymbolicZero
    return SymbolicZero(aval)


# ---------------------------------------------------------------------------
# Issue 18 (h18f): effects on jax.Ref inputs, by position in the IR
# ---------------------------------------------------------------------------
# JAX names the Ref an effect reads or writes (JaxprInputEffect.input) by the
# jaxpr Var itself.  The IR re-creates every Var when it emits a jaxpr, so it keeps
# such effects by position instead (the form files store too): an equation's by
# its operand (JAX's new_jaxpr_eqn resolves those back to the new Vars), a
# region's by its binder (constvars, then invars).
def input_effects_by_position(effs, binders: Sequence[Any]):
    """``effs`` with each effect on one of ``binders`` (Vars) given by its index."""
    if not any(isinstance(e, JaxprInputEffect) and not isinstance(e.input, int) for e in effs):
        return effs
    index = {}
    for i, v in enumerate(binders):
        if isinstance(v, Var):
            index.setdefault(v, i)
    out = set()
    for e in effs:
        if isinstance(e, JaxprInputEffect) and not isinstance(e.input, int):
            i = index.get(e.input)
            if i is not None:
                e = e.replace(i)
        out.add(e)
    return out


def input_effects_on(effs, binders: Sequence[Any]):
    """``effs`` with each positional effect naming its binder (a Var) again."""
    if not any(isinstance(e, JaxprInputEffect) and isinstance(e.input, int) for e in effs):
        return effs
    return {e.replace(binders[e.input])
            if isinstance(e, JaxprInputEffect) and isinstance(e.input, int)
            and 0 <= e.input < len(binders) else e
            for e in effs}


# ---------------------------------------------------------------------------
# --- forward_only staged as first-order rules (closure/rules.py) -----------
def subjaxprs_of(eqn) -> list:
    """The jaxprs in one jaxpr equation's params (not descending into them)."""
    out = []
    for value in eqn.params.values():
        for v in (value if isinstance(value, (tuple, list)) else (value,)):
            if isinstance(v, ClosedJaxpr):
                out.append(v.jaxpr)
            elif isinstance(v, Jaxpr):
                out.append(v)
    return out


def calls_primitive(jaxpr, name: str) -> bool:
    """Whether ``jaxpr`` (a Jaxpr) binds the primitive ``name``, in the jaxprs its
    equations hold too (each looked at once)."""
    stack, seen = [jaxpr], set()
    while stack:
        j = stack.pop()
        if id(j) in seen:
            continue
        seen.add(id(j))
        for eqn in j.eqns:
            if eqn.primitive.name == name:
                return True
            stack.extend(subjaxprs_of(eqn))
    return False
# ---------------------------------------------------------------------------


# ---------------------------------------------------------------------------
# --- sharding requests on operands (passes/cse.py) -------------------------
def _constraint_requests(name, p):
    return ((name, p.get("sharding"), p.get("unconstrained_dims")),)


def _shard_map_requests(name, p):
    return tuple((name, p.get("mesh"), spec) for spec in p.get("in_specs", ()))


def _jit_requests(name, p):
    shardings = p.get("in_shardings") or ()
    if all(isinstance(s, UnspecifiedValue) for s in shardings):
        return None
    return tuple(None if isinstance(s, UnspecifiedValue) else ("jit", s) for s in shardings)


def _device_put_requests(name, p):
    return tuple(None if d is None else (name, d) for d in p.get("devices", ()))


#: The primitives whose params ask an operand for a sharding, by name.
_SHARDING_REQUESTS = {"sharding_constraint": _constraint_requests,
                      "shard_map": _shard_map_requests,
                      "jit": _jit_requests, "pjit": _jit_requests,
                      "device_put": _device_put_requests}


def operand_sharding_requests(eqn) -> tuple | None:
    """Per operand of a jaxpr-cc equation, a hashable description of the sharding it
    asks its operand to have (None: no request), or None when the equation asks
    for none at all.  XLA propagates such a request backwards to the producer of
    the operand, so two equal computations with different requests downstream are
    laid out differently by jax.jit and must stay two computations."""
    rule = _SHARDING_REQUESTS.get(eqn.prim.name)
    return None if rule is None else rule(eqn.prim.name, eqn.params)
# ---------------------------------------------------------------------------


# ---------------------------------------------------------------------------
# --- input shardings of a compiled function that closes over a jax.Ref -----
def compiled_argument_shardings(compiled) -> list:
    """The sharding of each flat argument leaf of a ``jax.stages.Compiled`` (None for
    an argument XLA found unused).  ``Compiled.input_shardings`` fails ("Too many
    leaves") when the function closes over a jax.Ref: JAX passes each such Ref as an
    extra input after the arguments, which this leaves out."""
    n_const = len(compiled._params.const_args)
    flat = list(compiled._executable._in_shardings[n_const:])
    kept = compiled._executable._kept_var_idx
    taken = iter(flat)
    return [next(taken) if i + n_const in kept else None
            for i in range(compiled.in_tree.num_leaves)]


def closed_over_ref_inputs(compiled) -> int:
    """How many jax.Refs the function of a ``jax.stages.Compiled`` closes over (JAX
    passes them as inputs after the arguments)."""
    n_const = len(compiled._params.const_args)
    kept = compiled._executable._kept_var_idx
    n_kept = sum(1 for i in range(compiled.in_tree.num_leaves) if i + n_const in kept)
    return len(compiled._executable._in_shardings) - n_const - n_kept


def compiled_result_shardings(compiled) -> list:
    """The sharding of each flat result leaf of a ``jax.stages.Compiled``; the new
    values of closed-over jax.Refs, which JAX returns after the results, left out."""
    return list(compiled._executable._out_shardings)[:compiled.out_tree.num_leaves]
# ---------------------------------------------------------------------------


# ---------------------------------------------------------------------------
# --- which primitives may ask for an operand sharding (issue 14, h14h) -----
def sharding_request_primitives() -> frozenset[str]:
    """Names of the primitives ``operand_sharding_requests`` may return requests
    for; every other equation asks for none (lets a walk skip the call)."""
    return frozenset(_SHARDING_REQUESTS)
# ---------------------------------------------------------------------------


# ---------------------------------------------------------------------------
# Issue 18 (h18h): escaped tracers among a trace's constants (frontend/trace.py)
# ---------------------------------------------------------------------------
def check_no_escaped_tracers(consts: Sequence[Any]) -> None:
    """Raise JAX's UnexpectedTracerError (its exact text) for a constant that is a
    tracer of a trace that has ended -- a value a side effect leaked out of an inner
    transformation -- as jax.jit does when it runs a jaxpr holding one, even where
    the program never reads it."""
    tracers = [c for c in consts if isinstance(c, _core.Tracer)]
    if not tracers:
        return
    # JAX invalidates every finished trace except a jaxpr trace (is_valid() tells);
    # a jaxpr trace is live when it is the current one or one it nests in.  (A
    # custom_jvp function JAX runs under vmap may close over a tracer of a live
    # batch trace that is not in that chain.)
    live, trace, outermost = set(), _core.trace_ctx.trace, None
    while trace is not None and id(trace) not in live:
        live.add(id(trace))
        outermost = trace
        trace = getattr(trace, "parent_trace", None)
    if not isinstance(outermost, _core.EvalTrace):
        return  # a trace that does not name its parent (eager shard_map): cannot tell
    for c in tracers:
        if not c._trace.is_valid() or (isinstance(c._trace, _pe.DynamicJaxprTrace)
                                       and id(c._trace) not in live):
            raise _core.escaped_tracer_error(c)


# jaxpr_cc traces the user's function through a fresh wrapper each time, which JAX
# sees as a "never seen function" cache miss: explaining it would add a second,
# misleading explanation to the one jax.explain_cache_misses gives for the user's
# own call.  The trace runs with explanations off around the wrapper and as the
# user had them inside it (the user's own nested jax.jit calls).
def explaining_cache_misses() -> bool:
    from jax._src import config as _config
    return bool(_config.explain_cache_misses.value)


def cache_miss_explanations(on: bool):
    """A context in which JAX explains its tracing cache misses iff ``on``."""
    from jax._src import config as _config
    return _config.explain_cache_misses(on)


# --- parameters JAX derives from another parameter of the same equation --------
# ``reduce`` keeps the user's reducer as a Python function (``computation``) beside
# the jaxpr traced from it; JAX's rules for ``reduce`` (lowering, jvp) read the
# jaxpr only, and batching passes the function through.  The IR holds the jaxpr
# alone -- so a program with a user-written reducer saves, loads and emits -- and
# the function is made again from the jaxpr when the equation goes back to JAX.
def _reducer_of(params: dict):
    run = jaxpr_as_fun(params["jaxpr"])

    def computation(*args):
        outs = run(*jax.tree_util.tree_leaves(args))
        return outs[0] if len(outs) == 1 else tuple(outs)
    return computation


_DERIVED_PARAMS: dict[str, dict[str, Callable[[dict], Any]]] = {
    "reduce": {"computation": _reducer_of},
}


def params_for_ir(prim_name: str, params: dict) -> dict:
    """``params`` without those JAX derives from the others (``_DERIVED_PARAMS``)."""
    derived = _DERIVED_PARAMS.get(prim_name)
    if not derived:
        return params
    return {k: v for k, v in params.items() if k not in derived}


def params_for_jax(prim_name: str, params: dict) -> dict:
    """``params`` (their regions already jaxprs) with the derived ones made again."""
    derived = _DERIVED_PARAMS.get(prim_name)
    if not derived:
        return params
    return {**params, **{k: make(params) for k, make in derived.items() if k not in params}}
