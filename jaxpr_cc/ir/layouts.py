"""Operand layouts of the primitives that hold regions: one table, read by every pass
that moves a value across a region boundary.

A primitive's layout says which of an equation's operands are handed, unchanged and
in every run of a region, to that region's leading inputs: its *constant groups*.

* ``jit`` / ``pjit`` / ``closed_call`` / ``core_call`` / ``remat`` / ``shard_map``:
  every operand feeds the one body, in order.
* ``cond``: operand 0 picks the branch; the rest feed every branch.
* ``while``: ``cond_nconsts`` operands feed the condition, the next ``body_nconsts``
  the body; the carry that follows changes between runs, so it is in no group.
* ``scan``: ``num_consts`` operands feed the body; carry and scanned inputs are not
  constant.
* first-order custom rules (``custom_vjp_call``, ``custom_jvp_call``, ``linear_call``
  from ``jaxpr_cc.closure``): the leading ``num_consts`` (``num_res``) operands feed the
  leading inputs of every region the equation holds -- primal, rules and variants.

Passes read the table to know a value inside a region from the operand outside
(constant folding), to add an operand that a region reads (hoisting: inserted at the
end of a group, in the operands and in each region of the group, with the group's count
param and the per-operand params given their default entry), and to drop operands
and results (dce keeps the per-operand and per-result params in step).

Adding a primitive with a region is one entry in ``LAYOUTS``; docs/passes.md shows
an example.  A primitive with no entry is opaque: passes leave its regions' signatures
alone.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from jax.sharding import PartitionSpec

from ..closure.ir_rules import is_first_order_custom
from ..jax_adapter import UNSPECIFIED_SHARDING, is_input_effect


@dataclass(frozen=True)
class RegionSlot:
    """A region of an equation (``eqn.params[key]``, or its ``index``-th entry) whose
    inputs from ``first_input`` on receive a constant group's operands."""
    key: str
    index: int | None
    first_input: int

    def region(self, eqn):
        value = eqn.params[self.key]
        return value if self.index is None else value[self.index]


@dataclass(frozen=True)
class ConstantGroup:
    """Operands ``start:stop`` of an equation, handed unchanged to each slot's region.
    ``count_param`` holds the group's size when the primitive stores it;
    ``names_param`` (custom rules' ``const_names``) names each member."""
    start: int
    stop: int
    slots: tuple[RegionSlot, ...]
    count_param: str | None = None
    names_param: str | None = None


@dataclass(frozen=True)
class Loop:
    """How one loop equation threads values between iterations.

    Operands: the constant groups, then ``n_carry`` carried operands from
    ``carry_start``, then ``n_xs`` per-iteration operands (scan's scanned inputs).
    Results: the final carry, then the per-iteration results (scan's stacked outputs).

    ``step`` is the region run each iteration: its inputs are constant group
    ``step_group``'s operands, the carry, then the per-iteration operands; its
    outputs are the next carry, then the per-iteration results.  Each of ``tests``
    (a region and its constant group) reads its group's operands and the carry and
    returns the exit test (``while``'s condition).  ``carry_param`` holds
    ``n_carry`` when the primitive stores it."""
    carry_start: int
    n_carry: int
    n_xs: int
    groups: tuple[ConstantGroup, ...]
    step: RegionSlot
    step_group: int
    tests: tuple[tuple[RegionSlot, int], ...] = ()
    carry_param: str | None = None

    @property
    def carried(self) -> range:
        """Positions of the carried operands (result ``i`` is the final value of
        operand ``carry_start + i``)."""
        return range(self.carry_start, self.carry_start + self.n_carry)

    @property
    def xs(self) -> range:
        """Positions of the per-iteration operands."""
        start = self.carry_start + self.n_carry
        return range(start, start + self.n_xs)

    def group_size(self, index: int) -> int:
        group = self.groups[index]
        return group.stop - group.start


