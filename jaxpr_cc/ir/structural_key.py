"""Exact, hashable keys for equation parameters, literals and whole regions.

Two keys are equal only when the things they describe are interchangeable:
floats compare by bit pattern (``0.0`` and ``-0.0`` differ, NaN equals itself),
``True`` differs from ``1``, arrays compare by dtype, shape and bytes, regions
compare structurally (same equations over the same dataflow, values numbered by
definition order), and anything without a trustworthy equality (Python callables,
unhashable objects) compares by identity.  ``cse`` merges equations whose keys
are equal.  Each parameter type's key is the key aspect of its entry in the
parameter-type registry (``ir.param_types``); this module supplies the caches and the
structural keys of arrays, literals and regions those aspects recurse into.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from . import param_types
from .arrays import identity_only, placement_key, to_numpy
from .region import Region
from .value import Value, is_literal


_PLAIN = (type(None), str, int)


class KeyMaker:
    """Builds keys, caching per region and per array object for one pass run."""

    def __init__(self):
        self._regions: dict[int, tuple] = {}
        self._arrays: dict[int, tuple] = {}
        self._literals: dict[int, tuple] = {}
        self._open: set[int] = set()  # regions whose key is being built
        self._keep: list[Any] = []  # keeps cached objects alive so their ids stay unique

    # ------------------------------------------------------------- params
    def params(self, params: dict) -> tuple:
        """Parameters in the order JAX bound them (one primitive always binds its
        parameters in the same order, so equal parameter sets give equal keys)."""
        out = []
        for k, v in params.items():
            t = type(v)
            if t is str or v is None:
                out.append((k, v))
            elif t is int:
                out.append((k, ("i", v)))
            else:
                out.append((k, self.value(v)))
        return tuple(out)

    def plain_params(self, params: dict) -> tuple | None:
        """``params(params)``, or None if a parameter holds a region (the caller must
        simplify nested regions before keying them)."""
        out = []
        for k, v in params.items():
            t = type(v)
            if t is str or v is None:
                out.append((k, v))
            elif t is int:
                out.append((k, ("i", v)))
            elif t is Region or (t is tuple and v and type(v[0]) is Region):
                return None
            else:
                out.append((k, self.value(v)))
        return tuple(out)

    def value(self, v: Any) -> Any:
        """The key aspect of ``v``'s entry in the parameter-type registry."""
        t = type(v)
        # The commonest parameters, keyed as their registry entries would key them.
        if t in _PLAIN:
            return v if t is not int else ("i", v)
        if t is bool:
            return ("b", v)
        if t is tuple:
            return ("tuple", tuple([self.value(x) for x in v]))
        return param_types.entry_for(v).key(v, self)

    def array(self, x: Any) -> tuple:
        key = self._arrays.get(id(x))
        if key is None and identity_only(x):  # a value of an enclosing trace: identity
            key = self._arrays[id(x)] = ("traced", param_types.identity_key(x))
            self._keep.append(x)
        if key is None:
            a = to_numpy(x)
            dtype = getattr(x, "dtype", a.dtype)
            weak = bool(getattr(x, "weak_type", False))
            key = self._arrays[id(x)] = ("array", str(dtype), weak, a.shape,
                                         placement_key(x),
                                         np.ascontiguousarray(a).tobytes())
            self._keep.append(x)
        return key

    def literal(self, lit) -> tuple:
        hit = self._literals.get(id(lit))
        if hit is not None and hit[0] is lit:
            return hit[1]
        aval = lit.aval
        val = lit.val
        try:
            key = ("lit", aval, np.asarray(val, dtype=aval.dtype).tobytes())
        except (TypeError, ValueError):
            key = ("lit", aval, self.value(val))
        self._literals[id(lit)] = (lit, key)
        return key

    # ------------------------------------------------------------ regions
    def region(self, region: Region) -> RegionKey:
        """A structural key: equal for regions that compute the same thing the same way."""
        key = self._regions.get(id(region))
        if key is not None:
            return key
        if id(region) in self._open:
            # A region that calls itself (recursion through a custom rule): inside its
            # own key it stands for itself, so only calls of this very function match.
            return ("recursive", param_types.identity_key(region))
        self._open.add(id(region))
        try:
            return self._region_key(region)
        finally:
            self._open.discard(id(region))

    def _region_key(self, region: Region) -> tuple:
        numbers: dict[Value, int] = {}
        for v in region.constvars + region.invars:
            numbers[v] = len(numbers)

        def ref(a):
            if is_literal(a):
                return self.literal(a)
            return numbers.get(a, -1)

        consts = tuple(self.value(c) for c in region.consts) if region.consts is not None else None
        eqns = []
        for eqn in region.equations:
            eqns.append((eqn.prim, self.params(eqn.params), tuple(ref(a) for a in eqn.inputs),
                         tuple(o.aval for o in eqn.outputs), _Effects(eqn.effects)))
            for o in eqn.outputs:
                numbers[o] = len(numbers)
        key = RegionKey(("region", consts, tuple(v.aval for v in region.constvars),
                         tuple(v.aval for v in region.invars), tuple(eqns),
                         tuple(ref(a) for a in region.outvars)))
        self._regions[id(region)] = key
        self._keep.append(region)
        return key


class RegionKey:
    """A region's structural key.  Python does not cache tuple hashes, and a key that
    holds a region's key (a call's params) is hashed once per call site: the hash is
    computed once here, and the one key ``KeyMaker`` caches per region compares equal
    to itself without walking the tuple."""
    __slots__ = ("parts", "_hash")

    def __init__(self, parts: tuple):
        self.parts = parts
        self._hash = hash(parts)

    def __eq__(self, other):
        return self is other or (type(other) is RegionKey and self._hash == other._hash
                                 and self.parts == other.parts)

    def __hash__(self):
        return self._hash

    def __repr__(self):
        return f"RegionKey({self.parts!r})"


class _Effects:
    """Effects sets compare by equality; JAX effect objects are hashable."""
    __slots__ = ("effects",)

    def __init__(self, effects):
        self.effects = frozenset(effects)

    def __eq__(self, other):
        return type(other) is _Effects and other.effects == self.effects

    def __hash__(self):
        return hash(len(self.effects))

