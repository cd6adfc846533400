"""The algebraic identities ``simplify`` applies, as a table keyed by primitive name.

A rule looks at one equation (and the producers of its operands) and returns a
rewrite, or None:

* ``Forward(atoms)``  -- each result is the given operand / literal;
* ``Constant(value)`` -- the single result is a constant scalar everywhere (a
  literal, or ``broadcast_in_dim`` of one);
* ``Become(prim, inputs, params)`` -- the single-result equation is replaced, in
  place, by a cheaper one with the same result;
* ``Inline(region, operands)`` -- the equation is the given region applied to
  ``operands`` (a ``cond`` whose branch is known, a trivial call).

``exact`` rules hold bit for bit for every input -- NaN, infinities, -0.0 and
denormals included -- as XLA evaluates the program under ``jax.jit``, and keep
JAX's derivatives.  Rules that are not only run with ``fast-math``:
``x + 0.0 -> x`` (``-0.0 + 0.0`` is ``+0.0``), ``x * 0.0 -> 0`` (NaN, infinities,
negative x), ``x * -1.0 -> -x`` (XLA's CPU multiply flushes a denormal result to
zero, negation does not), ...  Integer identities are exact (two's-complement
wraparound included).  Some identities hold for values but not for derivatives
and are kept to integers: ``max(x, -inf) -> x`` and ``max(x, x) -> x`` (JAX's
derivative of ``max`` is 0 at NaN, where every comparison is false),
``abs(-x) -> abs(x)`` and ``abs(abs(x)) -> abs(x)`` (the derivative of ``abs`` at
0 and NaN depends on the sign the comparison sees).  Complex
``x * 1`` and ``x / 1`` are left alone: complex products mix the components
(``(a+bi)(1+0i)`` has real part ``a*1 - b*0``, NaN for infinite ``b``).

Only rewrites that keep each result's exact type (shape, dtype, weak type) are
made, so a region's signature never changes and a rewrite inside a shared region
(a custom rule used at several call sites) is valid for every user.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import jax
import numpy as np

from ..ir.equation import Equation
from ..ir.layouts import loop_of
from ..ir.region import Region
from ..ir.value import Atom, Value
from ..jax_adapter import Literal, UnspecifiedValue, is_input_effect
from .constant_fold import evaluate, evaluation_safe, literal_array, same_bits, scalar_constant
from .copy_propagation import is_noop_convert
from .effects import EffectOracle


# --------------------------------------------------------------------------- rewrites
@dataclass
class Forward:
    atoms: list
    # The equation goes even if it has effects (a loop that runs no iteration).
    drop_effects: bool = False


@dataclass
class Constant:
    value: np.ndarray


@dataclass
class Become:
    prim: Any
    inputs: list
    params: dict


@dataclass
class Inline:
    region: Region
    operands: list


@dataclass(frozen=True)
class Rule:
    """One identity.  ``name`` is its statistic; ``exact`` False means fast-math only;
    ``option`` names a further pass option that must be on."""
    name: str
    apply: Callable[[Equation, "RuleContext"], Any]
    exact: bool = True
    option: str | None = None
    doc: str = ""


@dataclass
class RuleContext:
    """What rules may consult besides the equation."""
    fast_math: bool = False
    inline_calls: bool = False


# --------------------------------------------------------------------------- predicates
def _dtype(atom) -> np.dtype:
    return atom.aval.dtype


_KINDS: dict = {}


def _kind(dtype) -> str:
    """'b' bool, 'i' signed, 'u' unsigned, 'f' real float, 'c' complex, '' other
    (numpy's kind letters, with ml_dtypes' floats as 'f'); cached per dtype."""
    kind = _KINDS.get(dtype)
    if kind is None:
        sub = jax.numpy.issubdtype
        if dtype == np.bool_:
            kind = "b"
        elif sub(dtype, np.signedinteger):
            kind = "i"
        elif sub(dtype, np.unsignedinteger):
            kind = "u"
        elif sub(dtype, np.complexfloating):
            kind = "c"
        elif sub(dtype, np.floating):
            kind = "f"
        else:
            kind = ""
        _KINDS[dtype] = kind
    return kind


def is_float(atom) -> bool:
    return _kind(atom.aval.dtype) in ("f", "c")


def is_integer(atom) -> bool:
    return _kind(atom.aval.dtype) in ("b", "i", "u")


def is_signed(atom) -> bool:
    return _kind(atom.aval.dtype) == "i"


def _is(value: np.ndarray | None, target) -> bool:
    """``value`` equals ``target`` bit for bit (so -0.0 is not 0.0)."""
    if value is None:
        return False
    try:
        want = np.asarray(target, dtype=value.dtype)
    except (TypeError, ValueError, OverflowError):
        return False
    return same_bits(value, want)


def _all_ones(dtype) -> np.ndarray:
    if dtype == np.bool_:
        return np.asarray(True)
    return np.invert(np.zeros((), dtype))


def same_atom(a, b) -> bool:
    """The same value, or literals of one type with the same bits."""
    if a is b:
        return True
    if type(a) is Literal and type(b) is Literal:
        return a.aval == b.aval and same_bits(literal_array(a), literal_array(b))
    return False


def fits(atom, out: Value) -> bool:
    """``atom`` can stand for ``out``: the same shape, dtype and weak type."""
    return atom.aval == out.aval


def _forward(atom, eqn) -> Forward | None:
    return Forward([atom]) if fits(atom, eqn.outputs[0]) else None


def _commuted(eqn):
    a, b = eqn.inputs[0], eqn.inputs[1]
    return ((a, b), (b, a))


def _producer(atom, name: str) -> Equation | None:
    if type(atom) is Value and type(atom.producer) is Equation and atom.producer.prim.name == name:
        return atom.producer
    return None


# --------------------------------------------------------------------------- arithmetic
def _identity_operand(target, when: Callable[[Any], bool], commutative: bool = True):
    """``x op c -> x`` where ``c`` is the scalar constant ``target``."""
    def rule(eqn, cx):
        pairs = _commuted(eqn) if commutative else ((eqn.inputs[0], eqn.inputs[1]),)
        for x, c in pairs:
            value = scalar_constant(c)
            if value is not None and when(x) and _is(value, target(c)):
                rw = _forward(x, eqn)
                if rw is not None:
                    return rw
        return None
    return rule


def _absorbing_operand(target, when: Callable[[Any], bool], result=None):
    """``x op c -> c`` (or ``result(c)``) where ``c`` is the scalar constant ``target``."""
    def rule(eqn, cx):
        for x, c in _commuted(eqn):
            value = scalar_constant(c)
            if value is not None and when(x) and _is(value, target(c)):
                return Constant(value if result is None else np.asarray(result(c), value.dtype))
        return None
    return rule


def _self_operands(result: Callable[[Any], Any] | None, when: Callable[[Any], bool] = None):
    """``x op x -> x`` (``result`` None) or ``-> result(x)`` (a constant)."""
    def rule(eqn, cx):
        a, b = eqn.inputs[0], eqn.inputs[1]
        if not same_atom(a, b) or (when is not None and not when(a)):
            return None
        if result is None:
            return _forward(a, eqn)
        return Constant(np.asarray(result(a), dtype=_dtype(eqn.outputs[0])))
    return rule


def is_complex(atom) -> bool:
    return _kind(atom.aval.dtype) == "c"


def _int(x) -> bool:
    return is_integer(x)


def _float(x) -> bool:
    return is_float(x)


def _real(x) -> bool:
    """Integers, booleans and real floats: complex multiplication and division mix
    the components (``(a+bi) * (1+0i)`` has real part ``a*1 - b*0``, NaN for
    infinite ``b``), so identities that hold per component do not hold for them."""
    return not is_complex(x)


def _any(x) -> bool:
    return True


def _neg_of(eqn, cx):
    """``neg(neg(x)) -> x``."""
    inner = _producer(eqn.inputs[0], "neg")
    return _forward(inner.inputs[0], eqn) if inner is not None else None


def _not_not(eqn, cx):
    inner = _producer(eqn.inputs[0], "not")
    return _forward(inner.inputs[0], eqn) if inner is not None else None


def _times_minus_one(when):
    def rule(eqn, cx):
        for x, c in _commuted(eqn):
            value = scalar_constant(c)
            if value is not None and when(x) and _is(value, -1) and fits(x, eqn.outputs[0]):
                return Become(jax.lax.neg_p, [x], {})
        return None
    return rule


def _zero_minus(when, zero):
    def rule(eqn, cx):
        a, x = eqn.inputs
        value = scalar_constant(a)
        if value is not None and when(x) and _is(value, zero) and fits(x, eqn.outputs[0]):
            return Become(jax.lax.neg_p, [x], {})
        return None
    return rule


def _rhs_is(target, when):
    """``x op c -> x`` for a right operand ``c`` only (``x - 0``, ``x / 1``, ``x << 0``)."""
    def rule(eqn, cx):
        x, c = eqn.inputs[0], eqn.inputs[1]
        value = scalar_constant(c)
        if value is not None and when(x) and _is(value, target(c)):
            return _forward(x, eqn)
        return None
    return rule


def _rem_one(eqn, cx):
    x, c = eqn.inputs
    value = scalar_constant(c)
    if value is not None and _kind(x.aval.dtype) in ("i", "u") and _is(value, 1):
        return Constant(np.zeros((), _dtype(eqn.outputs[0])))
    return None


def _abs_of(eqn, cx):
    """``abs(abs(x)) -> abs(x)``; ``abs(-x) -> abs(x)`` for signed integers (for an
    unsigned ``x``, ``-x`` wraps around and ``abs`` is the identity: 1 vs 255).
    Not for floats: JAX's derivative of ``abs(u)`` is ``t if u >= 0 else -t``, so
    at ``x = 0`` (``-0.0 >= 0``) and NaN the two sides' derivatives differ."""
    x = eqn.inputs[0]
    kind = _kind(x.aval.dtype)
    if kind not in ("i", "u"):
        return None
    if _producer(x, "abs") is not None:
        return _forward(x, eqn)
    inner = _producer(x, "neg")
    if inner is not None and kind == "i" and fits(inner.inputs[0], x):
        return Become(eqn.prim, [inner.inputs[0]], dict(eqn.params))
    return None


