"""Primitives by name: the registry a saved program's ``"op"`` fields are looked up in.

Built from JAX's own primitives (``jax_adapter.primitives_registry``, which imports
a fixed list of JAX modules and collects the ``Primitive`` objects they define) plus
primitives jaxpr-cc itself defines.  Names read from a file are only ever used as
dictionary keys here: nothing named in a file is imported.

Saving checks that each equation's primitive is the very object this registry
returns for its name, so a program that uses a primitive a fresh process could not
find (or one whose name two primitives share) is refused at save time.
"""
from __future__ import annotations

import threading

from ..ir import library_refs
from ..jax_adapter import PRIMITIVE_MODULES_SECOND_TIER, Primitive, primitives_registry

# jaxpr-cc modules that define primitives of their own; they are imported (they are
# part of this package, never named by a file) before the registry is built.
EXTENSION_MODULES: tuple[str, ...] = ()

_lock = threading.Lock()
_registry: dict[str, list[Primitive]] | None = None
_extra: dict[str, Primitive] = {}
_second_tier_loaded = False
_library_tier_loaded = False


def register_primitive(prim: Primitive) -> None:
    """Make a primitive defined outside JAX's module namespaces loadable by name."""
    with _lock:
        existing = _extra.get(prim.name)
        if existing is not None and existing is not prim:
            raise ValueError(f"another primitive named {prim.name!r} is already registered")
        _extra[prim.name] = prim
        global _registry
        _registry = None


def _table() -> dict[str, list[Primitive]]:
    global _registry
    with _lock:
        if _registry is None:
            modules = EXTENSION_MODULES + (PRIMITIVE_MODULES_SECOND_TIER if _second_tier_loaded else ())
            table = primitives_registry(modules)
            if _library_tier_loaded:
                _add_library_primitives(table)
            for name, prim in _extra.items():
                found = table.setdefault(name, [])
                if not any(p is prim for p in found):
                    found.append(prim)
            _registry = table
        return _registry


def _add_library_primitives(table: dict[str, list[Primitive]]) -> None:
    """The primitives the numerical libraries (``ir.library_refs.LIBRARY_PACKAGES``:
    equinox, lineax...) define at module level, when they are installed."""
    import sys
    library_refs.import_primitive_modules()
    for modname, mod in sorted(sys.modules.items()):
        if mod is None or not library_refs.in_library(modname):
            continue
        for value in list(getattr(mod, "__dict__", {}).values()):
            if isinstance(value, Primitive):
                found = table.setdefault(value.name, [])
                if not any(p is value for p in found):
                    found.append(value)


def _find(name: str) -> list[Primitive] | None:
    """Primitives called ``name``; imports the heavier JAX modules (a fixed list), then
    the numerical libraries' primitive modules, the first time a name is not among
    the common ones."""
    global _registry, _second_tier_loaded, _library_tier_loaded
    found = _table().get(name)
    if found is None and not _second_tier_loaded:
        with _lock:
            _second_tier_loaded = True
            _registry = None
        found = _table().get(name)
    if found is None and not _library_tier_loaded:
        with _lock:
            _library_tier_loaded = True
            _registry = None
        found = _table().get(name)
    return found


def lookup(name: str) -> Primitive | None:
    """The primitive called ``name``, or None if there is none (or it is ambiguous)."""
    found = _find(name)
    if found is None or len(found) != 1:
        return None
    return found[0]


def problem_with(prim: Primitive) -> str | None:
    """Why ``prim`` could not be loaded back by name, or None if it can."""
    found = _find(prim.name)
    if not found:
        return (f"primitive {prim.name!r} is not one of JAX's registered primitives nor one "
                f"that {', '.join(library_refs.LIBRARY_PACKAGES)} define, so a "
                f"saved program could not be read back (register it with "
                f"jaxpr_cc.io.primitives.register_primitive)")
    if len(found) > 1:
        return f"primitive name {prim.name!r} is shared by {len(found)} different primitives"
    if found[0] is not prim:
        return (f"primitive {prim.name!r} is a different object from JAX's primitive of that "
                f"name")
    return None
