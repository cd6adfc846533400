"""Reading a ``while`` loop's exit test: is it the convergence of its iterates?

Works on JAX jaxprs (a loop's condition and body), so both the ``implicit-diff``
pass (``passes/fixed_point_match.py``, which proves a loop is a fixed-point
solve before it rewrites it) and the transposition of linear loops
(``closure/transpose.py``, which gives a loop that stops on a test of its linear
carries the meaning of its limit only when that test is a convergence test) read
it the same way.

Carries are classified by how the body updates them (``carry_kinds``):

* **state** -- floating-point carries the body updates as ``x <- f(theta, x)``;
* **previous** -- carries the body sets to the incoming value of a state carry
  (the ``(x_prev, x) -> (x, f(x))`` pair of a tutorial ``fixed_point``);
* **invariant** -- carries the body passes through unchanged (parameters);
* **counter** -- integer / boolean carries (iteration counters, flags);
* **auxiliary** -- floating-point carries no state update reads and whose final
  value is unused (a convergence gap the condition tests).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import jax.numpy as jnp
import numpy as np

from .. import jax_adapter as jx

STATE, PREVIOUS, INVARIANT, COUNTER, AUXILIARY = (
    "state", "previous", "invariant", "counter", "auxiliary")


def is_inexact(aval) -> bool:
    return jnp.issubdtype(aval.dtype, jnp.inexact)


def carry_kinds(body, body_n: int) -> tuple[list[str], dict[int, int]] | str:
    """``(kinds, copies)`` of a loop body (a jaxpr taking ``body_n`` constants,
    then the carries): each carry's kind, and previous carry -> the state carry
    it copies; or a one-line reason the carries are not an iteration's."""
    carries = body.invars[body_n:]
    position = {v: i for i, v in enumerate(carries)}
    consts = set(body.invars[:body_n])
    kinds: list[str] = []
    copies: dict[int, int] = {}
    for i, out in enumerate(body.outvars):
        aval = carries[i].aval
        literal = isinstance(out, jx.Literal)
        if not literal and out is carries[i]:
            kinds.append(INVARIANT)
        elif not literal and out in position:
            kinds.append(PREVIOUS)
            copies[i] = position[out]
        elif not is_inexact(aval):
            kinds.append(COUNTER)
        elif not literal and out in consts:
            return f"carry {i} is set to a loop constant, not updated from the iterate"
        else:
            kinds.append(STATE)
    for i, j in copies.items():
        if kinds[j] != STATE:
            if not is_inexact(carries[i].aval):
                kinds[i] = COUNTER
                continue
            if kinds[j] == PREVIOUS:
                return (f"carry {i} copies carry {j}, itself the previous iterate: a change "
                        f"over two iterations, which a period-2 orbit also makes small, is "
                        f"not a convergence test")
            return f"carry {i} copies carry {j}, which the iteration does not update"
    return kinds, copies


# ------------------------------------------------------ the convergence test
# The exit test is read by a small abstract interpretation of the condition
# (and, for a convergence gap the body computes and carries, of the body).
# Each value gets a tag saying how it relates to the change of the iterate
# between two successive iterations:
#
#   fixed   -- reads only constants and counters (an iteration cap, a tolerance)
#   iterate -- reads the iterates' values, not their change (a relative
#              tolerance, refused as the bound of a test: see _RELATIVE)
#   new/old -- a state carry's current / previous value (``carries`` = which)
#   next    -- the update applied to the current value, ``T(x)`` (the same
#              equations, on the same operands, as the body's update of the
#              carry: ``_update_images``); ``x - T(x)`` is the residual, the
#              change the next iteration would make
#   image   -- a value computed from the current iterate by something that is
#              not the loop's update (``x - g(x)`` proves nothing about T)
#   diff    -- a signed, elementwise change ``x_{k+1} - x_k`` (possibly scaled)
#   measure -- a nonnegative size of that change (|d|, d^2, max, sum, norm)
#   big     -- a boolean whose falsehood means the carries have converged, or
#              an iteration cap (a ``fixed`` conjunct) stopped the loop
#   small   -- a boolean whose truth means the carries have converged, or a cap
#   bad     -- the change is used in a way that proves nothing (``why`` says how)
#
# The loop is a fixed-point solve when the condition's result is ``big`` for
# every state carry.  Differences of two successive values are changes (old and
# new, or new and next); old and next are two steps apart (a period-2
# oscillation has no change over two steps), which proves nothing.
@dataclass(frozen=True)
class _Tag:
    kind: str
    carries: frozenset = frozenset()
    why: str = ""
    # For fixed / iterate values: "pos" (known > 0), "nonneg" (known >= 0),
    # "zero" (a zero literal, or a product with one), "neg" (a negative literal)
    # or "" (unknown).  Only a known sign keeps a
    # scaled size a size (|d| * c > tol with c < 0 runs while |d| is small).
    sign: str = ""


