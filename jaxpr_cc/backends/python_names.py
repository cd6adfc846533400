"""Python identifiers for the values of an emitted module.

One ``ModuleNamer`` hands out every name of a module, so a name means one thing
everywhere in the file: nested functions never shadow the variables they close
over, and helper names (``jax``, ``lax``, ``_bind``...) are never reused.
"""
from __future__ import annotations

import builtins
import keyword
import re

# Names the emitted module binds at top level (imports and helpers).
MODULE_RESERVED = frozenset({
    "jax", "jnp", "lax", "np", "P", "_CONSTS", "_bind", "_primitive", "_mesh", "_device",
    "_import_callable", "_SIDECAR", "_HERE", "os", "sys", "collections", "importlib",
})

_NOT_IDENT = re.compile(r"[^0-9A-Za-z_]+")


def to_identifier(hint: str | None, default: str = "v") -> str:
    """``params.w_in`` -> ``params_w_in``; ``xs.0`` -> ``xs_0``; ``scatter-add`` ->
    ``scatter_add``.  Never a keyword, never starts with a digit."""
    if not hint:
        return default
    name = _NOT_IDENT.sub("_", hint)
    if not name.strip("_"):
        return default
    if name[0].isdigit():
        name = f"{default}_{name}"
    if keyword.iskeyword(name) or keyword.issoftkeyword(name):
        name = name + "_"
    return name


class ModuleNamer:
    """Unique identifiers across one emitted module, allocated in emission order
    (so the same program always gets the same names)."""

    def __init__(self, reserved=()):
        self.taken: set[str] = set(MODULE_RESERVED) | set(reserved) | set(dir(builtins))
        self.counts: dict[str, int] = {}

    def fresh(self, hint: str | None, default: str = "v") -> str:
        base = to_identifier(hint, default)
        # A dunder name means something to Python (a module's ``__dict__``, its
        # ``__getattr__``): never handed out as it is.
        if base not in self.taken and not (base.startswith("__") and base.endswith("__")):
            self.taken.add(base)
            return base
        n = self.counts.get(base, 0)
        while True:
            n += 1
            name = f"{base}_{n}"
            if name not in self.taken:
                self.counts[base] = n
                self.taken.add(name)
                return name

    def claim(self, name: str) -> bool:
        """Take ``name`` exactly if it is free; report whether it was."""
        if name in self.taken or not name.isidentifier() or keyword.iskeyword(name):
            return False
        self.taken.add(name)
        return True