def _integer_pow(eqn, cx):
    y = eqn.params.get("y")
    x = eqn.inputs[0]
    if y == 1:
        return _forward(x, eqn)
    if y == 0:
        return Constant(np.ones((), _dtype(eqn.outputs[0])))
    return None


# --------------------------------------------------------------------------- structure
def _noop_convert(eqn, cx):
    return _forward(eqn.inputs[0], eqn) if is_noop_convert(eqn) else None


def _convert_roundtrip(eqn, cx):
    """``convert(convert(x: A -> B) -> A) -> x`` for integers/booleans when B holds
    every value of A (the inner conversion is exact, so the outer one undoes it)."""
    inner = _producer(eqn.inputs[0], "convert_element_type")
    if inner is None or eqn.params.get("sharding") is not None:
        return None
    x = inner.inputs[0]
    a, b = _dtype(x), _dtype(eqn.inputs[0])
    if not (is_integer(x) and is_integer(eqn.inputs[0])) or not np.can_cast(a, b, "safe"):
        return None
    return _forward(x, eqn)


def _noop_reshape(eqn, cx):
    p = eqn.params
    if p.get("dimensions") is None and p.get("sharding") is None \
            and tuple(p["new_sizes"]) == tuple(eqn.inputs[0].aval.shape):
        return _forward(eqn.inputs[0], eqn)
    return None


