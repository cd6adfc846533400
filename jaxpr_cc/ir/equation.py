"""Equations: one primitive application, the nodes of a region's graph."""
from __future__ import annotations

import weakref
from typing import Any, Iterator

from .value import Atom, Value

# The Region class, set by region.py when it is imported (region.py imports this
# module, so a module-level import here would be circular; a function-level import
# would run on every call of the hot ``regions()`` below).
Region: type = type(None)


class Equation:
    """``outputs = prim[params](*inputs)``.

    Parameters that held sub-jaxprs hold :class:`Region` objects instead (directly, or
    inside tuples, as ``cond``'s ``branches`` do); everything else is kept as JAX gave
    it.  Identity is object identity: two equations with equal fields are distinct
    nodes.
    """

    __slots__ = ("prim", "inputs", "outputs", "params", "effects", "source_info", "ctx",
                 "_region_ref", "__weakref__")

    def __init__(self, prim, inputs: list[Atom], outputs: list[Value], params: dict,
                 effects=frozenset(), source_info=None, ctx=None):
        self.prim = prim
        self.inputs = inputs
        self.outputs = outputs
        self.params = params
        self.effects = effects
        self.source_info = source_info
        self.ctx = ctx
        self._region_ref = None  # the Region this equation lives in, set on insertion
        for i, out in enumerate(outputs):
            out.producer = self
            out.index = i

    @property
    def region(self):
        """The Region this equation lives in (None when not inserted, or when the
        region is gone)."""
        ref = self._region_ref
        return None if ref is None else ref()

    @region.setter
    def region(self, region) -> None:
        # Held weakly: a region's graph holds its equations, and a strong
        # back-pointer would make every region a reference cycle, keeping its
        # constants (arrays the user's function closed over) alive after the last
        # program holding it is dropped, until the garbage collector runs.
        self._region_ref = None if region is None else weakref.ref(region)

    @property
    def name(self) -> str:
        return self.prim.name

    def regions(self) -> Iterator[tuple[str, int | None, Any]]:
        """Nested regions as ``(param_name, index_or_None, region)``, in param order."""
        region_t = Region
        for key, value in self.params.items():
            t = type(value)
            if t is region_t:
                yield key, None, value
            elif t is tuple and value and type(value[0]) is region_t:
                for i, r in enumerate(value):
                    yield key, i, r

    def has_regions(self) -> bool:
        region_t = Region
        for value in self.params.values():
            t = type(value)
            if t is region_t or (t is tuple and value and type(value[0]) is region_t):
                return True
        return False

    def __repr__(self) -> str:
        return f"<Equation {self.prim.name} {len(self.inputs)}->{len(self.outputs)}>"