_FIXED, _ITERATE = _Tag("fixed"), _Tag("iterate")
# Tags of values that are not the change (nor a test of it).
_FREE = ("fixed", "iterate", "new", "old", "next")
# Operations that move or copy elements without changing them.  A conversion
# keeps a change a change only between floating-point types (to an integer it
# rounds: x.astype(int) != xp.astype(int) does not test convergence).
_SHAPE_OPS = ("reshape", "squeeze", "expand_dims", "broadcast_in_dim", "copy", "copy_p",
              "transpose")
_REDUCE_MEASURE = ("reduce_max", "reduce_sum")
CALL_PARAMS = ("jaxpr", "call_jaxpr")
_FLIP = {"gt": "lt", "lt": "gt", "ge": "le", "le": "ge", "eq": "eq", "ne": "ne"}


#: Why a tolerance (or a scale of the change) that reads the iterate is refused.
_RELATIVE = ("the change of the iterate is compared with (or scaled by) a value of the iterate "
             "itself, not a loop-invariant tolerance: a relative test |x_(k+1) - x_k| > "
             "rtol |x| is also met by an iterate that grows without converging "
             "(x <- x + t stops once |x| > |t| / rtol)")
#: hints key: relative tolerances are accepted (convergence_test's ``relative``).
_RELATIVE_OK = "relative tolerances accepted"
#: hints key: a dict that receives every value's tag (see loop_cap).
_TAGS = "tags"


def _finite_literal(atom, nonzero: bool) -> bool:
    """``atom`` is a literal whose elements are all finite (and nonzero)."""
    if not isinstance(atom, jx.Literal):
        return False
    try:
        v = np.asarray(atom.val)
        if not np.issubdtype(v.dtype, np.number) or np.iscomplexobj(v):
            return False
        return bool(np.all(np.isfinite(v)) and (not nonzero or np.all(v != 0)))
    except (TypeError, ValueError):
        return False


def _bad(why: str) -> _Tag:
    return _Tag("bad", why=why)


def sub_jaxpr(eqn):
    for key in CALL_PARAMS:
        sub = eqn.params.get(key)
        if sub is not None:
            return getattr(sub, "jaxpr", sub)
    return None


def _literal_tag(value) -> _Tag:
    try:
        v = np.asarray(value)
        if v.dtype == bool or not np.issubdtype(v.dtype, np.number) or np.iscomplexobj(v):
            return _FIXED
        if np.all(v == 0):
            return _Tag("fixed", sign="zero")
        if np.all(v > 0):
            return _Tag("fixed", sign="pos")
        if np.all(v >= 0):
            return _Tag("fixed", sign="nonneg")
        if np.all(v < 0):
            return _Tag("fixed", sign="neg")
    except (TypeError, ValueError):
        pass
    return _FIXED


def _keeps_values(eqn) -> bool:
    """A shape operation, or a conversion between floating-point types."""
    name = eqn.primitive.name
    if name in _SHAPE_OPS:
        return True
    if name == "convert_element_type":
        return (is_inexact(eqn.invars[0].aval) and is_inexact(eqn.outvars[0].aval))
    return False


