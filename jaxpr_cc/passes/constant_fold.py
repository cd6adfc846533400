"""``constant-fold{max-bytes=N}``: evaluate equations whose operands are all known.

A value is a *known constant* when it is a literal, a constant of its region
(``region.consts``; never a hoisted parameter: those are inputs of the body), or
the result of an equation folded here.  In each region (every region, once each),
equations whose operands are all known form a constant subgraph; it is evaluated
in one ``jax.jit`` whose known inputs are embedded as constants -- exactly what
XLA sees when it compiles the unfolded program, so the folded values are the
ones a jitted run of the original computes (XLA constant-folds with its own
evaluator, which rounds transcendental functions differently from its CPU
kernels and never flushes denormals).  Each folded result then becomes:

* a scalar -> a literal;
* an array whose elements are all the same bits -> ``broadcast_in_dim`` of a
  scalar literal (the form JAX itself stages ``jnp.full`` in; no constant);
* any other array -> a constant of the top-level region.  Nested regions never
  receive constants (a program with nested constants is no longer first-order,
  which the saved-program format requires), so such results stay computed there.

Results larger than ``max_bytes`` are not folded (nor anything computed from
them), which bounds both the constants a program gains and the work of
evaluating them.  Never folded: equations with effects, host callbacks,
random-bit generation, custom-rule equations (their regions are folded inside,
each keeping its signature, so a rule stays valid for its primal), collectives,
sharding and layout annotations, loops (a constant ``while`` need not
terminate), and anything with such an equation in a nested region.

Scalar literal operands (and splat constants) of calls, branches and loop
constants are substituted into the called region first (a region shared with
other equations is copied for this one), so constants reach nested regions;
``dce`` then drops the operands nothing reads any more.

This module also holds the small constant helpers ``simplify`` shares: literal
construction, reading scalar constants behind an operand, and evaluation.
"""
from __future__ import annotations

import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Iterable

import jax
import numpy as np

from ..backends.jaxpr import region_to_closed_jaxpr
from ..closure.ir_rules import FIRST_ORDER_KEYS
from ..ir.equation import Equation
from ..ir.layouts import constant_groups, layout_of
from ..ir.region import Region
from ..ir.value import Value
from ..jax_adapter import (ExtendedDType, Literal, ShapedArray, TypedComplex, TypedFloat, TypedInt,
                           TypedNdArray, eval_jaxpr, no_effects)
from .base import Pass, PassContext, register_pass
from .effects import CALLBACK_PRIMITIVES, RANDOM_PRIMITIVES
from .sharing import RegionOwnership
from .signature import has_regions, set_inputs
from ..ir.structural_key import KeyMaker

# --------------------------------------------------------------------------- constants
_USABLE_DTYPES: dict[Any, bool] = {}


def is_usable_aval(aval) -> bool:
    """A plain array of a numeric or boolean dtype: the values this module evaluates
    and turns into literals (not PRNG keys, float0 tangents, tokens or references)."""
    if type(aval) is not ShapedArray:
        return False
    dtype = aval.dtype
    hit = _USABLE_DTYPES.get(dtype)
    if hit is None:
        hit = (not isinstance(dtype, ExtendedDType)) and (
            dtype == np.bool_ or bool(jax.numpy.issubdtype(dtype, np.number)))
        _USABLE_DTYPES[dtype] = hit
    return hit


def literal_array(lit: Literal) -> np.ndarray:
    """The value of a literal as a 0-d numpy array of its dtype."""
    return np.asarray(lit.val, dtype=lit.aval.dtype)


def make_literal(value: Any, aval) -> Literal:
    """A scalar ``Literal`` of type ``aval`` holding ``value``, in the form JAX stages:
    Python ``bool`` for booleans, JAX's typed Python scalars for weakly typed
    numbers, a typed 0-d host array otherwise."""
    dtype = np.dtype(aval.dtype)
    host = np.asarray(value, dtype=dtype).reshape(())
    if dtype == np.bool_:
        return Literal(bool(host), aval)
    if aval.weak_type:
        kind = dtype.kind
        if kind in "iu":
            return Literal(TypedInt(int(host), dtype), aval)
        if kind == "c":
            return Literal(TypedComplex(complex(host), dtype), aval)
        if kind == "f" or jax.numpy.issubdtype(dtype, np.floating):
            return Literal(TypedFloat(float(host), dtype), aval)
    return Literal(TypedNdArray(host, aval), aval)


