"""Regions: a list of equations over a use-def graph (a networkx MultiDiGraph).

Graph nodes are the region's equations plus two sentinels: ``entry`` (which defines
the region's constants and inputs) and ``exit`` (which reads its outputs).  An edge
``producer -> consumer`` with key ``k`` and attribute ``value`` says that operand
``k`` of ``consumer`` (output ``k`` for ``exit``) is ``value``.  Literal operands
have no edge.

The region also keeps a program order (``equations``).  Insertions keep it a valid
topological order; ``topo_order()`` repairs it deterministically when a caller has
made it invalid, keeping the existing order wherever it is valid.
"""
from __future__ import annotations

import weakref
from typing import Any, Iterable, Iterator, Sequence

import networkx as nx

from .equation import Equation
from .value import Atom, Value, is_literal


class RegionEntry:
    """Sentinel node that defines a region's constants and inputs.  It refers to its region
    weakly (see ``Equation.region``): the region's graph holds the sentinel."""
    __slots__ = ("_region_ref",)

    def __init__(self, region):
        self._region_ref = weakref.ref(region)

    @property
    def region(self):
        return self._region_ref()

    def __repr__(self):
        return "<entry>"


class RegionExit:
    """Sentinel node that reads a region's outputs.  It refers to its region
    weakly (see ``Equation.region``): the region's graph holds the sentinel."""
    __slots__ = ("_region_ref",)

    def __init__(self, region):
        self._region_ref = weakref.ref(region)

    @property
    def region(self):
        return self._region_ref()

    def __repr__(self):
        return "<exit>"


class IRError(ValueError):
    """A use-def operation was asked to do something that would break the graph."""


