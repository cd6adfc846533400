"""Changing the operand and result lists of equations and regions in bulk.

``dce`` drops unused inputs and outputs of calls, branches and loops, and
``hoist-consts`` threads new operands into them; both keep the use-def graph
(edges keyed by operand position) consistent through these helpers.
"""
from __future__ import annotations

from typing import Any, Sequence

from ..ir.equation import Equation
from ..ir.region import IRError, Region
from ..ir.value import Atom, Value


def has_regions(eqn: Equation) -> bool:
    """``eqn.has_regions()`` without its per-call import: passes ask this of every
    equation of a program, and it is on their hot path."""
    for p in eqn.params.values():
        t = type(p)
        if t is Region or (t is tuple and p and type(p[0]) is Region):
            return True
    return False


# The two helpers below edit networkx's adjacency dicts directly, as
# ir/graph_build.py does: cse and dce call them once per merged or removed
# equation of programs with 100k equations, where networkx's per-edge API calls
# would dominate.  ``succ[u][v]`` and ``pred[v][u]`` share one dict of
# ``{operand_position: {"value": Value}}``.

def detach(region: Region, eqn: Equation) -> None:
    """Remove ``eqn`` from ``region`` (its results must have no readers left)."""
    g = region.graph
    succ, pred = g._succ, g._pred
    for producer in pred[eqn]:
        del succ[producer][eqn]
    for consumer in succ[eqn]:
        del pred[consumer][eqn]
    del succ[eqn], pred[eqn], g._node[eqn]
    del region._order[eqn]
    eqn.region = None


def merge_into(region: Region, duplicate: Equation, original: Equation) -> int:
    """Make every reader of ``duplicate``'s results read ``original``'s instead and
    remove ``duplicate``; returns how many operands were redirected."""
    g = region.graph
    succ, pred = g._succ, g._pred
    exit_ = region.exit
    replacement = dict(zip(duplicate.outputs, original.outputs))
    into = succ[original]
    moved = 0
    for consumer, keyed in succ[duplicate].items():
        target = into.get(consumer)
        if target is None:
            target = into[consumer] = pred[consumer][original] = {}
        for pos, data in keyed.items():
            new = replacement[data["value"]]
            if consumer is exit_:
                region.outvars[pos] = new
            else:
                consumer.inputs[pos] = new
            target[pos] = {"value": new}
            moved += 1
        del pred[consumer][duplicate]
    for producer in pred[duplicate]:
        del succ[producer][duplicate]
    del succ[duplicate], pred[duplicate], g._node[duplicate]
    del region._order[duplicate]
    duplicate.region = None
    return moved


def set_inputs(region: Region, eqn: Equation, inputs: Sequence[Atom]) -> None:
    """Replace ``eqn``'s operand list, re-keying its use-def edges by position."""
    region.set_inputs(eqn, inputs)


def keep_outputs(region: Region, eqn: Equation, keep: Sequence[bool]) -> None:
    """Drop the results of ``eqn`` whose ``keep`` flag is False.  They must be unused,
    except as outputs of ``region`` at positions its caller is about to drop (DCE
    rewrites a region's body before it shrinks the region's signature)."""
    new = []
    for out, k in zip(eqn.outputs, keep):
        if k:
            new.append(out)
        elif any(consumer is not region.exit for consumer, _ in region.users(out)):
            raise IRError(f"cannot drop result {out!r} of {eqn.prim.name}: it is still used")
    for i, out in enumerate(new):
        out.index = i
    eqn.outputs = new


def keep_region_outputs(region: Region, keep: Sequence[bool]) -> None:
    if all(keep):
        return
    region.set_outvars([a for a, k in zip(region.outvars, keep) if k])


def used_binders(region: Region) -> set[Value]:
    """The region's constants and inputs that some equation or output reads."""
    return {data["value"] for keyed in region.graph._succ[region.entry].values()
            for data in keyed.values()}


def binder_uses(region: Region) -> dict[Value, list[tuple[Any, int]]]:
    """Every reader of every region binder, from one sweep of the entry's edges:
    ``{binder: [(consumer, operand_position), ...]}`` (consumer may be the exit)."""
    uses: dict[Value, list[tuple[Any, int]]] = {}
    for consumer, keyed in region.graph._succ[region.entry].items():
        for pos, data in keyed.items():
            uses.setdefault(data["value"], []).append((consumer, pos))
    return uses


def append_input(region: Region, eqn: Equation, atom: Atom) -> None:
    """Add ``atom`` as a new last operand of ``eqn``."""
    eqn.inputs.append(atom)
    if type(atom) is Value:
        region.graph.add_edge(atom.producer, eqn, key=len(eqn.inputs) - 1, value=atom)


def insert_input(region: Region, eqn: Equation, position: int, atom: Atom) -> None:
    """Add ``atom`` as operand ``position`` of ``eqn``, shifting later operands."""
    inputs = list(eqn.inputs)
    inputs.insert(position, atom)
    set_inputs(region, eqn, inputs)


def keep_region_inputs(region: Region, keep: Sequence[bool]) -> None:
    """Drop the region inputs whose ``keep`` flag is False (they must be unused)."""
    if all(keep):
        return
    used = used_binders(region)
    new = []
    for v, k in zip(region.invars, keep):
        if k:
            new.append(v)
        elif v in used:
            raise IRError(f"cannot drop region input {v!r}: it is still used")
    region.invars = new
    region._renumber_binders()


def keep_entries(values: Any, keep: Sequence[bool]) -> Any:
    """Filter a per-operand (or per-result) tuple parameter; non-tuples pass through."""
    if not isinstance(values, tuple) or len(values) != len(keep):
        return values
    return tuple(v for v, k in zip(values, keep) if k)


def remove_unused_consts(region: Region) -> int:
    """Drop a closed region's constants that nothing reads; returns how many."""
    if region.consts is None or not region.constvars:
        return 0
    read = used_binders(region)
    used = [v in read for v in region.constvars]
    if all(used):
        return 0
    region.constvars = [v for v, u in zip(region.constvars, used) if u]
    region.consts = [c for c, u in zip(region.consts, used) if u]
    region._renumber_binders()
    return used.count(False)