def scalar_constant(atom) -> np.ndarray | None:
    """The scalar every element of ``atom`` equals, when that is known locally: a
    scalar literal, or ``broadcast_in_dim`` of one (how JAX stages ``jnp.full``)."""
    if type(atom) is Literal:
        return literal_array(atom) if np.ndim(atom.val) == 0 else None
    producer = atom.producer
    if type(producer) is Equation and producer.prim.name == "broadcast_in_dim":
        src = producer.inputs[0]
        if type(src) is Literal and np.ndim(src.val) == 0:
            return literal_array(src)
    return None


def concrete_value(atom, known: dict) -> np.ndarray | None:
    """The value of ``atom`` when it is a literal, a known constant or a splat."""
    if type(atom) is Literal:
        return literal_array(atom)
    value = known.get(atom)
    if value is not None:
        return np.asarray(value)
    scalar = scalar_constant(atom)
    if scalar is not None:
        return np.broadcast_to(scalar, atom.aval.shape)
    return None


def is_splat_equation(eqn: Equation) -> bool:
    """``broadcast_in_dim`` of a scalar literal: already the canonical form of a
    constant array whose elements are all equal."""
    return (eqn.prim.name == "broadcast_in_dim" and type(eqn.inputs[0]) is Literal
            and np.ndim(eqn.inputs[0].val) == 0)


def splat_allowed(aval) -> bool:
    """A ``broadcast_in_dim`` without a sharding request types exactly as ``aval``:
    true unless ``aval`` is sharded over a mesh (explicit sharding in types)."""
    sharding = getattr(aval, "sharding", None)
    mesh = getattr(sharding, "mesh", None)
    return mesh is None or bool(getattr(mesh, "empty", False))


def splat_params(aval) -> dict:
    return {"shape": tuple(aval.shape), "broadcast_dimensions": (), "sharding": None}


