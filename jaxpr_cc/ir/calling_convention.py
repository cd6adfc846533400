"""Checking a call against the signature a program was traced with.

A program (and an executable compiled from it) is one computation on inputs of the
types it was traced with.  Fed anything else it would compute something else: a
longer vector read as a shorter one, the bits of a float read as an integer.  So
every call is checked leaf by leaf, and a call is accepted exactly when
``jax.jit`` of the original function would reuse its trace for it: the argument's
type as JAX sees it (``jax.typeof``: after dtype canonicalization, e.g. a
``float64`` NumPy array is ``float32`` without x64) has the traced shape, dtype and
weak type.  Weak types must match both ways, because JAX's type promotion reads
them while tracing: ``x + bf16_array`` is ``bfloat16`` for a Python-scalar ``x``
and ``float32`` for a ``float32`` array ``x``, so a retrace for the other kind
could compute a different result (see docs/format.md, *Calling a program*).

Under ``jax.vmap`` the arguments are batch tracers whose type is the per-example
type, so the per-example shape is what is checked; under ``jax.jit`` and
``jax.grad`` the tracers carry the caller's types as well.
"""
from __future__ import annotations

import collections
from typing import Any, Sequence

import jax
import numpy as np
from jax import tree_util

__all__ = ["argument_path", "check_argument_types", "describe_type", "layout_in_type",
           "structure_mismatch"]


def argument_path(path: Sequence[Any]) -> str:
    """``args[0]['w']`` / ``kwargs['scale']`` for a key path into ``(args, kwargs)``."""
    if not path:
        return "arguments"
    head, rest = path[0], tuple(path[1:])
    index = getattr(head, "idx", None)
    root = {0: "args", 1: "kwargs"}.get(index, tree_util.keystr((head,)))
    return root + tree_util.keystr(rest)


def _dtype_name(dtype) -> str:
    # float0 (the tangent type of integers) is a NumPy structured dtype; JAX prints
    # it as float0
    return "float0" if dtype == jax.dtypes.float0 else str(dtype)


def _is_key_dtype(dtype) -> bool:
    return jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def describe_type(aval) -> str:
    """``float32[3]``, or ``weakly typed float32[] (like a Python scalar)``."""
    text = f"{_dtype_name(aval.dtype)}[{','.join(map(str, aval.shape))}]"
    if getattr(aval, "weak_type", False):
        # Not only a Python scalar: jnp.array(1.0) is weakly typed too.
        return f"weakly typed {text} (like a Python scalar)"
    return text


# Classes of jax.Arrays and tracers: their .aval is what jax.typeof returns, read
# ~20x faster (an executable call checks every leaf).
_CARRIES_AVAL: set = set()


def _type_of(x: Any, accept_specs: bool = False):
    cls = type(x)
    if cls in _CARRIES_AVAL:
        return x.aval
    if isinstance(x, jax.ShapeDtypeStruct) and not accept_specs:
        return None  # a type, not a value: jax.jit refuses it too
    if isinstance(x, (jax.Array, jax.core.Tracer)):
        _CARRIES_AVAL.add(cls)
        return x.aval
    try:
        return jax.typeof(x)
    except (TypeError, OverflowError, ValueError):
        return None


def _same_type(got, want, weak_matters: bool = True, mesh_matters: bool = True) -> bool:
    return (got.shape == want.shape and got.dtype == want.dtype
            and (got.weak_type == want.weak_type or not weak_matters)
            and (not mesh_matters or _same_mesh_type(got, want)))


def layout_in_type(aval) -> bool:
    """Does ``aval``'s type say how it is laid out (a spec over Explicit mesh axes)?"""
    spec = getattr(getattr(aval, "sharding", None), "spec", None)
    return spec is not None and any(entry is not None for entry in spec)


def _mesh_type(aval):
    """The mesh part of ``aval``'s type (its sharding over an abstract mesh), or
    None when its type names no mesh (an unplaced value, a single device)."""
    sharding = getattr(aval, "sharding", None)
    mesh = getattr(sharding, "mesh", None)
    return None if mesh is None or mesh.empty else sharding


