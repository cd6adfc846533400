"""The one module that touches JAX internals (``jax._src``).

JAX's internal APIs move quickly (``ClosedJaxpr`` is being folded into ``Jaxpr``
upstream, constants are moving into invars), so every other module of jaxpr-cc
imports what it needs of JAX's internals from here.  A JAX upgrade should touch
this file and nothing else.  The names exported here are deliberately plain
re-exports or tiny wrappers, each with the reason it is needed.
"""
from __future__ import annotations

from typing import Any, Sequence

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
DebugInfo = _lu.DebugInfo
no_effects = _core.no_effects

new_jaxpr_eqn = _core.new_jaxpr_eqn
eval_jaxpr = _core.eval_jaxpr
jaxpr_as_fun = _core.jaxpr_as_fun  # removed from public jax.core in 0.10
check_jaxpr = _core.check_jaxpr
new_source_info = _source_info_util.new_source_info


def get_aval(x: Any) -> AbstractValue:
    return _core.get_aval(x)


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
    """JAX's own dead-code elimination; used as a reference by tests and benchmarks."""
    return _pe.dce_jaxpr(jaxpr, list(used_outputs), instantiate=instantiate)


def is_effectful(eqn_effects) -> bool:
    return bool(eqn_effects)


def primitives_registry() -> dict[str, Primitive]:
    """Every Primitive object JAX has created so far, by name.

    Built by walking the modules that define primitives: used by the saved-program
    loader, which must map names back to primitives without importing anything a
    file names.
    """
    import gc  # noqa: F401  (kept local: only the loader needs this)
    import jax.lax  # noqa: F401  (ensure lax primitives exist)
    import jax.numpy  # noqa: F401
    import jax.random  # noqa: F401
    from jax._src import (custom_derivatives, ad_checkpoint, callback, debugging,  # noqa: F401
                          prng, pjit, dispatch)
    from jax._src.lax import control_flow  # noqa: F401
    registry: dict[str, Primitive] = {}
    import sys
    for modname, mod in list(sys.modules.items()):
        if not modname.startswith("jax"):
            continue
        for value in list(vars(mod).values()) if hasattr(mod, "__dict__") else []:
            if isinstance(value, Primitive):
                registry.setdefault(value.name, value)
    return registry


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
    return tuple(_api_util.resolve_kwargs(fun, args, kwargs))


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
    """Call a ``linear_util.WrappedFun`` (JAX's staged custom-rule callables)."""
    return fun.call_wrapped(*args)


def wrapped_fun_target(fun):
    """The user's Python function inside a ``linear_util.WrappedFun`` (or ``fun``)."""
    return getattr(fun, "f", fun)


# --- effects and jit parameters (used by jaxpr_cc/passes) ---------------------
# JAX's own DCE treats some effects as removable (reads, named-axis collectives,
# internal mutable arrays); the passes classify effects the same way so that our
# dce never keeps less than pe.dce_jaxpr would, and never drops what it keeps.
from jax._src import effects as _effects  # noqa: E402
from jax._src import sharding_impls as _sharding_impls  # noqa: E402

#: The ``in_shardings``/``out_shardings`` entry of a jit operand with no sharding
#: request; passes that add operands to a ``jit`` equation (hoist-consts) use it.
UNSPECIFIED_SHARDING = _sharding_impls.UNSPECIFIED


def is_removable_effect(effect) -> bool:
    """True when JAX's DCE may drop an equation whose only effects are like this one."""
    return _pe.dceable_effects.contains(effect)


def is_named_axis_effect(effect) -> bool:
    """A collective's dependence on a named mesh/vmap axis: not a side effect."""
    return isinstance(effect, _core.NamedAxisEffect)


def is_input_effect(effect) -> bool:
    """An effect that names one of the equation's inputs by position (state refs):
    changing the equation's operand list would make it point at the wrong input."""
    return isinstance(effect, _effects.JaxprInputEffect)


# --- XLA executables and jaxpr_cc.jit (backends/xla.py, jit.py) ---------------
from jax._src import array as _array  # noqa: E402
from jax._src import sharding_impls as _xla_sharding_impls  # noqa: E402

#: The concrete array type: ``jaxpr_cc.jit``'s cache lookup tests ``type(x) is
#: ArrayImpl`` first, the cheapest way to recognise the common argument.
ArrayImpl = _array.ArrayImpl


def trace_state_clean() -> bool:
    """True when no JAX transformation is tracing: ``jaxpr_cc.jit`` may then run
    its compiled executable; otherwise it must bind the program into the trace."""
    return _core.trace_state_clean()


def named_sharding_from_hlo(sharding, mesh):
    """The NamedSharding over ``mesh`` equivalent to a compiler-chosen sharding
    (XLA reports propagated input shardings as ``GSPMDSharding``), or None when
    ``sharding`` is of another kind or has no equivalent on ``mesh``.

    Saving a multi-device executable needs every sharding as a NamedSharding:
    that is what ``jax.export`` serializes and what can be rebuilt by device id.
    """
    if not isinstance(sharding, _xla_sharding_impls.GSPMDSharding):
        return None
    try:
        named = _xla_sharding_impls._gspmd_to_named_sharding_via_mesh(sharding, mesh)
    except (ValueError, TypeError, AssertionError):
        return None
    return named


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
