"""Transposing a jaxpr that is linear in some of its inputs.

``transpose_linear(closed, linear)`` takes a constant-free ``ClosedJaxpr`` and a
mask of the inputs it is linear in; it returns a constant-free ``ClosedJaxpr``
taking ``(the other inputs, in order; cotangents of every output)`` and
returning the cotangents of the linear inputs.  The work is JAX's own
``jax.linear_transpose``, applied to an evaluation of the jaxpr and traced with
``jax_adapter.trace_flat``; the other inputs are constants of the transposition.

JAX transposes no ``while_loop``; loops that iterate a linear map are bound as
``linear_call`` rules whose transpose iterates the transposed map (see "while
loops" below): counted loops exactly; loops to convergence (a fixed-point or
Neumann iteration of an adjoint solve) as the limit of their iteration, by the
transposed iteration run until it no longer changes at working precision.  A
loop whose stopping test reads the linear input is accepted only when that
test is a convergence test (``closure.convergence``): any other test makes the
trip count, and so the map, depend on the linear input.  Whether such a loop
runs at all is read at its start on a probe of the linear input (``_StartProbe``):
one that does not returns its start, and transposes as such.  Such loops are found
inside calls, custom rules' primals, ``cond`` branches and ``scan`` bodies too.

When the jaxpr is not linear in those inputs -- a nonlinear primitive reads them
(``sin(ct)``, ``ct * ct``, ``clip(ct)``), a loop's stopping test reads them
other than through its carries, or an output does not depend on them but is not
zero (an affine map) -- :class:`NotTransposableError`
names the first offending equation and the user source line it came from.
That check runs first, on the jaxpr's structure (JAX's transposition would
silently drop the constant part of an affine map).  It tracks known zeros: a
value computed from zeros by an operation linear in them (no constant added or
placed beside them) is zero, so an accumulator that starts at zero and to which
a loop only adds zeros is a zero output, not an affine one.  It is conservative: a map
that is linear only because a constant part cancels or never reaches the
result (an ODE adjoint packing state and cotangent into one array) is reported
as affine.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from .. import jax_adapter as jx
from ..jax_adapter import ClosedJaxpr, Literal
from .convergence import COUNTER, STATE, carry_kinds, convergence_test, held, loop_cap
from .value_numbers import value_numbers


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
    problem, affine = linearity(closed.jaxpr, linear)
    if problem is not None:
        raise _error(what, linear_name, problem)
    out_avals = list(closed.out_avals)
    lin_examples = [_example(in_avals[i]) for i in lin_pos]

    def transposed(*args):
        others, cts = args[:len(other_pos)], args[len(other_pos):]

        def forward(*lin):
            full = [None] * len(in_avals)
            for i, v in zip(other_pos, others):
                full[i] = v
            for i, v in zip(lin_pos, lin):
                full[i] = v
            # Loops that iterate a linear map are bound as linear_calls whose
            # transpose iterates the transposed map (JAX transposes no while_loop).
            return eval_linear(closed.jaxpr, (), full, linear)

        if not lin_examples:
            return []
        # Whether each loop to convergence runs at all, read at its start on a
        # probe of the linear input (see _StartProbe); the transposition uses it.
        with _StartProbe.reading(_probe_starts(closed.jaxpr, forward, lin_examples)):
            result = list(jax.linear_transpose(forward, *lin_examples)(list(cts)))
        if affine:
            # A constant was merged into the linear values (see _MERGES); the
            # function is linear only if the constant parts never reach the
            # outputs: check that they do not, at the values given (the function
            # at a zero linear input is zero).  Where they do, the function is
            # affine and has no transpose: the result is NaN rather than the
            # transpose of its linear part.
            full = [None] * len(in_avals)
            for i, v in zip(other_pos, others):
                full[i] = v
            for i in lin_pos:
                full[i] = jnp.zeros(in_avals[i].shape, in_avals[i].dtype)
            at_zero = _eval_at_zero(closed.jaxpr, (), full,
                                    [i in lin_pos for i in range(len(in_avals))])
            linear_here = functools.reduce(
                jnp.logical_and, [jnp.all(z == 0) for z, a in zip(at_zero, out_avals)
                                  if jnp.issubdtype(a.dtype, jnp.inexact)], jnp.bool_(True))
            # A linear input no output reads has a zero cotangent whatever the check
            # says: it stays a plain zero, so that an analysis of this transpose sees
            # it as one (a custom_vjp's tangent for an output whose cotangent its bwd
            # never reads is then a symbolic zero; the other results carry the NaN).
            unread = [not any(reaches(closed.jaxpr, [j == i for j in range(len(in_avals))]))
                      for i in lin_pos]
            result = [r if skip else jnp.where(linear_here, r, jnp.full_like(r, jnp.nan))
                      for r, skip in zip(result, unread)]
        return result

    t_avals = [in_avals[i] for i in other_pos] + [_ct_aval(a) for a in out_avals]
    try:
        jaxpr, consts, _ = jx.trace_flat(transposed, t_avals, "transpose")
    except (NotImplementedError, AssertionError, TypeError, ValueError) as e:
        # The structural check above found nothing; report what JAX said.
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise NotTransposableError(f"{what} cannot be transposed in {linear_name}: "
                                   f"JAX says: {first}") from e
    if consts:
        # Array literals of the jaxpr (a Runge-Kutta tableau) that the
        # transposition's trace picked up as constants: literals again (rule
        # regions are constant-free).  Anything else is reported, not kept.
        inlined = jx.inline_host_consts(jaxpr, consts)
        if inlined is None:
            raise NotTransposableError(f"{what}: its transpose captured {len(consts)} array "
                                       f"constants; rule regions must be constant-free")
        jaxpr = inlined
    return ClosedJaxpr(jx.vectors_as_rhs(jaxpr), [])


def _example(aval) -> jax.ShapeDtypeStruct:
    # Inside shard_map (check_vma) a linear input's type includes the manual axes
    # it varies over (and its mesh, where they are Manual); jax.linear_transpose
    # checks the cotangents against it.
    sharding = getattr(aval, "sharding", None)
    typed = {} if sharding is None or sharding.mesh.empty else {"sharding": sharding}
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype,
                                manual_axis_type=jx.manual_axis_type_of(aval), **typed)


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
    "select_and_scatter_add": (slice(1, 2), "a window selection (max pooling's derivative) by "
                                            "a value that depends on the linear input"),
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
# Primitives whose result i is operand i, moved or fenced (device_put of a
# tuple, as CG does with (b, x0)): linear, and zero, operand by operand.
_PER_OPERAND = ("device_put", "optimization_barrier")
# Primitives whose value is their operand's and which only stop JAX's derivatives
# (stop_gradient): as a map of the bwd's cotangent, the identity.  The bwd is
# transposed as a map of values; JAX's derivative of the bwd is not involved.
_VALUE_IDENTITY = ("stop_gradient",)
# (pvary: shard_map's check_vma cast of a device-invariant value to a varying
# one; it moves no data, so a zero stays zero -- `0 * i` in a bwd under shard_map.)
_ZERO_PRESERVING = ("broadcast_in_dim", "convert_element_type", "reshape", "transpose",
                    "squeeze", "expand_dims", "neg", "copy", "pvary")
_AFFINE = "does not depend on the linear input and is not zero (an affine map, not a linear one)"


def _pow_one_linearity(eqn, flags):
    """``x ** 1`` is ``x``."""
    return eqn.params["y"] == 1, [True]


def _sort_linearity(eqn, flags):
    """A sort whose keys do not read the linear input permutes its other
    operands by the keys' order: linear in them (the keys' results are not)."""
    keys = eqn.params["num_keys"]
    return not any(flags[:keys]), [False] * keys + list(flags[keys:])


def _pow_one_form(eqn, invals):
    return [invals[0]]


def _sort_form(eqn, invals):
    """The sort as the permutation it applies (a sort of the keys with an index
    payload) gathered from the other operands, which JAX transposes as a
    scatter-add."""
    dim, keys = eqn.params["dimension"], eqn.params["num_keys"]
    shape = jnp.shape(invals[0])
    index = jax.lax.broadcasted_iota(jnp.int32, shape, dim)
    *sorted_keys, order = jax.lax.sort((*invals[:keys], index), dimension=dim,
                                       is_stable=eqn.params["is_stable"], num_keys=keys)
    return [*sorted_keys, *[jnp.take_along_axis(x, order, axis=dim) for x in invals[keys:]]]


def _gather_fill_linearity(eqn, flags):
    """A gather of the linear input that fills out-of-bounds indices with a
    nonzero value puts a constant there: linear elsewhere."""
    fill = jx.gather_fill_value(eqn.params)
    return (fill is not None and not fill == 0 and flags[0] and not flags[1]), [True]


def _gather_fill_form(eqn, invals):
    """The gather with a zero fill, plus a term that is NaN times the operand where
    an index is out of bounds: the constant the fill puts beside the cotangent
    makes the transposed map NaN, never a different number (as for other
    constants, see _MERGES).  (A mask on the gather's result alone would be
    dropped with the out-of-bounds entries by the transposed scatter.)"""
    operand, indices = invals
    out = jx.gather_as(eqn.params, operand, indices, 0)
    inside = jx.gather_as(eqn.params, jnp.ones_like(operand), indices, 0)
    poison = jnp.where(inside == 1, 0.0, jnp.nan).astype(out.dtype)
    return [out + jnp.sum(operand).astype(out.dtype) * poison]


# Primitives JAX gives no transpose rule that are linear for some operands:
# name -> (whether linear for these flags, and which results then are; the
# equation's value in a form JAX transposes).
_LINEAR_FORMS = {
    "integer_pow": (_pow_one_linearity, _pow_one_form),
    "sort": (_sort_linearity, _sort_form),
    "gather": (_gather_fill_linearity, _gather_fill_form),
}


_LENIENT = [0]
# Counts the constants merged into linear values while one jaxpr is analysed
# (outside lenient passes): see _MERGES.
_MERGED = [0]

# Primitives that place values side by side (the operands occupy different
# positions of the result): a non-zero constant merged with the linear input
# this way (a buffer of inf into which linear values are written, a selection
# between a linear value and a constant) makes an affine value whose constant
# part may never be read -- diffrax's save buffers.  Structure cannot tell, so
# those are accepted here and checked where the function is transposed (its
# value at a zero linear input must be zero).  A constant *added* to the linear
# input (add, sub, scatter-add) shifts every value: refused.
_MERGES = ("concatenate", "pad", "select_n", "dynamic_update_slice", "scatter")


class _lenient:
    """Within: :func:`_scan` does not stop at problems (a loop's carries are
    being found; an early iteration may see a carry as not yet linear)."""

    def __enter__(self):
        _LENIENT[0] += 1

    def __exit__(self, *exc):
        _LENIENT[0] -= 1


#: The jaxprs being read (innermost last), each with its value numbers once
#: asked for: a loop's carries are compared by value in the jaxpr that starts it.
_ENCLOSING: list = []


class _reading:
    """Within: equations read belong to ``jaxpr``."""

    def __init__(self, jaxpr):
        self.entry = [jaxpr, None]

    def __enter__(self):
        _ENCLOSING.append(self.entry)

    def __exit__(self, *exc):
        _ENCLOSING.pop()


def _same_value(a, b) -> bool:
    """Whether atoms ``a`` and ``b`` of the jaxpr being read hold the same value
    by construction (see ``value_numbers``)."""
    if a is b:
        return True
    if not _ENCLOSING:
        return False
    entry = _ENCLOSING[-1]
    if entry[1] is None:
        entry[1] = value_numbers(entry[0])
    numbers = entry[1]
    return a in numbers and b in numbers and numbers[a] == numbers[b]


def first_nonlinear_equation(jaxpr, linear: Sequence[bool]) -> "Problem | None":
    """The first equation that keeps ``jaxpr`` from being linear in the inputs
    marked ``linear`` (a :class:`Problem`), or None when none is found."""
    return linearity(jaxpr, linear)[0]


def linearity(jaxpr, linear: Sequence[bool]) -> "tuple[Problem | None, bool]":
    """``(problem, merged)``: the first equation that keeps ``jaxpr`` from being
    linear in the inputs marked ``linear`` (or None), and whether a non-zero
    constant is merged into the linear values somewhere (see ``_MERGES``): then
    ``jaxpr`` is linear only if that constant never reaches its outputs, which
    only its values can tell."""
    saved = _MERGED[0]
    _MERGED[0] = 0
    try:
        found, _, _ = _scan(jaxpr, list(linear), [False] * len(linear), check_outputs=True)
        return found, _MERGED[0] > 0
    finally:
        _MERGED[0] = saved


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
    with _reading(jaxpr):
        return _scan_equations(jaxpr, linear, zeros, check_outputs=check_outputs)


def _scan_equations(jaxpr, linear: list[bool], zeros: list[bool], *, check_outputs: bool):
    dep = {v for v, flag in zip(jaxpr.invars, linear) if flag}
    live = _live_equations(jaxpr)
    # Tolerances a linear solve takes from its right-hand side are not part of
    # the linear map (see _solve_tolerances): their equations are not checked.
    in_cones = {id(e) for cone in _solve_tolerances(jaxpr, linear).values()
                for e in cone.equations}
    live = [is_live and id(e) not in in_cones for e, is_live in zip(jaxpr.eqns, live)]
    used = _used_vars(jaxpr, live)
    zero_vars = {v for v, flag in zip(jaxpr.invars, zeros) if flag}

    def depends(atom) -> bool:
        return not isinstance(atom, Literal) and atom in dep

    def is_zero(atom) -> bool:
        return _is_zero_literal(atom) if isinstance(atom, Literal) else atom in zero_vars

    for eqn, is_live in zip(jaxpr.eqns, live):
        if not is_live:
            continue  # dead code (a discarded step size): it computes nothing
        flags = [depends(a) for a in eqn.invars]
        zflags = [is_zero(a) for a in eqn.invars]
        name = eqn.primitive.name
        if not any(flags):
            if any(zflags):
                zero_vars.update(v for v, z in zip(eqn.outvars, _zero_results(eqn, zflags, used))
                                 if z)
            continue
        joint = _JOINT_OPERANDS.get(name)
        if joint is not None:
            for pos in range(len(eqn.invars))[joint]:
                if not flags[pos] and not zflags[pos] and not _LENIENT[0]:
                    if name in _MERGES:
                        _MERGED[0] += 1
                        continue
                    return Problem(eqn, f"'{name}' adds operand {pos}, which {_AFFINE}"), None, None
        problem, outs, out_zero = _eqn_linearity(eqn, flags, zflags, used)
        if problem is not None:
            if not _LENIENT[0]:
                return problem, None, None
            # Finding which values carry the linear input (a loop's fixed point):
            # go on as if the equation were linear; the final check reports it.
            # (Discrete results -- a comparison, a rounding -- carry nothing linear.)
            outs = [r and jnp.issubdtype(v.aval.dtype, jnp.inexact)
                    for v, r in zip(eqn.outvars, _eqn_reaches(eqn, flags))]
            out_zero = [False] * len(eqn.outvars)
        if jx.is_bilinear(eqn.primitive) and any(z and not f for z, f in zip(zflags, flags)):
            out_zero = [True] * len(eqn.outvars)  # a product with a zero (0.0 * sum(g))
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


def known_zero_outputs(jaxpr, zeros: Sequence[bool]) -> list[bool]:
    """Which outputs of ``jaxpr`` are zero whenever its inputs marked ``zeros``
    are, whatever the other inputs hold: zeros followed through linear maps,
    products with a zero and loops that only ever add zeros (``_zero_results``).
    The other inputs are treated as unknown values, so no linearity of the
    jaxpr is assumed.  (A custom rule's tangent for a pattern of perturbed
    inputs: an output it computes from the zero tangents alone is a zero.)"""
    _, _, out_zero = _scan(jaxpr, [False] * len(jaxpr.invars), list(zeros),
                           check_outputs=False)
    return list(out_zero)


def _zero_results(eqn, zflags: list[bool], used) -> list[bool]:
    """Which results of ``eqn`` are known zeros, given which operands are (none
    carries the linear input).  A result is zero when it is a linear function of
    the zero operands alone: the linearity analysis, run with the zero operands as
    the linear ones, finds no problem (no nonlinear use, no constant added or
    merged in) -- a linear map of zero is zero.  (An accumulator that starts at
    zero and to which a loop only ever adds zeros: equinox's checkpointed bwd
    accumulates the cotangent of a closed-over value its step does not use.)"""
    name = eqn.primitive.name
    n_out = len(eqn.outvars)
    if eqn.primitive is jx.forward_mode_refused_p:
        return [False] * n_out  # a refusal raises when evaluated: never a zero
    if name in _ZERO_PRESERVING:
        return [zflags[0]] * n_out
    if name in _PER_OPERAND:
        return list(zflags)
    if name == "linear_call" and len(eqn.params["callee"].jaxpr.invars) == len(zflags):
        # A call of its callee (residuals, then linear operands): a result is zero
        # when the callee computes it from the zero operands alone (a custom_vjp's
        # tangent for an output whose cotangent its bwd never reads).
        return known_zero_outputs(eqn.params["callee"].jaxpr, zflags)
    if jx.is_bilinear(eqn.primitive) and any(zflags):
        return [True] * n_out  # mul, dot_general: zero times anything
    # Only float operands can carry a linear value (a False predicate is no zero).
    zflags = [z and jnp.issubdtype(a.aval.dtype, jnp.inexact) for a, z in zip(eqn.invars, zflags)]
    if not any(zflags):
        return [False] * n_out
    joint = _JOINT_OPERANDS.get(name)
    if joint is not None and any(not zflags[pos] for pos in range(len(eqn.invars))[joint]):
        return [False] * n_out  # a non-zero operand is added or placed in
    saved_lenient, saved_merged = _LENIENT[0], _MERGED[0]
    _LENIENT[0] = 0  # strict: a fixed point being found must not assume a zero
    try:
        problem, outs, out_zero = _eqn_linearity(eqn, zflags, zflags, used)
        merged = _MERGED[0] != saved_merged  # a constant placed beside the zeros
    finally:
        _LENIENT[0], _MERGED[0] = saved_lenient, saved_merged
    if problem is not None or merged:
        return [False] * n_out
    return [bool(a or b) for a, b in zip(outs, out_zero)]


def _sub_jaxpr(eqn):
    for key in _CALL_PARAMS:
        sub = eqn.params.get(key)
        if sub is not None:
            return sub.jaxpr if isinstance(sub, ClosedJaxpr) else sub
    return None


def _expand(flags, read) -> list[bool]:
    """Per-output ``flags`` of the outputs marked ``read``, False for the others."""
    it = iter(flags)
    return [next(it) if r else False for r in read]


def _eqn_linearity(eqn, flags: list[bool], zeros: list[bool], used):
    """``(problem, out_linear, out_zero)`` for one equation reading linear values."""
    name = eqn.primitive.name
    n_out = len(eqn.outvars)
    if name == "while":
        return _while_linearity(eqn, flags, zeros, used)
    if name == "cond":
        return _cond_linearity(eqn, flags, zeros)
    if name == "scan":
        return _scan_linearity(eqn, flags, zeros)
    if name in _PER_OPERAND or name in _VALUE_IDENTITY:
        return None, list(flags), list(zeros)
    if name == "linear_call":
        lead = eqn.params["num_callee_consts"] + eqn.params["num_res"]
        if any(flags[:lead]):
            return (Problem(eqn, "a linear_call residual that depends on the linear input"),
                    None, None)
        # Its results are linear in all its linear operands together: one that
        # neither carries the linear input nor is zero adds a part of its own (the
        # known-zero analysis runs this with the zero values as the linear input).
        for k in range(lead, len(eqn.invars)):
            if (not flags[k] and not zeros[k]
                    and jnp.issubdtype(eqn.invars[k].aval.dtype, jnp.inexact)):
                return (Problem(eqn, f"linear_call's linear operand {k - lead} {_AFFINE}"),
                        None, None)
        return None, [True] * n_out, [False] * n_out
    form = _LINEAR_FORMS.get(name)
    if form is not None:
        ok, out_flags = form[0](eqn, flags)
        if ok:
            return None, out_flags, [f and all(z for z, g in zip(zeros, flags) if g)
                                     for f in out_flags]
    sub = _sub_jaxpr(eqn)
    if sub is not None and len(sub.invars) == len(flags):
        # Calls (jit, remat, custom rules' primals, which partial evaluation
        # inlines): the problem, if any, is inside -- in what computes the
        # results the caller reads (lineax's solve also returns a status code).
        read = [v in used for v in eqn.outvars]
        if not all(read):
            sub, _ = jx.dce_jaxpr(sub, read, instantiate=True)
        problem, outs, out_zero = _scan(sub, flags, zeros, check_outputs=False)
        if problem is not None:
            return problem.within(eqn), None, None
        if not all(read):
            outs, out_zero = _expand(outs, read), _expand(out_zero, read)
        return None, outs, out_zero
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
    # (One nothing reads -- lineax's solve status -- changes nothing.)
    discrete = next((v.aval for v in eqn.outvars
                     if not jnp.issubdtype(v.aval.dtype, jnp.inexact) and v in used), None)
    if discrete is not None:
        return (Problem(eqn, f"'{name}' to {discrete.str_short()} is not a linear operation "
                             f"(it rounds or compares the linear input)"), None, None)
    return None, [True] * n_out, [False] * n_out


def _cond_linearity(eqn, flags, zeros):
    if flags[0]:
        return Problem(eqn, "a cond branch index that depends on the linear input"), None, None
    n_out = len(eqn.outvars)
    results = []
    for branch in _taken_branches(eqn):
        problem, b_lin, b_zero = _scan(branch.jaxpr, flags[1:], zeros[1:], check_outputs=False)
        if problem is not None:
            return problem.within(eqn), None, None
        results.append((b_lin, b_zero))
    outs = [any(r[0][k] for r in results) for k in range(n_out)]
    for j, (b_lin, b_zero) in enumerate(results):
        for k in range(n_out):
            if outs[k] and not b_lin[k] and not b_zero[k] and not _LENIENT[0]:
                # A selection between a linear value and a constant: a merge.
                _MERGED[0] += 1
    out_zero = [all(r[1][k] for r in results) for k in range(n_out)]
    return None, outs, out_zero


def _taken_branches(eqn) -> list:
    """The branches a cond can take: only one when its index is a literal (equinox
    and diffrax emit ``cond(1, ...)`` for a branch decided at trace time, whose other
    branch reads buffers that are affine in the linear input)."""
    branches = list(eqn.params["branches"])
    index = eqn.invars[0]
    if isinstance(index, Literal) and np.ndim(index.val) == 0:
        # lax.cond/switch clamp the index into range.
        return [branches[int(np.clip(int(index.val), 0, len(branches) - 1))]]
    return branches


def _scan_linearity(eqn, flags, zeros):
    body = eqn.params["jaxpr"].jaxpr
    n_consts, n_carry = eqn.params["num_consts"], eqn.params["num_carry"]
    carry = slice(n_consts, n_consts + n_carry)
    init_linear, init_zero = flags[carry], zeros[carry]
    flags, zeros = list(flags), list(zeros)
    # A carry carries the linear input if it starts with it or the body puts it
    # there; it is zero only if it starts zero and the body keeps it zero.
    with _lenient():
        while True:
            _, outs, out_zero = _scan(body, flags, zeros, check_outputs=False)
            lin_new = [a or b for a, b in zip(flags[carry], outs[:n_carry])]
            zero_new = [a and b for a, b in zip(zeros[carry], out_zero[:n_carry])]
            if lin_new == flags[carry] and zero_new == zeros[carry]:
                break
            flags[carry], zeros[carry] = lin_new, zero_new
    problem, outs, out_zero = _scan(body, flags, zeros, check_outputs=False)
    if problem is not None:
        return problem.within(eqn), None, None
    for k in range(n_carry):
        if not lin_new[k]:
            continue
        if not init_linear[k] and not init_zero[k]:
            return Problem(eqn, f"scan carry {k} starts from a value that {_AFFINE}"), None, None
        if not outs[k] and not out_zero[k]:
            return (Problem(eqn, f"the scan body sets carry {k} to a value that {_AFFINE}"),
                    None, None)
    return None, lin_new + outs[n_carry:], zero_new + out_zero[n_carry:]


# ------------------------------------------------------------- while loops
# A while_loop reading the linear input is linear when its carries split into
# linear ones L (they carry the linear input; the body maps them, with the
# linear loop constants, linearly) and the others N (a counter, coefficients:
# nothing linear reaches them).  Two kinds are transposed:
#
# * counted loops -- the stopping test reads N only, so the trip count T does
#   not depend on the linear input: the transpose runs the transposed body T
#   times, accumulating the constants' cotangents (exact);
# * loops to convergence -- the stopping test reads L and is a convergence
#   test of it (``|x_prev - x| > tol``, a residual, a Neumann term that
#   vanishes; checked by ``closure.convergence``): the loop computes the limit
#   of x <- M x + B c, and the transpose is that of the limit:
#   c_bar = B^T sum_j (M^T)^j L_bar and x0_bar = lim (M^T)^N L_bar (zero for a
#   contraction; a Neumann sum's accumulator keeps its start's cotangent).  It
#   runs the transposed iteration until neither changes at working precision
#   (``_transposed_limit``; NaN when it never settles).  Any other test on L
#   (``|g| > 1``) makes the trip count depend on the linear input: refused.
#
# Either way the linear update must not read N (the same linear map every
# step); a loop to convergence must not let its trip count escape.
def _live_equations(jaxpr) -> list[bool]:
    """Which equations reach an output or have effects (the others are dead)."""
    needed = {a for a in jaxpr.outvars if not isinstance(a, Literal)}
    live = [False] * len(jaxpr.eqns)
    for i in range(len(jaxpr.eqns) - 1, -1, -1):
        eqn = jaxpr.eqns[i]
        if eqn.effects or any(v in needed for v in eqn.outvars):
            live[i] = True
            needed.update(a for a in eqn.invars if not isinstance(a, Literal))
    return live


def _used_vars(jaxpr, live=None) -> set:
    """The variables live equations and the outputs read."""
    live = _live_equations(jaxpr) if live is None else live
    used = {a for e, is_live in zip(jaxpr.eqns, live) if is_live
            for a in e.invars if not isinstance(a, Literal)}
    used.update(a for a in jaxpr.outvars if not isinstance(a, Literal))
    return used


def reaches(jaxpr, flags) -> list[bool]:
    """Which outputs of ``jaxpr`` read the inputs marked: data dependence,
    followed through calls, branches and loop carries."""
    dep = {v for v, f in zip(jaxpr.invars, flags) if f}
    for e in jaxpr.eqns:
        in_flags = [not isinstance(a, Literal) and a in dep for a in e.invars]
        if any(in_flags):
            dep.update(v for v, f in zip(e.outvars, _eqn_reaches(e, in_flags)) if f)
    return [not isinstance(a, Literal) and a in dep for a in jaxpr.outvars]


def _while_reaches(eqn, flags) -> tuple[list[bool], bool]:
    """``(carries, test_reads)`` for a while_loop whose operands marked ``flags``
    are read: which carries their values reach through the body (not counting
    the trip count), and whether the loop's test reads them."""
    p = eqn.params
    cc, bc = p["cond_nconsts"], p["body_nconsts"]
    carry = list(flags[cc + bc:])
    body = p["body_jaxpr"].jaxpr
    while True:
        new = [a or b for a, b in zip(carry, reaches(body, list(flags[cc:cc + bc]) + carry))]
        if new == carry:
            break
        carry = new
    test_reads = any(flags[:cc]) or any(reaches(p["cond_jaxpr"].jaxpr, list(flags[:cc]) + carry))
    return carry, test_reads


