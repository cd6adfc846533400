"""Equation parameters as JSON, through a table of per-type encoders and decoders.

JSON's own values stand for themselves: ``null``, ``true``/``false``, integers,
strings, finite floats; a JSON array is a Python *tuple* (JAX's parameters are
almost always tuples).  Every other value is a tagged object ``{"$t": TAG, "v":
PAYLOAD}``, e.g. ``{"$t": "dtype", "v": "float32"}``,
``{"$t": "enum", "v": ["Precision", "HIGHEST"]}``, ``{"$t": "region", "v": 3}``.

The encoder for a value is the save aspect of its entry in the parameter-type
registry (``ir.param_types``), which this module fills in; a type with no encoder
raises ``SaveError`` naming the primitive and the parameter, so an unsavable program
fails at save time, never at load time.  Decoders are looked up by tag; unknown tags
are refused.
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import json
import math
import struct
import types
from typing import Any, Callable

import numpy as np

from ..ir import library_refs, param_types
from ..ir.region import Region
from ..jax_adapter import (JAX_SENTINELS, AbstractToken, ClosedJaxpr, Effect, ExtendedDType,
                           Jaxpr, Primitive, ShapedArray, TypedComplex, TypedFloat, TypedInt, UnspecifiedValue,
                           UNSPECIFIED, array_copy_semantics_type, custom_vmap_rule_type,
                           dots_saveable_type, hashable_array_type, is_made_checkpoint_policy,
                           linear_solve_tuple_type, named_policy_types, param_enum_types,
                           jax_sentinel_name, prng_impl_by_name, prng_impl_type, WrappedFun)
from ..storage import dtypes, pytrees
from . import effects, primitives, shardings
from ..storage.errors import FormatError, SaveError

_MAX_DEPTH = 200
# Tags whose values compare by identity; equal payloads decode to one shared object.
_SHARED_TAGS = frozenset({"partial", "library_instance"})


@dataclasses.dataclass(frozen=True)
class Codec:
    tag: str
    encode: Callable[[Any, "ParamEncoder"], Any]   # value -> payload
    decode: Callable[[Any, "ParamDecoder"], Any] | None   # payload -> value


def register(types_: tuple[type, ...] | type, tag: str | None, encode, decode) -> None:
    """Give the registry entries of ``types_`` the save aspect ``tag``/``encode`` and
    register the decoder of ``tag``.  With ``tag`` None the encoder writes the tagged
    object itself (a type saved in more than one form)."""
    if tag is not None:
        param_types.add_decoder(tag, decode)
    if encode is not None:
        param_types.extend(types_, tag=tag, encode=encode)


_ENUMS: dict[str, type] = {cls.__name__: cls
                           for cls in (*param_enum_types(), array_copy_semantics_type())}
_ENUM_NAMES = {cls: name for name, cls in _ENUMS.items()}


def codec_for(value: Any) -> Codec | None:
    """The codec that would encode ``value`` (None for JSON-native values and for
    values that cannot be saved)."""
    entry = param_types.entry_for(value)
    if entry.encode is None or entry.name == "default" or _is_json_native(value):
        return None
    return Codec(entry.tag, entry.encode, param_types.decoder(entry.tag))


def _is_json_native(value: Any) -> bool:
    return value is None or type(value) in (bool, int, float, str, tuple)


def is_callable_param(value: Any) -> bool:
    return param_types.is_python_callable(value) or (
        callable(value) and not isinstance(value, type) and codec_for(value) is None)


# ------------------------------------------------------------------ encoder
class ParamEncoder:
    """Encodes parameter values of one program; ``where`` names the primitive and
    parameter being encoded, for error messages."""

    def __init__(self, region_ref: Callable[[Region], int], jaxpr_ref: Callable[[Any], int],
                 array_ref: Callable[[Any, str], dict], aval_codec):
        self.region_ref = region_ref
        self.jaxpr_ref = jaxpr_ref
        self.array_ref = array_ref
        self.avals = aval_codec
        self.where = "parameter"
        self._depth = 0

    def encode(self, value: Any) -> Any:
        t = type(value)
        if t is str or t is int or t is bool or value is None:  # JSON-native (as their entries)
            return value
        self._depth += 1
        try:
            if self._depth > _MAX_DEPTH:
                raise SaveError(f"cannot save {self.where}: nested too deeply")
            entry = param_types.entry_for(value)
            if entry.encode is None:
                raise SaveError(self._cannot(value))
            payload = entry.encode(value, self)
            return payload if entry.tag is None else {"$t": entry.tag, "v": payload}
        finally:
            self._depth -= 1

    def _cannot(self, value: Any) -> str:
        t = type(value)
        target = getattr(value, "callback_func", None)  # pure_callback / io_callback
        if target is not None:
            name = f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', '?')}"
            hint = ""
            if name.startswith("equinox._errors."):
                hint = ("; it is equinox's runtime error check (eqx.error_if): set "
                        "EQX_ON_ERROR=nan before importing equinox to trace without it")
            return (f"cannot save {self.where}: the callback {name} is Python code, not "
                    f"data{hint}")
        if type(value) is custom_vmap_rule_type():
            return (f"cannot save {self.where}: jax.custom_batching.custom_vmap's batching rule "
                    f"({getattr(value, '__qualname__', '?')}) is Python code, not data, and its "
                    f"result depends on the batch size vmap gives it; emit_python imports it "
                    f"by name")
        if is_callable_param(value):
            return (f"cannot save {self.where}: it holds a Python callable "
                    f"({getattr(value, '__qualname__', t.__name__)}); only first-order programs "
                    f"can be saved: trace with jaxpr_cc.trace and run closure conversion so that "
                    f"custom rules are held as regions")
        reason = param_types.entry_for(value).cannot_save or "no encoder for this type"
        return f"cannot save {self.where} of type {t.__module__}.{t.__qualname__}: {reason}"


# ------------------------------------------------------------------ decoder
class ParamDecoder:
    def __init__(self, region: Callable[[Any], Region], jaxpr: Callable[[Any, bool], Any],
                 host_value: Callable[[Any], Any], aval_codec):
        self.region = region
        self.jaxpr = jaxpr
        self.host_value = host_value
        self.avals = aval_codec
        self._depth = 0
        self._shared: dict[tuple, Any] = {}

    def decode(self, obj: Any) -> Any:
        t = type(obj)
        if t is str or t is int or t is bool or obj is None or t is float:
            return obj
        self._depth += 1
        try:
            if self._depth > _MAX_DEPTH:
                raise FormatError("parameter nested too deeply")
            if t is list:
                return tuple([self.decode(v) for v in obj])
            if t is dict:
                if len(obj) != 2 or "$t" not in obj or "v" not in obj:
                    raise FormatError(f"malformed tagged parameter value (fields {sorted(obj)[:6]})")
                decode = param_types.decoder(obj["$t"]) if type(obj["$t"]) is str else None
                if decode is None:
                    raise FormatError(f"unknown parameter type tag {str(obj['$t'])[:40]!r}")
                if obj["$t"] not in _SHARED_TAGS:
                    return decode(obj["v"], self)
                # Objects compared by identity (a partial, a library instance) that were
                # one object when saved must be one object again: equinox checks that
                # the static data a closure-converted function is called with *is* equal
                # to the data it was traced with.
                memo_key = (obj["$t"], json.dumps(obj["v"], sort_keys=True))
                found = self._shared.get(memo_key)
                if found is None:
                    found = self._shared[memo_key] = decode(obj["v"], self)
                return found
            raise FormatError(f"malformed parameter value {str(obj)[:40]}")
        finally:
            self._depth -= 1


# ---------------------------------------------------------- codec bodies
def _enc_json(value, enc):
    return value


def _enc_float(value, enc):
    if math.isfinite(value):
        return value
    return {"$t": "float", "v": struct.pack(">d", value).hex()}


def _dec_float(v, dec):
    if type(v) is not str or len(v) != 16:
        raise FormatError("malformed float bits")
    try:
        value = struct.unpack(">d", bytes.fromhex(v))[0]
    except ValueError:
        raise FormatError("malformed float bits") from None
    if math.isfinite(value):
        raise FormatError("finite floats are written as JSON numbers")
    return value


def _list_payload(v, what):
    if not isinstance(v, list):
        raise FormatError(f"{what} payload must be a list")
    return v


def _enc_dict(value: dict, enc):
    return [[enc.encode(k), enc.encode(v)] for k, v in value.items()]


def _dec_dict(v, dec):
    out = {}
    for pair in _list_payload(v, "dict"):
        if not (isinstance(pair, list) and len(pair) == 2):
            raise FormatError("dict items must be [key, value] pairs")
        key = dec.decode(pair[0])
        try:
            if key in out:
                raise FormatError("duplicate dict key")
        except TypeError:
            raise FormatError("unhashable dict key") from None
        out[key] = dec.decode(pair[1])
    return out


def _enc_set(value, enc):
    return sorted((enc.encode(v) for v in value), key=lambda e: json.dumps(e, sort_keys=True))


def _dec_set(cls):
    def decode(v, dec):
        items = [dec.decode(x) for x in _list_payload(v, cls.__name__)]
        try:
            out = cls(items)
        except TypeError:
            raise FormatError(f"unhashable {cls.__name__} element") from None
        if len(out) != len(items):
            raise FormatError(f"{cls.__name__} lists an element twice")
        return out
    return decode


def _enc_dtype(value, enc):
    name = dtypes.dtype_name(value)
    if name is None:
        raise SaveError(f"cannot save {enc.where}: dtype {value} has no name in the format")
    return name


def _dec_dtype(v, dec):
    return dtypes.dtype_from_name(v)


def _enc_type(value, enc):
    if isinstance(value, type) and issubclass(value, np.generic):
        name = dtypes.dtype_name(np.dtype(value))
        if name is not None:
            return {"$t": "scalar_type", "v": name}
    try:
        return {"$t": "library_ref", "v": list(library_refs.reference(value))}
    except library_refs.NotReachable:
        pass
    raise SaveError(f"cannot save {enc.where}: the class {getattr(value, '__qualname__', value)} "
                    f"(only numpy scalar types and classes of "
                    f"{', '.join(library_refs.LIBRARY_PACKAGES)} can be saved as classes)")


def _dec_type(v, dec):
    dtype = dtypes.dtype_from_name(v)
    if not isinstance(dtype, np.dtype):
        raise FormatError(f"{v!r} is not a numpy scalar type")
    return dtype.type


def _enc_np_scalar(value, enc):
    return [_enc_dtype(value.dtype, enc), dtypes.encode_scalar(value, value.dtype)]


def _dec_np_scalar(v, dec):
    if not (isinstance(v, list) and len(v) == 2):
        raise FormatError("malformed numpy scalar")
    return dtypes.decode_scalar(v[1], dtypes.dtype_from_name(v[0]))[()]


def _enc_typed_scalar(value, enc):
    base = {TypedInt: int, TypedFloat: float, TypedComplex: complex}[type(value)]
    storage = {int: "int64", float: "float64", complex: "complex128"}[base]
    return [_enc_dtype(value.dtype, enc), dtypes.encode_scalar(base(value), np.dtype(storage))]


def _dec_typed_scalar(v, dec):
    if not (isinstance(v, list) and len(v) == 2):
        raise FormatError("malformed typed scalar")
    dtype = dtypes.dtype_from_name(v[0])
    kind = dtypes.category(dtype)
    cls, storage = {"int": (TypedInt, "int64"), "float": (TypedFloat, "float64"),
                    "complex": (TypedComplex, "complex128")}.get(kind, (None, None))
    if cls is None:
        raise FormatError(f"a typed scalar cannot have dtype {v[0]!r}")
    return cls(dtypes.decode_scalar(v[1], np.dtype(storage))[()].item(), dtype)


def _enc_enum(value, enc):
    return [_ENUM_NAMES[type(value)], value.name]


def _dec_enum(v, dec):
    if not (isinstance(v, list) and len(v) == 2 and all(type(x) is str for x in v)):
        raise FormatError("malformed enum")
    cls = _ENUMS.get(v[0])
    if cls is None:
        raise FormatError(f"unknown enum type {v[0][:40]!r}")
    try:
        return cls[v[1]]
    except KeyError:
        raise FormatError(f"{v[0]} has no member {v[1][:40]!r}") from None


def _record(cls: type, fields: tuple[str, ...], positional: bool):
    """Codec functions for a class rebuilt from named fields."""
    def encode(value, enc):
        return {f: enc.encode(getattr(value, f)) for f in fields}

    def decode(v, dec):
        if not isinstance(v, dict) or set(v) != set(fields):
            raise FormatError(f"malformed {cls.__name__}: expected fields {list(fields)}")
        values = {f: dec.decode(v[f]) for f in fields}
        try:
            return cls(*[values[f] for f in fields]) if positional else cls(**values)
        except (TypeError, ValueError) as e:
            raise FormatError(f"invalid {cls.__name__}: {e}") from None
    return encode, decode


def _named_policy(cls: type, field: str):
    """Codec functions for a remat policy made from checkpoint names: the sorted names."""
    def encode(value, enc):
        return {"names": sorted(getattr(value, field))}

    def decode(v, dec):
        names = v.get("names") if isinstance(v, dict) else None
        if set(v if isinstance(v, dict) else ()) != {"names"} or not isinstance(names, list) \
                or not all(isinstance(n, str) for n in names):
            raise FormatError(f"malformed {cls.__name__}: expected {{'names': [str, ...]}}")
        return cls(frozenset(names))
    return encode, decode


def _enc_region(value, enc):
    return enc.region_ref(value)


def _dec_region(v, dec):
    return dec.region(v)


def _enc_jaxpr(value, enc):
    return enc.jaxpr_ref(value)


def _dec_jaxpr(closed: bool):
    def decode(v, dec):
        return dec.jaxpr(v, closed)
    return decode


def _enc_array(value, enc):
    return enc.array_ref(value, enc.where)


def _dec_array(v, dec):
    return dec.host_value(v)


def _enc_treedef(value, enc):
    try:
        return {"$t": "treedef", "v": pytrees.encode_treedef(value, enc.where)}
    except SaveError:
        pass
    # Custom nodes (a library primitive's operands: lineax operators, equinox Modules):
    # each node as its class (by name) and auxiliary data (a parameter value itself).
    return {"$t": "treedef_nodes", "v": _enc_nodes(value, enc, 0)}


_BUILTIN_NODES = {"tuple": tuple, "list": list, "dict": dict, "None": type(None)}
_BUILTIN_NODE_NAMES = {v: k for k, v in _BUILTIN_NODES.items()}


def _enc_nodes(treedef, enc, depth):
    if depth > _MAX_DEPTH:
        raise SaveError(f"cannot save {enc.where}: pytree nested too deeply")
    node_data = treedef.node_data()
    if node_data is None:
        return "*"
    node_type, aux = node_data
    name = _BUILTIN_NODE_NAMES.get(node_type)
    if name is None:
        try:
            name = list(library_refs.reference(node_type))
        except library_refs.NotReachable:
            raise SaveError(f"cannot save {enc.where}: pytree node type {node_type.__module__}."
                            f"{node_type.__qualname__} is not a class of "
                            f"{', '.join(library_refs.LIBRARY_PACKAGES)}") from None
    return {"node": name, "aux": enc.encode(aux),
            "children": [_enc_nodes(c, enc, depth + 1) for c in treedef.children()]}


def _dec_treedef_nodes(v, dec):
    import jax
    leaf = jax.tree_util.tree_structure(0)

    def node(x, depth):
        if depth > _MAX_DEPTH:
            raise FormatError("pytree nested too deeply")
        if x == "*":
            return leaf
        if not (isinstance(x, dict) and set(x) == {"node", "aux", "children"}
                and isinstance(x["children"], list)):
            raise FormatError("malformed pytree node")
        if type(x["node"]) is str:
            cls = _BUILTIN_NODES.get(x["node"])
            if cls is None:
                raise FormatError(f"unknown pytree node {x['node'][:40]!r}")
        else:
            cls = _dec_library_ref(x["node"], dec)
        aux = dec.decode(x["aux"])
        if cls is dict:
            aux = list(aux) if isinstance(aux, tuple) else aux
        children = [node(c, depth + 1) for c in x["children"]]
        try:
            return jax.tree_util.PyTreeDef.from_node_data_and_children(
                jax.tree_util.default_registry, (cls, aux), children)
        except (TypeError, ValueError) as e:
            raise FormatError(f"invalid pytree node {getattr(cls, '__qualname__', cls)}: "
                              f"{e}") from None
    return node(v, 0)


def _dec_treedef(v, dec):
    return pytrees.decode_treedef(v)


def _enc_effect(value, enc):
    return effects.encode_effect(value, enc.where)


def _dec_effect(v, dec):
    return effects.decode_effect(v)


def _enc_aval(value, enc):
    return enc.avals.encode(value, enc.where)


def _dec_aval(v, dec):
    return dec.avals.decode(v)


def _enc_primitive(value, enc):
    problem = primitives.problem_with(value)
    if problem:
        raise SaveError(f"cannot save {enc.where}: {problem}")
    return value.name


def _dec_primitive(v, dec):
    prim = primitives.lookup(v) if type(v) is str else None
    if prim is None:
        raise FormatError(f"unknown primitive {str(v)[:60]!r}")
    return prim


def _remat_policies() -> dict[str, Any]:
    import jax
    table = {}
    for name in sorted(dir(jax.checkpoint_policies)):
        if not name.startswith("_"):
            table[name] = getattr(jax.checkpoint_policies, name)
    return table


_POLICIES = _remat_policies()
_POLICY_NAMES = {id(v): k for k, v in _POLICIES.items()}


def _enc_function(value, enc):
    name = _POLICY_NAMES.get(id(value))
    if name is not None and _POLICIES[name] is value:
        return {"$t": "checkpoint_policy", "v": name}
    try:  # a module-level function of a numerical library, by name
        return {"$t": "library_ref", "v": list(library_refs.reference(value))}
    except library_refs.NotReachable:
        if is_made_checkpoint_policy(value):
            raise SaveError(f"cannot save {enc.where}: the checkpoint policy "
                            f"{value.__qualname__} is a closure jax.checkpoint_policies made "
                            f"from other values (a combination or an offloading policy): "
                            f"code, not data; named policies and name lists are saved") from None
        raise SaveError(enc._cannot(value)) from None


def _enc_partial(value, enc):
    # functools.partial of a library function with data arguments (equinox passes
    # ``partial(while_loop, kind="lax")`` as a static field).
    return {"func": enc.encode(value.func), "args": enc.encode(tuple(value.args)),
            "keywords": enc.encode(dict(value.keywords))}


def _dec_partial(v, dec):
    if not (isinstance(v, dict) and set(v) == {"func", "args", "keywords"}):
        raise FormatError("malformed partial")
    func, args, keywords = dec.decode(v["func"]), dec.decode(v["args"]), dec.decode(v["keywords"])
    if not callable(func) or type(args) is not tuple or type(keywords) is not dict \
            or not all(type(k) is str for k in keywords):
        raise FormatError("malformed partial")
    return functools.partial(func, *args, **keywords)


def _enc_library_object(value, enc):
    """The default rule: an object of a numerical library, by name when it is reachable
    from a library module (identity kept), else as its class and fields."""
    try:
        return {"$t": "library_ref", "v": list(library_refs.reference(value))}
    except library_refs.NotReachable as e:
        reason = str(e)
    state = library_refs.instance_state(value)
    if state is None:
        raise SaveError(enc._cannot(value))
    try:
        cls = library_refs.reference(type(value))
    except library_refs.NotReachable:
        raise SaveError(f"cannot save {enc.where}: {reason}; its class is not reachable "
                        f"by name either") from None
    return {"$t": "library_instance",
            "v": {"class": list(cls), "state": [[k, enc.encode(x)] for k, x in state.items()]}}


def _enc_sentinel(value, enc):
    """One of JAX's markers by name, else a library's (equinox's), as any library object."""
    name = jax_sentinel_name(value)
    if name is None:
        return _enc_library_object(value, enc)
    return {"$t": "jax_sentinel", "v": name}


def _dec_sentinel(v, dec):
    if v not in JAX_SENTINELS:
        raise FormatError(f"unknown JAX marker {str(v)[:60]!r} (known: {', '.join(JAX_SENTINELS)})")
    return JAX_SENTINELS[v][2]


def _dec_library_ref(v, dec):
    if not (isinstance(v, list) and len(v) in (2, 3) and all(type(x) is str for x in v)):
        raise FormatError("malformed library reference")
    try:
        return library_refs.resolve_reference(v)
    except library_refs.NotReachable as e:
        raise FormatError(f"library object {v[0][:60]}.{v[1][:60]}: {e}") from None


def _dec_library_instance(v, dec):
    if not (isinstance(v, dict) and set(v) == {"class", "state"} and isinstance(v["state"], list)):
        raise FormatError("malformed library instance")
    cls = _dec_library_ref(v["class"], dec)
    if not isinstance(cls, type):
        raise FormatError(f"{v['class'][1][:60]} is not a class")
    state = {}
    for item in v["state"]:
        if not (isinstance(item, list) and len(item) == 2 and type(item[0]) is str):
            raise FormatError("malformed library instance field")
        state[item[0]] = dec.decode(item[1])
    try:
        return library_refs.rebuild_instance(cls, state)
    except (TypeError, AttributeError) as e:
        raise FormatError(f"cannot rebuild {cls.__qualname__}: {e}") from None


def _enc_shape_dtype_struct(value, enc):
    if getattr(value, "sharding", None) is not None:
        raise SaveError(f"cannot save {enc.where}: a ShapeDtypeStruct with a sharding")
    return {"shape": enc.encode(tuple(value.shape)), "dtype": _enc_dtype(value.dtype, enc),
            "weak_type": bool(value.weak_type)}


def _dec_shape_dtype_struct(v, dec):
    import jax
    if not (isinstance(v, dict) and set(v) == {"shape", "dtype", "weak_type"}):
        raise FormatError("malformed ShapeDtypeStruct")
    shape = dec.decode(v["shape"])
    if type(shape) is not tuple or not all(type(d) is int and d >= 0 for d in shape) \
            or type(v["weak_type"]) is not bool:
        raise FormatError("malformed ShapeDtypeStruct")
    return jax.ShapeDtypeStruct(shape, dtypes.dtype_from_name(v["dtype"]),
                                weak_type=v["weak_type"])


def _dec_function(v, dec):
    if type(v) is str and v in _POLICIES and isinstance(_POLICIES[v], types.FunctionType):
        return _POLICIES[v]
    raise FormatError(f"unknown checkpoint policy {str(v)[:40]!r}")


def _enc_prng_impl(value, enc):
    # A PRNG implementation is saved by its registered name (``threefry2x32``,
    # ``rbg``...), the name jax.random.key(..., impl=name) takes.
    if prng_impl_by_name(value.name) is not value:
        raise SaveError(f"cannot save {enc.where}: PRNG implementation {value.name!r} is not "
                        f"registered with JAX under that name (register it with "
                        f"jax.extend.random.define_prng_impl before saving)")
    return value.name


def _dec_prng_impl(v, dec):
    impl = prng_impl_by_name(v) if type(v) is str else None
    if impl is None:
        raise FormatError(f"unknown PRNG implementation {str(v)[:40]!r}")
    return impl


def _singleton(obj):
    def decode(v, dec):
        if v is not None:
            raise FormatError("malformed singleton")
        return obj
    return (lambda value, enc: None), decode


def _wrap(encode, decode):
    """Adapt ``shardings``' (value, where) encoders and (payload) decoders."""
    return (lambda value, enc: encode(value, enc.where)), (lambda v, dec: decode(v))


def _build_table() -> None:
    import jax

    # JSON's own values stand for themselves (no tag); a JSON array is a tuple.
    param_types.extend((type(None), str, bool, int), encode=_enc_json)
    param_types.extend(float, encode=_enc_float)  # non-finite floats are tagged "float"
    param_types.extend(tuple, encode=lambda v, e: [e.encode(x) for x in v])
    register((), "float", None, _dec_float)
    param_types.extend(complex, cannot_save="complex parameters have no encoding in the format "
                                            "(no JAX primitive holds one)")
    param_types.extend(param_types.NAMEDTUPLE,
                       cannot_save="a named tuple JAX does not define (its class is code)")
    param_types.extend(enum.Enum, cannot_save="an enum JAX does not define as a parameter type")
    param_types.extend(param_types.DTYPE_LIKE, cannot_save="a dtype-like object that is not "
                                                           "one of JAX's dtypes")
    register(param_types.SENTINEL, None, _enc_sentinel, None)
    register((), "jax_sentinel", None, _dec_sentinel)
    register(list, "list", lambda v, e: [e.encode(x) for x in v],
             lambda v, d: [d.decode(x) for x in _list_payload(v, "list")])
    register(dict, "dict", _enc_dict, _dec_dict)
    register(frozenset, "frozenset", _enc_set, _dec_set(frozenset))
    register(set, "set", _enc_set, _dec_set(set))
    register(np.dtype, "dtype", _enc_dtype, _dec_dtype)
    register(ExtendedDType, "extended_dtype", _enc_dtype, _dec_dtype)
    register(type, None, _enc_type, None)
    register((), "scalar_type", None, _dec_type)
    register((), "library_ref", None, _dec_library_ref)
    register((), "library_instance", None, _dec_library_instance)
    register(param_types.DEFAULT, None, _enc_library_object, None)
    register(jax.ShapeDtypeStruct, "ShapeDtypeStruct", _enc_shape_dtype_struct,
             _dec_shape_dtype_struct)
    register(functools.partial, "partial", _enc_partial, _dec_partial)
    register(np.generic, "numpy_scalar", _enc_np_scalar, _dec_np_scalar)
    register((TypedInt, TypedFloat, TypedComplex), "typed_scalar", _enc_typed_scalar,
             _dec_typed_scalar)
    register((np.ndarray, jax.Array), "array", _enc_array, _dec_array)
    register(tuple(_ENUM_NAMES), "enum", _enc_enum, _dec_enum)
    held = hashable_array_type()
    register(held, "hashable_array", lambda v, e: _enc_array(v.val, e),
             lambda v, d: held(_dec_array(v, d)))
    for cls in (jax.lax.GatherDimensionNumbers, jax.lax.ScatterDimensionNumbers,
                jax.lax.ConvDimensionNumbers, jax.lax.DotAlgorithm):
        register(cls, cls.__name__, *_record(cls, tuple(cls._fields), positional=True))
    register(jax.lax.RaggedDotDimensionNumbers, "RaggedDotDimensionNumbers",
             *_record(jax.lax.RaggedDotDimensionNumbers,
                      ("dot_dimension_numbers", "lhs_ragged_dimensions", "rhs_group_dimensions"),
                      positional=False))
    solve = linear_solve_tuple_type()
    register(solve, "LinearSolveTuple", *_record(solve, tuple(solve._fields), positional=True))
    register(prng_impl_type(), "prng_impl", _enc_prng_impl, _dec_prng_impl)
    register(jax.lax.Tolerance, "Tolerance",
             *_record(jax.lax.Tolerance, ("atol", "rtol", "ulps"), positional=False))
    dots = dots_saveable_type()
    register(dots, "DotsSaveable",
             *_record(dots, tuple(f.name for f in dataclasses.fields(dots)), positional=False))
    for cls, (_, field) in named_policy_types().items():
        register(cls, cls.__name__, *_named_policy(cls, field))
    register(Region, "region", _enc_region, _dec_region)
    register(Jaxpr, "jaxpr", _enc_jaxpr, _dec_jaxpr(closed=False))
    register(ClosedJaxpr, "closed_jaxpr", _enc_jaxpr, _dec_jaxpr(closed=True))
    register(type(jax.tree_util.tree_structure(0)), None, _enc_treedef, None)
    register((), "treedef", None, _dec_treedef)
    register((), "treedef_nodes", None, _dec_treedef_nodes)
    register(Effect, "effect", _enc_effect, _dec_effect)
    register((ShapedArray, AbstractToken), "aval", _enc_aval, _dec_aval)
    register(Primitive, "primitive", _enc_primitive, _dec_primitive)
    register(types.FunctionType, None, _enc_function, None)
    register((), "checkpoint_policy", None, _dec_function)
    param_types.extend((types.FunctionType, types.MethodType, types.BuiltinFunctionType),
                       cannot_save="a Python callable is code, not data (only JAX's named "
                                   "checkpoint policies are saved, by name)")
    param_types.extend(WrappedFun, cannot_save="a custom rule JAX staged is code: run the "
                                               "closure-convert pass to make it first-order")
    register(jax.sharding.Mesh, "mesh", *_wrap(shardings.encode_mesh, shardings.decode_mesh))
    register(jax.sharding.AbstractMesh, "abstract_mesh",
             *_wrap(shardings.encode_abstract_mesh, shardings.decode_abstract_mesh))
    register(jax.sharding.NamedSharding, "named_sharding",
             *_wrap(shardings.encode_named_sharding, shardings.decode_named_sharding))
    register(jax.sharding.SingleDeviceSharding, "single_device_sharding",
             *_wrap(shardings.encode_single_device_sharding,
                    shardings.decode_single_device_sharding))
    register(jax.sharding.PartitionSpec, "pspec",
             *_wrap(shardings.encode_pspec, shardings.decode_pspec))
    register(jax.Device, "device",
             *_wrap(shardings.encode_device, shardings.decode_device))
    register(UnspecifiedValue, "unspecified", *_singleton(UNSPECIFIED))
    unconstrained = jax.sharding.PartitionSpec.UNCONSTRAINED
    register(type(unconstrained), "unconstrained", *_singleton(unconstrained))


_build_table()
