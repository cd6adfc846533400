"""Effects (``jax._src.effects.Effect`` objects) as JSON, through a table.

JAX's singleton effects are written by name (``"debug"``, ``"ordered_io"``, ...);
``NamedAxisEffect(name)`` as ``{"named_axis": NAME}``; ``GenericEffect(prim)`` as
``{"generic": PRIMITIVE}``; effects on mutable-array inputs given by position as
``{"read": i}`` / ``{"write": i}`` / ``{"accum": i}``.  Other effects cannot be saved.
A set of effects is a list sorted by its JSON text.
"""
from __future__ import annotations

import json
from typing import Any

from ..jax_adapter import (GenericEffect, JaxprInputEffect, NamedAxisEffect, known_effects,
                           no_effects, ref_effect_types)
from . import primitives
from ..storage.errors import FormatError, SaveError

_BY_NAME = known_effects()
_NAMES = {id(e): name for name, e in _BY_NAME.items()}
_REF_TYPES = ref_effect_types()
_REF_NAMES = {cls: name for name, cls in _REF_TYPES.items()}


def encode_effect(effect: Any, where: str) -> Any:
    name = _NAMES.get(id(effect))
    if name is not None:
        return name
    if isinstance(effect, NamedAxisEffect):
        if type(effect.name) is not str:
            raise SaveError(f"{where}: named-axis effect with non-string axis {effect.name!r}")
        return {"named_axis": effect.name}
    if isinstance(effect, GenericEffect):
        problem = primitives.problem_with(effect.prim)
        if problem:
            raise SaveError(f"{where}: effect {effect}: {problem}")
        return {"generic": effect.prim.name}
    ref_name = _REF_NAMES.get(type(effect))
    if ref_name is not None:
        if type(effect.input) is int:
            return {ref_name: effect.input}
        raise SaveError(f"{where}: effect {effect} refers to a jaxpr variable; effects on "
                        f"mutable-array inputs cannot be saved")
    if isinstance(effect, JaxprInputEffect):
        raise SaveError(f"{where}: input effect {type(effect).__name__} cannot be saved")
    raise SaveError(f"{where}: effect {type(effect).__module__}.{type(effect).__qualname__} "
                    f"cannot be saved (no encoder for it)")


def decode_effect(obj: Any):
    if type(obj) is str:
        effect = _BY_NAME.get(obj)
        if effect is None:
            raise FormatError(f"unknown effect {obj[:60]!r}")
        return effect
    if isinstance(obj, dict) and len(obj) == 1:
        (key, value), = obj.items()
        if key == "named_axis" and type(value) is str:
            return NamedAxisEffect(value)
        if key == "generic" and type(value) is str:
            prim = primitives.lookup(value)
            if prim is None:
                raise FormatError(f"effect names unknown primitive {value[:60]!r}")
            return GenericEffect(prim)
        if key in _REF_TYPES and type(value) is int and value >= 0:
            return _REF_TYPES[key](value)
    raise FormatError(f"malformed effect {str(obj)[:60]}")


def encode_effects(effects, where: str) -> list:
    encoded = [encode_effect(e, where) for e in effects]
    return sorted(encoded, key=lambda e: json.dumps(e, sort_keys=True))


def decode_effects(obj: Any):
    if not obj:
        if obj != []:
            raise FormatError("effects must be a list")
        return no_effects
    if not isinstance(obj, list):
        raise FormatError("effects must be a list")
    out = frozenset(decode_effect(e) for e in obj)
    if len(out) != len(obj):
        raise FormatError("an effect is listed twice")
    return out