def _eqn_reaches(eqn, flags) -> list[bool]:
    name = eqn.primitive.name
    n_out = len(eqn.outvars)
    p = eqn.params
    if name in _PER_OPERAND:
        return list(flags)
    if name == "while":
        carry, test_reads = _while_reaches(eqn, flags)
        # When the trip count depends on them, so does every carry.
        return [True] * n_out if test_reads else carry
    if name == "scan":
        nc, ncarry = p["num_consts"], p["num_carry"]
        carry = list(flags[nc:nc + ncarry])
        body = p["jaxpr"].jaxpr
        while True:
            outs = reaches(body, list(flags[:nc]) + carry + list(flags[nc + ncarry:]))
            new = [a or b for a, b in zip(carry, outs[:ncarry])]
            if new == carry:
                return new + outs[ncarry:]
            carry = new
    if name == "cond":
        if flags[0]:
            return [True] * n_out
        outs = [False] * n_out
        for branch in _taken_branches(eqn):
            outs = [a or b for a, b in zip(outs, reaches(branch.jaxpr, list(flags[1:])))]
        return outs
    if name == "linear_call":
        # Its callee's dependence (callee constants, residuals, linear operands):
        # vjp-to-jvp's tangent of an output whose cotangent the bwd never reads
        # reads no tangent.
        callee = p["callee"].jaxpr
        if len(callee.invars) == len(flags):
            return reaches(callee, list(flags))
    sub = _sub_jaxpr(eqn)
    if sub is not None and len(sub.invars) == len(flags):
        return reaches(sub, list(flags))
    return [True] * n_out