def _reshape_of_reshape(eqn, cx):
    """``reshape(reshape(x)) -> reshape(x)`` (``squeeze`` is a reshape too)."""
    p = eqn.params
    if p.get("dimensions") is not None or p.get("sharding") is not None:
        return None
    x = eqn.inputs[0]
    inner = _producer(x, "reshape")
    if inner is not None and (inner.params.get("dimensions") is not None
                              or inner.params.get("sharding") is not None):
        inner = None
    if inner is None:
        inner = _producer(x, "squeeze")
    if inner is None:
        return None
    src = inner.inputs[0]
    if tuple(src.aval.shape) == tuple(eqn.outputs[0].aval.shape):
        return _forward(src, eqn)
    return Become(eqn.prim, [src], dict(p))


def _noop_squeeze(eqn, cx):
    return _forward(eqn.inputs[0], eqn) if not tuple(eqn.params["dimensions"]) else None


def _noop_transpose(eqn, cx):
    perm = tuple(eqn.params["permutation"])
    return _forward(eqn.inputs[0], eqn) if perm == tuple(range(len(perm))) else None


def _transpose_of_transpose(eqn, cx):
    inner = _producer(eqn.inputs[0], "transpose")
    if inner is None:
        return None
    outer_perm, inner_perm = eqn.params["permutation"], inner.params["permutation"]
    composed = tuple(inner_perm[i] for i in outer_perm)
    src = inner.inputs[0]
    if composed == tuple(range(len(composed))):
        return _forward(src, eqn)
    return Become(eqn.prim, [src], dict(eqn.params, permutation=composed))


