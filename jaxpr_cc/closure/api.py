"""``jaxpr_cc.closure_convert``: a drop-in for ``jax.closure_convert``.

Same contract: ``closure_convert(fun, *example_args) -> (converted, hoisted)`` where
``converted(*args, *hoisted)`` computes ``fun(*args)`` and ``hoisted`` lists the
values lifted out of ``fun``'s closure.  ``hoist`` chooses which:

* ``"perturbed"`` (JAX's behaviour): values that may carry a tangent (tracers that
  are, or may be, differentiated);
* ``"arrays"``: every closed-over array, concrete, integer or differentiated alike —
  useful when the converted function is handed to a rule that must see all its
  data (e.g. to save or re-trace it).

Conversions of the same function at the same argument types are cached while the
values they hoisted are concrete (a cached tracer would outlive its trace).
"""
from __future__ import annotations

import weakref
from typing import Any, Callable

import jax
from jax import tree_util

from .. import jax_adapter as jx
from . import naming

HOIST_CHOICES = ("perturbed", "arrays")
_cache: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()
# jax.closure_convert's own cache is one jax.clear_caches() empties (the function
# may read globals that changed since): so is this one.
_CLEAR_HOOK = jx.on_clear_caches(_cache.clear)


def closure_convert(fun: Callable, *example_args, hoist: str = "perturbed"):
    if hoist not in HOIST_CHOICES:
        raise ValueError(f"hoist must be one of {', '.join(HOIST_CHOICES)}, got {hoist!r}")
    flat, in_tree = tree_util.tree_flatten(example_args)
    avals = tuple(jx.typeof(x) for x in flat)
    key = (in_tree, avals, hoist)
    try:
        per_fun = _cache.setdefault(fun, {})
    except TypeError:  # not weak-referenceable: no caching
        per_fun = {}
    hit = per_fun.get(key)
    if hit is not None:
        return hit
    store = {}

    def flat_fun(*xs):
        out = fun(*tree_util.tree_unflatten(in_tree, xs))
        leaves, store["out_tree"] = tree_util.tree_flatten(out)
        return leaves

    jaxpr, consts, _ = jx.trace_flat(flat_fun, avals, "closure_convert")
    out_tree = store["out_tree"]
    if hoist == "perturbed":
        chosen = [jx.maybe_perturbed(c) for c in consts]
    else:
        chosen = [isinstance(c, (jax.Array, jx.Tracer)) or hasattr(c, "shape") for c in consts]
    kept = [c for c, h in zip(consts, chosen) if not h]
    hoisted = [c for c, h in zip(consts, chosen) if h]
    n_hoisted = len(hoisted)

    def converted(*args_and_hoisted):
        n_args = len(args_and_hoisted) - n_hoisted
        args, lifted = args_and_hoisted[:n_args], args_and_hoisted[n_args:]
        flat_args, tree = tree_util.tree_flatten(tuple(args))
        if tree != in_tree:
            # JAX's own words (callers match them), then which function and how to fix.
            raise TypeError(
                f"The inputs to the closure produced by closure_convert must have the same "
                f"Pytree structure as the example arguments passed when closure_convert was "
                f"called. Expected {in_tree}, but got {tree} (converting "
                f"{naming.name_of(fun)}: pass the example arguments' structure, then the "
                f"{n_hoisted} hoisted values unpacked)")
        k, h = iter(kept), iter(lifted)
        all_consts = [next(h) if c else next(k) for c in chosen]
        outs = jx.eval_jaxpr(jaxpr, [], *all_consts, *flat_args)
        return tree_util.tree_unflatten(out_tree, outs)

    converted.__name__ = f"{getattr(fun, '__name__', 'fun')}_closure_converted"
    result = (converted, hoisted)
    if not any(isinstance(c, jx.Tracer) for c in consts):
        per_fun[key] = result
    return result
