"""``hoist-consts``: every constant becomes an explicit parameter of the program.

Constants live in three places: the top-level region's constants, constants of
nested closed regions (a ``jit`` body that closed over an array), and -- if
``literals`` is set -- literal operands.  Each one at least ``min_bytes`` large
becomes a leading input of the body whose value is bound to the program
(``program.params``), so the program keeps its calling convention while a
compiler sees the array as an argument, not as a constant to embed and fold:
compilation no longer scales with the constant's size, and new values
(``program.with_params``) need no recompilation.

A constant nested in a region is threaded outwards level by level: the region
gets a new input, the equation that holds it a new operand (at the end of the
region's constant group in ``ir.layouts``: appended for calls and branches, among the
constants of loops and custom rules), and the operand is supplied the same way one level up.
Supplies are requested lazily from the top down, so a value reaches the
top level once and every level reuses an operand it already has.  With
``dedupe`` (default) identical constants -- same type (sharding included), dtype,
shape, weak type, placement and bytes -- become one parameter.  Regions outside
any constant group (custom rules whose derivative rules are Python callables)
keep their constants; the statistic ``constants-left-nested`` counts them.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..ir.arrays import identity_only, is_mutable_ref, nbytes, placement_key, to_numpy
from ..ir.layouts import ConstantGroup, RegionSlot, constant_groups, grown_params
from ..ir.region import Region
from ..ir.value import Value, is_literal
from .base import Pass, PassContext, register_pass
from ..ir.module import recursive_regions
from .sharing import RegionOwnership
from .signature import append_input, binder_uses, has_regions, insert_input

Supply = Callable[[Any, Any, "str | None"], Value]


@register_pass("hoist-consts")
@dataclass(frozen=True)
class HoistConstants(Pass):
    summary = "turn constants (top-level, nested, optionally literals) into bound parameters"
    min_bytes: int = 0
    dedupe: bool = True
    literals: bool = False

    def __post_init__(self):
        if self.min_bytes < 0:
            raise ValueError(f"min-bytes must be >= 0, got {self.min_bytes}")

    def run(self, program, ctx: PassContext):
        _Hoister(self, program, ctx).run()
        return program


class _Hoister:
    def __init__(self, options: HoistConstants, program, ctx: PassContext):
        self.options = options
        self.program = program
        self.ctx = ctx
        self.new_params: list[Any] = []
        self.owner = RegionOwnership(program.body)
        self.recursive = recursive_regions(program.body)
        self._needs: dict[int, bool] = {}
        self._alive: list[Region] = []
        # (dtype, shape, weak_type) -> [(array, body input)], for deduplication
        self.buckets: dict[tuple, list[tuple[Any, Value]]] = {}

    def run(self) -> None:
        body = self.program.body
        for i, value in enumerate(self.program.params):
            self._remember(value, body.invars[i])
        self._region(body, self._supply_top)
        if self.new_params:
            self.program.params = self.program.params + tuple(self.new_params)
        self.ctx.changed = bool(self.ctx.stats.get("constants-hoisted"))

    # ------------------------------------------------------------ supplies
    def _bucket_key(self, value, aval) -> tuple:
        # The full type (an explicit mesh puts the sharding in it) and the concrete
        # placement: equal bytes laid out differently are not the same parameter.
        return (str(aval.dtype), tuple(aval.shape), bool(getattr(aval, "weak_type", False)),
                str(aval), placement_key(value))

    def _remember(self, value, v: Value) -> None:
        self.buckets.setdefault(self._bucket_key(value, v.aval), []).append((value, v))

    def _supply_top(self, value, aval, name) -> Value:
        """A body input bound to ``value``: an existing parameter holding the same
        bytes (with ``dedupe``), or a new one after the existing parameters."""
        if self.options.dedupe:
            for other, v in self.buckets.get(self._bucket_key(value, aval), ()):
                if other is value or _same_bytes(other, value):
                    self.ctx.count("constants-deduplicated")
                    return v
        body = self.program.body
        position = len(self.program.params) + len(self.new_params)
        v = body.add_input(aval, name or f"param{position}", position=position)
        self.new_params.append(value)
        self._remember(value, v)
        self.ctx.count("params-added")
        self.ctx.count("bytes-hoisted", nbytes(value))
        return v

    def _supply_nested(self, rule, outer: Region, eqn, key: str, idx, outer_supply: Supply,
                       value, aval, name) -> Value:
        return rule(outer, eqn, key, idx, outer_supply(value, aval, name))

    # ------------------------------------------------------------- regions
    def _region(self, region: Region, supply: Supply) -> None:
        for eqn in list(region.equations):
            if not has_regions(eqn):
                continue
            subs = list(eqn.regions())
            rule = thread_into if can_thread(eqn) else None
            if rule is not None and any(id(sub) in self.recursive for _, _, sub in subs):
                # Threading a new operand into a function that calls itself would have
                # to thread it through its own inner calls as well: left in place.
                rule = None
            if rule is None:
                left = sum(self._count_nested(sub) for _, _, sub in subs)
                if left:
                    self.ctx.count("constants-left-nested", left)
                continue
            if not any(self._has_work(sub) for _, _, sub in subs):
                continue
            # Threading gives the equation's regions new inputs: regions shared
            # with other equations are copied first.
            self.owner.own_all(eqn)
            for key, idx, sub in list(eqn.regions()):
                self._region(sub, functools.partial(self._supply_nested, rule, region, eqn,
                                                    key, idx, supply))
        self._constants(region, supply)
        if self.options.literals:
            self._literals(region, supply)

    def _has_work(self, region: Region) -> bool:
        """Whether anything in ``region`` (or below, through threadable equations)
        would be hoisted."""
        hit = self._needs.get(id(region))
        if hit is not None:
            return hit
        self._alive.append(region)
        # A region that (recursively) calls itself: the cycle adds no work of its own.
        self._needs[id(region)] = False
        found = region.consts is not None and any(self._big_enough(c) for c in region.consts)
        if not found and self.options.literals:
            found = any(is_literal(a) and self._big_enough(_literal_value(a))
                        for a in region.outvars) or any(
                is_literal(a) and self._big_enough(_literal_value(a))
                for e in region.equations for a in e.inputs)
        if not found:
            for eqn in region.equations:
                if has_regions(eqn) and can_thread(eqn) and any(
                        self._has_work(sub) for _, _, sub in eqn.regions()):
                    found = True
                    break
        self._needs[id(region)] = found
        return found

    def _big_enough(self, value) -> bool:
        # A mutable Ref stays where the program reads and writes it; a token (no
        # dtype: no bytes to share, and not a value a parameter can hold) stays too.
        return (not is_mutable_ref(value) and hasattr(value, "dtype")
                and nbytes(value) >= self.options.min_bytes)

    def _constants(self, region: Region, supply: Supply) -> None:
        if region.consts is None or not region.constvars:
            return
        uses = binder_uses(region)
        keep_vars, keep_values = [], []
        for cv, value in zip(list(region.constvars), list(region.consts)):
            if not self._big_enough(value):
                keep_vars.append(cv)
                keep_values.append(value)
                continue
            v = supply(value, cv.aval, cv.name)
            for consumer, pos in uses.get(cv, ()):
                region.set_operand(consumer, pos, v)
            self.ctx.count("constants-hoisted")
        region.constvars = keep_vars
        region.consts = keep_values
        region._renumber_binders()

    def _literals(self, region: Region, supply: Supply) -> None:
        value_of = _literal_value
        for eqn in list(region.equations):
            for pos, atom in enumerate(list(eqn.inputs)):
                if is_literal(atom) and self._big_enough(value_of(atom)):
                    region.set_operand(eqn, pos, supply(value_of(atom), atom.aval, None))
                    self.ctx.count("constants-hoisted")
                    self.ctx.count("literals-hoisted")
        for pos, atom in enumerate(list(region.outvars)):
            if is_literal(atom) and self._big_enough(value_of(atom)):
                region.set_operand(region.exit, pos, supply(value_of(atom), atom.aval, None))
                self.ctx.count("constants-hoisted")
                self.ctx.count("literals-hoisted")

    def _count_nested(self, region: Region) -> int:
        n = 0
        for r in region.regions():
            if r.consts is not None:
                n += sum(1 for c in r.consts if self._big_enough(c))
        return n


def _literal_value(lit) -> np.ndarray:
    return np.asarray(lit.val, dtype=lit.aval.dtype)


def _same_bytes(a, b) -> bool:
    if identity_only(a) or identity_only(b):  # values of an enclosing trace: only identity
        return False
    x, y = to_numpy(a), to_numpy(b)
    if x.shape != y.shape or x.dtype != y.dtype:
        return False
    x, y = np.ascontiguousarray(x), np.ascontiguousarray(y)
    return np.array_equal(x.reshape(-1).view(np.uint8), y.reshape(-1).view(np.uint8))


# ------------------------------------------------------------------ threading
def _operand_position(eqn, value: Value, start: int, stop: int) -> int | None:
    for pos in range(start, stop):
        if eqn.inputs[pos] is value:
            return pos
    return None


def _slot_of(eqn, key: str, idx) -> tuple[ConstantGroup, RegionSlot] | None:
    for group in constant_groups(eqn):
        for slot in group.slots:
            if slot.key == key and slot.index == idx:
                return group, slot
    return None


def thread_into(outer: Region, eqn, key: str, idx, value: Value) -> Value:
    """The input of region ``eqn.params[key][idx]`` that receives ``value`` (an atom
    of ``outer``): an operand of the region's constant group that already is
    ``value``, or a new last member of that group (``ir.layouts``)."""
    group, slot = _slot_of(eqn, key, idx)
    pos = _operand_position(eqn, value, group.start, group.stop)
    if pos is not None:
        return slot.region(eqn).invars[slot.first_input + pos - group.start]
    n = group.stop - group.start
    if group.stop == len(eqn.inputs):
        append_input(outer, eqn, value)
    else:
        insert_input(outer, eqn, group.stop, value)
    added: dict[int, Value] = {}
    for s in group.slots:
        sub = s.region(eqn)
        if id(sub) not in added:
            added[id(sub)] = sub.add_input(value.aval, value.name, position=s.first_input + n)
    eqn.params = grown_params(eqn, group, value.name or f"param{n}")
    return added[id(slot.region(eqn))]


def can_thread(eqn) -> bool:
    """Whether every region of ``eqn`` belongs to a constant group, so a constant
    nested in any of them can become an operand."""
    groups = constant_groups(eqn)
    covered = {(s.key, s.index) for g in groups for s in g.slots}
    return bool(groups) and all((key, idx) in covered for key, idx, _ in eqn.regions())