@dataclass(frozen=True)
class Layout:
    """``groups(eqn)``: the equation's constant groups.  ``operand_params``: params
    with one entry per operand, each with the entry a new operand gets;
    ``result_params``: params with one entry per result.  ``transparent``: a region
    sees each operand of a group as the value itself and computes the equation's
    results from it by its own equations -- not true of ``shard_map`` (a region sees
    one shard) nor of custom rules (their derivatives are not their regions').
    ``loop(eqn)``: for loops, how the carry flows (``Loop``); None otherwise."""
    groups: Callable[[Any], tuple[ConstantGroup, ...]]
    operand_params: tuple[tuple[str, Any], ...] = ()
    result_params: tuple[str, ...] = ()
    transparent: bool = True
    loop: Callable[[Any], Loop] | None = None


def _call(key: str) -> Callable:
    return lambda eqn: (ConstantGroup(0, len(eqn.inputs), (RegionSlot(key, None, 0),)),)


def _cond(eqn) -> tuple[ConstantGroup, ...]:
    slots = tuple(RegionSlot("branches", i, 0) for i in range(len(eqn.params["branches"])))
    return (ConstantGroup(1, len(eqn.inputs), slots),)


def _while(eqn) -> tuple[ConstantGroup, ...]:
    nc, nb = eqn.params["cond_nconsts"], eqn.params["body_nconsts"]
    return (ConstantGroup(0, nc, (RegionSlot("cond_jaxpr", None, 0),), "cond_nconsts"),
            ConstantGroup(nc, nc + nb, (RegionSlot("body_jaxpr", None, 0),), "body_nconsts"))


def _scan(eqn) -> tuple[ConstantGroup, ...]:
    n = eqn.params["num_consts"]
    return (ConstantGroup(0, n, (RegionSlot("jaxpr", None, 0),), "num_consts"),)


def _while_loop(eqn) -> Loop:
    groups = _while(eqn)
    start = groups[1].stop
    return Loop(carry_start=start, n_carry=len(eqn.inputs) - start, n_xs=0, groups=groups,
                step=RegionSlot("body_jaxpr", None, 0), step_group=1,
                tests=((RegionSlot("cond_jaxpr", None, 0), 0),))


def _scan_loop(eqn) -> Loop:
    groups = _scan(eqn)
    start, n_carry = groups[0].stop, eqn.params["num_carry"]
    return Loop(carry_start=start, n_carry=n_carry, n_xs=len(eqn.inputs) - start - n_carry,
                groups=groups, step=RegionSlot("jaxpr", None, 0), step_group=0,
                carry_param="num_carry")


#: The param counting a custom-rule equation's leading closed-over operands.
_CLOSED_OVER = {"custom_vjp_call": "num_consts", "custom_jvp_call": "num_consts",
                "linear_call": "num_res"}


def closed_over_count(eqn) -> int:
    """How many leading operands of a custom-rule equation are values its rules close
    over (0 for any other equation, and for rules that store no count)."""
    param = _CLOSED_OVER.get(eqn.prim.name)
    return eqn.params.get(param, 0) if param is not None else 0


def _custom(count_param: str, names_param: str | None) -> Callable:
    def groups(eqn) -> tuple[ConstantGroup, ...]:
        p = eqn.params
        # Rules still held as Python callables (JAX's own form) take their constants
        # in ways only JAX knows: no group.  A linear_call whose callee has its own
        # constants interleaves them with the residuals.
        if not is_first_order_custom(eqn.prim.name, p) or p.get("num_callee_consts", 0):
            return ()
        slots = tuple(RegionSlot(key, idx, 0) for key, idx, _ in eqn.regions())
        return (ConstantGroup(0, p[count_param], slots, count_param, names_param),)
    return groups


_JIT = Layout(_call("jaxpr"),
              operand_params=(("in_shardings", UNSPECIFIED_SHARDING), ("in_layouts", None),
                              ("donated_invars", False)),
              result_params=("out_shardings", "out_layouts"))
_REMAT = Layout(_call("jaxpr"), operand_params=(("prevent_cse", False),))

