"""``copy-propagation``: read values where they come from, not through copies.

Two kinds of equations pass values along unchanged:

* identity equations -- ``copy``, ``convert_element_type`` to the type the value
  already has, ``device_put`` with no device or memory target (inside a program
  it only says "this value"): their readers read the operand instead, and the
  equation is removed.  A conversion that only makes a weakly typed value
  strongly typed is looked through by each reader whose own result types JAX
  computes to be the same either way (``mul(weak, strong)`` is strong anyway);
* wrappers whose region returns one of its inputs (or a literal) as an output --
  calls (``jit`` without a sharding or layout request on that value, nor
  donation; ``closed_call``, ``core_call``; ``checkpoint``), ``cond`` when every
  branch returns the same input, and loop-carried values a ``while`` or ``scan``
  body passes through unchanged: readers of that result read the operand (the
  literal) directly.  The wrapper itself stays (``dce`` shrinks it once nothing
  reads the result).

Custom-rule equations are never looked through: a custom derivative rule may
give an identity primal a different derivative (gradient clipping), which
reading around the equation would lose.  ``shard_map`` is not either (a value
passed through is re-assembled from its shards by the output specification).
Every region is processed (once each, innermost first, so a call whose body
forwards after its own copies are removed is seen as forwarding).  Only values
of exactly the same type (shape, dtype, weak type) are substituted.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..ir.equation import Equation
from ..ir.layouts import LAYOUTS, loop_of
from ..ir.region import Region
from ..jax_adapter import Literal, ShapedArray, UnspecifiedValue, is_input_effect
from .base import Pass, PassContext, register_pass
from .constant_fold import literal_array, same_bits
from .signature import has_regions


def is_noop_convert(eqn: Equation) -> bool:
    """``convert_element_type`` to the dtype and weak type the operand already has."""
    p = eqn.params
    x = eqn.inputs[0]
    aval = x.aval
    return (type(aval) is ShapedArray and p.get("sharding") is None
            and p.get("new_dtype") == aval.dtype and bool(p.get("weak_type")) == aval.weak_type)


def is_weak_to_strong(eqn: Equation) -> bool:
    """``convert_element_type`` that only makes a weakly typed value strongly typed
    (same dtype): the value is unchanged, only how JAX promotes it."""
    p = eqn.params
    aval = eqn.inputs[0].aval
    return (type(aval) is ShapedArray and aval.weak_type and p.get("sharding") is None
            and p.get("new_dtype") == aval.dtype and not p.get("weak_type"))


def forward_weak_operand(region: Region, eqn: Equation) -> int:
    """Let readers of a weak->strong conversion read the weak value where the weak
    type makes no difference to them: an equation (without regions) whose result
    types, computed by JAX for the weak operand, are exactly the ones it has.
    Region outputs keep the strong value (a caller would see the weak type)."""
    src, out = eqn.inputs[0], eqn.outputs[0]
    moved = 0
    for consumer, pos in region.users(out):
        if consumer is region.exit or has_regions(consumer) or consumer.effects:
            continue
        avals = [a.aval for a in consumer.inputs]
        avals[pos] = src.aval
        try:
            result, _ = consumer.prim.abstract_eval(*avals, **consumer.params)
        except Exception:  # noqa: BLE001 -- a rule that cannot tell: keep the conversion
            continue
        if not consumer.prim.multiple_results:
            result = [result]
        if len(result) != len(consumer.outputs) or any(
                r != o.aval for r, o in zip(result, consumer.outputs)):
            continue
        region.set_operand(consumer, pos, src)
        moved += 1
    return moved


def _same_literal(a, b) -> bool:
    return a.aval == b.aval and same_bits(literal_array(a), literal_array(b))


# --------------------------------------------------------------------------- identities
def _copy(eqn):
    return [0]


def _convert(eqn):
    return [0] if is_noop_convert(eqn) else None


def _device_put(eqn):
    p = eqn.params
    devices, srcs = p.get("devices", ()), p.get("srcs", ())
    if len(devices) != len(eqn.inputs) or any(d is not None for d in devices) \
            or any(s is not None for s in srcs):
        return None
    return list(range(len(eqn.inputs)))


#: Identity equations: primitive -> function giving, per result, the operand
#: position it equals (or None when this equation is not an identity).
IDENTITIES: dict[str, Callable[[Equation], list[int] | None]] = {
    "copy": _copy,
    "copy_p": _copy,
    "convert_element_type": _convert,
    "device_put": _device_put,
}


# --------------------------------------------------------------------------- wrappers
def _region_forwards(region: Region) -> list:
    """Per output of ``region``: the input index it returns, a Literal, or None."""
    index = {v: i for i, v in enumerate(region.invars)}
    out = []
    for a in region.outvars:
        if type(a) is Literal:
            out.append(a)
        else:
            out.append(index.get(a))
    return out


def _call(param: str, jit: bool = False):
    def forwards(eqn):
        p = eqn.params
        result = []
        for i, f in enumerate(_region_forwards(p[param])):
            if jit and f is not None and not _jit_transparent(p, i, f):
                f = None
            result.append(f)
        return result
    return forwards


def _jit_transparent(p: dict, out_index: int, src) -> bool:
    """A ``jit`` passes a value along unchanged unless it reshards, re-lays-out or
    donates it."""
    def unspecified(key, i):
        seq = p.get(key)
        return seq is None or isinstance(seq[i], UnspecifiedValue)

    def none(key, i):
        seq = p.get(key)
        return seq is None or seq[i] is None

    if not (unspecified("out_shardings", out_index) and none("out_layouts", out_index)):
        return False
    if isinstance(src, int):
        donated = p.get("donated_invars")
        if not (unspecified("in_shardings", src) and none("in_layouts", src)) or (
                donated is not None and donated[src]):
            return False
    return True


def _cond(eqn):
    per_branch = [_region_forwards(b) for b in eqn.params["branches"]]
    result = []
    for outs in zip(*per_branch):
        first = outs[0]
        if first is None:
            result.append(None)
        elif type(first) is Literal:
            same = all(type(o) is Literal and _same_literal(first, o) for o in outs[1:])
            result.append(first if same else None)
        else:
            same = all(type(o) is int and o == first for o in outs[1:])
            result.append(first + 1 if same else None)  # operand 0 is the index
    return result


def _loop(eqn):
    """A carried value the step region returns unchanged is the initial one."""
    loop = loop_of(eqn)
    step: Region = loop.step.region(eqn)
    first = loop.group_size(loop.step_group)
    result = [None] * len(eqn.outputs)
    for i in range(loop.n_carry):
        if step.outvars[i] is step.invars[first + i]:
            result[i] = loop.carry_start + i
    return result


#: Wrappers: primitive -> function giving, per result, the operand position it
#: passes along unchanged, a Literal it always returns, or None.
WRAPPERS: dict[str, Callable[[Equation], list]] = {
    "jit": _call("jaxpr", jit=True),
    "pjit": _call("jaxpr", jit=True),
    "closed_call": _call("call_jaxpr"),
    "core_call": _call("call_jaxpr"),
    "checkpoint": _call("jaxpr"),
    "remat2": _call("jaxpr"),
    "cond": _cond,
}
WRAPPERS.update({name: _loop for name, layout in LAYOUTS.items() if layout.loop is not None})


@register_pass("copy-propagation")
@dataclass(frozen=True)
class CopyPropagation(Pass):
    summary = "read values through copies, no-op conversions and pass-through wrappers"

    def run(self, program, ctx: PassContext):
        prop = _Propagator(ctx)
        prop.region(program.body)
        ctx.changed = prop.changed
        return program


class _Propagator:
    def __init__(self, ctx: PassContext):
        self.ctx = ctx
        self.done: set[int] = set()
        self._alive: list[Region] = []
        self.changed = False

    def region(self, region: Region) -> None:
        if id(region) in self.done:
            return
        self.done.add(id(region))
        self._alive.append(region)
        identities, wrappers = IDENTITIES, WRAPPERS
        forwarded = removed = 0
        for eqn in region.equations:
            name = eqn.prim.name
            if name == "convert_element_type" and is_weak_to_strong(eqn):
                moved = forward_weak_operand(region, eqn)
                if moved:
                    forwarded += moved
                    if not region.has_users(eqn.outputs[0]):
                        region.erase(eqn)
                        removed += 1
                continue
            identity = identities.get(name)
            if identity is not None:
                positions = identity(eqn)
                if positions is None or eqn.effects:
                    continue
                ok = True
                for out, pos in zip(eqn.outputs, positions):
                    if eqn.inputs[pos].aval != out.aval:
                        ok = False
                        break
                if not ok:
                    continue
                for out, pos in zip(eqn.outputs, positions):
                    if region.replace_all_uses_with(out, eqn.inputs[pos]):
                        forwarded += 1
                region.erase(eqn)
                removed += 1
                continue
            if not has_regions(eqn):
                continue
            for _, _, sub in eqn.regions():
                self.region(sub)
            wrapper = wrappers.get(name)
            if wrapper is None or any(is_input_effect(e) for e in eqn.effects):
                continue
            for out, src in zip(eqn.outputs, wrapper(eqn)):
                if src is None:
                    continue
                atom = src if type(src) is Literal else eqn.inputs[src]
                if atom.aval != out.aval or not region.has_users(out):
                    continue
                region.replace_all_uses_with(out, atom)
                forwarded += 1
        if forwarded or removed:
            self.changed = True
            if forwarded:
                self.ctx.count("values-forwarded", forwarded)
            if removed:
                self.ctx.count("equations-removed", removed)


def propagate_copies(program, ctx: PassContext | None = None):
    """Run ``copy-propagation`` in place on ``program`` (no copy); returns it."""
    return CopyPropagation().run(program, ctx or PassContext())
