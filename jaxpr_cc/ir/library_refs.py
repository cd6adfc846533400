"""Objects of the JAX ecosystem's numerical libraries, named by module and attribute.

Library primitives (lineax's ``linear_solve``, equinox's ``unvmap_any``...) carry
parameters that are library objects: module-level sentinels (equinox's ``MISSING``),
functions (``lineax.max_norm``), classes (an ``eqx.Enumeration``), solver and
operator instances, and the primitive objects themselves.  Such an object is
reconstructible when it is reachable by name from a module of one of
:data:`LIBRARY_PACKAGES` (identity preserved: a sentinel reads back as the very
sentinel), or when it is an instance of a class of those packages whose state is
plain data (its ``__dict__`` / ``__slots__`` fields).

Only modules of these packages are ever imported by name (a name read from a file
outside them is refused), so loading a program never runs code the program names
outside the libraries it was traced with.
"""
from __future__ import annotations

import importlib
import sys
import threading
from typing import Any

# Packages whose objects may be named in saved programs and emitted modules.
LIBRARY_PACKAGES = ("equinox", "lineax", "optimistix", "diffrax")
# Modules that define the libraries' primitives, imported (when installed) before a
# primitive name is looked up among them.
PRIMITIVE_MODULES = ("equinox.internal", "lineax", "lineax.internal")

_lock = threading.Lock()
_index: dict[int, tuple[str, str]] | None = None  # id(object) -> (module, attribute)
# id(class) -> (module, attribute) of a module-level instance: classes made at run
# time (equinox's ``str2jax`` tokens) are reachable only as the type of their instance.
_type_index: dict[int, tuple[str, str]] = {}
_indexed_modules = 0


class NotReachable(LookupError):
    """An object is not reachable by name from a library module."""


def in_library(module_name: str) -> bool:
    return type(module_name) is str and module_name.split(".")[0] in LIBRARY_PACKAGES


def _library_modules() -> list[tuple[str, Any]]:
    return [(name, mod) for name, mod in sorted(sys.modules.items())
            if mod is not None and in_library(name)]


def reference(obj: Any) -> tuple[str, ...]:
    """``(module, qualname)`` naming ``obj`` in a library module, identity checked; a
    class reachable only as the type of a module-level instance is
    ``(module, attribute, "type")``."""
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str) and in_library(module) \
            and "<" not in qualname:
        try:
            if resolve(module, qualname) is obj:
                return module, qualname
        except NotReachable:
            pass
    found = _lookup_index(obj)
    if found is None and isinstance(obj, type):
        with _lock:
            by_type = _type_index.get(id(obj))
        if by_type is not None and type(resolve(*by_type)) is obj:
            return (*by_type, "type")
    if found is None:
        raise NotReachable(f"{type(obj).__module__}.{type(obj).__qualname__} object is not "
                           f"reachable by name from a module of {', '.join(LIBRARY_PACKAGES)}")
    return found


def _lookup_index(obj: Any) -> tuple[str, str] | None:
    """Module-level attributes by identity (sentinels have no name of their own); the
    index is rebuilt when more library modules have been imported since."""
    global _index, _indexed_modules
    with _lock:
        modules = _library_modules()
        if _index is None or len(modules) != _indexed_modules:
            index: dict[int, tuple[str, str]] = {}
            _type_index.clear()
            for name, mod in modules:
                for attr, value in list(getattr(mod, "__dict__", {}).items()):
                    if not attr.startswith("__"):
                        index.setdefault(id(value), (name, attr))
                        _type_index.setdefault(id(type(value)), (name, attr))
            _index, _indexed_modules = index, len(modules)
        found = _index.get(id(obj))
    if found is not None and resolve(*found) is obj:
        return found
    return None


def resolve(module: str, qualname: str) -> Any:
    """The object ``module``.``qualname``; imports ``module`` only inside the libraries."""
    if not in_library(module) or type(qualname) is not str or not qualname:
        raise NotReachable(f"{str(module)[:80]!r} is not a module of "
                           f"{', '.join(LIBRARY_PACKAGES)}")
    try:
        target = sys.modules.get(module) or importlib.import_module(module)
    except ImportError as e:
        raise NotReachable(f"cannot import {module!r} ({e})") from None
    for part in qualname.split("."):
        if part.startswith("__") or not hasattr(target, part):
            raise NotReachable(f"{module}.{qualname[:80]} does not exist")
        target = getattr(target, part)
    return target


def resolve_reference(ref: Any) -> Any:
    """The object a :func:`reference` names."""
    if isinstance(ref, (list, tuple)) and len(ref) == 3 and ref[2] == "type":
        return type(resolve(ref[0], ref[1]))
    if isinstance(ref, (list, tuple)) and len(ref) == 2:
        return resolve(ref[0], ref[1])
    raise NotReachable("malformed library reference")


def import_primitive_modules() -> None:
    """Import the libraries' primitive-defining modules that are installed."""
    for name in PRIMITIVE_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            continue


def instance_state(obj: Any) -> dict[str, Any] | None:
    """The fields of a library-class instance (``__dict__`` and set ``__slots__``), or
    None if its class is not a library class."""
    cls = type(obj)
    if not in_library(cls.__module__) or "<" in cls.__qualname__:
        return None
    state: dict[str, Any] = {}
    for klass in cls.__mro__:
        for slot in getattr(klass, "__slots__", ()):
            if slot in ("__dict__", "__weakref__") or slot in state:
                continue
            if hasattr(obj, slot):
                state[slot] = getattr(obj, slot)
    state.update(getattr(obj, "__dict__", {}))
    return state


def rebuild_instance(cls: type, state: dict[str, Any]) -> Any:
    """An instance of ``cls`` with ``state``, made without running ``__init__`` (as
    pickle and ``tree_unflatten`` do)."""
    obj = cls.__new__(cls)
    for name, value in state.items():
        object.__setattr__(obj, name, value)
    return obj