#: The layout of each primitive that holds regions, by primitive name.
LAYOUTS: dict[str, Layout] = {
    "jit": _JIT,
    "pjit": _JIT,
    "closed_call": Layout(_call("call_jaxpr")),
    "core_call": Layout(_call("call_jaxpr")),
    "remat2": _REMAT,
    "checkpoint": _REMAT,
    "shard_map": Layout(_call("jaxpr"), operand_params=(("in_specs", PartitionSpec()),),
                        result_params=("out_specs",), transparent=False),
    "cond": Layout(_cond),
    "while": Layout(_while, loop=_while_loop),
    "scan": Layout(_scan, operand_params=(("linear", False),), loop=_scan_loop),
    "custom_vjp_call": Layout(_custom(_CLOSED_OVER["custom_vjp_call"], "const_names"),
                              transparent=False),
    "custom_jvp_call": Layout(_custom(_CLOSED_OVER["custom_jvp_call"], "const_names"),
                              transparent=False),
    "linear_call": Layout(_custom(_CLOSED_OVER["linear_call"], None), transparent=False),
}


def layout_of(eqn) -> Layout | None:
    return LAYOUTS.get(eqn.prim.name)


def constant_groups(eqn) -> tuple[ConstantGroup, ...]:
    """``eqn``'s constant groups; none when its effects name operands by position
    (moving or adding operands would shift them)."""
    layout = LAYOUTS.get(eqn.prim.name)
    if layout is None or any(is_input_effect(e) for e in eqn.effects):
        return ()
    return layout.groups(eqn)


def loop_of(eqn) -> Loop | None:
    """``eqn``'s carry layout when it is a loop with a table entry, else None."""
    layout = LAYOUTS.get(eqn.prim.name)
    if layout is None or layout.loop is None:
        return None
    return layout.loop(eqn)


def structural_params(eqn) -> frozenset[str]:
    """The params of ``eqn`` that its layout describes: region keys, group and carry
    counts, per-operand and per-result params.  A backend that rebuilds the
    equation from its layout need only understand the others."""
    layout = LAYOUTS.get(eqn.prim.name)
    if layout is None:
        return frozenset()
    names = {key for key, _, _ in eqn.regions()}
    names.update(name for name, _ in layout.operand_params)
    names.update(layout.result_params)
    for group in layout.groups(eqn):
        names.update(n for n in (group.count_param, group.names_param) if n is not None)
    if layout.loop is not None:
        carry_param = layout.loop(eqn).carry_param
        if carry_param is not None:
            names.add(carry_param)
    return frozenset(n for n in names if n in eqn.params)


def resized_params(eqn, keep_inputs, keep_outputs=None) -> dict:
    """``eqn``'s params after dropping the operands (and results) whose ``keep``
    entry is false: group and carry counts recounted, per-operand and per-result
    params filtered.  Dropping a carried operand drops its result too: callers pass
    masks that agree on the carry."""
    layout = LAYOUTS[eqn.prim.name]
    params = dict(eqn.params)
    for group in layout.groups(eqn):
        if group.count_param is not None:
            params[group.count_param] = sum(keep_inputs[group.start:group.stop])
        if group.names_param is not None and group.names_param in params:
            params[group.names_param] = _kept(params[group.names_param],
                                              keep_inputs[group.start:group.stop])
    if layout.loop is not None:
        loop = layout.loop(eqn)
        if loop.carry_param is not None:
            params[loop.carry_param] = sum(keep_inputs[loop.carry_start:loop.carry_start
                                                       + loop.n_carry])
    for name, _ in layout.operand_params:
        if name in params:
            params[name] = _kept(params[name], keep_inputs)
    if keep_outputs is not None:
        for name in layout.result_params:
            if name in params:
                params[name] = _kept(params[name], keep_outputs)
    return params


def grown_params(eqn, group: ConstantGroup, name: str) -> dict:
    """``eqn``'s params after a new last member, named ``name``, joins its
    constant ``group``: the group's count and names, and the per-operand params
    (with the new operand's default entry)."""
    params = dict(eqn.params)
    n = group.stop - group.start
    if group.count_param is not None:
        params[group.count_param] = n + 1
    if group.names_param is not None and isinstance(params.get(group.names_param), tuple):
        params[group.names_param] = params[group.names_param] + (name,)
    for key, entry in layout_of(eqn).operand_params:
        if isinstance(params.get(key), tuple):
            entries = list(params[key])
            entries.insert(group.stop, entry)
            params[key] = tuple(entries)
    return params


def _kept(values, keep):
    if not isinstance(values, tuple) or len(values) != len(keep):
        return values
    return tuple(v for v, k in zip(values, keep) if k)
