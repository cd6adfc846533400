"""One registry of equation-parameter types: how each prints, saves, loads, is spelled
as Python source, and is keyed for CSE.

The table is keyed by the parameter's Python type.  Each entry (:class:`ParamType`)
owns four aspects, every one a function ``aspect(value, context)`` whose context is
the caller's recursion object:

* ``print(value, fmt)`` -> text; ``fmt(x)`` prints a nested value (``ir.printer``);
* ``encode(value, enc)`` -> JSON payload under the entry's ``tag``, and
  ``decode(payload, dec)`` -> value (``io.param_codecs``);
* ``spell(value, sp)`` -> Python source; ``sp.spell(x)`` spells a nested value and
  ``sp.dtype_objects`` asks for ``np.dtype(...)`` objects (``backends.python_spelling``);
* ``key(value, keys)`` -> a hashable key equal only for interchangeable values;
  ``keys.value(x)``, ``keys.array(x)`` and ``keys.region(r)`` key nested values
  (``ir.structural_key``).

This module defines the entries with their printing and keying (both need only the
IR); the file format and the Python backend add their aspects to the same entries
(:func:`extend`), since the core IR imports nothing above it.  A missing ``encode``
means "cannot be saved" and a missing ``spell`` "has no Python spelling";
``cannot_save`` / ``cannot_spell`` say why, for the error message.

A value's entry is found by :func:`entry_for`: its exact type; else, for a bare
``object()``, the sentinel entry; for an enum, the enum entry (before ``int``:
``IntEnum`` parameters are enums); for an unregistered namedtuple, the namedtuple
entry; else the nearest registered base class (MRO); else,
for a dtype-like object, the extended-dtype entry; else the default entry (printed
by ``repr`` without memory addresses, keyed by value when hashable and not callable,
otherwise by identity).
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import re
import types
from typing import Any, Callable

import numpy as np

from .arrays import array_digest, identity_only, to_numpy
from .region import Region

SMALL_ARRAY = 8  # arrays with at most this many elements are printed in full
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+|0x[0-9a-fA-F]{6,}")


@dataclasses.dataclass
class ParamType:
    """The four aspects of one parameter type (see the module docstring).  An aspect
    left None is inherited from ``parent`` (the entry the type resolved to before it
    got an entry of its own), so aspects added to a base later reach its subtypes."""
    name: str
    print: Callable[[Any, Callable[[Any], str]], str] | None = None
    key: Callable[[Any, Any], Any] | None = None
    tag: str | None = None
    encode: Callable[[Any, Any], Any] | None = None
    spell: Callable[[Any, Any], str] | None = None
    cannot_save: str | None = None   # why, when there is no ``encode``
    cannot_spell: str | None = None  # why, when there is no ``spell``
    parent: "ParamType | None" = None

    def merged(self) -> "ParamType":
        if self.parent is None:
            return self
        base = self.parent.merged()
        own = {a: getattr(self, a) for a in _ASPECTS}
        if own["encode"] is not None or own["cannot_save"]:  # own codec or own refusal
            own["tag"] = self.tag if self.tag is not None else _REFUSED
            own["encode"] = self.encode or _REFUSED
        if own["cannot_spell"] and own["spell"] is None:
            own["spell"] = _REFUSED
        merged = {a: v if v is not None else getattr(base, a) for a, v in own.items()}
        return ParamType(self.name, **{a: None if v is _REFUSED else v
                                       for a, v in merged.items()})

    def missing(self) -> list[str]:
        """Aspects neither provided nor refused with a reason."""
        out = [a for a in ("print", "key") if getattr(self, a) is None]
        if self.encode is None and not self.cannot_save:
            out.append("save")
        if self.spell is None and not self.cannot_spell:
            out.append("spell")
        return out


_REFUSED = object()  # an aspect a type refuses (not inherited from its parent)
_ASPECTS = ("print", "key", "tag", "encode", "spell", "cannot_save", "cannot_spell")
_TABLE: dict[type, ParamType] = {}
_DECODERS: dict[str, Callable[[Any, Any], Any]] = {}
# Pseudo-types for the rules that are not one Python class.
NAMEDTUPLE = type("namedtuple", (), {})  # a tuple subclass with ``_fields``
DEFAULT = type("default", (), {})        # anything else


def define(types_: type | tuple[type, ...], name: str, *, print, key, **aspects) -> None:
    """Register the entry of ``types_`` (one entry per type, each its own object, so a
    layer extending one type never changes another)."""
    for t in (types_ if isinstance(types_, tuple) else (types_,)):
        if t in _TABLE:
            raise ValueError(f"parameter type {t!r} is registered twice")
        _TABLE[t] = ParamType(name, print, key, **aspects)
    _resolve.cache_clear()


def extend(types_: type | tuple[type, ...], **aspects) -> None:
    """Add aspects (``tag``/``encode``, ``spell``, ``cannot_*``) to the entries of
    ``types_``; a type with no entry of its own gets one whose other aspects are
    inherited from the entry it resolves to now."""
    for t in (types_ if isinstance(types_, tuple) else (types_,)):
        entry = _TABLE.get(t)
        if entry is None:
            parent = _own_entry(t)
            entry = _TABLE[t] = ParamType(t.__qualname__, parent=parent)
        for aspect, value in aspects.items():
            if getattr(entry, aspect) is not None and not aspect.startswith("cannot_"):
                raise ValueError(f"parameter type {t!r} already has a {aspect} aspect")
            setattr(entry, aspect, value)
        _resolve.cache_clear()


def add_decoder(tag: str, decode: Callable[[Any, Any], Any]) -> None:
    """The decoder of the payloads saved under ``tag``."""
    if tag in _DECODERS:
        raise ValueError(f"parameter codec tag {tag!r} is registered twice")
    _DECODERS[tag] = decode


def decoder(tag: str) -> Callable[[Any, Any], Any] | None:
    return _DECODERS.get(tag)


def entries() -> dict[type, ParamType]:
    """Every registered entry by type (pseudo-types included), aspects inherited, for
    enumeration tests."""
    return {t: e.merged() for t, e in _TABLE.items()}


def entry_for(value: Any) -> ParamType:
    return _resolve(type(value))


@functools.lru_cache(maxsize=None)
def _resolve(t: type) -> ParamType:
    return _own_entry(t).merged()


def _own_entry(t: type) -> ParamType:
    hit = _TABLE.get(t)
    if hit is not None:
        return hit
    if t is object:
        return _TABLE[SENTINEL]
    if issubclass(t, enum.Enum):
        return _TABLE[enum.Enum]
    if issubclass(t, tuple) and hasattr(t, "_fields"):
        return _TABLE[NAMEDTUPLE]
    for base in t.__mro__[1:]:
        hit = _TABLE.get(base)
        if hit is not None:
            return hit
    if hasattr(t, "dtype") and t.__name__.endswith("DType"):
        return _TABLE[DTYPE_LIKE]
    return _TABLE[DEFAULT]


# ------------------------------------------------------------------ printing helpers
def format_scalar(val: Any) -> str:
    a = np.asarray(val)
    if a.shape == ():
        return repr(a.item())
    return format_array(val)


def format_array(x: Any) -> str:
    if identity_only(x):  # a value of an enclosing trace: its type only
        return f"traced<{dtype_short_name(x.dtype)}[{','.join(map(str, x.shape))}]>"
    a = to_numpy(x)
    dtype = getattr(x, "dtype", a.dtype)
    head = f"{dtype_short_name(dtype)}[{','.join(map(str, a.shape))}]"
    if a.size <= SMALL_ARRAY:
        return f"array<{head}: {np.array2string(a.reshape(-1), separator=', ', threshold=SMALL_ARRAY)}>"
    return f"array<{head} sha256:{array_digest(x)}>"


def dtype_short_name(dtype) -> str:
    try:
        from ..jax_adapter import ShapedArray
        return ShapedArray((), dtype).str_short(short_dtypes=True).split("[")[0]
    except Exception:
        return str(dtype)


def print_default(value: Any, fmt=None) -> str:
    """``repr`` with memory addresses removed and whitespace collapsed (so two processes
    print byte-identical text)."""
    return " ".join(_ADDRESS.sub("", repr(value)).split())


def _print_repr(value, fmt) -> str:
    return repr(value)


def _print_callable(f: Any, fmt) -> str:
    inner = getattr(f, "f", None)  # lu.WrappedFun wraps the user's function
    target = inner if inner is not None else f
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) \
        or type(target).__name__
    return f"<fn {name}>"


def _print_enum(value: enum.Enum, fmt) -> str:
    # An enum that is also a Python scalar (IntEnum, StrEnum) prints by its repr: the
    # printed form the goldens were written with.
    if isinstance(value, (bool, int, float, str)):
        return repr(value)
    return f"{type(value).__name__}.{value.name}"


def _print_namedtuple(value, fmt) -> str:
    inner = ", ".join(f"{f}={fmt(getattr(value, f))}" for f in value._fields)
    return f"{type(value).__name__}({inner})"


def _print_tuple(value, fmt) -> str:
    inner = ", ".join(fmt(v) for v in value)
    return f"({inner}{',' if len(value) == 1 else ''})"


def _print_list(value, fmt) -> str:
    return "[" + ", ".join(fmt(v) for v in value) + "]"


def _print_dict(value, fmt) -> str:
    return "{" + ", ".join(f"{fmt(k)}: {fmt(v)}"
                           for k, v in sorted(value.items(), key=lambda kv: repr(kv[0]))) + "}"


def _print_set(value, fmt) -> str:
    # Set iteration order follows string hashes, which vary with PYTHONHASHSEED.
    inner = ", ".join(sorted(fmt(v) for v in value))
    return f"{type(value).__name__}({{{inner}}})" if inner else f"{type(value).__name__}()"


def _print_class(value, fmt) -> str:
    if issubclass(value, np.generic):
        return dtype_short_name(np.dtype(value))
    return print_default(value)


def _print_dtype_like(value, fmt) -> str:
    if hasattr(value, "dtype") and type(value).__name__.endswith("DType"):
        return dtype_short_name(value)
    return print_default(value)


# ------------------------------------------------------------------- keying helpers
class _Identity:
    """Wraps an object so that it equals only itself (and hashes by identity)."""
    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __eq__(self, other):
        return type(other) is _Identity and other.obj is self.obj

    def __hash__(self):
        return id(self.obj)


def key_default(v, keys) -> Any:
    """Callables and unhashable objects have no trustworthy equality: identity."""
    if callable(v) and not isinstance(v, type):
        return _Identity(v)
    try:
        hash(v)
    except TypeError:
        return _Identity(v)
    return (type(v), v)


def identity_key(v) -> "_Identity":
    """A key equal only to the key of this very object."""
    return _Identity(v)


def _key_identity(v, keys):
    return _Identity(v)


def _key_typed(v, keys):
    return (type(v), v)


def _key_sequence(v, keys):
    return (type(v).__name__, tuple(keys.value(x) for x in v))


def _key_namedtuple(v, keys):
    return (type(v), tuple(keys.value(x) for x in v))


def _key_record(fields: tuple[str, ...]):
    """Records JAX compares by identity (a policy object, a tolerance): by their fields."""
    def key(v, keys):
        return (type(v), tuple(keys.value(getattr(v, f)) for f in fields))
    return key


def _print_named_policy(factory: str, field: str):
    def print_policy(v, fmt):
        return f"{factory}({', '.join(repr(n) for n in sorted(getattr(v, field)))})"
    return print_policy


def _key_named_policy(field: str):
    def key(v, keys):
        return (type(v), tuple(sorted(getattr(v, field))))
    return key


def _key_dict(v, keys):
    return ("dict", tuple(sorted(((repr(k), keys.value(x)) for k, x in v.items()),
                                 key=lambda kv: kv[0])))


def _key_array(v, keys):
    return keys.array(v)


def _key_region(v, keys):
    return keys.region(v)


# Pseudo-type of objects that act as dtypes by name (JAX's extended dtypes).
DTYPE_LIKE = type("dtype_like", (), {})
# Pseudo-type of bare ``object()`` instances: markers compared by identity (JAX's
# ``no_axis_name``, see ``jax_adapter.JAX_SENTINELS``; else a library's, handled as
# the default entry handles library objects).
SENTINEL = type("sentinel", (), {})


def _print_sentinel(value, fmt) -> str:
    from ..jax_adapter import jax_sentinel_name
    name = jax_sentinel_name(value)
    return print_default(value) if name is None else f"<{name}>"


def _build() -> None:
    import jax

    from ..jax_adapter import (ExtendedDType, TypedComplex, TypedFloat, TypedInt, WrappedFun,
                               dots_saveable_type, named_policy_types)
    define(DEFAULT, "default", print=print_default, key=key_default)
    define(type(None), "None", print=_print_repr, key=lambda v, k: v)
    define(str, "str", print=_print_repr, key=lambda v, k: v)
    define(bool, "bool", print=_print_repr, key=lambda v, k: ("b", v))
    define(int, "int", print=_print_repr, key=lambda v, k: ("i", v))
    define(float, "float", print=_print_repr, key=lambda v, k: ("f", v.hex()))
    define(complex, "complex", print=print_default,
           key=lambda v, k: ("c", v.real.hex(), v.imag.hex()))
    define((TypedInt, TypedFloat, TypedComplex), "typed scalar", print=_print_repr, key=_key_typed)
    define(tuple, "tuple", print=_print_tuple, key=_key_sequence)
    define(list, "list", print=_print_list, key=_key_sequence)
    define(NAMEDTUPLE, "namedtuple", print=_print_namedtuple, key=_key_namedtuple)
    define(dict, "dict", print=_print_dict, key=_key_dict)
    define((set, frozenset), "set", print=_print_set, key=key_default)
    define((np.ndarray, jax.Array), "array", print=lambda v, f: format_array(v), key=_key_array)
    define(np.generic, "numpy scalar", print=lambda v, f: format_scalar(v), key=_key_array)
    define(np.dtype, "dtype", print=lambda v, f: dtype_short_name(v), key=_key_typed)
    define((ExtendedDType, DTYPE_LIKE), "extended dtype", print=_print_dtype_like,
           key=key_default)
    define(type, "class", print=_print_class, key=key_default)
    define(SENTINEL, "sentinel", print=_print_sentinel, key=_key_identity)
    define(enum.Enum, "enum", print=_print_enum, key=_key_typed)
    define(Region, "region", print=print_default, key=_key_region)
    dots = dots_saveable_type()
    define(dots, "DotsSaveable", print=print_default,
           key=_key_record(tuple(f.name for f in dataclasses.fields(dots))))
    define(jax.lax.Tolerance, "Tolerance", print=print_default,
           key=_key_record(("atol", "rtol", "ulps")))
    for cls, (factory, field) in named_policy_types().items():
        define(cls, cls.__name__, print=_print_named_policy(factory, field),
               key=_key_named_policy(field))
    define((types.FunctionType, types.MethodType, types.BuiltinFunctionType, functools.partial,
            WrappedFun), "python callable", print=_print_callable, key=_key_identity)


_build()


def is_python_callable(value: Any) -> bool:
    """Python functions and JAX's wrappers of them (custom rules, thunks)."""
    return entry_for(value).name == "python callable"