def _same_mesh_type(got, want) -> bool:
    # A value placed on a mesh has that mesh in its type (JAX's avals carry it,
    # and jax.jit traces again for another).  The program's equations are typed
    # on the traced mesh: a value on another mesh is another type.  A value whose
    # type names no mesh (NumPy, an unplaced array) is placed as traced.
    want_mesh = _mesh_type(want)
    if want_mesh is None:
        return True
    got_mesh = _mesh_type(got)
    return got_mesh is None or got_mesh == want_mesh


def check_argument_types(name: str, leaves: Sequence[Any], expected: Sequence[Any],
                         args_and_kwargs: tuple, *, what: str = "program",
                         accept_specs: bool = False, mesh_matters: bool = True) -> None:
    """Raise ``TypeError`` if a leaf's type differs from the traced type.

    ``leaves`` are the flattened ``args_and_kwargs`` (used only to name the
    argument in the message); ``expected`` the traced avals, one per leaf.
    ``accept_specs``: ``jax.ShapeDtypeStruct`` leaves stand for their type (example
    arguments); in a call they are refused, as ``jax.jit`` refuses them.
    An executable, like jax.jit's compiled one, checks shapes and dtypes only: the
    weak type was decided when it was compiled (a strongly typed float32 array runs
    one compiled for a Python float, and the other way round).
    ``mesh_matters``: a value on another mesh than traced is refused (the
    program's equations are typed on the traced mesh); an executable compiled for
    fixed placements leaves that to XLA, which takes equivalent placements.
    """
    carries_aval = _CARRIES_AVAL
    weak_matters = what != "executable"
    try:
        for x, want in zip(leaves, expected):  # the common case, kept cheap
            if type(x) not in carries_aval:
                break
            got = x.aval
            if (got.shape != want.shape or got.dtype != want.dtype
                    or (got.weak_type != want.weak_type and weak_matters)
                    or (mesh_matters and not _same_mesh_type(got, want))):
                break
        else:
            return
    except AttributeError:  # an unshaped input (a token): the careful loop below
        pass
    for i, (x, want) in enumerate(zip(leaves, expected)):
        if not hasattr(want, "shape"):  # tokens and other unshaped inputs
            continue
        got = _type_of(x, accept_specs)
        if got is None or not hasattr(got, "shape") or not _same_type(got, want, weak_matters,
                                                                        mesh_matters):
            raise TypeError(_mismatch_message(name, what, i, x, got, want, args_and_kwargs))


def _mesh_text(aval) -> str:
    sharding = _mesh_type(aval)
    mesh = sharding.mesh
    axes = ", ".join(f"{n!r}: {k}" for n, k in zip(mesh.axis_names, mesh.axis_sizes))
    types = sorted({t.name for t in mesh.axis_types})
    spec = "" if all(e is None for e in sharding.spec) else f" as {sharding.spec}"
    return f"on mesh ({axes}) with {'/'.join(types)} axes{spec}"


def _leaf_path(index: int, args_and_kwargs: tuple) -> str:
    try:
        paths = tree_util.tree_flatten_with_path(args_and_kwargs)[0]
        return argument_path(paths[index][0])
    except Exception:  # a path is only decoration; the leaf number still identifies it
        return f"argument leaf {index}"