class _WhileSplit:
    """How a while_loop reads the linear input: which loop constants and carries
    carry it, and whether its stopping test reads them (a loop to convergence)."""
    __slots__ = ("cc", "bc", "const_lin", "carry_lin", "carry_zero", "converges", "varying",
                 "carry_affine", "linear_body")

    def __init__(self, cc, bc, const_lin, carry_lin, carry_zero, converges, varying,
                 carry_affine=None, linear_body=None):
        self.cc, self.bc = cc, bc
        self.const_lin, self.carry_lin = const_lin, carry_lin
        self.carry_zero, self.converges = carry_zero, converges
        self.varying = varying  # the linear map reads the other carries
        # Linear carries with a constant part: they start from (or the body sets
        # them to) a value that does not carry the linear input and is not zero.
        self.carry_affine = carry_affine or [False] * len(carry_lin)
        # The body whose linear map the loop iterates (test-only carries, such
        # as a convergence gap, passed through): what is transposed.
        self.linear_body = linear_body


def _while_split(eqn, flags, zeros, used=frozenset(), *, check: bool = True):
    """``(problem, split)`` for a while_loop whose operands are marked ``flags``."""
    p = eqn.params
    cc, bc = p["cond_nconsts"], p["body_nconsts"]
    if any(flags[:cc]):
        # The test reads the linear input through its constants (a residual
        # |x - T(x)| whose T reads it): read it as a test of carries the body
        # passes through.
        eqn, order = _cond_constants_carried(eqn, flags)
        flags, zeros = [flags[i] for i in order], [zeros[i] for i in order]
        problem, split = _while_split(eqn, flags, zeros, used, check=check)
        if split is not None and not split.converges:
            return Problem(eqn, "a while_loop whose stopping test reads a value computed from "
                                "the linear input other than its carries"), None
        return problem, split
    body, cond = p["body_jaxpr"].jaxpr, p["cond_jaxpr"].jaxpr
    const_lin = list(flags[cc:cc + bc])
    carry = slice(cc + bc, None)
    init_lin, init_zero = list(flags[carry]), list(zeros[carry])
    lin, zero = list(init_lin), list(init_zero)
    const_zero = list(zeros[cc:cc + bc])
    # Carries only the stopping test reads (a gap |x_new - x| or a "not
    # converged" flag the body computes and carries) are not part of the linear
    # map, only of its trip count: the body's linearity is that of the body
    # without them (they pass through), and whether the test is a convergence
    # test is read below.
    full_body = body
    test_only = _test_only_carries(body, bc, eqn.outvars, used)
    if any(test_only):
        body = _passing_through(body, bc, test_only)
    with _lenient():
        while True:
            _, outs, out_zero = _scan(body, const_lin + lin, const_zero + zero,
                                      check_outputs=False)
            lin_new = [a or b for a, b in zip(lin, outs)]
            zero_new = [a and b for a, b in zip(zero, out_zero)]
            if lin_new == lin and zero_new == zero:
                break
            lin, zero = lin_new, zero_new
    merged_before = _MERGED[0]
    problem, outs, out_zero = _scan(body, const_lin + lin, const_zero + zero, check_outputs=False)
    merges_in_body = _MERGED[0] != merged_before
    if problem is not None and check and not _LENIENT[0]:
        return problem.within(eqn), None
    if outs is None:  # lenient: a problem inside, every carry it reaches is linear
        outs, out_zero = lin, [False] * len(lin)
    # An affine carry (a save buffer filled with inf, then overwritten with the
    # linear values) is its constant part, computed by the loop with the linear
    # input zeroed, plus its linear part, which is transposed.  Whether the
    # constant parts cancel by the time they reach the outputs is checked where
    # they do (transpose_linear), not assumed.
    affine = [bool(flag) and ((not init_lin[k] and not init_zero[k])
                              or (not outs[k] and not out_zero[k]))
              for k, flag in enumerate(lin)]
    if check and any(affine) and not _LENIENT[0]:
        _MERGED[0] += 1
    reads_n = reaches(body, [False] * bc + [not f for f in lin])
    varying = any(r and f for r, f in zip(reads_n, lin))
    # A test-only carry computed from the linear carries makes a test of them.
    tainted = [t and (f or r) for t, f, r in
               zip(test_only, init_lin, reaches(full_body, const_lin + lin))]
    converges = any(reaches(cond, [False] * cc + [f or t for f, t in zip(lin, tainted)]))
    if check and converges:
        for k, flag in enumerate(lin):
            if not flag:
                continue
            # A loop to convergence is transposed as the fixed point of its linear
            # map; a constant part would move that fixed point.
            if not init_lin[k] and not init_zero[k]:
                return Problem(eqn, f"while_loop carry {k} starts from a value that {_AFFINE}"), None
            if not outs[k] and not out_zero[k]:
                return (Problem(eqn, f"the while_loop body sets carry {k} to a value that "
                                     f"{_AFFINE}"), None)
        if merges_in_body:
            # A constant placed beside the linear values (where, concatenate) is
            # otherwise checked at a zero linear input, where a loop to
            # convergence stops at once and cannot show it.
            return (Problem(eqn, f"the body of a while_loop that stops on a test of the "
                                 f"linear input places a constant beside the linear values, "
                                 f"which {_AFFINE}"), None)
    if check and converges and any(lin):
        reason = _read_convergence_test(eqn, lin, zero_starts=init_zero)
        if reason is not None:
            return (Problem(eqn, f"a while_loop that stops on a test of the linear input, so "
                                 f"its trip count depends on it, and {reason}: it is not the "
                                 f"limit of a linear iteration"), None)
    if varying and converges:
        return (Problem(eqn, "a while_loop that stops on a test of the linear input and whose "
                             "linear update reads a carry that does not carry it (a counter or "
                             "coefficient: the map changes from step to step, so the loop does "
                             "not iterate one linear map to its fixed point)"), None)
    read_after = [k for k, (f, v) in enumerate(zip(lin, eqn.outvars)) if not f and v in used]
    if converges and check and read_after:
        k = read_after[0]
        return (Problem(eqn, f"carry {k} ({eqn.outvars[k].aval.str_short()}) of a while_loop "
                             f"that stops on a test of the linear input is used after the loop; "
                             f"it does not carry the linear input, but its final value depends "
                             f"on the trip count, which does"), None)
    if converges and not any(lin[k] for k in range(len(lin))):
        converges = False
    return None, _WhileSplit(cc, bc, const_lin, lin, zero, converges, varying, affine, body)


