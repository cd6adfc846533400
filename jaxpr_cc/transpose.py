"""Transposing a jaxpr that is linear in some of its inputs.

``transpose_linear(closed, linear)`` takes a constant-free ``ClosedJaxpr`` and a
mask of the inputs it is linear in; it returns a constant-free ``ClosedJaxpr``
taking ``(the other inputs, in order; cotangents of every output)`` and
returning the cotangents of the linear inputs.  The work is JAX's own
``jax.linear_transpose``, applied to an evaluation of the jaxpr and traced with
``jax_adapter.trace_flat``; the other inputs are constants of the transposition.

When the jaxpr is not linear in those inputs -- a nonlinear primitive reads them
(``sin(ct)``, ``ct * ct``, ``clip(ct)``), a loop carries them, or an output does
not depend on them but is not zero (an affine map) -- :class:`NotTransposableError`
names the first offending equation and the user source line it came from.
That check runs first, on the jaxpr's structure (JAX's transposition would
silently drop the constant part of an affine map), and is conservative: a map
that is linear only because a constant part cancels or never reaches the
result (an ODE adjoint packing state and cotangent into one array) is reported
as affine.
"""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from . import jax_adapter as jx
from .jax_adapter import ClosedJaxpr, Literal


class NotTransposableError(ValueError):
    """The jaxpr is not linear (or not transposable) in the inputs said to be linear."""

    def __init__(self, message: str, equation=None, reason: str = ""):
        super().__init__(message)
        self.equation = equation
        self.reason = reason


def transpose_linear(closed: ClosedJaxpr, linear: Sequence[bool], *,
                     what: str = "the function", linear_name: str = "its linear inputs") -> ClosedJaxpr:
    """The transpose of ``closed`` with respect to the inputs marked in ``linear``.

    ``what`` names the function and ``linear_name`` its linear inputs in error
    messages (e.g. "the bwd of custom_vjp rule 'f' (f.py:12)", "the cotangent").
    """
    linear = list(linear)
    in_avals = list(closed.in_avals)
    if len(linear) != len(in_avals):
        raise ValueError(f"transpose_linear: {len(linear)} linearity flags for {len(in_avals)} inputs")
    if closed.consts:
        raise ValueError("transpose_linear: the jaxpr must be constant-free "
                         "(lift its constants to inputs first)")
    lin_pos = [i for i, flag in enumerate(linear) if flag]
    other_pos = [i for i, flag in enumerate(linear) if not flag]
    for i in lin_pos:
        if not jnp.issubdtype(in_avals[i].dtype, jnp.inexact):
            raise NotTransposableError(
                f"{what}: linear input {i} is {in_avals[i].str_short()}; only float and complex "
                f"inputs can be transposed")
    problem = first_nonlinear_equation(closed.jaxpr, linear)
    if problem is not None:
        raise _error(what, linear_name, problem)
    out_avals = list(closed.out_avals)
    lin_examples = [jax.ShapeDtypeStruct(in_avals[i].shape, in_avals[i].dtype) for i in lin_pos]

    def transposed(*args):
        others, cts = args[:len(other_pos)], args[len(other_pos):]

        def forward(*lin):
            full = [None] * len(in_avals)
            for i, v in zip(other_pos, others):
                full[i] = v
            for i, v in zip(lin_pos, lin):
                full[i] = v
            return list(jx.eval_jaxpr(closed.jaxpr, (), *full))

        if not lin_examples:
            return []
        return list(jax.linear_transpose(forward, *lin_examples)(list(cts)))

    t_avals = [in_avals[i] for i in other_pos] + [_ct_aval(a) for a in out_avals]
    try:
        jaxpr, consts, _ = jx.trace_flat(transposed, t_avals, "transpose")
    except (NotImplementedError, AssertionError, TypeError, ValueError) as e:
        # The structural check above found nothing; report what JAX said.
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise NotTransposableError(f"{what} cannot be transposed in {linear_name}: "
                                   f"JAX says: {first}") from e
    if consts:
        # Only an array constant created by the transposition itself lands here;
        # rule regions must be constant-free, so this is reported, not kept.
        raise NotTransposableError(f"{what}: its transpose captured {len(consts)} array "
                                   f"constants; rule regions must be constant-free")
    return ClosedJaxpr(jaxpr, [])


