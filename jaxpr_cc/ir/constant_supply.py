"""Give a region a constant array through the equations that hold it.

First-order rule regions must be constant-free (``closure.ir_rules``): an array a
rule body reads is one of the rule's closed-over operands, so that the rule can be
rebuilt and traced again (forward mode, higher orders) with the array as a value it
is given.  ``supply_constant`` makes a concrete array available inside such a region:
the array becomes a constant of the top-level body and is threaded inwards through
each equation that holds a region on the way -- as a new member of the constant
group (``ir.layouts``) that feeds it.  Every region of that group gets a new input,
and every equation holding any of them gets a new operand, supplied the same way
from the region it sits in; a rule that calls itself supplies its own inner calls
from the input just added.
"""
from __future__ import annotations

from typing import Any

from .layouts import ConstantGroup, constant_groups, grown_params
from .region import Region
from .value import Value


def supply_constant(body: Region, region: Region, value: Any, aval,
                    name: str | None = None) -> Value:
    """A value of ``region`` holding the concrete ``value``: a constant of ``region``
    itself when it may hold one (the top-level body, or a region no custom rule
    encloses) or when some equation on the way has no constant group for it, else
    an input threaded from a constant of ``body``."""
    if region is body:
        return body.add_const(aval, value, name)
    users = _users(body)
    plans: dict[int, tuple] = {}
    if not _inside_rule(region, users, {}) or not _plan(region, body, users, plans):
        return region.add_const(aval, value, name)
    return _thread(region, body, plans, {}, value, aval, name)


def _users(body: Region) -> dict[int, list]:
    """id(region) -> [(enclosing region, equation)] for every equation holding it."""
    users: dict[int, list] = {}
    for outer in body.regions():
        for eqn in outer.equations:
            for _, _, sub in eqn.regions():
                users.setdefault(id(sub), []).append((outer, eqn))
    return users


def _inside_rule(region: Region, users: dict, seen: dict) -> bool:
    if id(region) in seen:
        return seen[id(region)]
    seen[id(region)] = False  # a cycle adds nothing
    found = any(eqn.prim.name in _CUSTOM or _inside_rule(outer, users, seen)
                for outer, eqn in users.get(id(region), ()))
    seen[id(region)] = found
    return found


_CUSTOM = ("custom_vjp_call", "custom_jvp_call", "linear_call")


def _group_of(eqn, region: Region) -> ConstantGroup | None:
    for group in constant_groups(eqn):
        if any(slot.region(eqn) is region for slot in group.slots):
            return group
    return None


def _plan(region: Region, body: Region, users: dict, plans: dict) -> bool:
    """Work out, without changing anything, the regions that take the new input (at
    which position) and the equations that take a new operand, for ``region`` and,
    recursively, for every region those equations sit in.  False when some equation
    on the way has no constant group for a region it holds."""
    if region is body or id(region) in plans:
        return True
    positions: dict[int, tuple[Region, int]] = {id(region): (region, -1)}
    eqns: dict[int, tuple] = {}
    todo = [region]
    while todo:
        current = todo.pop()
        holders = users.get(id(current), ())
        if not holders:
            return False
        for outer, eqn in holders:
            if id(eqn) in eqns:
                continue
            group = _group_of(eqn, current)
            if group is None:
                return False
            eqns[id(eqn)] = (outer, eqn, group)
            size = group.stop - group.start
            for slot in group.slots:
                sub = slot.region(eqn)
                at = slot.first_input + size
                known = positions.get(id(sub))
                if known is not None and known[1] not in (-1, at):
                    return False  # held by equations that disagree on its layout
                if known is None:
                    todo.append(sub)
                positions[id(sub)] = (sub, at)
    if any(at < 0 for _, at in positions.values()):
        return False
    plans[id(region)] = (tuple(positions.values()), tuple(eqns.values()))
    for member, _ in positions.values():
        plans.setdefault(id(member), plans[id(region)])
    return all(_plan(outer, body, users, plans) for outer, _, _ in eqns.values())


def _thread(region: Region, body: Region, plans: dict, made: dict, value, aval, name) -> Value:
    if id(region) in made:
        return made[id(region)]
    if region is body:
        made[id(body)] = body.add_const(aval, value, name)
        return made[id(body)]
    members, eqns = plans[id(region)]
    # Inputs first: an equation inside one of these regions (a rule calling itself)
    # is supplied from the input its own region just got.
    for member, at in members:
        made[id(member)] = member.add_input(aval, name, position=at)
    for outer, eqn, group in eqns:
        operand = _thread(outer, body, plans, made, value, aval, name)
        _add_operand(outer, eqn, group, operand)
    return made[id(region)]


def _add_operand(outer: Region, eqn, group: ConstantGroup, operand: Value) -> None:
    """``operand`` as the new last member of ``eqn``'s ``group`` (its regions already
    have the matching input), with the group's params kept in step."""
    params = grown_params(eqn, group, operand.name or f"const{group.stop - group.start}")
    inputs = list(eqn.inputs)
    inputs.insert(group.stop, operand)
    outer.set_inputs(eqn, inputs)
    eqn.params = params