def become_splat(region: Region, eqn: Equation, scalar: Any) -> None:
    """Turn the single-result ``eqn`` into ``broadcast_in_dim`` of a literal, in place:
    its result (and every use of it) stays, its operands and regions go."""
    out = eqn.outputs[0]
    lit = make_literal(scalar, ShapedArray((), out.aval.dtype, weak_type=out.aval.weak_type))
    set_inputs(region, eqn, [lit])
    eqn.prim = jax.lax.broadcast_in_dim_p
    eqn.params = splat_params(out.aval)
    eqn.effects = no_effects


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Bitwise equality of two arrays of one dtype (``-0.0 != 0.0``, NaN payloads count)."""
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return a.reshape(-1).view(np.uint8).tobytes() == b.reshape(-1).view(np.uint8).tobytes()


def splat_scalar(a: np.ndarray) -> np.ndarray | None:
    """The scalar all elements of ``a`` share bit for bit, or None."""
    flat = np.ascontiguousarray(a).reshape(-1)
    if flat.size == 0:
        return np.zeros((), a.dtype)
    rows = flat.view(np.uint8).reshape(flat.size, a.dtype.itemsize)
    if (rows == rows[0]).all():
        return flat[0:1].reshape(())
    return None


def aval_bytes(aval) -> int:
    return int(np.prod(aval.shape, dtype=np.int64)) * np.dtype(aval.dtype).itemsize


def evaluate(eqns: Iterable[Equation], known: dict[Value, Any], wanted: Iterable[Value]) -> list:
    """Evaluate ``eqns`` (in order; every operand is a literal, a key of ``known`` or a
    result of an earlier one) under ``jax.jit`` with the known values embedded as
    constants, so XLA treats them as it does in the whole program; returns the
    values of ``wanted`` as host arrays, None for each value that a program run
    op by op (``Program.__call__``: XLA's kernels, operands passed as arguments)
    computes with other bits.

    The two differ by an ulp where XLA's compile-time evaluator rounds a
    transcendental function differently from its CPU kernel (``expm1(1e-7)``) or
    keeps a denormal the kernel flushes: such a value has no single folded form
    that leaves both a jitted and an op-by-op run unchanged, so it stays computed.
    Integer-only evaluations are exact and are not evaluated twice."""
    scratch = Region(closed=True)
    env: dict[Value, Value] = {}
    for eqn in eqns:
        inputs = []
        for a in eqn.inputs:
            if type(a) is Value:
                mapped = env.get(a)
                if mapped is None:
                    mapped = env[a] = scratch.add_const(a.aval, known[a])
                inputs.append(mapped)
            else:
                inputs.append(a)
        outputs = [Value(o.aval) for o in eqn.outputs]
        env.update(zip(eqn.outputs, outputs))
        scratch.append(Equation(eqn.prim, inputs, outputs, eqn.params, eqn.effects,
                                eqn.source_info, eqn.ctx))
    wanted = list(wanted)
    scratch.set_outvars([env[v] for v in wanted])
    # The same constant subgraph recurs (a rule region at every call site, every
    # round of canonicalize): its exact structure and constant bytes key a cache.
    key = KeyMaker().region(scratch)
    hit = _EVALUATED.get(key)
    if hit is not None:
        _EVALUATED.move_to_end(key)
        return list(hit)
    closed = region_to_closed_jaxpr(scratch)
    jaxpr, consts = closed.jaxpr, closed.consts
    values = [np.asarray(v) for v in jax.jit(lambda: eval_jaxpr(jaxpr, consts))()]
    if any(_inexact_values(eqn) for eqn in scratch.equations):
        op_by_op = [np.asarray(v) for v in eval_jaxpr(jaxpr, consts)]
        values = [v if same_bits(v, w) else None for v, w in zip(values, op_by_op)]
    _remember(key, values)
    return values


def _inexact_values(eqn: Equation) -> bool:
    return any(np.issubdtype(np.dtype(v.aval.dtype), np.inexact)
               for v in [*eqn.inputs, *eqn.outputs]
               if not isinstance(v.aval.dtype, ExtendedDType))


# Results of ``evaluate`` by the structural key of what was evaluated (least
# recently used first), bounded in total bytes.
_EVALUATED: "OrderedDict[tuple, tuple]" = OrderedDict()
_EVALUATED_BYTES = [0]
_EVALUATED_LIMIT = 64 << 20


def _remember(key: tuple, values: list) -> None:
    size = sum(int(v.nbytes) for v in values if v is not None)
    if size > _EVALUATED_LIMIT // 8:
        return
    _EVALUATED[key] = tuple(values)
    _EVALUATED_BYTES[0] += size
    while _EVALUATED_BYTES[0] > _EVALUATED_LIMIT:
        _, old = _EVALUATED.popitem(last=False)
        _EVALUATED_BYTES[0] -= sum(int(v.nbytes) for v in old if v is not None)


# --------------------------------------------------------------------------- what folds
#: Primitives never evaluated at compile time, beyond effects, callbacks and random
#: bits: custom rules (folded inside instead), loops (a constant ``while`` may not
#: terminate; a constant ``scan`` may run for long), annotations whose meaning is the
#: equation itself (barriers, shardings, placement), and collectives (they need
#: the named axes of an enclosing ``shard_map``/``pmap``).
NEVER_FOLD = frozenset(FIRST_ORDER_KEYS) | CALLBACK_PRIMITIVES | RANDOM_PRIMITIVES | frozenset({
    "custom_transpose_call", "custom_lin", "while", "scan",
    "optimization_barrier", "sharding_constraint", "device_put", "mesh_cast", "reshard",
    "pvary", "pbroadcast", "axis_index", "psum", "pmax", "pmin", "ppermute", "pgather",
    "all_gather", "all_to_all", "psum_scatter", "reduce_scatter", "psum_invariant",
    "all_gather_invariant", "shard_map", "xla_pmap", "pmap",
})


def _nonzero_integer_divisor(eqn: Equation, known: dict) -> bool:
    """XLA's compile-time evaluator kills the process (SIGFPE) on an integer
    division by zero, which its CPU kernels define (``x / 0 = -1``, ``x % 0 = x``):
    fold integer ``div``/``rem`` only for a divisor known here to have no zero."""
    divisor = eqn.inputs[1]
    dtype = divisor.aval.dtype
    if not (np.issubdtype(dtype, np.integer)):
        return True
    if type(divisor) is Literal:
        value = literal_array(divisor)
    else:
        value = known.get(divisor)
        if value is None:
            return False  # computed in this batch: its value is not known yet
    return bool(np.all(np.asarray(value) != 0))


#: Extra conditions for evaluating some primitives, by name.
EVALUATION_GUARDS = {"div": _nonzero_integer_divisor, "rem": _nonzero_integer_divisor}


def evaluation_safe(eqn: Equation, known: dict) -> bool:
    """``eqn`` may be evaluated at compile time: not a primitive that never folds,
    no effects, its guard (if any) passes, and the same holds for everything in its
    regions (where only literal operands are known)."""
    name = eqn.prim.name
    if name in NEVER_FOLD or eqn.effects:
        return False
    guard = EVALUATION_GUARDS.get(name)
    if guard is not None and not guard(eqn, known):
        return False
    if has_regions(eqn):
        return all(evaluation_safe(e, {}) for _, _, sub in eqn.regions() for e in sub.equations)
    return True


def propagation_targets(eqn) -> list[tuple]:
    """Regions that see a known operand as is: ``(param, index_or_None, first_operand,
    first_input, count)`` for each region of each constant group of a transparent
    layout (``ir.layouts``)."""
    layout = layout_of(eqn)
    if layout is None or not layout.transparent:
        return []
    return [(slot.key, slot.index, group.start, slot.first_input, group.stop - group.start)
            for group in constant_groups(eqn) for slot in group.slots]


# Equations already evaluated whose results could not be placed (arrays of a nested
# region that are not splats), with the operands they had then: a later run (the
# next round of ``canonicalize``) skips them instead of compiling them again.
_UNPLACEABLE: "weakref.WeakKeyDictionary[Equation, tuple]" = weakref.WeakKeyDictionary()


@register_pass("constant-fold")
@dataclass(frozen=True)
class ConstantFold(Pass):
    summary = "evaluate equations whose operands are all known constants, in every region"
    max_bytes: int = 1 << 20

    def __post_init__(self):
        if self.max_bytes < 0:
            raise ValueError(f"max-bytes must be >= 0, got {self.max_bytes}")

    def run(self, program, ctx: PassContext):
        folder = _Folder(self, program.body, ctx)
        folder.region(program.body, top=True)
        ctx.changed = folder.changed
        return program


class _Folder:
    def __init__(self, options: ConstantFold, root: Region, ctx: PassContext):
        self.max_bytes = options.max_bytes
        self.ctx = ctx
        self.owner = RegionOwnership(root)
        self.done: set[int] = set()
        self._alive: list[Region] = []  # regions seen stay alive, so ids stay unique
        self._region_ok: dict[int, bool] = {}
        self.changed = False

    def count(self, key: str, n: int = 1) -> None:
        if n:
            self.ctx.count(key, n)

    # ------------------------------------------------------------ predicates
    def foldable(self, eqn: Equation, known: dict) -> bool:
        name = eqn.prim.name
        if name in NEVER_FOLD or eqn.effects or not eqn.inputs:
            return False
        guard = EVALUATION_GUARDS.get(name)
        if guard is not None and not guard(eqn, known):
            return False
        for o in eqn.outputs:
            if not is_usable_aval(o.aval) or aval_bytes(o.aval) > self.max_bytes:
                return False
        if has_regions(eqn):
            return all(self.region_foldable(sub) for _, _, sub in eqn.regions())
        return True

    def region_foldable(self, region: Region) -> bool:
        key = id(region)
        hit = self._region_ok.get(key)
        if hit is None:
            self._alive.append(region)
            hit = self._region_ok[key] = all(evaluation_safe(e, {}) for e in region.equations)
        return hit

    # --------------------------------------------------------------- regions
    def region(self, region: Region, top: bool) -> None:
        if id(region) in self.done:
            return
        self.done.add(id(region))
        self._alive.append(region)
        known: dict[Value, Any] = {}
        if region.consts is not None:
            for v, c in zip(region.constvars, region.consts):
                if c is not None and is_usable_aval(v.aval):
                    known[v] = c
                    if not v.aval.shape and region.has_users(v):
                        # A scalar constant is a literal (as JAX stages scalars).
                        region.replace_all_uses_with(v, make_literal(np.asarray(c), v.aval))
                        self.count("literals-created")
                        self.changed = True
        # Folding can make the operands of an integer division by zero known, which
        # is then folded the run-time way, which can make more equations foldable.
        while self.sweep(region, top, known):
            pass
        # Regions last: the constants just folded here reach them as operands.
        for eqn in region.equations:
            if has_regions(eqn):
                self.propagate_into(region, eqn)
                for _, _, sub in eqn.regions():
                    self.region(sub, top=False)

    def sweep(self, region: Region, top: bool, known: dict) -> bool:
        """Fold what is foldable now; True if something was placed."""
        symbolic: set[Value] = set(known)
        candidates: list[Equation] = []
        zero_divisions: list[Equation] = []
        for eqn in region.equations:
            operands_known = True
            for a in eqn.inputs:
                if type(a) is Value:
                    if a not in symbolic:
                        operands_known = False
                        break
                elif not is_usable_aval(a.aval):
                    operands_known = False
                    break
            if not operands_known:
                continue
            if self.foldable(eqn, known):
                candidates.append(eqn)
                symbolic.update(eqn.outputs)
            elif eqn.prim.name in EVALUATION_GUARDS and not eqn.effects:
                zero_divisions.append(eqn)
        placed = self.fold(region, top, candidates, known) if candidates else False
        for eqn in zero_divisions:
            if eqn.region is region:
                placed |= self.fold_at_run_time(region, top, eqn, known)
        return placed

    def fold(self, region: Region, top: bool, candidates: list[Equation], known: dict) -> bool:
        targets = []
        for eqn in candidates:
            if is_splat_equation(eqn) or not any(region.has_users(o) for o in eqn.outputs):
                continue
            stale = _UNPLACEABLE.get(eqn)
            if stale is not None and len(stale) == len(eqn.inputs) and all(
                    a is b for a, b in zip(stale, eqn.inputs)):
                continue
            targets.append(eqn)
        if not targets:
            return False
        # Evaluate the targets and the candidates they depend on, in program order.
        needed: set[Equation] = set(targets)
        for eqn in reversed(candidates):
            if eqn in needed:
                for a in eqn.inputs:
                    if type(a) is Value and type(a.producer) is Equation and a not in known:
                        needed.add(a.producer)
        batch = [e for e in candidates if e in needed]
        wanted = [o for e in targets for o in e.outputs]
        try:
            values = dict(zip(wanted, evaluate(batch, known, wanted)))
        except Exception:  # noqa: BLE001 -- one equation JAX cannot evaluate alone
            values = self.evaluate_one_by_one(batch, known, set(wanted))
        differing = [o for o, v in values.items() if v is None]
        if differing:
            self.count("not-folded (jitted and op-by-op runs differ)", len(differing))
            values = {o: v for o, v in values.items() if v is not None}
        # Last first: a result only folded equations read is then no longer read,
        # and is not materialized.
        placed = False
        for eqn in reversed(targets):
            placed |= self.place(region, top, eqn, values, known)
        return placed

    def fold_at_run_time(self, region: Region, top: bool, eqn: Equation, known: dict) -> bool:
        """An integer division whose operands are known, with a zero divisor: XLA's
        compile-time evaluator would crash on it, so it is evaluated the way the
        unfolded program runs it -- by XLA's kernels, operands passed as arguments
        (``x / 0 = -1``, ``x % 0 = x``) -- and then cannot reach that evaluator."""
        operands = []
        for a in eqn.inputs:
            value = concrete_value(a, known)
            if value is None:
                return False
            operands.append(value)
        if not any(region.has_users(o) for o in eqn.outputs):
            return False
        prim, params = eqn.prim, eqn.params
        try:
            results = jax.jit(lambda *ops: prim.bind(*ops, **params))(*operands)
        except Exception:  # noqa: BLE001 -- leave it to run
            self.count("evaluation-failures")
            return False
        results = results if prim.multiple_results else [results]
        values = {o: np.asarray(r) for o, r in zip(eqn.outputs, results)}
        if self.place(region, top, eqn, values, known):
            self.count("divisions-by-zero-folded")
            return True
        return False

    def evaluate_one_by_one(self, batch: list[Equation], known: dict, wanted: set) -> dict:
        """Fallback when the batch fails: each equation alone, skipping (with what
        depends on it) any that JAX cannot evaluate."""
        values = dict(known)
        out: dict[Value, Any] = {}
        for eqn in batch:
            if any(type(a) is Value and a not in values for a in eqn.inputs):
                continue
            try:
                results = evaluate([eqn], values, eqn.outputs)
            except Exception:  # noqa: BLE001
                self.count("evaluation-failures")
                continue
            for o, r in zip(eqn.outputs, results):
                if r is None:  # jitted and op-by-op runs differ: left computed
                    continue
                values[o] = r
                if o in wanted:
                    out[o] = r
        return out

    def place(self, region: Region, top: bool, eqn: Equation, values: dict, known: dict) -> bool:
        """Replace the used results of ``eqn`` by their folded values where they can
        be held: literal, splat, or (top level only) constant.  True if it did."""
        outs = eqn.outputs
        if any(o not in values for o in outs):
            return False
        if not any(region.has_users(o) for o in outs):
            # Only equations folded after it read it: it is absorbed into them.
            region.erase(eqn)
            self.count("equations-folded")
            self.changed = True
            return False
        if len(outs) == 1 and outs[0].aval.shape and splat_allowed(outs[0].aval):
            scalar = splat_scalar(values[outs[0]])
            if scalar is not None:
                become_splat(region, eqn, scalar)
                self.count("equations-folded")
                self.count("splats-created")
                self.changed = True
                return True
        placed = False
        for o in outs:
            if not region.has_users(o):
                continue
            value = values[o]
            if not o.aval.shape:
                region.replace_all_uses_with(o, make_literal(value, o.aval))
                self.count("literals-created")
            elif top and splat_allowed(o.aval):   # (a constant carries no sharding either)
                cv = region.add_const(o.aval, _device_value(value, o.aval))
                known[cv] = region.consts[-1]
                region.replace_all_uses_with(o, cv)
                self.count("constants-created")
                self.count("bytes-materialized", int(value.nbytes))
            else:
                continue
            placed = True
        if not placed:
            _UNPLACEABLE[eqn] = tuple(eqn.inputs)
            return False
        self.changed = True
        if not any(region.has_users(o) for o in outs):
            region.erase(eqn)
            self.count("equations-folded")
        return True

    # ------------------------------------------------------ into regions
    def propagate_into(self, region: Region, eqn: Equation) -> None:
        """Substitute scalar literal / splat operands into the regions they feed."""
        for key, idx, first_operand, first_input, n in propagation_targets(eqn):
            for k in range(n):
                atom = eqn.inputs[first_operand + k]
                if type(atom) is Value and not (type(atom.producer) is Equation
                                                and is_splat_equation(atom.producer)):
                    continue
                if type(atom) is Literal and (np.ndim(atom.val) or not is_usable_aval(atom.aval)):
                    continue
                param = eqn.params[key]
                sub = param if idx is None else param[idx]
                inner = sub.invars[first_input + k]
                if not sub.has_users(inner) or inner.aval != atom.aval:
                    continue
                if self.owner.is_shared(sub):
                    # A function called from several sites is not specialized for
                    # one of them: that would copy its body per constant.
                    continue
                sub = self.owner.own(eqn, key, idx)
                inner = sub.invars[first_input + k]
                if type(atom) is Literal:
                    sub.replace_all_uses_with(inner, atom)
                else:
                    src = atom.producer
                    copy = Equation(src.prim, list(src.inputs), [Value(atom.aval)], dict(src.params),
                                    no_effects, src.source_info, src.ctx)
                    first = sub.equations[0] if len(sub) else None
                    if first is None:
                        sub.append(copy)
                    else:
                        sub.insert_before(first, copy)
                    sub.replace_all_uses_with(inner, copy.outputs[0])
                self.count("operands-propagated")
                self.changed = True


def _device_value(value: np.ndarray, aval) -> Any:
    """The folded array as a JAX array with the result's weak type, like the
    constants JAX itself closes over."""
    from ..jax_adapter import weak_device_array
    if aval.weak_type:
        return weak_device_array(value)
    return jax.numpy.asarray(value)


def fold_constants(program, ctx: PassContext | None = None, **options):
    """Run ``constant-fold`` in place on ``program`` (no copy); returns it."""
    return ConstantFold(**options).run(program, ctx or PassContext())
