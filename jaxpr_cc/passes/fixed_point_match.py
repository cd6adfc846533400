"""Recognizing ``while`` loops that iterate a map to a fixed point, and proving it.

A loop matches when its carries split into

* **state** -- floating-point carries the body updates as ``x <- f(theta, x)``;
* **previous** -- carries the body sets to the incoming value of a state carry
  (the ``(x_prev, x) -> (x, f(x))`` pair of a tutorial ``fixed_point``);
* **invariant** -- carries the body passes through unchanged (parameters);
* **counter** -- integer / boolean carries (iteration counters, flags);
* **auxiliary** -- floating-point carries no state update reads and whose final
  value is unused (a convergence gap the condition tests),

the state update ``f`` reads only the body's constants, the state and the
invariant carries (not a counter, not a previous iterate), and the exit test is
the convergence of every state carry: the loop runs while the change
``x_(k+1) - x_k`` between successive iterates (taken from a previous-iterate carry,
or computed by the body and carried as a gap, or the step ``s`` of an update
``x <- x + s``) -- or the residual ``x - T(x)`` of the map the loop iterates
(``T`` recomputed by the condition on the carried iterate, or by the body on
the iterate it returns, and the residual carried) -- has a size above a
loop-invariant tolerance, optionally also while an iteration counter is below
a cap (``convergence_test``).  A tolerance that reads the iterate (a relative
test ``|dx| > rtol |x|``) is refused: an iterate growing without bound meets
it too.  A size is scaled only by a factor proven positive (a positive
literal, sums and maxima with one; ``exp``, products and powers can underflow
to 0, which makes the test constant) and divided only by a finite positive
literal.  A loop that runs while the
iterate itself passes a test (explicit time stepping ``while t < T``, a growth
loop ``while x < 10``) or while a counter does is not a fixed-point solve: it is
left alone unless forced.  Carries holding the convergence gap are auxiliary:
at the fixed point they are zero whatever the parameters are.
``theta`` -- what the fixed point depends on -- is the body constants and the
invariant carries that ``f`` reads.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .. import jax_adapter as jx
from ..backends.jaxpr import region_to_closed_jaxpr
from ..closure.convergence import (AUXILIARY, CALL_PARAMS, COUNTER, INVARIANT, PREVIOUS, STATE,
                                   carry_kinds, convergence_test, is_inexact, sub_jaxpr)
from ..ir.equation import Equation
from ..ir.layouts import loop_of



@dataclass
class FixedPointLoop:
    """A matched loop.  Operand layout of the ``while``: ``cond_n`` condition
    constants, ``body_n`` body constants, then one operand per carry."""
    eqn: Equation
    cond_n: int
    body_n: int
    kinds: list[str]                 # per carry
    copies: dict[int, int]           # previous carry -> the state carry it copies
    state: list[int]                 # state carries, in the order f returns them
    f_jaxpr: object                  # Jaxpr: f's inputs (below) -> the state carries' updates
    f_inputs: list[tuple[str, int]]  # per f input: ("const", k) body constant k / ("carry", i)
    cond_jaxpr: object = None        # Jaxpr of the exit test (cond constants, carries) -> bool
    body_jaxpr: object = None        # Jaxpr of the body (body constants, carries) -> carries
    # id(equation) -> operand: the 'and'/'or' equations of the exit test that join
    # the convergence test with an iteration cap; the convergence test alone is
    # the condition with each replaced by that operand (see convergence_only).
    cap_joins: dict = None
    forced: bool = False

    @property
    def n_carry(self) -> int:
        return len(self.kinds)

    def carry_operand(self, i: int) -> int:
        return self.cond_n + self.body_n + i

    def const_operand(self, k: int) -> int:
        return self.cond_n + k

    @property
    def theta(self) -> list[tuple[str, int]]:
        """f's inputs that are not state: body constants and invariant carries."""
        return [src for src in self.f_inputs if not (src[0] == "carry" and src[1] in self.state)]