def _ct_aval(aval):
    return jx.to_cotangent_aval(aval) if jnp.issubdtype(aval.dtype, jnp.inexact) else aval


def _error(what: str, linear_name: str, problem: "Problem") -> NotTransposableError:
    eqn = problem.equation
    message = f"{what} is not linear in {linear_name}: {problem.reason}"
    if eqn is not None:
        message += f" at `{eqn_text(eqn)}`"
        inside = [_call_name(e) for e in problem.context]
        if inside:
            message += " inside " + " inside ".join(f"`{n}`" for n in inside)
        # JAX records no user frame for equations of library functions traced
        # under jit (jnp.clip): the nearest enclosing call's frame is the user's.
        where = next((w for w in map(lambda e: jx.source_summary(e.source_info),
                                     [eqn, *problem.context]) if w), "")
        if where:
            message += f" ({where})"
    return NotTransposableError(message, eqn, problem.reason)


def _call_name(eqn) -> str:
    name = eqn.params.get("name")
    return f"{eqn.primitive.name}[{name}]" if isinstance(name, str) else eqn.primitive.name


def eqn_text(eqn) -> str:
    """A one-line rendering of a jaxpr equation by types (variable names mean
    nothing outside the jaxpr): ``mul[...](f32[3], 2.0) -> f32[3]``; scalar
    params are shown, nested jaxprs are not."""
    def atom(a):
        if isinstance(a, Literal):
            return str(np.asarray(a.val).item()) if np.ndim(a.val) == 0 else str(a.val)
        return a.aval.str_short(short_dtypes=True)
    shown = [f"{k}={v}" for k, v in sorted(eqn.params.items())
             if isinstance(v, (bool, int, float, str)) or (isinstance(v, tuple) and all(
                 isinstance(x, (int, float, str)) for x in v))]
    params = f"[{' '.join(shown)}]" if shown and len(" ".join(shown)) <= 80 else ""
    ins = ", ".join(atom(a) for a in eqn.invars)
    outs = ", ".join(v.aval.str_short(short_dtypes=True) for v in eqn.outvars)
    return f"{eqn.primitive.name}{params}({ins}) -> {outs}"


class Problem:
    """Why a jaxpr is not linear: the equation, the reason, and the calls
    (innermost first) that contain the equation."""
    __slots__ = ("equation", "reason", "context")

    def __init__(self, equation, reason: str, context=()):
        self.equation = equation
        self.reason = reason
        self.context = tuple(context)

    def within(self, call_eqn) -> "Problem":
        return Problem(self.equation, self.reason, self.context + (call_eqn,))


# --------------------------------------------------------------- linearity
# Primitives whose transpose exists for some operands only: position -> why the
# other operands cannot carry the linear input.
_NONLINEAR_OPERANDS = {
    "div": (slice(1, 2), "division by a value that depends on the linear input"),
    "select_n": (slice(0, 1), "a selection predicate that depends on the linear input"),
    "dynamic_slice": (slice(1, None), "slice indices that depend on the linear input"),
    "dynamic_update_slice": (slice(2, None), "update indices that depend on the linear input"),
    "gather": (slice(1, 2), "gather indices that depend on the linear input"),
    "scatter-add": (slice(1, 2), "scatter indices that depend on the linear input"),
    "scatter-sub": (slice(1, 2), "scatter indices that depend on the linear input"),
    "scatter": (slice(1, 2), "scatter indices that depend on the linear input"),
    "scatter-mul": (slice(1, 3), "scatter-multiplication by indices or factors that depend on "
                                 "the linear input"),
    "select_and_gather_add": (slice(1, 2), "a window selection by a value that depends on the "
                                           "linear input"),
    "triangular_solve": (slice(0, 1), "a triangular solve whose matrix depends on the linear "
                                      "input"),
}
_CALL_PARAMS = ("jaxpr", "call_jaxpr", "fun_jaxpr")