def _noop_broadcast(eqn, cx):
    p = eqn.params
    x = eqn.inputs[0]
    shape = tuple(x.aval.shape)
    if p.get("sharding") is None and tuple(p["shape"]) == shape \
            and tuple(p["broadcast_dimensions"]) == tuple(range(len(shape))):
        return _forward(x, eqn)
    return None


def _noop_rev(eqn, cx):
    return _forward(eqn.inputs[0], eqn) if not tuple(eqn.params["dimensions"]) else None


def _noop_slice(eqn, cx):
    p = eqn.params
    x = eqn.inputs[0]
    strides = p.get("strides")
    if all(s == 0 for s in p["start_indices"]) and tuple(p["limit_indices"]) == tuple(x.aval.shape) \
            and (strides is None or all(s == 1 for s in strides)):
        return _forward(x, eqn)
    return None


def _noop_pad(eqn, cx):
    if all(tuple(c) == (0, 0, 0) for c in eqn.params["padding_config"]):
        return _forward(eqn.inputs[0], eqn)
    return None


def _full_dynamic_slice(eqn, cx):
    """Start indices are clamped so the slice fits: a full-size slice is the operand."""
    x = eqn.inputs[0]
    if tuple(eqn.params["slice_sizes"]) == tuple(x.aval.shape):
        return _forward(x, eqn)
    return None


def _full_dynamic_update(eqn, cx):
    x, update = eqn.inputs[0], eqn.inputs[1]
    if tuple(update.aval.shape) == tuple(x.aval.shape):
        return _forward(update, eqn)
    return None


def _single_concatenate(eqn, cx):
    return _forward(eqn.inputs[0], eqn) if len(eqn.inputs) == 1 else None


def _noop_reduce_precision(eqn, cx):
    x = eqn.inputs[0]
    try:
        info = jax.numpy.finfo(_dtype(x))
    except (TypeError, ValueError):
        return None
    if eqn.params["exponent_bits"] == info.nexp and eqn.params["mantissa_bits"] == info.nmant:
        return _forward(x, eqn)
    return None


def _part_of_complex(index: int):
    def rule(eqn, cx):
        inner = _producer(eqn.inputs[0], "complex")
        return _forward(inner.inputs[index], eqn) if inner is not None else None
    return rule


# --------------------------------------------------------------------------- selection
def _select_constant_predicate(eqn, cx):
    pred, cases = eqn.inputs[0], eqn.inputs[1:]
    value = scalar_constant(pred)
    if value is None:
        return None
    index = int(value)
    if 0 <= index < len(cases):
        return _forward(cases[index], eqn)
    return None


def _select_same_cases(eqn, cx):
    cases = eqn.inputs[1:]
    if all(same_atom(cases[0], c) for c in cases[1:]):
        return _forward(cases[0], eqn)
    return None


def _has_input_effects(eqn) -> bool:
    return any(is_input_effect(e) for e in eqn.effects)


def _cond_constant_index(eqn, cx):
    """``cond`` on a literal index is its branch (an out-of-range index runs the last
    branch, as XLA's conditional does)."""
    index = eqn.inputs[0]
    if type(index) is not Literal or _has_input_effects(eqn):
        return None
    branches = eqn.params["branches"]
    i = int(literal_array(index))
    if not 0 <= i < len(branches):
        i = len(branches) - 1
    return Inline(branches[i], list(eqn.inputs[1:]))