def _cond_constants_carried(eqn, flags):
    """``(loop, order)``: ``eqn`` with its stopping test's constants marked in
    ``flags`` moved to carries the body passes through (the same loop), and the
    order of its operands among ``eqn``'s."""
    p = eqn.params
    cc, bc = p["cond_nconsts"], p["body_nconsts"]
    moved = [i for i in range(cc) if flags[i]]
    kept = [i for i in range(cc) if not flags[i]]
    cond, body = p["cond_jaxpr"], p["body_jaxpr"]
    cj, bj = cond.jaxpr, body.jaxpr
    cond_j = jx.Jaxpr(cj.constvars, [cj.invars[i] for i in kept] + cj.invars[cc:] +
                      [cj.invars[i] for i in moved], cj.outvars, cj.eqns, cj.effects,
                      cj.debug_info)
    passed = [jx.Var(cj.invars[i].aval) for i in moved]
    body_j = jx.Jaxpr(bj.constvars, list(bj.invars) + passed, list(bj.outvars) + passed,
                      bj.eqns, bj.effects,
                      jx.fit_debug_info(bj.debug_info, len(bj.invars) + len(passed),
                                        len(bj.outvars) + len(passed)))
    order = kept + list(range(cc, len(eqn.invars))) + moved
    lanes = tuple(cj.outvars[0].aval.shape)
    if lanes:
        # A batched loop (its test gives bool[k...]) carries every value per lane;
        # the moved values, unbatched, are carried broadcast to the lanes (the
        # test reads lane 0's copy, which is every lane's).
        cond_c, body_c = _lane_carried(ClosedJaxpr(cond_j, cond.consts),
                                       ClosedJaxpr(body_j, body.consts), len(moved), lanes)
        params = dict(p, cond_nconsts=len(kept), cond_jaxpr=cond_c, body_jaxpr=body_c)
        outvars = list(eqn.outvars) + [jx.Var(a) for a in cond_c.in_avals[-len(moved):]]
    else:
        params = dict(p, cond_nconsts=len(kept), cond_jaxpr=ClosedJaxpr(cond_j, cond.consts),
                      body_jaxpr=ClosedJaxpr(body_j, body.consts))
        outvars = list(eqn.outvars) + [jx.Var(eqn.invars[i].aval) for i in moved]
    return eqn.replace(invars=[eqn.invars[i] for i in order], outvars=outvars,
                       params=params), order


def _lane_carried(cond, body, n_moved: int, lanes: tuple):
    """``cond`` and ``body`` (their last ``n_moved`` inputs: values the body passes
    through) taking those values broadcast to ``lanes``."""
    idx = (0,) * len(lanes)
    wide = [jax.ShapeDtypeStruct(lanes + tuple(a.shape), a.dtype)
            for a in cond.in_avals[-n_moved:]]
    narrow = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in cond.in_avals[:-n_moved]]
    b_in = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in body.in_avals[:-n_moved]]

    def cond_fn(*xs):
        return jx.eval_jaxpr(cond.jaxpr, cond.consts, *xs[:-n_moved],
                             *[x[idx] for x in xs[-n_moved:]])

    def body_fn(*xs):
        outs = jx.eval_jaxpr(body.jaxpr, body.consts, *xs[:-n_moved],
                             *[x[idx] for x in xs[-n_moved:]])
        return [*outs[:len(outs) - n_moved], *xs[-n_moved:]]

    return (jax.make_jaxpr(cond_fn)(*narrow, *wide), jax.make_jaxpr(body_fn)(*b_in, *wide))


def _test_only_carries(body, bc: int, outvars, used) -> list[bool]:
    """Carries that nothing after the loop reads (``used``) and whose value no
    other carry's update reads: only the stopping test can read them."""
    n = len(body.outvars)
    found = []
    for i in range(n):
        if outvars[i] in used:
            found.append(False)
            continue
        reached = reaches(body, [j == bc + i for j in range(len(body.invars))])
        found.append(not any(r for j, r in enumerate(reached) if j != i))
    return found


def _passing_through(body, bc: int, carries: list[bool]):
    """``body`` with the marked carries passed through unchanged (what computed
    them becomes dead code)."""
    outvars = [body.invars[bc + i] if flag else v
               for i, (v, flag) in enumerate(zip(body.outvars, carries))]
    return jx.Jaxpr(body.constvars, body.invars, outvars, body.eqns, body.effects,
                    body.debug_info)


def _read_convergence_test(eqn, lin, tags: dict | None = None,
                           zero_starts=None) -> str | None:
    """Why the exit test of a while_loop whose carries marked ``lin`` carry the
    linear input is not a convergence test of them, or None when it is (see
    ``closure.convergence``: the change between iterations, a residual or a
    vanishing step, above a tolerance, optionally capped).  Such a loop
    computes the limit of its iteration, a linear map; any other test on the
    linear carries makes the trip count, and so the map, depend on them
    (``while |g| > 1: g = g / 2``).  ``tags`` receives the reading."""
    p = eqn.params
    cc, bc = p["cond_nconsts"], p["body_nconsts"]
    body, cond = p["body_jaxpr"].jaxpr, p["cond_jaxpr"].jaxpr
    classified = carry_kinds(body, bc)
    if isinstance(classified, str):
        return classified
    kinds, copies = classified
    carries_in = eqn.invars[cc + bc:]
    for i, j in copies.items():
        if lin[i] and _same_value(carries_in[i], carries_in[j]):
            # (x_prev, x) = (g, g): the change test is met before the first
            # step, so the loop returns its start, not its limit.
            return (f"carry {i} (the previous iterate) starts equal to carry {j}, so the "
                    f"change between them is zero before the first step and the loop "
                    f"returns its start rather than iterating")
    # A relative tolerance is accepted: an iteration without a limit (one that
    # grows until |dx| < rtol |x|) is caught where the transposed iteration
    # runs to its limit (_transposed_limit gives NaN when there is none).
    tags = {} if tags is None else tags
    test = convergence_test(cond, cc, body, bc, kinds, copies, operands=list(eqn.invars),
                            relative=True, tags=tags)
    if isinstance(test, str):
        return test
    covered, gaps = test
    missing = [k for k, flag in enumerate(lin)
               if flag and kinds[k] == STATE and k not in covered and k not in gaps]
    if missing:
        return (f"it does not test the convergence of carr{'y' if len(missing) == 1 else 'ies'} "
                f"{', '.join(map(str, missing))}, which the iteration also updates")
    # What the test compares with, and its cap, must come from the iteration
    # count and constants alone: a counter whose update reads the iterate
    # (counting small steps) or a tolerance that changes with the count (a cap
    # written through the tolerance) stops the loop where its limit does not.
    step_lin = reaches(body, [False] * bc + list(lin))
    for k, kind in enumerate(kinds):
        if kind == COUNTER and k not in gaps and step_lin[k]:
            return (f"carry {k} ({carries_in[k].aval.str_short()}), which the test reads as an "
                    f"iteration count, is computed from the linear input")
    counted = [False] * cc + [kind == COUNTER and k not in gaps for k, kind in enumerate(kinds)]
    if _tolerance_reads(cond, counted, tags):
        return ("its tolerance changes with the iteration count (a cap written through the "
                "tolerance)")
    if _stops_at_its_start(eqn, zero_starts):
        return ("its test is already met at the start (a gap or flag that starts 'converged'), "
                "so the loop never runs and returns its start, not its limit")
    return None


def _stops_at_its_start(eqn, zero_starts=None) -> bool:
    """Whether the loop's test, when everything it reads at the start is a
    literal or a carry known to start at zero (``zero_starts``: ``0 * sum(g)``),
    is false there: the loop never runs."""
    p = eqn.params
    cc, bc = p["cond_nconsts"], p["body_nconsts"]
    cond = p["cond_jaxpr"]
    _, reads = jx.dce_jaxpr(cond.jaxpr, [True])
    operands = list(eqn.invars[:cc]) + list(eqn.invars[cc + bc:])
    zero = [False] * cc + list(zero_starts or [False] * (len(operands) - cc))
    if not any(reads) or not all(isinstance(a, Literal) or z
                                 for a, r, z in zip(operands, reads, zero) if r):
        return False
    args = [a.val if isinstance(a, Literal) else np.zeros(a.aval.shape, a.aval.dtype)
            for a in operands]
    with jax.ensure_compile_time_eval():  # literals: a value now, even inside a trace
        (pred,) = jx.eval_jaxpr(cond.jaxpr, cond.consts, *args)
    return not bool(np.any(np.asarray(pred)))


def _tolerance_reads(jaxpr, flags, tags) -> bool:
    """Whether a comparison that makes the convergence test (tagged big/small in
    ``tags``, reading no test itself) reads a value computed from the inputs
    marked ``flags``."""
    def is_test(v):
        t = tags.get(v)
        return t is not None and t.kind in ("big", "small")

    dep = {v for v, f in zip(jaxpr.invars, flags) if f}
    for eqn in jaxpr.eqns:
        ins = [not isinstance(a, Literal) and a in dep for a in eqn.invars]
        sub = _sub_jaxpr(eqn)
        if sub is not None and len(sub.invars) == len(eqn.invars):
            if _tolerance_reads(sub, ins, tags):
                return True
        elif any(ins) and all(is_test(v) for v in eqn.outvars) and not any(
                is_test(a) for a in eqn.invars if not isinstance(a, Literal)):
            return True
        if any(ins):
            dep.update(eqn.outvars)
    return False


def _iteration_cap(eqn, lin):
    """``(cap, body)`` of a loop to convergence with its convergence test held
    at "not converged" (``closure.convergence.held``): ``cap(cond operands)``
    its exit test (None without a cap) and ``body(body operands)`` its step,
    whose carried flags then hold only their caps."""
    tags: dict = {}
    if _read_convergence_test(eqn, lin, tags) is not None:
        return None, None
    cond, body = eqn.params["cond_jaxpr"], eqn.params["body_jaxpr"]
    cap = loop_cap(cond.jaxpr, tags)
    step = held(body.jaxpr, tags)
    return ((None if cap is None else (lambda args: cap(cond.consts, args))),
            lambda args: step(body.consts, args))

def _while_linearity(eqn, flags, zeros, used):
    problem, split = _while_split(eqn, flags, zeros, used)
    if problem is not None:
        return problem, None, None
    return None, list(split.carry_lin), list(split.carry_zero)


def _sub_jaxprs(params):
    for v in params.values():
        for x in (v if isinstance(v, (tuple, list)) else (v,)):
            if isinstance(x, ClosedJaxpr):
                yield x.jaxpr
            elif isinstance(x, jx.Jaxpr):
                yield x


def _has_while(jaxpr) -> bool:
    return any(e.primitive.name == "while" or any(_has_while(s) for s in _sub_jaxprs(e.params))
               for e in jaxpr.eqns)


def _eqn_has_while(eqn) -> bool:
    return eqn.primitive.name == "while" or any(_has_while(s) for s in _sub_jaxprs(eqn.params))


def _has_linear_form(jaxpr) -> bool:
    return any(e.primitive.name in _LINEAR_FORMS
               or any(_has_linear_form(s) for s in _sub_jaxprs(e.params)) for e in jaxpr.eqns)