# Primitives linear in several operands jointly (the sum of linear maps): an
# operand that does not carry the linear input adds a constant, which must be zero.
_JOINT_OPERANDS = {
    "add": slice(None), "sub": slice(None), "add_any": slice(None),
    "concatenate": slice(None), "stack": slice(None), "pad": slice(None),
    "complex": slice(None), "select_n": slice(1, None), "dynamic_update_slice": slice(0, 2),
    "scatter-add": slice(0, 3, 2), "scatter": slice(0, 3, 2),
}
_ZERO_PRESERVING = ("broadcast_in_dim", "convert_element_type", "reshape", "transpose",
                    "squeeze", "expand_dims", "neg", "copy")
_AFFINE = "does not depend on the linear input and is not zero (an affine map, not a linear one)"


def first_nonlinear_equation(jaxpr, linear: Sequence[bool]) -> "Problem | None":
    """The first equation that keeps ``jaxpr`` from being linear in the inputs
    marked ``linear`` (a :class:`Problem`), or None when none is found."""
    found, _, _ = _scan(jaxpr, list(linear), [False] * len(linear), check_outputs=True)
    return found


def _is_zero_literal(atom) -> bool:
    try:
        return bool(np.all(np.asarray(atom.val) == 0))
    except (TypeError, ValueError):
        return False


def _scan(jaxpr, linear: list[bool], zeros: list[bool], *, check_outputs: bool):
    """Forward dependence on the linear inputs through ``jaxpr`` whose inputs are
    marked ``linear`` (carry the linear input) and ``zeros`` (are known zeros).
    Returns ``(problem, out_linear, out_zero)``.

    With ``check_outputs`` every output must carry the linear inputs or be zero
    (the top level); inside calls and loops an output that does not carry them is
    a coefficient the enclosing jaxpr may use.
    """
    dep = {v for v, flag in zip(jaxpr.invars, linear) if flag}
    zero_vars = {v for v, flag in zip(jaxpr.invars, zeros) if flag}

    def depends(atom) -> bool:
        return not isinstance(atom, Literal) and atom in dep

    def is_zero(atom) -> bool:
        return _is_zero_literal(atom) if isinstance(atom, Literal) else atom in zero_vars

    for eqn in jaxpr.eqns:
        flags = [depends(a) for a in eqn.invars]
        zflags = [is_zero(a) for a in eqn.invars]
        name = eqn.primitive.name
        if not any(flags):
            if name in _ZERO_PRESERVING and zflags[0]:
                zero_vars.update(eqn.outvars)
            elif name == "mul" and any(zflags):
                zero_vars.update(eqn.outvars)
            continue
        joint = _JOINT_OPERANDS.get(name)
        if joint is not None:
            for pos in range(len(eqn.invars))[joint]:
                if not flags[pos] and not zflags[pos]:
                    return Problem(eqn, f"'{name}' adds operand {pos}, which {_AFFINE}"), None, None
        problem, outs, out_zero = _eqn_linearity(eqn, flags, zflags)
        if problem is not None:
            return problem, None, None
        dep.update(v for v, flag in zip(eqn.outvars, outs) if flag)
        zero_vars.update(v for v, flag in zip(eqn.outvars, out_zero) if flag)
    out_linear = [depends(a) for a in jaxpr.outvars]
    out_zero = [is_zero(a) for a in jaxpr.outvars]
    if check_outputs:
        for i, (atom, flag, zero) in enumerate(zip(jaxpr.outvars, out_linear, out_zero)):
            if not flag and not zero:
                producer = next((e for e in jaxpr.eqns if atom in e.outvars), None)
                return Problem(producer, f"output {i} {_AFFINE}"), None, None
    return None, out_linear, out_zero


def _sub_jaxpr(eqn):
    for key in _CALL_PARAMS:
        sub = eqn.params.get(key)
        if sub is not None:
            return sub.jaxpr if isinstance(sub, ClosedJaxpr) else sub
    return None