def _free_sign(eqn, tags: Sequence[_Tag]) -> str:
    """The sign of an operation on values that are not the change."""
    # "pos" is kept only by operations that cannot round a positive number to
    # zero: exp, a product, a quotient, a power or a narrowing conversion can
    # underflow (exp(-1000) == 0.0), so they give "nonneg" at best.
    name = eqn.primitive.name
    signs = [t.sign for t in tags]
    nonneg = all(x in ("pos", "nonneg", "zero") for x in signs)
    if name in ("exp", "exp2"):
        return "nonneg"
    if name in ("abs", "sqrt") and len(tags) == 1:
        return signs[0] if signs[0] == "pos" else "nonneg" if name == "abs" or \
            signs[0] == "nonneg" else ""
    if name == "square" or (name == "integer_pow" and eqn.params["y"] % 2 == 0):
        return "nonneg"
    if name == "integer_pow" and len(tags) == 1:
        return "nonneg" if signs[0] in ("pos", "nonneg") else ""
    if _keeps_values(eqn) and len(tags) == 1:
        if signs[0] == "zero":
            return "zero"
        if signs[0] == "pos" and name == "convert_element_type" and \
                jnp.finfo(eqn.outvars[0].aval.dtype).tiny > jnp.finfo(eqn.invars[0].aval.dtype).tiny:
            return "nonneg"   # a narrowing conversion rounds tiny values to zero
        return signs[0] if signs[0] in ("pos", "nonneg") else ""
    if name in _REDUCE_MEASURE and len(tags) == 1:
        if signs[0] == "pos" and int(np.prod(eqn.invars[0].aval.shape)) == 0:
            return "nonneg" if name == "reduce_sum" else ""   # an empty sum is 0
        return signs[0] if signs[0] in ("pos", "nonneg") else ""
    if name in ("add", "max") and nonneg:
        return "pos" if "pos" in signs else "zero" if set(signs) == {"zero"} else "nonneg"
    if name == "max" and "pos" in signs:
        return "pos"
    if name in ("mul", "div") and nonneg:
        return "nonneg"
    return ""


def _interpret(jaxpr, in_tags: Sequence[_Tag], seeds: dict | None = None,
               notes: dict | None = None, hints: dict | None = None) -> list[_Tag]:
    """Tags of ``jaxpr``'s outputs; ``seeds`` (var -> tag) override what an
    equation computes (the body's new iterates and steps)."""
    seeds = seeds or {}
    env: dict = {}
    def seeded(v, t: _Tag) -> _Tag:
        # A seed names what a plain value is; a value already seen to be a
        # change or a test of it (a gap the body carries) keeps that meaning.
        seed = seeds.get(v)
        return seed if seed is not None and t.kind in _FREE else t

    for v, t in zip(jaxpr.invars, in_tags):
        env[v] = seeded(v, t)

    def read(atom) -> _Tag:
        return _literal_tag(atom.val) if isinstance(atom, jx.Literal) else env.get(atom, _FIXED)

    # One value computed twice (``jnp.dot(y - p, y - p)``) is one atom to _transfer,
    # which knows a square by its operands being the same.
    first: dict = {}
    same: dict = {}

    def one(atom):
        return atom if isinstance(atom, jx.Literal) else same.get(atom, atom)

    for eqn in jaxpr.eqns:
        atoms = [one(a) for a in eqn.invars]
        if eqn.primitive.name in _RECOMPUTED and len(eqn.outvars) == 1:
            key = (eqn.primitive.name, tuple(a if isinstance(a, jx.Var) else
                                             ("literal", repr(a.val)) for a in atoms),
                   tuple(sorted((k, repr(v)) for k, v in eqn.params.items())))
            known = first.setdefault(key, eqn.outvars[0])
            if known is not eqn.outvars[0]:
                same[eqn.outvars[0]] = known
        outs = _transfer(eqn, [read(a) for a in eqn.invars], atoms, notes, hints)
        for v, t in zip(eqn.outvars, outs):
            env[v] = seeded(v, t)
    if hints is not None and _TAGS in hints:
        hints[_TAGS].update(env)
    return [read(a) for a in jaxpr.outvars]


#: Parameter-free elementwise operations whose recomputation on the same operands
#: is recognized as the same value.
_RECOMPUTED = ("sub", "add", "neg", "abs", "conj", "real", "imag", "mul")


def _plain(eqn, tags: Sequence[_Tag]) -> _Tag:
    """The tag of an operation that does not look at the change specially.  An
    ``iterate`` remembers which current iterates it reads (``carries``), so that
    ``x - g(x)`` with ``g`` not the loop's update can be named in the reason."""
    for t in tags:
        if t.kind == "bad":
            return t
    kind = "iterate" if any(t.kind != "fixed" for t in tags) else "fixed"
    reads = frozenset().union(*(t.carries for t in tags
                                if t.kind in ("new", "old", "next", "iterate")))
    if len(eqn.outvars) != 1 or not all(t.kind in _FREE
                                        for t in tags):
        return _Tag(kind, reads if kind == "iterate" else frozenset())
    return _Tag(kind, reads if kind == "iterate" else frozenset(), sign=_free_sign(eqn, tags))


