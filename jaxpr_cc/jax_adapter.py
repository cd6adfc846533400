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