def _eqn_linearity(eqn, flags: list[bool], zeros: list[bool]):
    """``(problem, out_linear, out_zero)`` for one equation reading linear values."""
    name = eqn.primitive.name
    n_out = len(eqn.outvars)
    if name == "while":
        return Problem(eqn, "a while_loop carries the linear input (a loop of unknown trip "
                            "count cannot be transposed)"), None, None
    if name == "cond":
        return _cond_linearity(eqn, flags, zeros)
    if name == "scan":
        return _scan_linearity(eqn, flags, zeros)
    if name == "linear_call":
        lead = eqn.params["num_callee_consts"] + eqn.params["num_res"]
        if any(flags[:lead]):
            return (Problem(eqn, "a linear_call residual that depends on the linear input"),
                    None, None)
        return None, [True] * n_out, [False] * n_out
    sub = _sub_jaxpr(eqn)
    if sub is not None and len(sub.invars) == len(flags):
        # Calls (jit, remat, custom rules' primals, which partial evaluation
        # inlines): the problem, if any, is inside.
        problem, outs, out_zero = _scan(sub, flags, zeros, check_outputs=False)
        return (problem.within(eqn) if problem is not None else None), outs, out_zero
    if not jx.has_transpose_rule(eqn.primitive):
        return (Problem(eqn, f"'{name}' is not a linear operation (it has no transpose rule)"),
                None, None)
    if jx.is_bilinear(eqn.primitive) and sum(flags) > 1:
        return (Problem(eqn, f"'{name}' of two values that both depend on the linear input"),
                None, None)
    positions = _NONLINEAR_OPERANDS.get(name)
    if positions is not None and any(flags[positions[0]]):
        return Problem(eqn, positions[1]), None, None
    if name == "custom_linear_solve":
        n_consts = sum(eqn.params["const_lengths"])
        if any(flags[:n_consts]):
            return (Problem(eqn, "a linear solve whose operator depends on the linear input"),
                    None, None)
    # An integer or boolean result of a float value rounds or compares it (JAX
    # registers a transpose for convert_element_type whatever the target dtype).
    discrete = next((v.aval for v in eqn.outvars
                     if not jnp.issubdtype(v.aval.dtype, jnp.inexact)), None)
    if discrete is not None:
        return (Problem(eqn, f"'{name}' to {discrete.str_short()} is not a linear operation "
                             f"(it rounds or compares the linear input)"), None, None)
    return None, [True] * n_out, [False] * n_out


def _cond_linearity(eqn, flags, zeros):
    if flags[0]:
        return Problem(eqn, "a cond branch index that depends on the linear input"), None, None
    n_out = len(eqn.outvars)
    results = []
    for branch in eqn.params["branches"]:
        problem, b_lin, b_zero = _scan(branch.jaxpr, flags[1:], zeros[1:], check_outputs=False)
        if problem is not None:
            return problem.within(eqn), None, None
        results.append((b_lin, b_zero))
    outs = [any(r[0][k] for r in results) for k in range(n_out)]
    for j, (b_lin, b_zero) in enumerate(results):
        for k in range(n_out):
            if outs[k] and not b_lin[k] and not b_zero[k]:
                return Problem(eqn, f"branch {j} of a cond returns output {k}, which {_AFFINE}"), \
                    None, None
    out_zero = [all(r[1][k] for r in results) for k in range(n_out)]
    return None, outs, out_zero


def _scan_linearity(eqn, flags, zeros):
    body = eqn.params["jaxpr"].jaxpr
    n_consts, n_carry = eqn.params["num_consts"], eqn.params["num_carry"]
    carry = slice(n_consts, n_consts + n_carry)
    init_linear, init_zero = flags[carry], zeros[carry]
    flags, zeros = list(flags), list(zeros)
    # A carry carries the linear input if it starts with it or the body puts it
    # there; it is zero only if it starts zero and the body keeps it zero.
    while True:
        problem, outs, out_zero = _scan(body, flags, zeros, check_outputs=False)
        if problem is not None:
            return problem.within(eqn), None, None
        lin_new = [a or b for a, b in zip(flags[carry], outs[:n_carry])]
        zero_new = [a and b for a, b in zip(zeros[carry], out_zero[:n_carry])]
        if lin_new == flags[carry] and zero_new == zeros[carry]:
            break
        flags[carry], zeros[carry] = lin_new, zero_new
    for k in range(n_carry):
        if not lin_new[k]:
            continue
        if not init_linear[k] and not init_zero[k]:
            return Problem(eqn, f"scan carry {k} starts from a value that {_AFFINE}"), None, None
        if not outs[k] and not out_zero[k]:
            return (Problem(eqn, f"the scan body sets carry {k} to a value that {_AFFINE}"),
                    None, None)
    return None, lin_new + outs[n_carry:], zero_new + out_zero[n_carry:]