def _while_false(eqn, cx):
    """A ``while`` whose condition is false on its initial carry runs no iteration:
    its results are the initial carry.  The condition must depend only on literal
    operands (and be free of effects) to be evaluated here."""
    if _has_input_effects(eqn):
        return None
    loop = loop_of(eqn)
    (cond_slot, cond_group), = loop.tests
    cond_consts = loop.groups[cond_group]
    cond: Region = cond_slot.region(eqn)
    oracle = EffectOracle()
    if any(oracle.has_side_effects(e) for e in cond.equations):
        return None  # the condition runs once even when the body does not
    carry = list(eqn.inputs[loop.carry_start:loop.carry_start + loop.n_carry])
    operands = list(eqn.inputs[cond_consts.start:cond_consts.stop]) + carry
    if not all(fits(a, o) for a, o in zip(carry, eqn.outputs)):
        return None
    out = cond.outvars[0]
    if type(out) is Literal:
        value = literal_array(out)
    else:
        value = _evaluate_from_literals(cond, out, operands)
        if value is None:
            return None
    if bool(value):
        return None
    return Forward(carry, drop_effects=True)


def _evaluate_from_literals(region: Region, out: Value, operands: Sequence[Atom]):
    """The value of ``out`` when it depends only on region inputs fed by scalar
    constants and on equations that may be evaluated at compile time."""
    feeding = dict(zip(region.invars, operands))
    slice_eqns: list[Equation] = []
    needed = {out}
    known: dict[Value, Any] = {}
    for eqn in reversed(region.equations):
        if not any(o in needed for o in eqn.outputs):
            continue
        if eqn.has_regions() or not evaluation_safe(eqn, {}):
            return None
        slice_eqns.append(eqn)
        for a in eqn.inputs:
            if type(a) is Value:
                needed.add(a)
    for v in needed:
        if v.producer is region.entry:
            if v not in feeding:
                return None  # a constant of the region: leave it to constant-fold
            value = scalar_constant(feeding[v])
            if value is None:
                return None
            known[v] = np.broadcast_to(value, v.aval.shape)
    if out in known:
        return known[out]
    slice_eqns.reverse()
    try:
        return evaluate(slice_eqns, known, [out])[0]
    except Exception:  # noqa: BLE001 -- not evaluable here: keep the loop
        return None


_NEUTRAL_JIT_PARAMS = ("in_shardings", "out_shardings")


def _trivial_jit(eqn) -> bool:
    """A ``jit`` with no placement, layout, donation or compiler options: inlining
    it changes nothing XLA computes (XLA inlines nested calls itself)."""
    p = eqn.params
    for key in _NEUTRAL_JIT_PARAMS:
        if not all(isinstance(s, UnspecifiedValue) for s in p.get(key, ())):
            return False
    if any(x is not None for x in p.get("in_layouts", ())) or \
            any(x is not None for x in p.get("out_layouts", ())):
        return False
    if any(p.get("donated_invars", ())) or p.get("compiler_options_kvs"):
        return False
    return True


def _inline_call(param: str, check: Callable[[Equation], bool] | None = None):
    def rule(eqn, cx):
        if not cx.inline_calls or _has_input_effects(eqn):
            return None
        if check is not None and not check(eqn):
            return None
        return Inline(eqn.params[param], list(eqn.inputs))
    return rule


# --------------------------------------------------------------------------- the table
def _r(name, apply, exact=True, option=None, doc=""):
    return Rule(name, apply, exact, option, doc)


def _zero(c):
    return 0


def _one(c):
    return 1


def _neg_zero(c):
    # Both components of a complex zero carry the sign.
    return complex(-0.0, -0.0) if is_complex(c) else -0.0


def _ones_bits(c):
    return _all_ones(_dtype(c))


def _lowest(c):
    dtype = _dtype(c)
    return False if dtype == np.bool_ else jax.numpy.iinfo(dtype).min


def _highest(c):
    dtype = _dtype(c)
    return True if dtype == np.bool_ else jax.numpy.iinfo(dtype).max

_ADD = (
    _r("add-zero-int", _identity_operand(_zero, _int), doc="x + 0 -> x (integers)"),
    _r("add-neg-zero", _identity_operand(_neg_zero, _float), doc="x + (-0.0) -> x"),
    _r("add-zero-float", _identity_operand(_zero, _float), exact=False,
       doc="x + 0.0 -> x (wrong for x = -0.0)"),
)