def _mismatch_message(name, what, index, x, got, want, args_and_kwargs) -> str:
    where = _leaf_path(index, args_and_kwargs)
    traced = describe_type(want)
    made = "compiled for" if what == "executable" else "traced with"
    if isinstance(x, jax.ShapeDtypeStruct):
        return (f"{name}: {where} is a jax.ShapeDtypeStruct (a type, not a value; jax.jit "
                f"refuses it too); the {what} was {made} {traced} there: pass an array of "
                f"that type, or use jax.eval_shape to compute with types only")
    if isinstance(x, np.ndarray) and got is None:
        native = x.dtype.newbyteorder("=") if x.dtype.byteorder not in "=|" else None
        if native is not None:
            return (f"{name}: {where} is a NumPy array of non-native byte order "
                    f"{x.dtype.str}, which JAX does not take (jax.jit refuses it too); the "
                    f"{what} was {made} {traced} there: pass x.astype({native.name!r})")
        return (f"{name}: {where} is a NumPy array of dtype {x.dtype}, which is not a JAX "
                f"array type; the {what} was {made} {traced} there: pass a value of that type")
    if type(x) is int and got is None:
        return (f"{name}: {where} is the Python int {x}, which overflows the integer type JAX "
                f"gives it (jax.jit raises OverflowError); the {what} was {made} {traced} "
                f"there: pass a value in range")
    if got is None or not hasattr(got, "shape"):
        return (f"{name}: {where} is a value of type {type(x).__name__}, not an array; the "
                f"{what} was {made} {traced} there: pass a value of that type")
    from ..jax_adapter import is_batch_tracer
    inside = " per example (under jax.vmap the mapped axis is not counted)" \
        if is_batch_tracer(x) and got.shape != want.shape else ""
    given = describe_type(got)
    head = f"{name}: {where} is {given}{inside}, but the {what} was {made} {traced}"
    if got.shape == want.shape and got.dtype == want.dtype and not _same_mesh_type(got, want):
        return (f"{name}: {where} is {given} {_mesh_text(got)}, but the {what} was {made} "
                f"{traced} {_mesh_text(want)}; its equations are typed on that mesh: place "
                f"the argument there (jax.device_put), or trace the function again with "
                f"this placement (jax.jit would trace again too)")
    if _is_key_dtype(want.dtype) and not _is_key_dtype(got.dtype):
        fix = (f"the dtype is the problem: the {what} takes a typed PRNG key "
               f"(jax.random.key); pass one, e.g. jax.random.wrap_key_data(k) of raw key "
               f"data k")
    elif _is_key_dtype(got.dtype) and not _is_key_dtype(want.dtype):
        fix = (f"the dtype is the problem: the {what} takes raw key data "
               f"(jax.random.PRNGKey); pass jax.random.key_data(k) of a typed key k")
    elif got.shape != want.shape:
        fix = (f"pass an array of shape {tuple(want.shape)}, or trace the function again with "
               f"the new shape")
    elif got.dtype != want.dtype:
        w_name, g_name = _dtype_name(want.dtype), _dtype_name(got.dtype)
        fix = (f"pass a value of dtype {w_name} (nothing is converted: reading a "
               f"{g_name} as {w_name} computes something else), or trace the function "
               f"again with a {g_name} argument")
    elif want.weak_type:
        fix = (f"pass a Python scalar as when tracing, or trace the function again with a "
               f"strongly typed {want.dtype} array (jnp.asarray(x, jnp.{want.dtype})): JAX "
               f"promotes weakly typed values differently, so jax.jit would trace again too")
    else:
        fix = (f"pass a {want.dtype} array (e.g. jnp.asarray(x, jnp.{want.dtype})), or trace "
               f"the function again with a Python scalar (JAX promotes weakly typed values "
               f"differently, so jax.jit would trace again too)")
    return f"{head}; {fix}"


# ---------------------------------------------------------------- structures
def _node_kind(node_data) -> str:
    if node_data is None:
        return "an array (leaf)"
    node_type, aux = node_data
    if node_type is type(None):
        return "None"
    from ..storage.pytrees import SavedNode
    if node_type is SavedNode:
        return f"a {aux[0]}.{aux[1]} (a custom pytree node read from a file)"
    return f"a {node_type.__module__}.{node_type.__qualname__}" \
        if node_type.__module__ != "builtins" else f"a {node_type.__qualname__}"


def _dict_keys(node_type, aux) -> list:
    # defaultdict's node data is (default_factory, keys)
    return list(aux[1] if node_type is collections.defaultdict else aux)


def _child_keys(treedef) -> list[str]:
    node_type, aux = treedef.node_data()
    n = len(treedef.children())
    if node_type in (tuple, list):
        return [f"[{i}]" for i in range(n)]
    if node_type in (dict, collections.OrderedDict, collections.defaultdict):
        return [f"[{k!r}]" for k in _dict_keys(node_type, aux)]
    fields = getattr(node_type, "_fields", None)
    if isinstance(fields, tuple) and len(fields) == n:
        return [f".{f}" for f in fields]
    try:
        example = tree_util.tree_unflatten(treedef, [0] * treedef.num_leaves)
        pairs = tree_util.tree_flatten_with_path(example, is_leaf=lambda x: x is not example)[0]
        if len(pairs) == n:
            return [tree_util.keystr(p) for p, _ in pairs]
    except Exception:  # keys only name the place of the difference
        pass
    return [f"<child {i}>" for i in range(n)]


