"""Finding pattern occurrences in regions, and splicing replacements in.

Matching is anchored: every equation of the root's primitive is a candidate,
and the pattern's operands are unified backwards with the candidate's, one
pattern equation to one program equation (commutative binary primitives in
either operand order).  A match binds each hole to a program atom.

``apply_rewrites(program, rewrites)`` rewrites every region of a program
(nested ones included, each shared region once): for each match, the
:class:`Rewrite`'s ``make_replacement(match)`` gives a function of the holes,
traced at the holes' abstract values and inlined before the matched root;
uses of the root's results move to the replacement's, and matched equations
left without users are erased.  Equations and regions the rewrite created are
not matched again.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from .. import jax_adapter as jx
from ..frontend.from_jaxpr import region_from_closed_jaxpr
from ..ir.equation import Equation
from ..ir.region import Region
from ..ir.value import Value, is_literal
from .pattern import COMMUTATIVE, Pattern


class RewriteError(ValueError):
    """A replacement that does not fit what it replaces."""


@dataclass
class Match:
    """One occurrence of a pattern in a region."""
    pattern: Pattern
    region: Region
    equations: dict          # pattern equation -> program equation
    holes: list              # program atoms bound to the pattern's holes, in order

    @property
    def root(self) -> Equation:
        return self.equations[self.pattern.root]

    @property
    def outputs(self) -> list[Value]:
        return list(self.root.outputs)

    @property
    def hole_avals(self) -> list:
        return [a.aval for a in self.holes]

    def matched_equations(self) -> list[Equation]:
        """The program equations of the match, in program order."""
        chosen = set(self.equations.values())
        return [e for e in self.region.equations if e in chosen]

    def subgraph_jaxpr(self):
        """A constant-free ClosedJaxpr ``(holes) -> (root outputs)`` made of the
        matched program equations themselves (same primitives, same params), so
        a replacement can keep the original computation bit for bit.  It takes
        one input per hole; a hole bound to a literal is an unused input (the
        literal stays in the equations)."""
        from ..backends.jaxpr import region_to_closed_jaxpr
        sub = Region()
        env: dict = {}
        for hole in self.holes:
            v = sub.add_input(hole.aval)
            if not is_literal(hole):
                env.setdefault(hole, v)
        for e in self.matched_equations():
            ins = [a if is_literal(a) else env[a] for a in e.inputs]
            outs = [Value(v.aval) for v in e.outputs]
            env.update(zip(e.outputs, outs))
            sub.append(Equation(e.prim, ins, outs, dict(e.params), e.effects, e.source_info, e.ctx))
        sub.set_outvars([env[v] for v in self.outputs])
        return region_to_closed_jaxpr(sub)


@dataclass(frozen=True, eq=False)
class Rewrite:
    """Replace ``pattern`` by ``make_replacement(match)``, a function of the holes
    returning the replacement outputs (traced at the holes' abstract values)."""
    pattern: Pattern
    make_replacement: Callable[[Match], Callable]
    name: str = ""


# ------------------------------------------------------------------ matching
class _State:
    __slots__ = ("eqns", "used", "holes")

    def __init__(self, eqns=None, used=None, holes=None):
        self.eqns = dict(eqns or {})
        self.used = set(used or ())
        self.holes = dict(holes or {})

    def copy(self) -> "_State":
        return _State(self.eqns, self.used, self.holes)


def find_matches(pattern: Pattern, region: Region, *, skip=frozenset()) -> Iterator[Match]:
    """Matches of ``pattern`` rooted at each candidate equation of ``region``, in
    program order (overlapping matches are all reported)."""
    root = pattern.root
    for eqn in region.equations:
        if eqn in skip or eqn.prim.name != root.prim.name or eqn.region is not region:
            continue
        state = _unify_eqn(pattern, region, root, eqn, _State(), skip)
        if state is None:
            continue
        holes = [state.holes[h] for h in pattern.holes]
        match = Match(pattern, region, state.eqns, holes)
        if pattern.constraint is None or pattern.constraint(match):
            yield match


def _unify_eqn(pattern, region, p_eqn, t_eqn, state, skip):
    if p_eqn in state.eqns:
        return state if state.eqns[p_eqn] is t_eqn else None
    if (t_eqn in state.used or t_eqn in skip or t_eqn.region is not region
            or t_eqn.prim.name != p_eqn.prim.name
            or len(t_eqn.inputs) != len(p_eqn.inputs) or len(t_eqn.outputs) != len(p_eqn.outputs)
            or t_eqn.effects or not pattern.params_match(p_eqn.params, t_eqn.params)):
        return None
    state = state.copy()
    state.eqns[p_eqn] = t_eqn
    state.used.add(t_eqn)
    orders = [list(range(len(p_eqn.inputs)))]
    if p_eqn.prim.name in COMMUTATIVE and len(p_eqn.inputs) == 2:
        orders.append([1, 0])
    for order in orders:
        trial = state
        for p_pos, t_pos in enumerate(order):
            trial = _unify_atom(pattern, region, p_eqn.inputs[p_pos], t_eqn.inputs[t_pos], trial, skip)
            if trial is None:
                break
        if trial is not None:
            return trial
    return None


def _unify_atom(pattern, region, p_atom, t_atom, state, skip):
    if is_literal(p_atom):
        return state if is_literal(t_atom) and _same_literal(p_atom, t_atom) else None
    p_region = pattern.region
    if p_atom.producer is p_region.entry:  # a hole
        bound = state.holes.get(p_atom)
        if bound is None:
            state = state.copy()
            state.holes[p_atom] = t_atom
            return state
        if bound is t_atom or (is_literal(bound) and is_literal(t_atom)
                               and _same_literal(bound, t_atom)):
            return state
        return None
    if is_literal(t_atom) or not isinstance(t_atom.producer, Equation):
        return None
    if t_atom.index != p_atom.index:
        return None
    return _unify_eqn(pattern, region, p_atom.producer, t_atom.producer, state, skip)


def _same_literal(a, b) -> bool:
    x, y = np.asarray(a.val), np.asarray(b.val)
    if x.shape != y.shape:
        return False
    try:
        return bool(np.all(x == y))
    except TypeError:
        return False


# ------------------------------------------------------------------ splicing
def _regions(body: Region) -> list[Region]:
    seen: dict[int, Region] = {}

    def visit(region: Region) -> None:
        if id(region) in seen:
            return
        seen[id(region)] = region
        for eqn in region.equations:
            for _, _, sub in eqn.regions():
                visit(sub)

    visit(body)
    return list(seen.values())


def apply_rewrites(program, rewrites, ctx=None) -> int:
    """Apply each rewrite at every match in every region of ``program`` (in place);
    returns the number of replacements.  ``ctx`` (a PassContext) counts them per
    rewrite name."""
    fresh: set = set()
    cache: dict = {}
    total = 0
    for region in _regions(program.body):
        for rewrite in rewrites:
            for eqn in region.equations:
                if eqn.region is not region or eqn in fresh:
                    continue  # erased or created by an earlier replacement
                match = next(find_matches_at(rewrite.pattern, region, eqn, fresh), None)
                if match is None:
                    continue
                splice(match, _replacement_jaxpr(rewrite, match, cache), fresh)
                total += 1
                if ctx is not None:
                    ctx.count(f"rewrites-{rewrite.name or rewrite.pattern.name}")
    return total


def find_matches_at(pattern: Pattern, region: Region, eqn: Equation, skip) -> Iterator[Match]:
    """The match of ``pattern`` rooted at ``eqn``, if any."""
    if eqn.prim.name != pattern.root.prim.name:
        return iter(())
    state = _unify_eqn(pattern, region, pattern.root, eqn, _State(), skip)
    if state is None:
        return iter(())
    match = Match(pattern, region, state.eqns, [state.holes[h] for h in pattern.holes])
    if pattern.constraint is not None and not pattern.constraint(match):
        return iter(())
    return iter((match,))


def _replacement_jaxpr(rewrite: Rewrite, match: Match, cache: dict):
    sub = match.subgraph_jaxpr()
    key = (id(rewrite), str(sub.jaxpr), tuple(str(a) for a in match.hole_avals))
    hit = cache.get(key)
    if hit is not None:
        return hit
    fn = rewrite.make_replacement(match)
    label = rewrite.name or rewrite.pattern.name

    def flat(*holes):
        out = fn(*holes)
        return list(out) if isinstance(out, (list, tuple)) else [out]

    jaxpr, consts, out_avals = jx.trace_flat(flat, match.hole_avals, label)
    if consts:
        raise RewriteError(f"rewrite {label!r}: the replacement captures {len(consts)} array "
                           f"constants; build constants from Python scalars or the inputs")
    want = [v.aval for v in match.outputs]
    if [(tuple(a.shape), a.dtype) for a in out_avals] != [(tuple(a.shape), a.dtype) for a in want]:
        got = ", ".join(a.str_short(short_dtypes=True) for a in out_avals)
        raise RewriteError(f"rewrite {label!r}: the replacement returns ({got}) where the pattern "
                           f"returns ({', '.join(a.str_short(short_dtypes=True) for a in want)})")
    closed = jx.ClosedJaxpr(jaxpr, [])
    cache[key] = closed
    return closed


def splice(match: Match, replacement, fresh: set) -> None:
    """Inline ``replacement`` (a ClosedJaxpr of the holes) before the match's root,
    move the root's uses to it, and erase matched equations left unused."""
    region = match.region
    sub = region_from_closed_jaxpr(replacement)
    env: dict[Any, Any] = dict(zip(sub.invars, match.holes))
    new_eqns = []
    for e in sub.equations:
        ins = [env.get(a, a) if not is_literal(a) else a for a in e.inputs]
        outs = [Value(v.aval) for v in e.outputs]
        env.update(zip(e.outputs, outs))
        ne = Equation(e.prim, ins, outs, e.params, e.effects, e.source_info, e.ctx)
        new_eqns.append(ne)
        fresh.add(ne)
    root = match.root
    if new_eqns:
        region.insert_before(root, new_eqns)
    for old, new in zip(match.outputs, [env.get(a, a) if not is_literal(a) else a
                                        for a in sub.outvars]):
        region.replace_all_uses_with(old, new)
    for e in reversed(match.matched_equations()):
        if e.region is region and not any(region.has_users(v) for v in e.outputs):
            region.erase(e)