def match_fixed_point(eqn: Equation, *, forced: bool = False,
                      result_used: Sequence[bool] | None = None) -> FixedPointLoop | str:
    """The loop's :class:`FixedPointLoop`, or a one-line reason it does not match.

    ``forced`` accepts a condition that does not test the iterates (the user
    selected the loop and vouches that it converges).  ``result_used`` says which
    loop results are read after the loop (default: all); unread carries that no
    state update reads are auxiliary, left out of the adjoint equation.
    """
    if eqn.prim.name != "while":
        return f"'{eqn.prim.name}' is not a while loop"
    if eqn.effects:
        return "the loop has side effects"
    p = eqn.params
    cond, body = p["cond_jaxpr"], p["body_jaxpr"]
    loop = loop_of(eqn)
    cond_n = loop.group_size(loop.tests[0][1])
    body_n = loop.group_size(loop.step_group)
    body_closed = region_to_closed_jaxpr(body)
    cond_closed = region_to_closed_jaxpr(cond)
    if body_closed.consts or cond_closed.consts:
        return "the loop body or condition carries constants of its own"
    carries = body_closed.jaxpr.invars[body_n:]
    m = len(carries)
    classified = carry_kinds(body_closed.jaxpr, body_n)
    if isinstance(classified, str):
        return classified
    kinds, copies = classified
    state = [i for i, k in enumerate(kinds) if k == STATE]
    if not state:
        return "no floating-point carry is updated by the iteration"

    gaps: set[int] = set()
    cap_joins: dict = {}
    test = convergence_test(cond_closed.jaxpr, cond_n, body_closed.jaxpr, body_n, kinds, copies,
                            cap_joins, operands=list(eqn.inputs))
    if isinstance(test, str):
        if not forced:
            return test
        covered = set(state)
    else:
        covered, gaps = test
    # A carry holding the convergence gap (|x_(k+1) - x_k|, or the step itself) is
    # zero at the fixed point whatever theta is: it is auxiliary, not iterated.
    for i in gaps:
        if kinds[i] == STATE:
            kinds[i] = AUXILIARY
    state = [i for i, k in enumerate(kinds) if k == STATE]
    if result_used is None:
        result_used = [True] * m
    while True:
        f_jaxpr, used_in = jx.dce_jaxpr(body_closed.jaxpr, [i in state for i in range(m)])
        aux = [i for i in state if not used_in[body_n + i] and not result_used[i]
               and i not in copies.values()]
        if not aux:
            break
        for i in aux:
            kinds[i] = AUXILIARY
        state = [i for i in state if i not in aux]
    if not state:
        return "no loop result depends on a floating-point carry the iteration updates"
    # The previous iterate and the convergence gap are not functions of the fixed
    # point: their derivatives are the loop's own, which the rule does not have.
    for i, kind in enumerate(kinds):
        if kind in (PREVIOUS, AUXILIARY) and result_used[i] and is_inexact(carries[i].aval):
            what = "the previous iterate" if kind == PREVIOUS else "the convergence gap"
            return (f"the program uses loop result {i} ({carries[i].aval.str_short()}), {what}, "
                    f"whose derivative is not that of the fixed point")
    missing = [i for i in state if i not in covered]
    if missing:
        which = ", ".join(f"{i} ({carries[i].aval.str_short()})" for i in missing)
        return (f"the exit test checks the convergence of carr{'y' if len(covered) == 1 else 'ies'} "
                f"{', '.join(map(str, sorted(covered))) or 'none'} but not of carr"
                f"{'y' if len(missing) == 1 else 'ies'} {which}, which the iteration also updates")
    f_inputs: list[tuple[str, int]] = []
    for k, used in enumerate(used_in):
        if not used:
            continue
        if k < body_n:
            f_inputs.append(("const", k))
            continue
        i = k - body_n
        if kinds[i] == COUNTER:
            return f"the update of the iterate reads carry {i} ({carries[i].aval.str_short()}), " \
                   f"an iteration counter"
        if kinds[i] == PREVIOUS:
            return f"the update of the iterate reads carry {i}, the previous iterate"
        if kinds[i] == AUXILIARY:
            return f"the update of the iterate reads carry {i}, the convergence gap"
        f_inputs.append(("carry", i))

    return FixedPointLoop(eqn=eqn, cond_n=cond_n, body_n=body_n, kinds=kinds, copies=copies,
                          state=state, f_jaxpr=f_jaxpr, f_inputs=f_inputs,
                          cond_jaxpr=cond_closed.jaxpr, body_jaxpr=body_closed.jaxpr,
                          cap_joins=cap_joins, forced=isinstance(test, str))


def convergence_only(loop: FixedPointLoop):
    """``test(cond_consts, carries) -> bool``: the loop's exit test without its
    iteration cap (each 'and'/'or' joining the convergence test with a test of
    counters and constants reads the convergence test alone).  True means the
    carries have not converged."""
    joins = loop.cap_joins or {}

    def run(jaxpr, consts, args):
        env = {}

        def read(atom):
            return atom.val if isinstance(atom, jx.Literal) else env[atom]

        for v, x in zip(jaxpr.constvars, consts):
            env[v] = x
        for v, x in zip(jaxpr.invars, args):
            env[v] = x
        for eqn in jaxpr.eqns:
            ins = [read(a) for a in eqn.invars]
            sub = sub_jaxpr(eqn)
            if id(eqn) in joins:
                outs = [ins[joins[id(eqn)]]]
            elif sub is not None and len(sub.invars) == len(ins) and _holds_join(sub, joins):
                sub_consts = getattr(next(eqn.params[k] for k in CALL_PARAMS
                                          if eqn.params.get(k) is not None), "consts", ())
                outs = run(sub, sub_consts, ins)
            else:
                outs = jx.eval_equation(eqn, ins)
            for v, x in zip(eqn.outvars, outs):
                env[v] = x
        return [read(a) for a in jaxpr.outvars]

    def test(cond_consts, carries):
        (result,) = run(loop.cond_jaxpr, (), [*cond_consts, *carries])
        return result

    return test


def _holds_join(jaxpr, joins) -> bool:
    for eqn in jaxpr.eqns:
        if id(eqn) in joins:
            return True
        sub = sub_jaxpr(eqn)
        if sub is not None and _holds_join(sub, joins):
            return True
    return False