#: Primitives JAX cannot transpose whose value is their primal's: a custom_vjp
#: call in a bwd (one calling its own function) is evaluated as its primal.
_BY_PRIMAL = ("custom_vjp_call",)


def _evaluated_by_parts(eqn) -> bool:
    """Does the linear evaluation go inside ``eqn``: a loop, or a call, loop or
    branch holding one, an equation with a linear form (``_LINEAR_FORMS``), or a
    custom_vjp call (``_BY_PRIMAL``)?"""
    return (eqn.primitive.name in _BY_PRIMAL or _eqn_has_while(eqn)
            or any(_has_linear_form(s) for s in _sub_jaxprs(eqn.params)))


#: Steps a loop whose test reads the linear input runs in ``_eval_at_zero``.
_AT_ZERO_STEPS = 64


def _eval_at_zero(jaxpr, consts, args, linear) -> list:
    """``jaxpr`` at a zero linear input (the inputs marked ``linear``), for the
    affine check.  A loop whose test reads the linear input runs at most
    ``_AT_ZERO_STEPS`` steps: at zero a linear iteration stays at zero and a
    relative convergence test (``|dx| < rtol |x|``: ``0 < 0``) is never met, so
    the loop would run for ever; a constant part that reaches the results does
    so within a few steps.  Other loops run as they do at any linear input (a
    time-stepping loop cut short would report that it did not finish: diffrax's
    "maximum number of solver steps")."""
    env = dict(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    lin = {v for v, f in zip(jaxpr.invars, linear) if f}

    def read(a):
        return a.val if isinstance(a, Literal) else env[a]

    for eqn in jaxpr.eqns:
        invals = [read(a) for a in eqn.invars]
        flags = [not isinstance(a, Literal) and a in lin for a in eqn.invars]
        callee = _callee(eqn)
        if eqn.primitive.name == "while":
            p = eqn.params
            cc, bc = p["cond_nconsts"], p["body_nconsts"]
            cond, body = p["cond_jaxpr"], p["body_jaxpr"]
            carry_lin, capped = _while_reaches(eqn, flags)
            cond_lin, body_lin = [*flags[:cc], *carry_lin], [*flags[cc:cc + bc], *carry_lin]

            def keep_going(c, cond=cond, cv=invals[:cc], cond_lin=cond_lin, capped=capped):
                (go,) = _eval_at_zero(cond.jaxpr, cond.consts, [*cv, *c[0]], cond_lin)
                return jnp.any(go) & (c[1] < _AT_ZERO_STEPS) if capped else jnp.any(go)

            def step(c, body=body, bv=invals[cc:cc + bc], body_lin=body_lin):
                return _eval_at_zero(body.jaxpr, body.consts, [*bv, *c[0]], body_lin), c[1] + 1

            outs, _ = jax.lax.while_loop(keep_going, step, (invals[cc + bc:], jnp.int32(0)))
        elif eqn.primitive.name == "scan":
            outs = _scan_at_zero(eqn, invals, flags)
        elif callee is not None:
            outs = _eval_at_zero(callee[0], callee[1], invals, flags)
        else:
            outs = jx.eval_equation(eqn, invals)
        env.update(zip(eqn.outvars, outs))
        if any(flags):
            lin.update(v for v, f in zip(eqn.outvars, _eqn_reaches(eqn, flags)) if f)
    return [read(a) for a in jaxpr.outvars]


def _scan_at_zero(eqn, invals, flags) -> list:
    """A scan in ``_eval_at_zero``: its body, on each step's slice of the scanned
    operands, evaluated the same way (its loops on the linear input capped)."""
    p = eqn.params
    nc, ncarry = p["num_consts"], p["num_carry"]
    body = p["jaxpr"]
    consts, carry, xs = invals[:nc], invals[nc:nc + ncarry], invals[nc + ncarry:]
    carry_lin = _eqn_reaches(eqn, flags)[:ncarry] if any(flags) else [False] * ncarry
    body_lin = [*flags[:nc], *carry_lin, *flags[nc + ncarry:]]

    def step(c, x):
        outs = _eval_at_zero(body.jaxpr, body.consts, [*consts, *c, *x], body_lin)
        return outs[:ncarry], outs[ncarry:]

    carry_out, ys = jax.lax.scan(step, list(carry), list(xs), length=p["length"],
                                 reverse=p["reverse"], unroll=p["unroll"])
    return [*carry_out, *ys]


def _callee(eqn):
    """``(jaxpr, consts)`` of a call-like equation whose body takes its operands
    (not a scan's body, which takes a slice of each scanned operand)."""
    if eqn.primitive.name == "scan":
        return None
    for key in _CALL_PARAMS:
        sub = eqn.params.get(key)
        if isinstance(sub, ClosedJaxpr) and len(sub.jaxpr.invars) == len(eqn.invars):
            return sub.jaxpr, sub.consts
        if isinstance(sub, jx.Jaxpr) and len(sub.invars) == len(eqn.invars) and not sub.constvars:
            return sub, ()
    return None


class _StartProbe:
    """Whether the loops to convergence of a linear map run at all, at the
    residuals given.  Such a loop returns its start, not the limit of its
    iteration, when its test is already met there -- a previous iterate that
    starts equal to the iterate (``flip(flip(g))``, ``g * s`` with ``s == 1`` at
    run time): the structural check (``_stops_at_its_start``) sees only starts
    equal by construction.  The map is evaluated once on a fixed pseudo-random
    linear input, each loop's test read at its start (at that input and at
    a much larger multiple of it (``_probe_scale``), ``_bind_linear_while``).  Met at both scales, the
    loop did not run; at one only, it runs for some inputs and not others, and
    its transpose is NaN -- unless running it there leaves its start where it
    was, when the limit is its start.

    Loops run in the probe as in the map, so a loop started from another
    loop's result is read where it starts.  A loop in a ``scan`` body is read
    at every step: the scan returns the readings as extra outputs, stacked, and
    the transposition scans them beside its operands; a loop in a ``cond``
    branch is read in the branch taken, each branch returning readings for all
    branches' loops (``_probe_branches``).  A loop is keyed by the path of calls
    to it, so a function called twice has its loops read at each call.  A loop
    run by a ``while_loop``'s body is not read: its transpose is its limit's.

    ``recording()`` is the probe being evaluated (``preds``: ``key(equation)`` -> its
    reading: a loop's test at its start, ``bool[3]``, or None when unread; a
    scan's or a cond's readings of the loops it holds, a dict); ``reading()``
    pushes the readings the transposition uses, ``pred_for(eqn)`` looks one up."""

    _recording: list = []
    _reading: list = [{}]

    def __init__(self):
        self.preds: dict = {}

    @classmethod
    def recording(cls) -> "_StartProbe | None":
        return cls._recording[-1] if cls._recording else None

    #: The call equations the evaluation is inside (a loop in a function called
    #: twice is two loops: its key is the path of calls to it).
    _calls: list = []

    @classmethod
    def key(cls, eqn) -> tuple:
        return (*cls._calls, id(eqn))

    @classmethod
    @contextlib.contextmanager
    def inside(cls, call):
        cls._calls.append(id(call))
        try:
            yield
        finally:
            cls._calls.pop()

    @classmethod
    def pred_for(cls, eqn):
        return cls._reading[-1].get(cls.key(eqn))

    @classmethod
    @contextlib.contextmanager
    def reading(cls, preds: dict):
        cls._reading.append(preds)
        try:
            yield
        finally:
            cls._reading.pop()

    @classmethod
    @contextlib.contextmanager
    def recording_into(cls, probe: "_StartProbe"):
        cls._recording.append(probe)
        try:
            yield probe
        finally:
            cls._recording.pop()

    def record(self, eqn, pred) -> None:
        key = self.key(eqn)
        self.preds[key] = None if key in self.preds else pred

    def readings(self) -> dict:
        """The readings taken (unread loops left out)."""
        return {k: v for k, v in self.preds.items() if v is not None}


#: The larger scale at which a loop's start test is read (``_bind_linear_while``):
#: ``2 ** _PROBE_SCALE_BITS``, or less where that would leave the values' range.
_PROBE_SCALE_BITS = 20


def _probe_scale(values):
    """The larger probe scale, a power of two: ``2 ** 20``, or less where the test
    could overflow at it -- a sum of the squares of all the values scaled (a
    relative test's norm) must stay within each dtype's range: a float16 carry,
    a float32 iterate near 1e33, scaled by ``2 ** 20``, read inf - inf."""
    values = [x for x in values if _floating(jnp.result_type(x))]
    count = sum(int(np.prod(jnp.shape(x))) for x in values)
    bits = jnp.float32(_PROBE_SCALE_BITS)
    for x in values:
        real = jnp.finfo(jnp.result_type(x)).dtype
        room = (0.5 * (np.log2(float(jnp.finfo(real).max)) - np.log2(max(count, 1))) - 1.0
                - jnp.log2(jnp.maximum(jnp.max(jnp.abs(x)), jnp.ones((), real))))
        bits = jnp.minimum(bits, jnp.floor(room.astype(jnp.float32)))
    return jnp.exp2(bits)


def _scaled(values, flags, scale):
    """The inexact ``values`` marked in ``flags`` times ``scale`` (in their dtype)."""
    return [x * scale.astype(jnp.finfo(jnp.result_type(x)).dtype)
            if f and _floating(jnp.result_type(x)) else x for x, f in zip(values, flags)]


def _lanes(cond, lin_values) -> bool:
    """Does the loop test each lane of a batch (vmap, nested vmaps): its test
    gives ``bool[k...]`` and every linear carry has those leading lanes?"""
    (out,) = cond.jaxpr.outvars
    shape = tuple(out.aval.shape)
    return (len(shape) >= 1 and bool(lin_values)
            and all(tuple(jnp.shape(x)[:len(shape)]) == shape for x in lin_values))


def _by_lane(flags, x):
    """Per-lane ``flags`` (``bool[k...]``) shaped to select along ``x``'s leading axes."""
    return jnp.reshape(flags, flags.shape + (1,) * (jnp.ndim(x) - jnp.ndim(flags)))


def _near(x, y):
    """Whether two arrays agree to the square root of their precision, element by
    element, relative to the larger of the two elements (a small component
    packed beside a large one in one carry is compared on its own scale)."""
    if not _floating(jnp.result_type(x)):
        return jnp.bool_(True)
    tol = float(np.sqrt(jnp.finfo(jnp.result_type(x)).eps))
    return jnp.all(jnp.abs(x - y) <= tol * jnp.maximum(jnp.abs(x), jnp.abs(y)))


def _probe_starts(jaxpr, forward, lin_examples) -> dict:
    """``{id(loop equation): its test at its start}`` for the loops to
    convergence ``forward`` (the map, of its linear inputs) runs, read on a
    fixed pseudo-random linear input (see ``_StartProbe``); ``{}`` when the map
    holds no loop or the probe fails."""
    if not _has_while(jaxpr):
        return {}
    rng = np.random.default_rng(20261129)

    def sample(example):
        shape, dtype = example.shape, np.dtype(example.dtype)
        x = rng.uniform(-1.0, 1.0, size=shape)
        if jnp.issubdtype(dtype, jnp.complexfloating):
            x = x + 1j * rng.uniform(-1.0, 1.0, size=shape)
        return np.asarray(x, dtype)

    with _StartProbe.recording_into(_StartProbe()) as probe:
        try:
            forward(*[sample(e) for e in lin_examples])
        except Exception:  # noqa: BLE001 -- no reading: the loops' transposes are their limits'
            return {}
    return probe.readings()


def eval_linear(jaxpr, consts, args, linear) -> list:
    """Evaluate ``jaxpr`` (linear in the inputs marked ``linear``) so that JAX can
    transpose it: every while_loop reading the linear input, also inside calls,
    custom rules' primals, cond branches and scan bodies, is bound as a
    ``linear_call`` whose transpose iterates the transposed map; everything else
    is bound as it is."""
    env: dict = {}
    dep: set = set()

    def read(a):
        return a.val if isinstance(a, Literal) else env[a]

    for v, c in zip(jaxpr.constvars, consts):
        env[v] = c
    for v, x, flag in zip(jaxpr.invars, args, linear):
        env[v] = x
        if flag:
            dep.add(v)
    with _reading(jaxpr):
        _eval_equations(jaxpr, env, dep)
    return [read(a) for a in jaxpr.outvars]


def _eval_equations(jaxpr, env: dict, dep: set) -> None:
    def read(a):
        return a.val if isinstance(a, Literal) else env[a]

    live = _live_equations(jaxpr)
    used = _used_vars(jaxpr, live)
    cones = _solve_tolerances(jaxpr, [v in dep for v in jaxpr.invars])
    in_cones = {id(e) for cone in cones.values() for e in cone.equations}
    for eqn, is_live in zip(jaxpr.eqns, live):
        if not is_live or id(eqn) in in_cones:
            continue
        cone = cones.get(id(eqn))
        if cone is not None:
            for v, x in zip(eqn.outvars, _bind_tolerant_solve(eqn, cone, read)):
                env[v] = x
                dep.add(v)
            continue
        invals = [read(a) for a in eqn.invars]
        flags = [not isinstance(a, Literal) and a in dep for a in eqn.invars]
        if any(flags) and _evaluated_by_parts(eqn):
            outs, out_flags = _eval_linear_eqn(eqn, invals, flags, used)
        else:
            if eqn.primitive.name in _VALUE_IDENTITY and any(flags):
                outs, out_flags = list(invals), list(flags)
            elif eqn.primitive.name in _PER_OPERAND and any(flags) and not all(flags):
                outs, out_flags = jx.eval_equation_per_operand(eqn, invals), list(flags)
            elif eqn.primitive.name in _LINEAR_FORMS and any(flags) and \
                    _LINEAR_FORMS[eqn.primitive.name][0](eqn, flags)[0]:
                linearity_of, form = _LINEAR_FORMS[eqn.primitive.name]
                outs, out_flags = form(eqn, invals), linearity_of(eqn, flags)[1]
            else:
                outs = jx.eval_equation(eqn, invals)
                out_flags = [any(flags)] * len(outs)
        for v, x, flag in zip(eqn.outvars, outs, out_flags):
            env[v] = x
            if flag:
                dep.add(v)


def _eval_linear_eqn(eqn, invals, flags, used):
    name = eqn.primitive.name
    n_out = len(eqn.outvars)
    if name == "while":
        return _bind_linear_while(eqn, invals, flags, used)
    if name == "cond":
        branches = [functools.partial(_run_branch, br, flags[1:]) for br in eqn.params["branches"]]
        probe = _StartProbe.recording()
        if probe is not None:
            outs, readings = jax.lax.switch(invals[0], _probe_branches(branches, invals[1:]),
                                            *invals[1:])
            probe.record(eqn, readings)
        else:
            readings = _StartProbe.pred_for(eqn) or {}
            outs = jax.lax.switch(invals[0], [_read_in(b, readings) for b in branches],
                                  *invals[1:])
        return list(outs), [True] * n_out
    if name == "scan":
        return _run_scan(eqn, invals, flags), [True] * n_out
    callee = _callee(eqn)
    if callee is not None:
        # Calls and custom rules' primals (JAX's transposition sees the primal of
        # a custom rule too): inline, so that their loops are found.
        with _StartProbe.inside(eqn):
            return eval_linear(callee[0], callee[1], invals, flags), [True] * n_out
    return jx.eval_equation(eqn, invals), [True] * n_out


def _run_branch(branch, flags, *ops):
    return eval_linear(branch.jaxpr, branch.consts, list(ops), flags)


def _recorded(fn):
    """``fn`` returning also the readings of the loops it runs (``_StartProbe``)."""
    def run(*args):
        with _StartProbe.recording_into(_StartProbe()) as probe:
            outs = fn(*args)
        return outs, probe.readings()
    return run


def _read_in(fn, readings):
    """``fn`` run with ``readings`` as the loops' start readings."""
    def run(*args):
        with _StartProbe.reading(readings):
            return fn(*args)
    return run


def _probe_branches(branches, ops):
    """The branches of a cond, in the probe, returning ``(outputs, readings)``
    with one structure for all: each branch's readings of its own loops, and
    "ran" (all true: the limit) for the other branches' loops, which are not
    transposed where this branch is taken."""
    shapes = [jax.eval_shape(_recorded(b), *ops)[1] for b in branches]
    union: dict = {}
    for own in shapes:
        for k, v in own.items():
            union.setdefault(k, v)

    def padded(b, own):
        def run(*args):
            outs, readings = _recorded(b)(*args)
            return outs, {k: readings[k] if k in own else
                          jax.tree.map(lambda a: jnp.ones(a.shape, a.dtype), v)
                          for k, v in union.items()}
        return run

    return [padded(b, own) for b, own in zip(branches, shapes)]


def _run_scan(eqn, invals, flags):
    p = eqn.params
    nc, ncarry = p["num_consts"], p["num_carry"]
    body = p["jaxpr"]
    consts, carry, xs = invals[:nc], invals[nc:nc + ncarry], invals[nc + ncarry:]
    c_flags, x_flags = flags[:nc], flags[nc + ncarry:]
    carry_flags = list(flags[nc:nc + ncarry])
    while True:  # the carries the linear input reaches
        outs = reaches(body.jaxpr, c_flags + carry_flags + x_flags)[:ncarry]
        new = [a or b for a, b in zip(carry_flags, outs)]
        if new == carry_flags:
            break
        carry_flags = new
    body_flags = c_flags + carry_flags + x_flags

    def body_fn(c, x):
        return eval_linear(body.jaxpr, body.consts, [*consts, *c, *x], body_flags)

    # The loops in the body are read at every step (_StartProbe): the probe
    # stacks the readings as outputs, the transposition scans them.
    probe = _StartProbe.recording()
    readings = None if probe is not None else _StartProbe.pred_for(eqn)

    def step(c, x):
        x, at_step = x
        if probe is not None:
            outs, at_step = _recorded(body_fn)(c, x)
        else:
            outs = _read_in(body_fn, at_step)(c, x)
        return outs[:ncarry], (outs[ncarry:], at_step)

    carry_out, (ys, stacked) = jax.lax.scan(
        step, list(carry), (list(xs), readings or {}), length=p["length"],
        reverse=p["reverse"], unroll=p["unroll"])
    if probe is not None:
        probe.record(eqn, stacked)
    return [*carry_out, *ys]


def _bind_linear_while(eqn, invals, flags, used, reading_key=None):
    # (reading_key: the loop's key among the start readings, _StartProbe: the
    # program's equation when this one is rewritten from it.)
    reading_key = eqn if reading_key is None else reading_key
    n_results = len(eqn.outvars)
    if any(flags[:eqn.params["cond_nconsts"]]):
        moved, order = _cond_constants_carried(eqn, flags)
        invals, flags = [invals[i] for i in order], [flags[i] for i in order]
        n_moved = len(moved.outvars) - n_results
        wide = [v.aval for v in moved.params["cond_jaxpr"].jaxpr.invars[-n_moved:]]
        invals = [*invals[:-n_moved], *[jnp.broadcast_to(x, a.shape)
                                        for x, a in zip(invals[-n_moved:], wide)]]
        outs, out_flags = _bind_linear_while(moved, invals, flags, used, reading_key)
        return outs[:n_results], out_flags[:n_results]
    zeros = [isinstance(a, Literal) and _is_zero_literal(a) for a in eqn.invars]
    _, split = _while_split(eqn, flags, zeros, used, check=False)
    p = eqn.params
    cc, bc = split.cc, split.bc
    body, cond = p["body_jaxpr"], p["cond_jaxpr"]
    n_carry = len(eqn.outvars)
    const_lin, carry_lin = split.const_lin, split.carry_lin
    c_consts = list(invals[:cc])
    b_consts, init = list(invals[cc:cc + bc]), list(invals[cc + bc:])
    b_avals = [v.aval for v in body.jaxpr.invars]
    const_avals, carry_avals = b_avals[:bc], b_avals[bc:]
    carry_flags = flags[cc + bc:]
    probe = _StartProbe.recording()
    if probe is not None:
        # The probe of the loops' starts: read this loop's test where it starts,
        # and run it as the map does (see _StartProbe).
        starts = list(invals[cc + bc:])
        pred = None
        if split.converges:
            # Read at the probe and at a much larger multiple of it: a test that
            # holds at one scale only (an absolute tolerance beside a start gap
            # of rounding size) runs for some cotangents and not for others --
            # the bwd is not linear there (see the transpose below).
            lanes = _lanes(cond, [x for x, lin in zip(starts, carry_lin) if lin])

            def ran_at(scale):
                scaled = _scaled(starts, carry_lin, scale)
                (ran,) = jx.eval_jaxpr(cond.jaxpr, cond.consts, *invals[:cc], *scaled)
                return ran if lanes else jnp.any(ran)

            def returns_its_start(scale):
                # Run where its test holds, does the loop end where it started (an
                # adjoint of a Newton step, whose iteration changes nothing)?  Then
                # whether it runs does not matter.
                scaled = _scaled(starts, carry_lin, scale)
                consts = _scaled(invals[cc:cc + bc], split.const_lin, scale)
                outs = jx.eval_equation(eqn, [*invals[:cc], *consts, *scaled])
                return functools.reduce(jnp.logical_and, [
                    _near(o, x) for o, x, lin in zip(outs, scaled, carry_lin) if lin],
                    jnp.bool_(True))

            scale = _probe_scale([x for x, lin in zip(starts, carry_lin) if lin])
            ran, ran_scaled = ran_at(jnp.float32(1.0)), ran_at(scale)
            differ = jnp.any(ran != ran_scaled)
            same = jax.lax.cond(differ, returns_its_start, lambda _: jnp.bool_(True),
                                jnp.where(jnp.any(ran & ~ran_scaled), jnp.float32(1.0), scale))
            pred = jnp.stack([ran, ran_scaled, jnp.broadcast_to(same, jnp.shape(ran))])
        probe.record(reading_key, pred)
        return jx.eval_equation(eqn, invals), list(carry_lin)
    probed_run = _StartProbe.pred_for(reading_key)
    # Affine carries whose start is a constant (not the linear input): the linear
    # part starts from zero, the constant part from that start.
    const_start = [a and not f for a, f in zip(split.carry_affine, carry_flags)]
    a_init = [x for x, f in zip(init, const_start) if f]
    init = [jnp.zeros_like(x) if f else x for x, f in zip(init, const_start)]
    res = [*c_consts, *[b for b, f in zip(b_consts, const_lin) if not f],
           *[x for x, f in zip(init, carry_lin) if not f], *a_init]
    lin = [*[b for b, f in zip(b_consts, const_lin) if f],
           *[x for x, f in zip(init, carry_lin) if f]]
    n_nl_const = bc - sum(const_lin)
    n_n_init = len(carry_lin) - sum(carry_lin)
    lin_const_avals = [a for a, f in zip(const_avals, const_lin) if f]
    lin_carry_avals = [a for a, f in zip(carry_avals, carry_lin) if f]
    lin_const_start = [f for f, lf in zip(const_start, carry_lin) if lf]

    def merge(flags_, lin_vals, other_vals):
        lin_it, other_it = iter(lin_vals), iter(other_vals)
        return [next(lin_it) if f else next(other_it) for f in flags_]

    def split_res(r):
        r = list(r)
        cut = cc + n_nl_const + n_n_init
        return r[:cc], r[cc:cc + n_nl_const], r[cc + n_nl_const:cut]

    def run_loop(r, lv):
        """The loop's linear carries, from the linear values ``lv`` (plus the
        constant starts of affine carries)."""
        cv, nl_consts, n_init = split_res(r)
        starts = iter(list(r)[cc + n_nl_const + n_n_init:])
        lv = list(lv)
        l_car = [v + next(starts) if f else v
                 for v, f in zip(lv[len(lin_const_avals):], lin_const_start)]
        ops = [*cv, *merge(const_lin, lv[:len(lin_const_avals)], nl_consts),
               *merge(carry_lin, l_car, n_init)]
        outs = jx.eval_equation(eqn, ops)
        return [o for o, f in zip(outs, carry_lin) if f]

    def callee(r, lv):
        if not any(split.carry_affine):
            return run_loop(r, lv)
        # Affine in lv: the linear part is the derivative, which drops the
        # constant part exactly (no inf - inf).  A counted loop's is taken at
        # lv = 0; a loop to convergence's at lv itself, where it runs as the
        # program ran it: at lv = 0 its test may stop it at once (an iterate
        # starting at 0 beside a previous iterate starting at lv), leaving the
        # start's derivative instead of the limit's.
        lv = list(lv)
        at = lv if split.converges else [jnp.zeros_like(v) for v in lv]
        return jax.jvp(lambda *v: run_loop(r, v), at, lv)[1]

    def zeros_of(avals):
        return [jnp.zeros(a.shape, a.dtype) for a in avals]

    cap, held_body = _iteration_cap(eqn, carry_lin) if split.converges else (None, None)

    def body_n(nl_consts, n_vals):
        """The carries that do not carry the linear input, one step on (in a
        loop to convergence, with its test held at "not converged": a flag it
        carries holds only its cap, as while the loop ran)."""
        full = [*merge(const_lin, zeros_of(lin_const_avals), nl_consts),
                *merge(carry_lin, zeros_of(lin_carry_avals), n_vals)]
        outs = (held_body(full) if held_body is not None
                else jx.eval_jaxpr(body.jaxpr, body.consts, *full))
        return [o for o, f in zip(outs, carry_lin) if not f]

    def body_t(nl_consts, n_vals, w):
        """(B^T w, M^T w): the transposed step."""
        def step(lc, lcar):
            full = [*merge(const_lin, lc, nl_consts), *merge(carry_lin, lcar, n_vals)]
            outs = eval_linear(split.linear_body, body.consts, full, [*const_lin, *carry_lin])
            return [o for o, f in zip(outs, carry_lin) if f]
        examples = ([_example(a) for a in lin_const_avals],
                    [_example(a) for a in lin_carry_avals])
        g_c, g_l = jax.linear_transpose(step, *examples)(list(w))
        return list(g_c), list(g_l)

    # Whether the loop ran at all, when its test at the start reads no linear
    # carry (a flag or gap that starts "converged" at run time): then it did not.
    start_reads_lin = any(reaches(cond.jaxpr, [False] * cc + list(carry_lin)))

    def stop_test(cv, n_vals, l_vals, per_lane=False):
        carries = merge(carry_lin, l_vals, n_vals)
        pred = jx.eval_jaxpr(cond.jaxpr, cond.consts, *cv, *carries)[0]
        # A batched loop (vmap) may test each lane (bool[k]): it runs while any
        # lane goes on, its body selecting per lane, as the while primitive does.
        if per_lane and _lanes(cond, l_vals):
            return pred
        return jnp.any(pred) if jnp.ndim(pred) else pred

    def transpose(r, cts):
        cv, nl_consts, n_init = split_res(r)
        l_bar = list(cts)
        if split.converges:
            cap_ok = None
            if cap is not None:
                def cap_ok(n_vals):
                    return cap([*cv, *merge(carry_lin, zeros_of(lin_carry_avals), n_vals)])
            limit = _transposed_limit(functools.partial(body_t, nl_consts, list(n_init)),
                                      l_bar, lin_const_avals, n_init,
                                      functools.partial(body_n, nl_consts), cap_ok)
            if start_reads_lin and probed_run is None:
                return list(limit)
            # Whether the loop ran: its test at the start, on the probe of the
            # linear input when the test reads it (_StartProbe); per lane, for a
            # batched loop whose lanes stop apart.
            if not start_reads_lin:
                ran = stop_test(cv, list(n_init), zeros_of(lin_carry_avals), per_lane=True)
                unsure = jnp.zeros_like(ran)
            else:
                ran, ran_scaled, same = probed_run[0], probed_run[1], probed_run[2]
                # A test that holds at one scale only is NaN, unless running the
                # loop leaves its start where it was (then either transpose will do).
                unsure = (ran != ran_scaled) & ~same
                ran = ran | ran_scaled
            # A loop (a lane) that did not run returns its start: cotangent l_bar
            # for it, none for the loop's constants.  Lanes do not mix: the
            # transposed iteration of the lanes that ran is the limit's.
            if jnp.ndim(ran) == 0:
                return [jnp.where(jnp.any(unsure), jnp.full_like(x, jnp.nan),
                                  jnp.where(ran, x, y))
                        for x, y in zip(limit, [*zeros_of(lin_const_avals), *l_bar])]
            ran_bar = [jnp.where(_by_lane(ran, x), x, jnp.zeros_like(x)) for x in l_bar]
            limit = _transposed_limit(functools.partial(body_t, nl_consts, list(n_init)),
                                      ran_bar, lin_const_avals, n_init,
                                      functools.partial(body_n, nl_consts), cap_ok)
            n_c = len(lin_const_avals)
            kept = [*limit[:n_c], *[v + jnp.where(_by_lane(ran, x), jnp.zeros_like(x), x)
                                    for v, x in zip(limit[n_c:], l_bar)]]
            return [jnp.where(jnp.any(unsure), jnp.full_like(x, jnp.nan), x) for x in kept]

        def count_cond(state):
            n_vals, _ = state
            return stop_test(cv, n_vals, zeros_of(lin_carry_avals))

        def count_step(state):
            n_vals, k = state
            return body_n(nl_consts, n_vals), k + 1

        _, trips = jax.lax.while_loop(count_cond, count_step, (list(n_init), jnp.int32(0)))

        def n_at(k):
            """The other carries at step k, recomputed from the start: the
            transposed steps need them in reverse order, and a while_loop keeps
            no history (quadratic in the trip count, for varying maps only)."""
            if not split.varying:
                return list(n_init)
            return jax.lax.fori_loop(0, k, lambda _, n: body_n(nl_consts, n), list(n_init))

        def back_step(j, state):
            acc, w = state
            g_c, g_l = body_t(nl_consts, n_at(trips - 1 - j), w)
            return [a + g for a, g in zip(acc, g_c)], g_l

        acc, w = jax.lax.fori_loop(0, trips, back_step, (zeros_of(lin_const_avals), l_bar))
        return [*acc, *w]

    l_out = _bind_rule(eqn, callee, transpose, res, lin,
                       [jx.to_cotangent_aval(a) for a in lin_carry_avals])
    outs, l_it = [], iter(l_out)
    need_n = any(not f and v in used for f, v in zip(carry_lin, eqn.outvars))
    n_out = None
    if need_n or any(split.carry_affine):
        # Counted loops only (checked): the other carries do not depend on the
        # linear input; run the loop with it zeroed to get them, and the
        # constant parts of affine carries.
        starts = iter(a_init)
        lin_start = [next(starts) if f else jnp.zeros(a.shape, a.dtype)
                     for f, a in zip(lin_const_start, lin_carry_avals)]
        ops = [*c_consts, *merge(const_lin, zeros_of(lin_const_avals),
                                 [b for b, f in zip(b_consts, const_lin) if not f]),
               *merge(carry_lin, lin_start,
                      [x for x, f in zip(init, carry_lin) if not f])]
        n_out = jx.eval_equation(eqn, ops)
    for k in range(n_carry):
        if carry_lin[k]:
            part = next(l_it)
            outs.append(part + n_out[k] if split.carry_affine[k] and n_out is not None
                        else part)
        elif n_out is not None:
            outs.append(n_out[k])
        else:
            aval = eqn.outvars[k].aval
            outs.append(jnp.zeros(aval.shape, aval.dtype))
    return outs, list(carry_lin)


def _floating(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.inexact)


#: Steps after which the transposed iteration of a loop to convergence without
#: an iteration cap gives up (its results are then NaN): an iteration that
#: neither converges nor overflows (a rotation) would otherwise run forever.
_LIMIT_STEPS = 1 << 24
#: Steps over which the terms of a transposed sum must shrink (``_transposed_limit``).
_DECAY_WINDOW = 1024


def _transposed_limit(step_t, l_bar, const_avals, n_init, n_step, cap_ok):
    """Cotangents ``(B^T s, v)`` of a loop ``x <- M x + B c`` run to its limit:
    ``s = sum_j (M^T)^j l_bar`` and ``v = lim (M^T)^N l_bar``, the cotangents of
    the linear loop constants ``c`` and of the start ``x_0``.  ``step_t(v)`` is
    ``(B^T v, M^T v)``.

    The loop's exit test is a convergence test (checked in ``_while_split``), so
    its result is the limit of the iteration whatever its trip count; the
    transposed iteration runs until neither cotangent changes at working
    precision.  ``v`` vanishes for a contraction (the start does not matter)
    and keeps the parts of the start that persist (a Neumann sum's accumulator
    is its start plus the terms).  The user's convergence test is not reused:
    it measures the forward iterate (its change, a residual, a vanishing term),
    which the transposed state is not.  Its iteration cap is: ``cap_ok(n)``
    (None: no cap) on the other carries ``n`` (``n_step`` steps them from
    ``n_init``) says whether the loop may take another step.  A loop stopped by
    its cap ran exactly that many steps, whatever the linear input: the
    transposed iteration stops there too, the exact transpose of those steps."""
    # Sizes are compared in the widest precision of the values: a float64 state
    # past float32's range would be inf in float32, and inf > inf reads as settled.
    wide = max((jnp.finfo(a.dtype).dtype for a in const_avals if _floating(a.dtype)),
               key=lambda d: d.itemsize, default=jnp.dtype(jnp.float32))
    wide = max([wide, *(jnp.finfo(x.dtype).dtype for x in l_bar if _floating(x.dtype))],
               key=lambda d: d.itemsize)

    def size(xs):
        return functools.reduce(jnp.maximum, [jnp.max(jnp.abs(x), initial=0.0).astype(wide)
                                              for x in xs], jnp.zeros((), wide))

    def still_changing(changes, values, scale):
        """Whether some element still changes by more than a unit of its own
        precision, relative to its own size (a component in small units beside
        one in large units converges as slowly as it does), or to ``eps`` times
        the largest value for an element that tends to zero."""
        out = jnp.bool_(False)
        for d, x in zip(changes, values):
            eps = jnp.finfo(x.dtype).eps
            floor = (eps * scale).astype(wide)
            out = out | jnp.any(jnp.abs(d).astype(wide) >
                                eps * jnp.maximum(jnp.abs(x).astype(wide), floor))
        return out

    def may_step(n_vals):
        """(whether the cap lets the loop step, whether lanes of a batched loop
        disagree about it).  A batched loop's lanes share the transposed state
        here, so lanes whose caps differ cannot each stop at their own."""
        pred = jnp.bool_(True) if cap_ok is None else cap_ok(n_vals)
        if jnp.ndim(pred) == 0:
            return pred, jnp.bool_(False)
        return jnp.any(pred), jnp.logical_and(jnp.any(pred), jnp.logical_not(jnp.all(pred)))

    def keep_going(state):
        _, _, n_vals, change, _, k, _ = state
        return functools.reduce(jnp.logical_and, [change, may_step(n_vals)[0], k < _LIMIT_STEPS])

    def step(state):
        v, acc, n_vals, _, give_up, k, (window, before) = state
        g_c, v_new = step_t(v)
        acc_new = [a + g for a, g in zip(acc, g_c)]
        scale = size([*v_new, *acc_new, *l_bar])
        moved = still_changing([*[a - b for a, b in zip(v_new, v)], *g_c], [*v_new, *acc_new],
                               scale)
        # A sum whose terms do not shrink (a mode the transposed map keeps, summed
        # for ever: the null space of a singular system the forward loop never
        # meets) "settles" only when its terms fall below its rounding: no limit.
        # Its largest term over a window of steps is no smaller than over the one
        # before (a slow contraction's is, by rate^window; an oscillating one's too).
        window = jnp.maximum(window, size(g_c))
        boundary = (k + 1) % _DECAY_WINDOW == 0
        kept = boundary & (k + 1 >= 2 * _DECAY_WINDOW) & (window > 0) & (window >= before)
        before = jnp.where(boundary, window, before)
        window = jnp.where(boundary, jnp.zeros_like(window), window)
        # A diverging iteration overflows: it stops there, with no limit to give.
        diverged = jnp.logical_not(jnp.isfinite(scale)) | kept
        change = jnp.logical_and(moved, jnp.logical_not(diverged))
        give_up = functools.reduce(jnp.logical_or, [give_up, may_step(n_vals)[1], diverged])
        return list(v_new), acc_new, n_step(n_vals), change, give_up, k + 1, (window, before)

    acc0 = [jnp.zeros(a.shape, a.dtype) for a in const_avals]
    v, acc, n_vals, change, give_up, _, _ = jax.lax.while_loop(
        keep_going, step, (list(l_bar), acc0, list(n_init), jnp.bool_(True), jnp.bool_(False),
                           jnp.int32(0), (jnp.zeros((), wide), jnp.zeros((), wide))))
    # Still changing and not stopped by the cap (no limit to give), diverged, or
    # stopped by caps that differ between lanes: NaN rather than another number.
    unsettled = jnp.logical_or(jnp.logical_and(change, may_step(n_vals)[0]), give_up)
    return [jnp.where(unsettled, jnp.nan, x).astype(x.dtype) for x in [*acc, *v]]


class _ToleranceCone:
    """The equations that compute a linear solve's tolerances from its right-hand
    side: ``equations`` (in order), the solve's const ``positions`` they give, the
    ``free`` values they read besides the right-hand side, and ``rhs``."""
    __slots__ = ("equations", "positions", "free", "rhs")

    def __init__(self, equations, positions, free, rhs):
        self.equations, self.positions, self.free = equations, positions, free
        self.rhs = rhs  # {value: k}: the k-th right-hand side, or a value it copies


def _solve_tolerances(jaxpr, linear: Sequence[bool]) -> dict:
    """``{id(solve equation): _ToleranceCone}`` for the ``custom_linear_solve``s of
    ``jaxpr`` whose ``solve`` / ``transpose_solve`` constants depend on the linear
    input only through the solve's right-hand side ``b``: a stopping tolerance
    relative to ``|b|``, which ``jax.scipy.sparse.linalg.gmres`` computes outside
    the solve.  JAX defines a ``custom_linear_solve`` as the exact solve, linear in
    ``b``, whatever those constants are (its derivative rules never differentiate
    them), so such a solve is linear in ``b``; its transpose solves the transposed
    system with the tolerances computed from the transposed right-hand side.
    The values the tolerances are computed from must be read by nothing else."""
    if not any(e.primitive.name == "custom_linear_solve" for e in jaxpr.eqns):
        return {}  # every scan and evaluation asks: most jaxprs have no solve
    dep = {v for v, f in zip(jaxpr.invars, linear) if f}
    producer, users = {}, {}
    for e, is_live in zip(jaxpr.eqns, _live_equations(jaxpr)):
        if not is_live:
            continue  # dead code (gmres's unused preconditioned tolerance) reads nothing
        ins = [a for a in e.invars if not isinstance(a, Literal)]
        flags = [not isinstance(a, Literal) and a in dep for a in e.invars]
        if any(flags):
            dep.update(v for v, f in zip(e.outvars, _eqn_reaches(e, flags)) if f)
        for v in e.outvars:
            producer[v] = e
        for a in ins:
            users.setdefault(a, []).append(e)
    outputs = {a for a in jaxpr.outvars if not isinstance(a, Literal)}
    cones = {}
    for e in jaxpr.eqns:
        if e.primitive.name != "custom_linear_solve":
            continue
        lengths = e.params["const_lengths"]
        n_consts = sum(lengths)
        start = lengths.matvec + lengths.vecmat
        positions = [i for i in range(start, n_consts)
                     if not isinstance(e.invars[i], Literal) and e.invars[i] in dep]
        if not positions or any(not isinstance(a, Literal) and a in dep
                                for a in e.invars[:start]):
            continue
        rhs = _rhs_aliases(e.invars[n_consts:], producer)
        roots = _rhs_roots(e.invars[n_consts:], producer)
        b_vars = set(rhs)
        cone, free, stack, ok = {}, [], [e.invars[i] for i in positions], True
        while stack and ok:
            v = stack.pop()
            if v in b_vars or v not in dep:
                if v not in b_vars and v not in free:
                    free.append(v)
                continue
            made_by = producer.get(v)
            if made_by is None or made_by.effects or _eqn_has_while(made_by):
                ok = False  # a linear input itself, or a loop: not a tolerance
                break
            if id(made_by) not in cone:
                cone[id(made_by)] = made_by
                stack.extend(a for a in made_by.invars if not isinstance(a, Literal))
        if ok:
            ordered = [c for c in jaxpr.eqns if id(c) in cone]
            cones[id(e)] = (roots, _ToleranceCone(ordered, positions, free, rhs))
    # Nothing but the cones and the tolerance operands of solves of one right-hand
    # side (two gmres calls on one cotangent share its norm once CSE merged it)
    # reads a cone's values: drop the cones whose values leak, until none does.
    while True:
        kept = {}
        for key, (roots, cone) in cones.items():
            group = {id(c) for r, other in cones.values() if r == roots for c in other.equations}
            leaks = any(v in outputs or any(id(u) not in group and
                                            not (id(u) in cones and
                                                 _reads_as_tolerance(u, v, roots, producer))
                                            for u in users.get(v, ()))
                        for c in cone.equations for v in c.outvars)
            if not leaks:
                kept[key] = (roots, cone)
        if len(kept) == len(cones):
            return {key: cone for key, (_, cone) in kept.items()}
        cones = kept


_COPIES = ("device_put", "copy")


def _rhs_aliases(atoms, producer) -> dict:
    """``{value: k}``: the right-hand-side operand ``atoms[k]`` and the values it is a
    copy of (``device_put``, which gmres applies to ``b`` before taking its norm)."""
    out = {}
    for k, a in enumerate(atoms):
        for v in _copy_chain(a, producer):
            out.setdefault(v, k)
    return out


def _copy_chain(a, producer) -> list:
    chain = []
    while not isinstance(a, Literal):
        chain.append(a)
        made_by = producer.get(a)
        if made_by is None or made_by.primitive.name not in _COPIES:
            break
        a = made_by.invars[made_by.outvars.index(a)]
    return chain


def _rhs_roots(atoms, producer) -> tuple:
    """What each right-hand-side operand is a copy of, at the start of its chain."""
    return tuple((_copy_chain(a, producer) or [a])[-1] for a in atoms)


def _reads_as_tolerance(eqn, v, roots: tuple, producer) -> bool:
    """Does ``eqn`` read ``v`` only as a solve / transpose_solve constant of a
    ``custom_linear_solve`` of the same right-hand side (``roots``)?"""
    if eqn.primitive.name != "custom_linear_solve":
        return False
    lengths = eqn.params["const_lengths"]
    n_consts, start = sum(lengths), lengths.matvec + lengths.vecmat
    if _rhs_roots(eqn.invars[n_consts:], producer) != roots:
        return False
    return all(start <= i < n_consts for i, a in enumerate(eqn.invars) if a is v)


def _bind_tolerant_solve(eqn, cone: "_ToleranceCone", read) -> list:
    """A ``custom_linear_solve`` whose tolerances come from its right-hand side,
    bound as a linear rule: the solve with tolerances from ``b``, transposed as the
    transposed solve with tolerances from its own right-hand side (the cotangent)."""
    n_consts = sum(eqn.params["const_lengths"])
    b_vars = list(eqn.invars[n_consts:])
    free_vals = [read(v) for v in cone.free]
    others = [read(a) for i, a in enumerate(eqn.invars[:n_consts]) if i not in cone.positions]
    res, lin = [*free_vals, *others], [read(v) for v in b_vars]
    nf = len(free_vals)

    def operands(r, rhs):
        env = dict(zip(cone.free, r[:nf]))
        env.update((v, rhs[k]) for v, k in cone.rhs.items())

        def value(a):
            return a.val if isinstance(a, Literal) else env[a]
        for c in cone.equations:
            env.update(zip(c.outvars, jx.eval_equation(c, [value(a) for a in c.invars])))
        rest = iter(r[nf:])
        return [value(a) if i in cone.positions else next(rest)
                for i, a in enumerate(eqn.invars[:n_consts])]

    def callee(r, lv):
        return jx.eval_equation(eqn, [*operands(r, lv), *lv])

    def transpose(r, cts):
        ops = operands(r, cts)
        examples = [_example(v.aval) for v in b_vars]
        solve = jax.linear_transpose(lambda *bv: jx.eval_equation(eqn, [*ops, *bv]), *examples)
        return list(solve(list(cts)))

    return _bind_rule(eqn, callee, transpose, res, lin,
                      [jx.to_cotangent_aval(v.aval) for v in eqn.outvars])


def _bind_rule(eqn, callee, transpose, res, lin, ct_avals):
    """``linear_call(callee, transpose)(res; lin)`` as a first-order rule (callee
    and transpose are constant-free jaxprs, so the IR can hold the equation and
    the saved-program format can write it)."""
    from .rules import LinearRule, RuleInfo, bind_linear_rule
    res_avals = [jax.typeof(x) for x in res]
    lin_avals = [jax.typeof(x) for x in lin]
    nr = len(res)
    c_jaxpr, c_consts, _ = jx.trace_flat(lambda *a: callee(a[:nr], a[nr:]),
                                         [*res_avals, *lin_avals], "while_linear")
    t_jaxpr, t_consts, _ = jx.trace_flat(lambda *a: transpose(a[:nr], a[nr:]),
                                         [*res_avals, *ct_avals], "while_transposed")
    # Constants either function captured become leading residuals of both.
    nc, nt = len(c_consts), len(t_consts)
    k_avals = [jax.typeof(x) for x in [*c_consts, *t_consts]]

    def callee_all(*a):
        return jx.eval_jaxpr(c_jaxpr, (), *a[:nc], *a[nc + nt:])

    def transpose_all(*a):
        return jx.eval_jaxpr(t_jaxpr, (), *a[nc:nc + nt], *a[nc + nt:])

    callee_c = _constant_free(callee_all, [*k_avals, *res_avals, *lin_avals], "while_linear")
    transpose_c = _constant_free(transpose_all, [*k_avals, *res_avals, *ct_avals],
                                 "while_transposed")
    where = jx.source_summary(eqn.source_info) or "?"
    info = RuleInfo(name="while_loop", source=where, const_names=())
    rule = LinearRule(info=info, callee=callee_c, transpose=transpose_c,
                      num_res=nc + nt + nr)
    return bind_linear_rule(rule, [*c_consts, *t_consts, *res, *lin])


def _constant_free(fn, avals, name):
    jaxpr, consts, _ = jx.trace_flat(fn, avals, name)
    if consts:
        raise NotTransposableError(f"the transpose of a while_loop captured {len(consts)} "
                                   f"constants")
    return ClosedJaxpr(jaxpr, [])
