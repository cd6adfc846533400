"""Copy-on-write for regions that several equations share.

The IR may share one Region between equations (a custom rule used at several
call sites, or a ``jit`` body JAX traced once and reused).  Simplifying a region
without touching its signature means the same for every user, so passes may do
that in place.  Anything that depends on one caller -- dropping results that
caller does not read, or adding an input that caller feeds -- must first give
that caller its own copy: :meth:`RegionOwnership.own`.
"""
from __future__ import annotations

from ..ir.clone import clone_function
from ..ir.region import Region
from .signature import has_regions


class RegionOwnership:
    """Reference counts of the regions below ``root``, computed on first use."""

    def __init__(self, root: Region):
        self.root = root
        self._refs: dict[int, int] | None = None
        # Every counted region stays alive for the pass run, so ids are never reused.
        self._alive: list[Region] = []

    def _count(self, start: Region, refs: dict[int, int]) -> None:
        seen = {id(start)}
        stack = [start]
        while stack:
            region = stack.pop()
            for eqn in region.equations:
                if not has_regions(eqn):
                    continue
                for _, _, sub in eqn.regions():
                    refs[id(sub)] = refs.get(id(sub), 0) + 1
                    if id(sub) not in seen:
                        seen.add(id(sub))
                        self._alive.append(sub)
                        stack.append(sub)

    def refs(self) -> dict[int, int]:
        if self._refs is None:
            self._refs = {}
            self._count(self.root, self._refs)
        return self._refs

    def is_shared(self, region: Region) -> bool:
        return self.refs().get(id(region), 0) > 1

    def own(self, eqn, key: str, index: int | None = None) -> Region:
        """The region ``eqn.params[key][index]``, copied first if anything else uses it."""
        param = eqn.params[key]
        sub = param if index is None else param[index]
        if not self.is_shared(sub):
            return sub
        refs = self.refs()
        new = clone_function(sub)
        params = dict(eqn.params)
        if index is None:
            params[key] = new
        else:
            items = list(param)
            items[index] = new
            params[key] = tuple(items)
        eqn.params = params
        refs[id(sub)] -= 1
        refs[id(new)] = 1
        self._alive.append(new)
        # The copy calls the same regions as the original: one more caller each.
        for e in new.equations:
            for _, _, callee in e.regions():
                refs[id(callee)] = refs.get(id(callee), 0) + 1
        return new

    def own_all(self, eqn) -> None:
        """Give ``eqn`` its own copy of every region it holds."""
        for key, index, _ in list(eqn.regions()):
            self.own(eqn, key, index)
