"""Python function -> Program."""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

import jax
from jax import tree_util

from .. import jax_adapter as jx
from ..ir.program import Program


def trace(fun: Callable, /, *example_args, closed_over: str = "auto",
          max_forward_size: int = 4096, **example_kwargs) -> Program:
    """Trace ``fun`` on example arguments into a first-order :class:`Program`.

    Arguments may be arrays, ``jax.ShapeDtypeStruct``s, Python scalars, or pytrees of
    them; keyword arguments are traced too.  The Program keeps the pytree structure
    of the arguments and of the result.

    Custom rules (``custom_vjp``, ``custom_jvp``, ``custom_gradient``, ``linear_call``)
    are traced while the trace is live; values they close over become explicit
    operands.  ``closed_over`` says how derivatives with respect to such values are
    formed ('auto', 'reverse', 'forward' or 'error'; see ``jaxpr_cc.closure.rules``),
    and ``max_forward_size`` bounds the forward policy.  These two keywords are
    options of ``trace`` and are not passed to ``fun``.  A rule that calls its own
    custom function (a fixed-point solver's fwd) is materialized once and called
    recursively, so every derivative order the rules define works.
    """
    if "rule_depth" in example_kwargs and "rule_depth" not in _parameters(fun):
        raise TypeError(
            "jaxpr_cc.trace: rule_depth was removed; recursion through custom rules is "
            "finite now (any derivative order works): drop the argument")
    return trace_call(fun, example_args, example_kwargs, closed_over=closed_over,
                      max_forward_size=max_forward_size)


def trace_call(fun: Callable, example_args: tuple, example_kwargs: dict, *,
               closed_over: str = "auto", max_forward_size: int = 4096) -> Program:
    """:func:`trace` of ``fun(*example_args, **example_kwargs)``, the keyword arguments
    given as a dict: every one goes to ``fun`` (``jaxpr_cc.jit`` passes a caller's
    keywords, whatever their names, as ``jax.jit`` does)."""
    from ..closure.session import current, session
    from .staged_rules import convert_program

    # A fresh function per trace (JAX caches traces by function, and this trace runs
    # in a closure session), carrying ``fun``'s name, signature and source location
    # (``__wrapped__``) so that JAX's errors name the user's function and arguments.
    explain = jx.explaining_cache_misses()

    def traced_fun(*args, **kwargs):
        if not explain:
            out = fun(*args, **kwargs)
        else:
            with jx.cache_miss_explanations(True):  # see jax_adapter: the user's own jits
                out = fun(*args, **kwargs)
        # JAX traces a custom_vjp's bwd when it differentiates, after ``fun`` returned.
        current().rebind_late_bwds()
        return out
    inner = innermost_function(fun)
    functools.update_wrapper(traced_fun, inner, updated=())
    traced_fun.__wrapped__ = inner  # JAX's source location of the user's code
    try:  # ... and the arguments as ``fun`` takes them (a partial binds some)
        traced_fun.__signature__ = inspect.signature(fun)
    except (TypeError, ValueError):
        pass

    options = dict(closed_over=closed_over, max_forward_size=max_forward_size)
    with session(**options), jx.cache_miss_explanations(False):
        closed, out_shape = jax.make_jaxpr(traced_fun, return_shape=True)(
            *example_args, **example_kwargs)
    jx.check_no_escaped_tracers(closed.consts)
    in_tree = tree_util.tree_structure((tuple(example_args), dict(example_kwargs)))
    out_tree = tree_util.tree_structure(out_shape)
    names = argument_names(fun, example_args, example_kwargs)
    program = Program.from_jaxpr(closed, in_tree=in_tree, out_tree=out_tree,
                                 name=getattr(inner, "__name__", "program"), arg_names=names)
    program.arg_shardings = traced_arg_shardings(example_args, example_kwargs)
    if not program.is_first_order():
        # Rules JAX staged without us (e.g. a jit body cached before this trace):
        # materialize them from their thunks.
        convert_program(program, **options)
    return program


def traced_arg_shardings(example_args: tuple, example_kwargs: dict) -> tuple | None:
    """The shardings of the committed arrays (and ShapeDtypeStructs) on a device mesh
    among the example arguments, one entry (or None) per flat leaf; None when there
    are none.

    Their avals carry only the abstract mesh: these are what let ``compile`` lay
    the arguments out as they were, as jax.jit does with committed arguments.
    Single-device placements are not kept, so programs stay portable."""
    leaves = tree_util.tree_leaves((tuple(example_args), dict(example_kwargs)))
    found = [_mesh_sharding(x) for x in leaves]
    return tuple(found) if any(s is not None for s in found) else None


def _mesh_sharding(x: Any):
    if isinstance(x, jax.ShapeDtypeStruct):
        sharding = x.sharding  # a placement given with the type, as jax.jit(f).lower takes it
    elif isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer) and \
            getattr(x, "committed", False):
        sharding = x.sharding
    else:
        return None
    if isinstance(sharding, jax.sharding.NamedSharding) and isinstance(
            sharding.mesh, jax.sharding.Mesh) and not sharding.mesh.empty:
        return sharding
    return None


def innermost_function(fun: Callable) -> Callable:
    """The user's own function under partials and ``__wrapped__`` chains (what JAX's
    error messages should name)."""
    while True:
        if isinstance(fun, functools.partial):
            fun = fun.func
        elif getattr(fun, "__wrapped__", None) is not None and callable(fun.__wrapped__):
            fun = fun.__wrapped__
        else:
            return fun


def argument_names(fun: Callable, args: tuple, kwargs: dict) -> list[str]:
    """Readable names for the flattened arguments: ``x``, ``params.w``, ``xs.0``."""
    try:
        params = list(inspect.signature(fun).parameters.values())
    except (TypeError, ValueError):
        params = []
    positional = [p.name for p in params
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    star = next((p.name for p in params if p.kind is p.VAR_POSITIONAL), None)
    leaves, _ = tree_util.tree_flatten_with_path((tuple(args), dict(kwargs)))
    names = []
    for path, _ in leaves:
        parts = [_key_str(k) for k in path]
        top = path[0].idx if hasattr(path[0], "idx") else 1
        first = path[1]
        if top == 0:
            i = first.idx
            if i < len(positional):
                head = positional[i]
            elif star is not None:
                head = f"{star}{i - len(positional)}"
            else:
                head = f"arg{i}"
        else:
            head = _key_str(first)
        names.append(".".join([head] + parts[2:]))
    return names


def _key_str(key: Any) -> str:
    for attr in ("key", "idx", "name"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def _parameters(fun) -> tuple:
    try:
        return tuple(inspect.signature(fun).parameters)
    except (TypeError, ValueError):
        return ()