SIMPLIFY_RULES: dict[str, tuple[Rule, ...]] = {
    "add": _ADD,
    "add_any": _ADD,
    "sub": (
        _r("sub-zero", _rhs_is(_zero, _any), doc="x - 0 -> x (+0.0 for floats)"),
        _r("sub-self-int", _self_operands(lambda a: 0, _int), doc="x - x -> 0 (integers)"),
        _r("sub-from-zero-int", _zero_minus(_int, 0), doc="0 - x -> -x (integers)"),
        _r("sub-neg-zero-float", _rhs_is(_neg_zero, _float), exact=False,
           doc="x - (-0.0) -> x (wrong for x = -0.0)"),
        _r("sub-self-float", _self_operands(lambda a: 0), exact=False,
           doc="x - x -> 0 (wrong for NaN and infinities)"),
        _r("sub-from-zero-float", _zero_minus(_float, -0.0), exact=False,
           doc="-0.0 - x -> -x (differs on denormals, which subtraction flushes)"),
    ),
    "mul": (
        _r("mul-one", _identity_operand(_one, _real), doc="x * 1 -> x (not complex)"),
        _r("mul-zero-int", _absorbing_operand(_zero, _int), doc="x * 0 -> 0 (integers)"),
        _r("mul-minus-one-int", _times_minus_one(is_signed), doc="x * -1 -> -x (integers)"),
        _r("mul-zero-float", _absorbing_operand(_zero, _float), exact=False,
           doc="x * 0.0 -> 0.0 (wrong for NaN, infinities and negative x)"),
        _r("mul-minus-one-float", _times_minus_one(_float), exact=False,
           doc="x * -1.0 -> -x (differs on denormals, which multiplication flushes)"),
    ),
    "div": (
        _r("div-one", _rhs_is(_one, _real), doc="x / 1 -> x (not complex)"),
        _r("div-self", _self_operands(lambda a: 1), exact=False,
           doc="x / x -> 1 (wrong for 0, NaN and infinities)"),
    ),
    "rem": (_r("rem-one-int", _rem_one, doc="x % 1 -> 0 (integers)"),),
    "neg": (_r("neg-neg", _neg_of, doc="-(-x) -> x"),),
    "not": (_r("not-not", _not_not, doc="~~x -> x"),),
    "and": (
        _r("and-all-ones", _identity_operand(_ones_bits, _int), doc="x & ~0 -> x"),
        _r("and-zero", _absorbing_operand(_zero, _int), doc="x & 0 -> 0"),
        _r("and-self", _self_operands(None), doc="x & x -> x"),
    ),
    "or": (
        _r("or-zero", _identity_operand(_zero, _int), doc="x | 0 -> x"),
        _r("or-all-ones", _absorbing_operand(_ones_bits, _int), doc="x | ~0 -> ~0"),
        _r("or-self", _self_operands(None), doc="x | x -> x"),
    ),
    "xor": (
        _r("xor-zero", _identity_operand(_zero, _int), doc="x ^ 0 -> x"),
        _r("xor-self", _self_operands(lambda a: 0), doc="x ^ x -> 0"),
    ),
    "shift_left": (_r("shift-by-zero", _rhs_is(_zero, _int), doc="x << 0 -> x"),),
    "shift_right_logical": (_r("shift-by-zero", _rhs_is(_zero, _int), doc="x >> 0 -> x"),),
    "shift_right_arithmetic": (_r("shift-by-zero", _rhs_is(_zero, _int), doc="x >> 0 -> x"),),
    # Integers only: for floats the values agree, but JAX's derivative of max/min
    # splits the tangent by comparisons, which are all false for NaN (and tie
    # for max(x, x)), so the gradient would change from 0 (or a split) to 1.
    "max": (
        _r("max-self", _self_operands(None, _int), doc="max(x, x) -> x (integers)"),
        _r("max-lowest", _identity_operand(_lowest, _int), doc="max(x, lowest) -> x (integers)"),
    ),
    "min": (
        _r("min-self", _self_operands(None, _int), doc="min(x, x) -> x (integers)"),
        _r("min-highest", _identity_operand(_highest, _int), doc="min(x, highest) -> x (integers)"),
    ),
    "abs": (_r("abs-sign", _abs_of, doc="abs(abs(x)) -> abs(x); abs(-x) -> abs(x) (integers)"),),
    "integer_pow": (_r("integer-pow-trivial", _integer_pow, doc="x ** 1 -> x; x ** 0 -> 1"),),
    "convert_element_type": (
        _r("noop-convert", _noop_convert, doc="convert to the same dtype and weak type -> x"),
        _r("convert-roundtrip-int", _convert_roundtrip,
           doc="convert(convert(x, wider integer), back) -> x"),
    ),
    "reshape": (
        _r("noop-reshape", _noop_reshape, doc="reshape to the same shape -> x"),
        _r("reshape-reshape", _reshape_of_reshape, doc="reshape(reshape(x)) -> reshape(x)"),
    ),
    "squeeze": (_r("noop-squeeze", _noop_squeeze, doc="squeeze of no dimensions -> x"),),
    "transpose": (
        _r("noop-transpose", _noop_transpose, doc="identity permutation -> x"),
        _r("transpose-transpose", _transpose_of_transpose,
           doc="transpose(transpose(x)) -> one transpose (or x)"),
    ),
    "broadcast_in_dim": (_r("noop-broadcast", _noop_broadcast, doc="broadcast to the same shape -> x"),),
    "rev": (_r("noop-rev", _noop_rev, doc="reverse no dimensions -> x"),),
    "slice": (_r("noop-slice", _noop_slice, doc="slice of everything -> x"),),
    "pad": (_r("noop-pad", _noop_pad, doc="pad by nothing -> x"),),
    "dynamic_slice": (_r("full-dynamic-slice", _full_dynamic_slice,
                         doc="dynamic slice of the full size -> x"),),
    "dynamic_update_slice": (_r("full-dynamic-update-slice", _full_dynamic_update,
                                doc="update of the full size -> the update"),),
    "concatenate": (_r("single-concatenate", _single_concatenate, doc="concatenate([x]) -> x"),),
    "reduce_precision": (_r("noop-reduce-precision", _noop_reduce_precision,
                            doc="reduce to the dtype's own precision -> x"),),
    "real": (_r("real-of-complex", _part_of_complex(0), doc="real(complex(a, b)) -> a"),),
    "imag": (_r("imag-of-complex", _part_of_complex(1), doc="imag(complex(a, b)) -> b"),),
    "select_n": (
        _r("select-constant-predicate", _select_constant_predicate,
           doc="select_n(c, *cases) with a constant predicate -> cases[c]"),
        _r("select-same-cases", _select_same_cases, doc="select_n(p, x, x) -> x"),
    ),
    "cond": (_r("cond-constant-index", _cond_constant_index,
                doc="cond with a literal index -> its branch, inlined"),),
    "while": (_r("while-false", _while_false,
                 doc="while whose condition is false on entry -> its initial carry"),),
    "jit": (_r("inline-call", _inline_call("jaxpr", _trivial_jit), option="inline_calls",
               doc="a jit without shardings, layouts, donation or options -> its body"),),
    "pjit": (_r("inline-call", _inline_call("jaxpr", _trivial_jit), option="inline_calls",
                doc="a jit without shardings, layouts, donation or options -> its body"),),
    "closed_call": (_r("inline-call", _inline_call("call_jaxpr"), option="inline_calls",
                       doc="closed_call -> its body"),),
    "core_call": (_r("inline-call", _inline_call("call_jaxpr"), option="inline_calls",
                     doc="core_call -> its body"),),
}


def _binary_gate(eqn) -> bool:
    """Every binary-operator rule needs a scalar-constant operand (a literal or a
    ``broadcast_in_dim``) or two identical operands: most equations of a program
    have neither, and are passed over without trying each rule."""
    a, b = eqn.inputs[0], eqn.inputs[1]
    if a is b or type(a) is Literal or type(b) is Literal:
        return True
    pa, pb = a.producer, b.producer
    return (type(pa) is Equation and pa.prim.name == "broadcast_in_dim") or (
        type(pb) is Equation and pb.prim.name == "broadcast_in_dim")


#: Cheap tests an equation must pass before its primitive's rules are tried.
RULE_GATES: dict[str, Callable[[Equation], bool]] = {
    name: _binary_gate for name in (
        "add", "add_any", "sub", "mul", "div", "rem", "and", "or", "xor", "max", "min",
        "shift_left", "shift_right_logical", "shift_right_arithmetic")
}


def rule_names(*, exact: bool | None = None) -> list[str]:
    """Names of the rules in the table (each once), optionally only (in)exact ones."""
    names: dict[str, None] = {}
    for rules in SIMPLIFY_RULES.values():
        for r in rules:
            if exact is None or r.exact == exact:
                names[r.name] = None
    return list(names)
