"""What a Python rule can see: a hashable fingerprint of a function's reachable state.

A custom function's rules are traced once and reused for later calls only when
tracing them again would give the same jaxpr with the same closed-over values.
Python gives no such guarantee by function identity: a rule reads closure cells,
defaults, globals, bound ``self`` and partial arguments, and any of them can be
rebound between two calls (an Euler step whose vector field reads a time that
changes every step; a ``custom_jvp`` defined once and called again after the
variable it closes over was rebound).

``fingerprint(obj)`` walks everything a function can read: closure cells, defaults,
the globals its code (and nested code) names, ``functools.partial`` parts, bound
``self``, containers and plain objects' attributes.  Arrays, tracers and other
opaque objects are identified by ``id`` (the caller keeps them alive so ids are not
reused); immutable Python scalars and strings by value; numpy arrays by content,
since they are mutable and are captured by value when traced.  When the walk is
too large to be worth it, the answer is ``None``: the caller then never reuses.
"""
from __future__ import annotations

import array
import collections
import functools
import types
import warnings
from typing import Any

import numpy as np

_SCALARS = (bool, int, float, complex, str, bytes, type(None), type(Ellipsis))
MAX_NODES = 4000


class _TooBig(Exception):
    pass


class Fingerprinter:
    """One walk.  ``keepalive`` receives every object identified by ``id``."""

    def __init__(self, keepalive: list, max_nodes: int = MAX_NODES):
        self.keepalive = keepalive
        self.budget = max_nodes
        self.active: set[int] = set()
        self.done: dict[int, Any] = {}

    def __call__(self, obj) -> Any:
        self.budget -= 1
        if self.budget < 0:
            raise _TooBig
        if isinstance(obj, _SCALARS):
            return (type(obj), obj) if obj == obj else (type(obj), repr(obj))
        key = id(obj)
        if key in self.done:
            return self.done[key]
        if key in self.active:  # a cycle: the object's identity stands for it
            self.keepalive.append(obj)
            return ("cycle", key)
        self.active.add(key)
        try:
            out = self._walk(obj)
        finally:
            self.active.discard(key)
        self.done[key] = out
        return out

    def _opaque(self, obj) -> tuple:
        self.keepalive.append(obj)
        return ("id", type(obj), id(obj))

    def _walk(self, obj) -> Any:
        if isinstance(obj, np.ndarray):
            return ("np", obj.shape, obj.dtype.str, hash(obj.tobytes()))
        if isinstance(obj, np.generic):
            return ("np", obj.dtype.str, obj.item() if obj == obj else repr(obj))
        if isinstance(obj, types.ModuleType):
            return ("module", obj.__name__)
        if isinstance(obj, type):
            return ("class", self._opaque(obj), self._data_attributes(obj))
        if isinstance(obj, (tuple, list, collections.deque)):
            return (type(obj), tuple(self(x) for x in tuple(obj)))
        if isinstance(obj, array.array):
            return ("array", obj.typecode, obj.tobytes())
        if isinstance(obj, dict):
            # A snapshot: reading an attribute can import lazily and grow a dict.
            return (type(obj), tuple((self(k), self(v)) for k, v in list(obj.items())))
        if isinstance(obj, (set, frozenset)):
            return self._opaque(obj) if not all(isinstance(x, _SCALARS) for x in obj) else (
                type(obj), tuple(sorted(map(repr, obj))))
        if isinstance(obj, types.FunctionType):
            return self._function(obj)
        if isinstance(obj, types.MethodType):
            return ("method", self(obj.__func__), self(obj.__self__))
        if isinstance(obj, functools.partial):
            return ("partial", self(obj.func), self(obj.args), self(obj.keywords))
        if isinstance(obj, (types.BuiltinFunctionType, types.CodeType)):
            return self._opaque(obj)
        if _is_array_like(obj):
            return self._opaque(obj)
        attrs = getattr(obj, "__dict__", None)
        slots = tuple(n for c in type(obj).__mro__ for n in getattr(c, "__slots__", ())
                      if isinstance(n, str) and hasattr(obj, n))
        if isinstance(attrs, dict) or slots:
            self.keepalive.append(obj)
            return ("object", self(type(obj)), id(obj), self(attrs),
                    tuple((n, self(getattr(obj, n))) for n in slots))
        return self._opaque(obj)

    def _data_attributes(self, cls: type) -> tuple:
        """A class's data attributes (not its methods): rules read them as
        ``Cls.c`` or ``self.c``, and they can be rebound between calls."""
        out = []
        for c in cls.__mro__:
            if c is object or c.__module__ == "builtins":
                continue
            for name, value in list(vars(c).items()):
                if not name.startswith("__") and _is_data(value):
                    out.append((c.__qualname__, name, self(value)))
        return tuple(out)

    def _function(self, fn: types.FunctionType) -> tuple:
        self.keepalive.append(fn)
        cells = tuple(self(_cell_contents(c)) for c in (fn.__closure__ or ()))
        g = fn.__globals__
        code_names = _global_names(fn.__code__)
        names = tuple(n for n in sorted(code_names) if n in g)
        # A module a rule names (``config.dt``): the data attributes its code names.
        module_data = tuple(
            (n, a, self(value)) for n in names if isinstance(g[n], types.ModuleType)
            for a in sorted(code_names)
            if _is_data(value := _module_attribute(g[n], a)))
        return ("function", fn.__code__, cells, self(fn.__defaults__), self(fn.__kwdefaults__),
                tuple((n, self(g[n])) for n in names), module_data)


def _module_attribute(module: types.ModuleType, name: str):
    """``module.name`` or None; deprecated module attributes (numpy's ``np.str``) warn
    when read, and reading them here is not the user's doing."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return getattr(module, name, None)


def fingerprint(obj, keepalive: list, max_nodes: int = MAX_NODES):
    """A hashable fingerprint of ``obj`` and everything it can read, or None when the
    walk exceeds ``max_nodes`` or meets something unhashable."""
    try:
        out = Fingerprinter(keepalive, max_nodes)(obj)
        hash(out)
    except Exception:  # too large, unhashable, or reading an attribute failed
        return None
    return out


def _cell_contents(cell):
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell: a variable not yet assigned
        return ("empty-cell",)


@functools.lru_cache(maxsize=4096)
def _global_names(code: types.CodeType) -> frozenset:
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _global_names(c)
    return frozenset(names)


def _is_data(value) -> bool:
    """Plain data an attribute can hold (not functions, classes, modules or
    descriptors): what a rebinding between two calls can change."""
    return value is not None and not callable(value) and not isinstance(
        value, (types.ModuleType, staticmethod, classmethod, property))


def _is_array_like(obj) -> bool:
    return hasattr(obj, "__jax_array__") or (hasattr(obj, "aval") and hasattr(obj, "shape"))
