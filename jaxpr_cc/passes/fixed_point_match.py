"""Recognizing ``while`` loops that iterate a map to a fixed point.

A loop matches when its carries split into

* **state** -- floating-point carries the body updates as ``x <- f(theta, x)``;
* **previous** -- carries the body sets to the incoming value of a state carry
  (the ``(x_prev, x) -> (x, f(x))`` pair of a tutorial ``fixed_point``);
* **invariant** -- carries the body passes through unchanged (parameters);
* **counter** -- integer / boolean carries (iteration counters, flags);
* **auxiliary** -- floating-point carries no state update reads and whose final
  value is unused (a convergence gap the condition tests),

the state update ``f`` reads only the body's constants, the state and the
invariant carries (not a counter, not a previous iterate), and the condition
reads the state or a previous iterate (a convergence test; a loop whose
condition only counts is a fixed-length loop, not a solve, unless forced).
``theta`` -- what the fixed point depends on -- is the body constants and the
invariant carries that ``f`` reads.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import jax.numpy as jnp

from .. import jax_adapter as jx
from ..backends.jaxpr import region_to_closed_jaxpr
from ..ir.equation import Equation
from ..ir.value import is_literal

STATE, PREVIOUS, INVARIANT, COUNTER, AUXILIARY = (
    "state", "previous", "invariant", "counter", "auxiliary")


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


def _inexact(aval) -> bool:
    return jnp.issubdtype(aval.dtype, jnp.inexact)


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
    cond_n, body_n = p["cond_nconsts"], p["body_nconsts"]
    carries = body.invars[body_n:]
    m = len(carries)
    position = {v: i for i, v in enumerate(carries)}
    consts = set(body.invars[:body_n])
    kinds: list[str] = []
    copies: dict[int, int] = {}
    for i, out in enumerate(body.outvars):
        aval = carries[i].aval
        if not is_literal(out) and out is carries[i]:
            kinds.append(INVARIANT)
        elif not is_literal(out) and out in position:
            kinds.append(PREVIOUS)
            copies[i] = position[out]
        elif not _inexact(aval):
            kinds.append(COUNTER)
        elif not is_literal(out) and out in consts:
            return f"carry {i} is set to a loop constant, not updated from the iterate"
        else:
            kinds.append(STATE)
    for i, j in copies.items():
        if kinds[j] != STATE:
            if not _inexact(carries[i].aval):
                kinds[i] = COUNTER
                continue
            return f"carry {i} copies carry {j}, which the iteration does not update"
    state = [i for i, k in enumerate(kinds) if k == STATE]
    if not state:
        return "no floating-point carry is updated by the iteration"

    body_closed = region_to_closed_jaxpr(body)
    cond_closed = region_to_closed_jaxpr(cond)
    if body_closed.consts or cond_closed.consts:
        return "the loop body or condition carries constants of its own"
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
        f_inputs.append(("carry", i))

    _, cond_used = jx.dce_jaxpr(cond_closed.jaxpr, [True])
    tests_iterate = any(cond_used[cond_n + i] and kinds[i] in (STATE, PREVIOUS, AUXILIARY)
                        for i in range(m))
    if not tests_iterate and not forced:
        return ("the loop condition does not test the iterates (a counted loop, not a fixed-point "
                "iteration); select it with implicit-diff{loops=...} if it converges anyway")
    return FixedPointLoop(eqn=eqn, cond_n=cond_n, body_n=body_n, kinds=kinds, copies=copies,
                          state=state, f_jaxpr=f_jaxpr, f_inputs=f_inputs)