def _transfer(eqn, tags: list[_Tag], atoms, notes: dict | None = None,
              hints: dict | None = None) -> list[_Tag]:
    name = eqn.primitive.name
    n_out = len(eqn.outvars)
    sub = sub_jaxpr(eqn)
    if sub is not None and len(sub.invars) == len(tags):
        return _interpret(sub, tags, notes=notes, hints=hints)
    kinds = [t.kind for t in tags]
    special = [t for t in tags if t.kind not in _FREE]
    if not special:
        # Successive values: (old, new) -- the change the body made -- or (new,
        # next) -- the residual x - T(x), the change the next step would make.
        if name in ("sub", "ne", "eq") and len(tags) == 2 and \
                {kinds[0], kinds[1]} in ({"new", "old"}, {"new", "next"}) \
                and tags[0].carries == tags[1].carries:
            kind = {"sub": "diff", "ne": "big", "eq": "small"}[name]
            return [_Tag(kind, tags[0].carries)]
        if name in ("sub", "ne", "eq") and len(tags) == 2 and hints is not None:
            if {kinds[0], kinds[1]} == {"old", "next"} and tags[0].carries == tags[1].carries:
                hints.setdefault("two steps", set()).update(tags[0].carries)
            for x, gx in (tags, tags[::-1]):
                if x.kind in ("new", "old") and gx.kind == "iterate" and x.carries & gx.carries:
                    hints.setdefault("image", set()).update(x.carries)
        # A product with a zero literal is zero whatever the other factor reads
        # (allclose's ``rtol * |b|`` with ``rtol=0``); an iterate that overflows
        # makes it NaN, which fails the closeness test: the loop runs on.
        if name == "mul" and any(t.kind == "fixed" and t.sign == "zero" for t in tags):
            return [_Tag("fixed", sign="zero")]
        if (_keeps_values(eqn) or name == "neg") and kinds[0] in ("new", "old", "next") \
                and len(tags) == 1:
            return [tags[0]]
        return [_plain(eqn, tags)] * n_out
    bad = next((t for t in tags if t.kind == "bad"), None)
    if bad is not None:
        return [bad] * n_out
    one = special[0]
    others = [t for t in tags if t is not one]
    union = frozenset().union(*(t.carries for t in special))
    what = f"'{name}' of the change of the iterate"
    # What may bound (or scale) the change: loop invariants, and values of the
    # iterate when relative tolerances are accepted (see convergence_test).
    bounds = ("fixed", "iterate") if hints is not None and hints.get(_RELATIVE_OK) else ("fixed",)

    def free(ts):
        return all(t.kind in _FREE for t in ts)

    if one.kind == "diff":
        if (_keeps_values(eqn) or name == "neg") and len(tags) == 1:
            return [one]
        if name in ("mul", "div") and len(special) == 1 and free(others) and \
                others[0].kind not in bounds:
            return [_bad(_RELATIVE)]
        if name == "mul" and len(special) == 1 and free(others) and \
                others[0].sign in ("pos", "neg"):
            return [one]  # a change scaled by a loop-invariant nonzero factor
        if name == "div" and tags[0] is one and _finite_literal(atoms[1], nonzero=True):
            return [one]
        if name in ("abs", "sqrt") or (name == "integer_pow" and eqn.params["y"] % 2 == 0
                                       and eqn.params["y"] > 0) or name == "square":
            return [_Tag("measure", one.carries)] if name != "sqrt" else [_bad(what)]
        if name == "mul" and len(tags) == 2 and atoms[0] is atoms[1]:
            return [_Tag("measure", one.carries)]
        if name == "dot_general" and len(tags) == 2 and atoms[0] is atoms[1]:
            (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
            if tuple(lc) == tuple(rc) == tuple(range(len(atoms[0].aval.shape))) and not lb:
                return [_Tag("measure", one.carries)]  # the squared norm d . d
        if name in ("ne",) and all(t.kind in ("diff", "fixed") for t in tags):
            return [_Tag("big", one.carries)]
        return [_bad(what + " (not a size of it)")]
    if one.kind == "measure":
        if all(t.kind == "measure" for t in special) and len(special) == len(tags) and \
                name in ("max", "add"):
            return [_Tag("measure", union)]
        if len(special) == 1:
            if (_keeps_values(eqn) or name in _REDUCE_MEASURE + ("abs", "sqrt", "square")) \
                    and len(tags) == 1:
                return [one]
            if name == "integer_pow" and eqn.params["y"] > 0:
                return [one]
            # The tolerance side is loop-invariant: a bound that moves with the
            # iterate proves nothing about its change (see _RELATIVE).
            if name in ("mul", "div", "pow") + tuple(_FLIP) and len(tags) == 2 and \
                    free(others) and others[0].kind not in bounds:
                return [_bad(_RELATIVE)]
            # Scaling keeps a size a size only by a positive factor (one that
            # overflows to inf still does: inf * |d| > tol runs while d != 0).
            # A divisor must be a finite positive literal: a computed one can
            # overflow to inf, and |d| / inf = 0 makes the test constant.
            if name == "mul" and free(others) and others[0].sign == "pos":
                return [one]
            # max(|d|, c) >= |d| for any loop invariant c, and |d| + c >= |d| for
            # c >= 0: a bound on either bounds the change (jnp.linalg.norm with
            # ord=inf is max(0, max|d|)).
            if len(tags) == 2 and free(others) and others[0].kind == "fixed" and (
                    name == "max" or (name == "add"
                                      and others[0].sign in ("pos", "nonneg", "zero"))):
                return [one]
            if name == "div" and tags[0] is one and _finite_literal(atoms[1], nonzero=True) \
                    and others[0].sign == "pos":
                return [one]
            # |d| / |x|, a change relative to the iterate, where relative tolerances
            # are accepted: as |d| > tol |x| (an iterate that overflows stops both).
            if name == "div" and tags[0] is one and free(others) and \
                    others[0].kind == "iterate" and "iterate" in bounds:
                return [one]
            if name == "div" and tags[0] is one and free(others):
                return [_bad("the size of the change is divided by a value not proven a finite "
                             "positive constant (a divisor that overflows to inf makes the "
                             "test constant)")]
            if name == "pow" and tags[0] is one and free(others) and others[0].sign == "pos":
                return [one]
            if name in ("mul", "pow") and free(others) and (name == "mul" or tags[0] is one):
                return [_bad(f"the size of the change is {'scaled' if name == 'mul' else 'raised'} "
                             f"by a factor not proven positive ('{name}'; exp, products and "
                             f"powers can underflow to 0, which makes the test constant)")]
            if name in _FLIP and len(tags) == 2 and free(others):
                op = name if tags[0] is one else _FLIP[name]
                if op in ("gt", "ge", "ne"):
                    return [_Tag("big", one.carries)]
                if op in ("lt", "le"):
                    return [_Tag("small", one.carries)]
        return [_bad(f"'{name}' of the size of the change of the iterate")]
    if one.kind in ("big", "small"):
        if name == "not" and len(tags) == 1:
            return [_Tag("small" if one.kind == "big" else "big", one.carries)]
        if len(tags) == 1 and (_keeps_values(eqn) or (
                name == "convert_element_type" and eqn.outvars[0].aval.dtype == bool)):
            return [one]
        if name in ("reduce_or", "reduce_and") and len(tags) == 1:
            ok = (name == "reduce_or") == (one.kind == "big")
            return [one if ok else _bad(f"'{name}' of a per-element convergence test "
                                        f"(the loop would stop when some elements converge)")]
        if name in ("and", "or") and len(tags) == 2:
            # big: false => converged (or a cap); small: true => converged (or a cap).
            a, b = tags
            joint = name == "and"
            strong = "small" if joint else "big"  # and of small / or of big: either suffices
            if a.kind == b.kind == one.kind:
                if one.kind == strong:
                    return [_Tag(one.kind, a.carries | b.carries)]
                return [_Tag(one.kind, a.carries & b.carries)]
            other = b if a is one else a
            if other.kind not in ("fixed", "iterate"):
                return [_bad(f"'{name}' of a convergence test and its opposite")]
            if other.kind == "fixed" and notes is not None:
                notes[id(eqn)] = 0 if a is one else 1
            if one.kind == strong or other.kind == "fixed":
                return [one]  # a cap on counters and constants, or a test that only adds iterations
            return [_bad(f"the loop can also stop on a test of the iterate's values ('{name}'), "
                         f"not only on its convergence or an iteration cap")]
        return [_bad(f"'{name}' of a convergence test")]
    return [_bad(what)]


def _body_seeds(body, body_n: int, kinds: list[str]) -> dict:
    """The body's new iterates (``new``) and update steps ``x_{k+1} = x_k +- s``
    (``s`` is the change, a ``diff``)."""
    steps: dict = {}
    news: dict = {}
    carries = body.invars[body_n:]
    producer = {v: e for e in body.eqns for v in e.outvars}
    for i, out in enumerate(body.outvars):
        if kinds[i] != STATE or isinstance(out, jx.Literal):
            continue
        mine = frozenset({i})
        news.setdefault(out, _Tag("new", mine))
        eqn = producer.get(out)
        if eqn is not None and eqn.primitive.name in ("add", "sub") and len(eqn.invars) == 2:
            a, b = eqn.invars
            if a is carries[i] and not isinstance(b, jx.Literal):
                steps.setdefault(b, _Tag("diff", mine))
            elif b is carries[i] and eqn.primitive.name == "add" and not isinstance(a, jx.Literal):
                steps.setdefault(a, _Tag("diff", mine))
    # A step that is also carried (to test it) is the change, not a new iterate;
    # so is a carried result the body computes again as the step (a Neumann
    # term ``A @ t`` written twice, once carried and once added to the sum).
    if steps:
        numbers = _Numbering()
        env = numbers.run(body, [numbers.intern(("input", k)) for k in range(len(body.invars))])
        step_of = {env[b]: tag for b, tag in steps.items() if b in env}
        for out in body.outvars:
            if not isinstance(out, jx.Literal) and out not in steps and env.get(out) in step_of:
                steps[out] = step_of[env[out]]
    seeds = dict(news)
    seeds.update(steps)
    return seeds


def _carry_tags(kinds, copies) -> list[_Tag]:
    tags = []
    for i, kind in enumerate(kinds):
        if kind == STATE:
            tags.append(_Tag("new", frozenset({i})))
        elif kind == PREVIOUS:
            tags.append(_Tag("old", frozenset({copies[i]})))
        elif kind in (COUNTER, INVARIANT):
            tags.append(_FIXED)
        else:
            tags.append(_ITERATE)
    return tags


def convergence_test(cond, cond_n: int, body, body_n: int, kinds: list[str],
                     copies: dict[int, int], cap_joins: dict | None = None,
                     operands: Sequence | None = None, relative: bool = False,
                     tags: dict | None = None) -> tuple[set[int], set[int]] | str:
    """``(covered, gaps)``: the state carries whose convergence the exit test
    checks, and the carries that hold a convergence gap the body computes; or a
    one-line reason the condition is not a convergence test.  ``operands`` (the
    loop's operands) let the condition's or the body's recomputation of the
    update ``T(x)`` be recognized (a residual ``x - T(x)``): the same equations
    on the same operands.  ``relative`` accepts tolerances that read the iterate
    (``|dx| > rtol |x|``), for a caller that checks by other means that the
    iteration has a limit (see _RELATIVE).  ``tags``, if given, receives the
    tag of every value of the condition and the body (see ``loop_cap``)."""
    m = len(kinds)
    carry_in = _carry_tags(kinds, copies)
    body_in = [_FIXED] * body_n + [_Tag("old", frozenset({i})) if k == STATE else
                                   (_FIXED if k in (COUNTER, INVARIANT) else _ITERATE)
                                   for i, k in enumerate(kinds)]
    body_seeds, cond_seeds = ({}, {}) if operands is None else \
        _update_images(cond, cond_n, body, body_n, kinds, operands)
    body_seeds.update(_body_seeds(body, body_n, kinds))
    hints: dict = {_RELATIVE_OK: True} if relative else {}
    if tags is not None:
        hints[_TAGS] = tags
    body_out = _interpret(body, body_in, body_seeds, hints=hints)
    gaps: set[int] = set()
    cond_in = list(carry_in)
    for i, t in enumerate(body_out):
        if t.kind in ("diff", "measure", "big", "small") and kinds[i] not in (INVARIANT, PREVIOUS):
            gaps.add(i)
            cond_in[i] = t
    (result,) = _interpret(cond, [_FIXED] * cond_n + cond_in, cond_seeds, notes=cap_joins,
                           hints=hints)
    if result.kind == "bad":
        return f"the exit test is not a convergence test: {result.why}"
    if result.kind == "small":
        return "the loop runs while the iterate's change is small (the opposite of a convergence test)"
    if result.kind != "big":
        reads = _cond_reads(cond, cond_n, m)
        floats = [i for i in reads if kinds[i] not in (COUNTER, INVARIANT)]
        if hints.get("two steps"):
            which = sorted(hints["two steps"])
            return (f"the exit test measures x_k - T(x_(k+1)) for carr{'y' if len(which) == 1 else 'ies'} "
                    f"{', '.join(map(str, which))}, a change over two iterations (which a "
                    f"period-2 oscillation also makes small), not the change of one step nor "
                    f"the residual x - T(x)")
        if hints.get("image"):
            which = sorted(hints["image"])
            return (f"the exit test measures x - g(x) for carr{'y' if len(which) == 1 else 'ies'} "
                    f"{', '.join(map(str, which))} with g not the loop's update T (not the same "
                    f"equations on the same operands as the body's), so it is not the residual "
                    f"x - T(x) of the iteration and proves no convergence")
        if not floats:
            what = "only iteration counters and constants (a counted loop)"
        else:
            what = ("the value of carr" + ("y " if len(floats) == 1 else "ies ") +
                    ", ".join(str(i) for i in floats) + ", not its change between iterations "
                    "(like 'while t < T' or 'while x < 10', which are not fixed-point solves)")
        return (f"the exit test is not a convergence test |x_(k+1) - x_k| > tol nor a residual "
                f"|x - T(x)| > tol: the condition tests {what}")
    return set(result.carries), gaps


# ---------------------------------------------- recomputations of the update
#: Sub-jaxprs (calls) up to this many equations are compared by their text;
#: larger ones only by identity (keeps the matcher linear on nested solvers).
_COMPARED_CALL_SIZE = 200


class _Numbering:
    """Value numbers: two values get the same number when the same equations
    compute them from the same operands (the loop's operands by identity,
    literals by value)."""

    def __init__(self):
        self.table: dict = {}
        self.texts: dict = {}

    def intern(self, key) -> int:
        return self.table.setdefault(key, len(self.table))

    def _param(self, v):
        if hasattr(v, "eqns") or hasattr(v, "jaxpr"):
            inner = getattr(v, "jaxpr", v)
            if len(getattr(inner, "eqns", ())) > _COMPARED_CALL_SIZE:
                return ("id", id(v))
            if id(v) not in self.texts:
                self.texts[id(v)] = (v, str(v))
            return ("text", self.texts[id(v)][1])
        if isinstance(v, (tuple, list)):
            return tuple(self._param(x) for x in v)
        try:
            hash(v)
            return v
        except TypeError:
            return ("repr", repr(v))

    def literal(self, atom) -> int:
        v = np.asarray(atom.val)
        return self.intern(("literal", str(v.dtype), v.shape, v.tobytes()))

    def run(self, jaxpr, in_numbers) -> dict:
        env = dict(zip(jaxpr.invars, in_numbers))

        def read(a):
            if isinstance(a, jx.Literal):
                return self.literal(a)
            if a not in env:
                env[a] = self.intern(("unknown", id(a)))
            return env[a]

        for eqn in jaxpr.eqns:
            ins = tuple(read(a) for a in eqn.invars)
            if eqn.effects:
                head = self.intern(("effect", id(eqn)))
            else:
                params = tuple(sorted((k, self._param(v)) for k, v in eqn.params.items()))
                head = self.intern((eqn.primitive.name, params, ins))
            for j, v in enumerate(eqn.outvars):
                env[v] = self.intern((head, j))
        return env


def _update_images(cond, cond_n: int, body, body_n: int, kinds: list[str], operands):
    """Seeds naming the recomputations of the update: ``(body seeds, condition
    seeds)``, var -> tag.  In the body a value equal to the update of the
    incoming carries is ``new`` (``x - T(x)`` written with ``T`` called again),
    one equal to the update of the body's own results is ``next`` (the residual
    at the new iterate); in the condition (which sees the new iterate), a
    value equal to the update of its carries is ``next``."""
    numbers = _Numbering()

    def outer(j):
        a = operands[j]
        return numbers.literal(a) if isinstance(a, jx.Literal) else numbers.intern(("operand", id(a)))

    m = len(kinds)
    # A carry the body passes through holds its start at every step: numbered
    # as that operand (a value the condition reads as a carry and the body as
    # a constant is the same value).
    carry_numbers = [outer(cond_n + body_n + i) if kinds[i] == INVARIANT
                     else numbers.intern(("carry", i)) for i in range(m)]
    body_consts = [outer(cond_n + k) for k in range(body_n)]
    once = numbers.run(body, body_consts + carry_numbers)

    def number(env, a):
        return numbers.literal(a) if isinstance(a, jx.Literal) else env[a]

    new_numbers = [number(once, a) for a in body.outvars]
    twice = numbers.run(body, body_consts + new_numbers)
    next_numbers = [number(twice, a) for a in body.outvars]
    state = [i for i, k in enumerate(kinds) if k == STATE]
    new_of = {new_numbers[i]: i for i in state}
    next_of = {next_numbers[i]: i for i in state if next_numbers[i] != new_numbers[i]}
    body_seeds: dict = {}
    for v, n in once.items():
        if n in next_of:
            body_seeds[v] = _Tag("next", frozenset({next_of[n]}))
        elif n in new_of and v not in body.invars:
            body_seeds[v] = _Tag("new", frozenset({new_of[n]}))
    cond_env = numbers.run(cond, [outer(j) for j in range(cond_n)] + new_numbers)
    cond_seeds = {v: _Tag("next", frozenset({next_of[n]}))
                  for v, n in cond_env.items() if n in next_of}
    return body_seeds, cond_seeds


def _cond_reads(cond, cond_n: int, m: int) -> list[int]:
    _, used = jx.dce_jaxpr(cond, [True])
    return [i for i in range(m) if used[cond_n + i]]


def held(jaxpr, tags: dict):
    """``run(consts, args) -> outputs``: ``jaxpr`` (a loop's condition or body,
    read with ``tags`` from ``convergence_test``) evaluated with its convergence
    test held at "not converged": each comparison that makes the test gives
    that answer (a big test holds, a small one does not); everything else --
    iteration caps on counters and constants, conditions on values the loop
    does not iterate, the ``and``/``or``/``not`` joining them -- is evaluated.
    A flag the body computes and carries (``(|u' - u| > tol) & (k < n)``) then
    holds only its cap, which the condition reads as the flag."""
    def is_test(v) -> bool:
        t = tags.get(v)
        return t is not None and t.kind in ("big", "small")

    def run(jaxpr, consts, args):
        env = dict(zip(jaxpr.constvars, consts))
        env.update(zip(jaxpr.invars, args))

        def read(a):
            return a.val if isinstance(a, jx.Literal) else env[a]

        for eqn in jaxpr.eqns:
            sub = sub_jaxpr(eqn)
            if sub is not None and len(sub.invars) == len(eqn.invars):
                params = next(eqn.params[k] for k in CALL_PARAMS if eqn.params.get(k) is not None)
                outs = run(sub, getattr(params, "consts", ()), [read(a) for a in eqn.invars])
            elif eqn.outvars and all(is_test(v) for v in eqn.outvars) and not any(
                    is_test(a) for a in eqn.invars if not isinstance(a, jx.Literal)):
                outs = [jnp.full(v.aval.shape, tags[v].kind == "big") for v in eqn.outvars]
            else:
                outs = jx.eval_equation(eqn, [read(a) for a in eqn.invars])
            env.update(zip(eqn.outvars, outs))
        return [read(a) for a in jaxpr.outvars]

    return lambda consts, args: run(jaxpr, consts, list(args))


def loop_cap(cond, tags: dict):
    """``cap(cond_consts_and_carries) -> bool``: the exit test of a loop whose
    convergence test was read (``tags`` from ``convergence_test``) with that test
    held at "not converged" (``held``) -- what is left is its iteration cap
    (``k < max``, read from counters and constants, directly or through a flag
    the body carries, whose value the caller computes with the body held too);
    None when the test reads neither.  A loop with a cap may stop before it
    converges, after exactly as many steps as the cap allows whatever its
    carries hold."""
    def is_test(v) -> bool:
        t = tags.get(v)
        return t is not None and t.kind in ("big", "small")

    def reads_cap(jaxpr) -> bool:
        if any(is_test(v) for v in jaxpr.invars):
            return True   # a carried flag, which may hold a cap
        for eqn in jaxpr.eqns:
            sub = sub_jaxpr(eqn)
            if sub is not None and reads_cap(sub):
                return True
            if eqn.primitive.name in ("and", "or") and any(is_test(a) for a in eqn.invars) \
                    and any(tags.get(a, _FIXED).kind == "fixed" for a in eqn.invars
                            if not isinstance(a, jx.Literal)):
                return True
        return False

    if not reads_cap(cond):
        return None
    run = held(cond, tags)

    def cap(consts, args):
        (result,) = run(consts, args)
        return result

    return cap