def structure_mismatch(given, expected, *, vouched: bool = False) -> str:
    """Where and how the pytree ``given`` differs from ``expected`` (both
    ``PyTreeDef``s of ``(args, kwargs)``): one phrase naming the first difference.
    ``vouched``: ``given`` is a ``like=`` example (see ``same_saved_structure``)."""
    return _first_difference(given, expected, (), vouched) or "the arguments differ in structure"


def _path_text(keys: tuple) -> str:
    if not keys:
        return "the arguments"
    root = {"[0]": "args", "[1]": "kwargs"}.get(keys[0], keys[0])
    return root + "".join(keys[1:])


def _first_difference(given, expected, keys: tuple, vouched: bool = False) -> str:
    g_data, e_data = given.node_data(), expected.node_data()
    g_type = None if g_data is None else g_data[0]
    e_type = None if e_data is None else e_data[0]
    here = _path_text(keys)
    from ..storage.pytrees import SavedNode, saved_node_difference
    saved_fits = False  # a live node standing for a saved custom node, itself fitting
    if g_type is not e_type:
        if e_type is SavedNode and g_data is not None and _same_name(g_type, e_data[1]):
            difference = saved_node_difference(given, e_data[1], vouched)
            if difference is not None:
                return f"{here} {difference}"
            saved_fits = True
        elif (g_data is not None and e_data is not None and g_type.__qualname__ ==
              getattr(e_type, "__qualname__", None) and g_type.__module__ == e_type.__module__):
            return (f"{here} is a {g_type.__module__}.{g_type.__qualname__} of another class "
                    f"than the one the program was traced with (same name; jax.jit would trace "
                    f"again): pass an instance of the traced class")
        else:
            return f"{here} is {_node_kind(g_data)} where the program takes {_node_kind(e_data)}"
    if g_data is None:
        return ""
    g_kids, e_kids = given.children(), expected.children()
    if saved_fits:
        for i, (g, e) in enumerate(zip(g_kids, e_kids)):
            found = _first_difference(g, e, keys + (_key_text(e_data[1][2][i]),), vouched)
            if found:
                return found
        return ""  # the live node fits the saved one: the difference is elsewhere
    if e_type in (dict, collections.OrderedDict, collections.defaultdict):
        g_keys, e_keys = _dict_keys(e_type, g_data[1]), _dict_keys(e_type, e_data[1])
        if g_keys != e_keys:
            missing = [k for k in e_keys if k not in g_keys]
            extra = [k for k in g_keys if k not in e_keys]
            parts = ([f"lacks keys {missing}"] if missing else []) + \
                    ([f"has unexpected keys {extra}"] if extra else [])
            return f"{here} " + (" and ".join(parts)
                                 or f"has its keys in the order {g_keys}, expected {e_keys}")
    if len(g_kids) != len(e_kids):
        return (f"{here} has {len(g_kids)} entries where the program takes {len(e_kids)}")
    child_keys = _child_keys(expected)
    for g, e, k in zip(g_kids, e_kids, child_keys):
        if g != e:
            found = _first_difference(g, e, keys + (k,), vouched)
            if found:
                return found
    if g_data[1] != e_data[1]:
        return (f"{here} is a {e_type.__qualname__} with different static data "
                f"({str(g_data[1])[:80]} where the program has {str(e_data[1])[:80]})")
    return ""  # every part fits (live nodes standing for saved ones): look elsewhere


def _same_name(g_type, saved_aux) -> bool:
    return (g_type.__module__, g_type.__qualname__) == (saved_aux[0], saved_aux[1])


def _key_text(key: tuple) -> str:
    kind, value = key
    return {"attr": f".{value}", "key": f"[{value!r}]", "index": f"[{value}]",
            "flat": f"<flat {value}>"}.get(kind, str(value))