class Region:
    """A jaxpr-shaped block: constants, inputs, equations, outputs.

    ``closed`` records whether JAX held this block as a ``ClosedJaxpr`` (constants
    carried as values in ``consts``) or as an open ``Jaxpr`` (``consts`` is None), so
    it can be handed back in the same form.
    """

    def __init__(self, *, closed: bool = True, effects=frozenset(), debug_info=None):
        self.graph = nx.MultiDiGraph()
        self.entry = RegionEntry(self)
        self.exit = RegionExit(self)
        self.graph.add_node(self.entry)
        self.graph.add_node(self.exit)
        self.constvars: list[Value] = []
        self.consts: list[Any] | None = [] if closed else None
        self.invars: list[Value] = []
        self.outvars: list[Atom] = []
        self._order: dict[Equation, None] = {}
        self.effects = effects
        self.debug_info = debug_info

    # ----------------------------------------------------------------- binders
    @property
    def closed(self) -> bool:
        return self.consts is not None

    def _renumber_binders(self) -> None:
        for i, v in enumerate(self.constvars + self.invars):
            v.producer = self.entry
            v.index = i

    def add_input(self, aval, name: str | None = None, position: int | None = None) -> Value:
        v = Value(aval, self.entry, 0, name)
        if position is None:
            self.invars.append(v)
        else:
            self.invars.insert(position, v)
        self._renumber_binders()
        return v

    def add_const(self, aval, value: Any = None, name: str | None = None) -> Value:
        v = Value(aval, self.entry, 0, name)
        self.constvars.append(v)
        if self.consts is not None:
            self.consts.append(value)
        self._renumber_binders()
        return v

    def remove_binder(self, value: Value) -> None:
        """Remove an unused input or constant."""
        if self.users(value):
            raise IRError(f"cannot remove region binder {value!r}: it still has users")
        if value in self.invars:
            self.invars.remove(value)
        else:
            i = self.constvars.index(value)
            del self.constvars[i]
            if self.consts is not None:
                del self.consts[i]
        self._renumber_binders()

    # --------------------------------------------------------------- outputs
    def set_outvars(self, outvars: Sequence[Atom]) -> None:
        g = self.graph
        for u, _, k in list(g.in_edges(self.exit, keys=True)):
            g.remove_edge(u, self.exit, key=k)
        self.outvars = list(outvars)
        for pos, atom in enumerate(self.outvars):
            if not is_literal(atom):
                g.add_edge(atom.producer, self.exit, key=pos, value=atom)

    # --------------------------------------------------------------- use-def
    @property
    def equations(self) -> list[Equation]:
        return list(self._order)

    def __iter__(self) -> Iterator[Equation]:
        return iter(list(self._order))

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, eqn) -> bool:
        return eqn in self._order

    @staticmethod
    def producer(value: Value):
        """The Equation that defines ``value``, or the RegionEntry for binders."""
        return value.producer

    def users(self, value: Value) -> list[tuple[Any, int]]:
        """``(consumer, operand_position)`` pairs reading ``value``; the consumer is an
        Equation, or the RegionExit for a region output (position = output index)."""
        succ = self.graph._succ.get(value.producer)
        if not succ:
            return []
        found = []
        for consumer, keyed in succ.items():
            for pos, data in keyed.items():
                if data["value"] is value:
                    found.append((consumer, pos))
        return found

    def has_users(self, value: Value) -> bool:
        succ = self.graph._succ.get(value.producer)
        if not succ:
            return False
        return any(data["value"] is value for keyed in succ.values() for data in keyed.values())

    def set_operand(self, consumer, pos: int, atom: Atom) -> None:
        """Point operand ``pos`` of ``consumer`` (an Equation or the exit) at ``atom``."""
        g = self.graph
        if consumer is self.exit:
            old = self.outvars[pos]
            self.outvars[pos] = atom
        else:
            old = consumer.inputs[pos]
            consumer.inputs[pos] = atom
        if not is_literal(old):
            g.remove_edge(old.producer, consumer, key=pos)
        if not is_literal(atom):
            g.add_edge(atom.producer, consumer, key=pos, value=atom)

    def set_inputs(self, eqn: Equation, inputs: Sequence[Atom]) -> None:
        """Replace ``eqn``'s operand list, re-keying its use-def edges by position."""
        g = self.graph
        for pos, atom in enumerate(eqn.inputs):
            if type(atom) is Value:
                g.remove_edge(atom.producer, eqn, key=pos)
        eqn.inputs = list(inputs)
        for pos, atom in enumerate(eqn.inputs):
            if type(atom) is Value:
                g.add_edge(atom.producer, eqn, key=pos, value=atom)

    def replace_all_uses_with(self, old: Value, new: Atom) -> int:
        """Make every reader of ``old`` read ``new``; returns how many uses moved."""
        if old is new:
            return 0
        uses = self.users(old)
        for consumer, pos in uses:
            self.set_operand(consumer, pos, new)
        return len(uses)

    # ------------------------------------------------------- insert / erase
    def _link(self, eqn: Equation) -> None:
        eqn.region = self
        g = self.graph
        g.add_node(eqn)
        for pos, atom in enumerate(eqn.inputs):
            if not is_literal(atom):
                if atom.producer is None:
                    raise IRError(f"operand {pos} of {eqn.prim.name} is a value with no definition")
                g.add_edge(atom.producer, eqn, key=pos, value=atom)

    def append(self, eqn: Equation) -> Equation:
        self._link(eqn)
        self._order[eqn] = None
        return eqn

    def insert_before(self, anchor: Equation, eqns: Equation | Iterable[Equation]) -> None:
        self._insert(anchor, eqns, after=False)

    def insert_after(self, anchor: Equation, eqns: Equation | Iterable[Equation]) -> None:
        self._insert(anchor, eqns, after=True)

    def _insert(self, anchor, eqns, after):
        new = [eqns] if isinstance(eqns, Equation) else list(eqns)
        if anchor not in self._order:
            raise IRError(f"{anchor!r} is not in this region")
        for e in new:
            self._link(e)
        order: dict[Equation, None] = {}
        for e in self._order:
            if e is anchor and not after:
                order.update(dict.fromkeys(new))
            order[e] = None
            if e is anchor and after:
                order.update(dict.fromkeys(new))
        self._order = order

    def erase(self, eqn: Equation, *, force: bool = False) -> None:
        """Remove ``eqn``. Its results must be unused unless ``force``."""
        if not force:
            for out in eqn.outputs:
                if self.has_users(out):
                    raise IRError(f"cannot erase {eqn.prim.name}: its result {out!r} is still used")
        self.graph.remove_node(eqn)
        del self._order[eqn]
        eqn.region = None

    def erase_many(self, eqns: Iterable[Equation]) -> None:
        """Remove a set of equations whose results are only used among themselves."""
        doomed = set(eqns)
        self.graph.remove_nodes_from(doomed)
        self._order = {e: None for e in self._order if e not in doomed}
        for e in doomed:
            e.region = None

    # ----------------------------------------------------------- ordering
    def order_is_valid(self) -> bool:
        seen = {self.entry}
        add = seen.add
        for eqn in self._order:
            for atom in eqn.inputs:
                if type(atom) is Value and atom.producer not in seen:
                    return False
            add(eqn)
        return True

    def topo_order(self) -> list[Equation]:
        """A topological order of the equations that keeps the current order wherever
        it is valid (ties broken by current position), so it is deterministic."""
        if self.order_is_valid():
            return list(self._order)
        position = {e: i for i, e in enumerate(self._order)}
        position[self.entry] = -1
        position[self.exit] = len(position) + 1
        order = [n for n in nx.lexicographical_topological_sort(self.graph, key=position.__getitem__)
                 if isinstance(n, Equation)]
        return order

    def sort(self) -> None:
        """Reorder the equations into ``topo_order()``."""
        self._order = dict.fromkeys(self.topo_order())

    # ------------------------------------------------------------- walking
    def walk(self) -> Iterator[tuple["Region", Equation]]:
        """Every (region, equation) of this region and of the regions it calls, each
        region once: a function called from many sites, or from itself, is one."""
        for region in self.regions():
            for eqn in region._order:
                yield region, eqn

    def regions(self) -> Iterator["Region"]:
        """This region and every region reachable from it, each once, pre-order
        (the walk is cycle-safe: a recursive function is visited once)."""
        seen = {id(self)}
        stack = [self]
        while stack:
            region = stack.pop()
            yield region
            found = []
            for eqn in region._order:
                for _, _, sub in eqn.regions():
                    if id(sub) not in seen:
                        seen.add(id(sub))
                        found.append(sub)
            stack.extend(reversed(found))

    def __repr__(self) -> str:
        return f"<Region {len(self.invars)} in, {len(self._order)} eqns, {len(self.outvars)} out>"


from . import equation as _equation  # noqa: E402

_equation.Region = Region
