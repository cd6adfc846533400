"""First-order custom rules and their re-binding through JAX's public APIs.

A rule here holds only constant-free ``ClosedJaxpr``s: every value the user's
Python rule closed over is a leading operand (``num_consts`` of them) of the
custom equation.  Layouts (``c`` = closed-over values, ``x`` = the function's
flattened dynamic arguments, ``r`` = residuals, ``ct``/``t`` = cotangents/tangents,
which exist for inexact leaves only):

* VJP   call: (c, x) -> y      fwd: (c, x) -> (y, r)      bwd: (c, r, ct_y) -> ct_x
* JVP   call: (c, x) -> y      jvp: (c, x, t_x) -> (y, t_y)
* linear_call  callee: (r, x) -> y      transpose: (r, ct_y) -> ct_x

``build_*`` turn a rule back into a ``jax.custom_vjp`` / ``jax.custom_jvp`` function
(or bind ``linear_call``), so that JAX's AD uses the user's rule exactly.  The
derivative with respect to closed-over values, which the user's rule cannot give,
follows the rule's ``closed_over`` policy (see ``const_mode``).
"""
from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from .. import jax_adapter as jx
from .errors import ClosedOverError

CLOSED_OVER_MODES = ("auto", "error", "reverse", "forward")


def is_inexact(aval) -> bool:
    return jnp.issubdtype(aval.dtype, jnp.inexact)


class LazyJaxpr:
    """A rule body made on first use.  A rule that calls its own custom function is a
    cycle: its fwd holds a call whose fwd is itself.  Bodies reached through a rule are
    made when JAX differentiates to that order, so every finite order is finite work.

    It also carries which of the body's tangent (or cotangent) outputs the user's rule
    returned as symbolic zeros (``SymbolicZero`` or ``None``): a traced body holds a
    dense zero there, and the rebuilt rule hands JAX a symbolic zero again, so a rule
    downstream sees that output unperturbed, as in JAX (``symbolic_outputs``)."""
    __slots__ = ("_make", "_value", "_zeros", "source")

    def __init__(self, make, zeros: tuple | None = None, source=None):
        self._make = make
        self._value = None
        self._zeros = None if zeros is None else _mask(zeros)
        # The IR region the body is exported from, when it is one (a rule rebuilt
        # from a program's params): importing the rule back takes the region itself
        # instead of exporting and re-importing it.
        self.source = source

    def get(self):
        if self._value is None:
            made = self._make()
            self._value = body(made)
            if self._zeros is None:
                self._zeros = symbolic_outputs(made)
        return self._value

    @property
    def zeros(self) -> tuple:
        self.get()
        return self._zeros


def _mask(zeros) -> tuple:
    zeros = tuple(bool(z) for z in zeros)
    return zeros if any(zeros) else ()


def marked(closed, zeros):
    """``closed`` (a body) recorded with the outputs its rule returned as symbolic
    zeros; ``closed`` itself when there are none."""
    zeros = _mask(zeros)
    if not zeros:
        return closed
    value = body(closed)
    return LazyJaxpr(lambda: value, zeros)


def symbolic_outputs(closed) -> tuple:
    """Which outputs of a body (its tangents for a jvp rule, all of them for a bwd or
    a transpose) its rule returned as symbolic zeros; ``()`` when none."""
    return closed.zeros if type(closed) is LazyJaxpr else ()


def body(closed):
    """A rule body: the ClosedJaxpr itself, or a LazyJaxpr's, made now."""
    return closed.get() if type(closed) is LazyJaxpr else closed


class PatternRules:
    """A symbolic-zeros rule's bodies for the perturbation patterns JAX decides when it
    differentiates, each made (traced from the user's Python rule) the first time JAX
    asks for that pattern and kept.  ``make(key)`` returns the body for ``key`` with
    the rule's closed-over values as its ``num_consts`` leading inputs, or None when
    the rule's main body is the one for ``key`` (keys: a ``custom_jvp`` rule's pattern
    of perturbed inexact arguments; a ``custom_vjp`` rule's ``("fwd", pattern)`` ->
    ``(fwd, num_res)`` and ``("bwd", pattern, ct_pattern)``; a ``linear_call``'s
    cotangent pattern).  Nothing is traced for a pattern JAX never gives, so every
    pattern of any number of inputs, at any nesting, costs one trace when used
    (docs/closure.md).  In-process only: a saved program keeps the bodies in its
    regions (``jvp_variants`` ...), not these.

    Passes may append operands to the rule's closed-over group (hoisting constants
    into it); ``get`` gives a body unused inputs for them, so it fits the equation."""
    __slots__ = ("_make", "_made", "num_consts", "main", "__weakref__")

    def __init__(self, make, num_consts: int, main: tuple | None = None):
        self._make, self._made, self.num_consts = make, {}, int(num_consts)
        self.main = main  # the pattern the rule's main bodies were traced for

    def raw(self, key):
        if key not in self._made:
            self._made[key] = self._make(key)
        return self._made[key]

    def get(self, key, const_avals):
        made = self.raw(key)
        if made is None:
            return None
        extra = list(const_avals[self.num_consts:])
        if isinstance(made, tuple):  # (fwd, num_res)
            return (_with_more_consts(made[0], self.num_consts, extra), made[1])
        return marked(_with_more_consts(made, self.num_consts, extra), symbolic_outputs(made))


def _with_more_consts(closed, num_consts: int, avals):
    """``closed`` (constants ``num_consts`` leading inputs) taking unused inputs of
    ``avals`` after them."""
    closed = body(closed)
    if not avals:
        return closed
    j = closed.jaxpr
    invars = list(j.invars)
    invars[num_consts:num_consts] = [jx.Var(a) for a in avals]
    return jx.ClosedJaxpr(jx.Jaxpr(j.constvars, invars, j.outvars, j.eqns, j.effects,
                                   jx.fit_debug_info(j.debug_info, len(invars), len(j.outvars))),
                          closed.consts)


def run(closed, *args):
    closed = body(closed)
    return jx.eval_jaxpr(closed.jaxpr, closed.consts, *args)


@dataclass(frozen=True, eq=False)
class RuleInfo:
    """What every rule records about where it came from and its closed-over values."""
    name: str                          # the user's Python function name
    source: str                        # "file.py:line" of that function
    const_names: tuple[str, ...]       # best-effort Python names of the closed-over values
    closed_over: str = "auto"          # policy for derivatives w.r.t. closed-over values
    max_forward_size: int = 4096       # forward policy: max total elements of those values
    reverse_ok: bool = True            # the primal has no while_loop outside custom rules
    # The kind of custom function the user wrote, when the rule was rewritten into
    # another kind (vjp-to-jvp): errors name the user's.  Not saved: it is set again
    # whenever the rewrite runs.
    written_as: str | None = None

    def describe_const(self, i: int, aval) -> str:
        name = self.const_names[i] if i < len(self.const_names) else f"const{i}"
        return f"'{name}' ({aval.str_short(short_dtypes=True)})"

    def const_mode(self, kind: str, perturbed: list[bool], const_avals) -> str:
        """'none' when no closed-over value is perturbed, else 'reverse' / 'forward',
        or raise ClosedOverError as the policy says."""
        hot = [i for i, p in enumerate(perturbed) if p]
        if not hot:
            return "none"
        mode = self.closed_over
        size = sum(int(np.prod(const_avals[i].shape)) for i in hot)
        if mode == "auto":
            if kind == "jvp":
                mode = "forward"  # a jvp of the primal w.r.t. the values is exact and cheap
            elif self.reverse_ok:
                mode = "reverse"
            elif size <= self.max_forward_size:
                mode = "forward"
            else:
                mode = "error"
        if mode == "forward" and kind == "vjp" and size > self.max_forward_size:
            raise ClosedOverError(
                f"{self.written_as or kind} rule '{self.name}' ({self.source}) closes over "
                f"{self.describe_const(hot[0], const_avals[hot[0]])}, which is being differentiated; "
                f"forward mode would need {size} jvp columns > max_forward_size={self.max_forward_size}: "
                f"raise max_forward_size or use closed_over='reverse'")
        if mode == "reverse" and kind == "vjp" and not self.reverse_ok:
            raise ClosedOverError(
                f"custom_{self.written_as or kind} rule '{self.name}' ({self.source}) closes over "
                f"{self.describe_const(hot[0], const_avals[hot[0]])}, which is being "
                f"differentiated; closed_over='reverse' asks for the reverse-mode derivative of "
                f"its primal, which runs a while_loop that reverse mode cannot differentiate: "
                f"trace with closed_over='auto' or 'forward'")
        if mode == "error" and self.closed_over == "auto":
            raise ClosedOverError(
                f"custom_{self.written_as or kind} rule '{self.name}' ({self.source}) closes over "
                f"{self.describe_const(hot[0], const_avals[hot[0]])}, which is being differentiated, "
                f"and its rule gives no derivative for it: its primal runs a while_loop, which "
                f"reverse mode cannot differentiate, and forward mode would need {size} jvp "
                f"columns > max_forward_size={self.max_forward_size}: pass the value to the rule "
                f"as an argument, or trace with a larger max_forward_size (jaxpr_cc.trace)")
        if mode == "error":
            raise ClosedOverError(
                f"custom_{self.written_as or kind} rule '{self.name}' ({self.source}) closes over "
                f"{self.describe_const(hot[0], const_avals[hot[0]])}, which is being differentiated, "
                f"and its rule gives no derivative for it: pass it as an argument, or trace with "
                f"closed_over='auto' (or 'reverse' / 'forward')")
        return mode


@dataclass(frozen=True, eq=False)
class VJPRule:
    info: RuleInfo
    call: Any                   # ClosedJaxpr (c, x) -> y
    fwd: Any                    # ClosedJaxpr (c, x) -> (y, r), or a LazyJaxpr of one
    bwd: Any                    # ClosedJaxpr (c, r, ct_y) -> ct_x (inexact x only), or lazy
    num_consts: int
    num_res: int
    symbolic_zeros: bool = False  # the user's flag (rules are stored dense)
    # A symbolic-zeros rule traced per perturbation pattern (docs/closure.md):
    # fwd_variants ((in_pattern, fwd, num_res), ...) by which inexact arguments are
    # perturbed; bwd_variants ((family, ct_pattern, bwd), ...) by the fwd whose
    # residuals they take (its in_pattern, () for ``fwd``) and which inexact outputs'
    # cotangents are not SymbolicZero.  Patterns not listed use ``fwd`` / ``bwd``.
    fwd_variants: tuple = ()
    bwd_variants: tuple = ()
    # Patterns the variants above do not list, traced when JAX first gives them
    # (``PatternRules``; keys ("fwd", in_pattern), ("bwd", in_pattern, ct_pattern)).
    pattern_rules: Any = None

    def replace(self, **kw) -> "VJPRule":
        return dataclasses.replace(self, **kw)

    def take_late_bwd(self, bwd, bwd_variants: tuple | None = None) -> None:
        """Make ``bwd`` and ``bwd_variants`` (traced when the program returned, as
        JAX traces a bwd when it differentiates) this rule's bwds; without
        variants, ``bwd`` (and the main fwd) serve every pattern.  In place: the
        rule is shared by identity -- calls that reused it, and calls of the
        custom function from inside its own rules (recursion) -- and all of them
        run their bwd late in JAX."""
        fwd_variants = self.fwd_variants if bwd_variants is not None else ()
        for name, value in (("bwd", bwd), ("fwd_variants", fwd_variants),
                            ("bwd_variants", bwd_variants or ()), ("pattern_rules", None)):
            object.__setattr__(self, name, value)


@dataclass(frozen=True, eq=False)
class JVPRule:
    info: RuleInfo
    call: Any                   # ClosedJaxpr (c, x) -> y
    jvp: Any                    # ClosedJaxpr (c, x, t_x) -> (y, t_y) (inexact leaves), or lazy
    num_consts: int
    symbolic_zeros: bool = False
    # A symbolic-zeros rule traced per pattern of perturbed inexact arguments:
    # ((pattern, jvp ClosedJaxpr or LazyJaxpr), ...), same layout as ``jvp``; the
    # pattern all-perturbed (and any not listed) uses ``jvp``.
    variants: tuple = ()
    pattern_rules: Any = None  # patterns not in ``variants``, traced when first used
    # A ``forward_only`` rule: its jvp is made from ``call`` (``forward_only_rule``),
    # so a program stores only this count of levels, not the jvp body.
    forward_only_levels: int | None = None

    def replace(self, **kw) -> "JVPRule":
        return dataclasses.replace(self, **kw)


@dataclass(frozen=True, eq=False)
class LinearRule:
    info: RuleInfo
    callee: Any                 # ClosedJaxpr (r, x) -> y
    transpose: Any              # ClosedJaxpr (r, ct_y) -> ct_x, or a LazyJaxpr of one
    num_res: int
    # The transpose of a custom_vjp's symbolic-zeros bwd traced per pattern of output
    # cotangents (vjp-to-jvp): ((ct_pattern, transpose), ...), ct_pattern telling which
    # of the callee's outputs have a cotangent that is not a symbolic zero.  The
    # transposition picks the one for the cotangents it is given; patterns not listed
    # use ``transpose``.
    transpose_variants: tuple = ()
    pattern_rules: Any = None  # cotangent patterns not listed, traced when first used


def _zeros(aval):
    # Inside shard_map a zero must vary over the manual axes its value's type does:
    # the rule bodies it is passed to were traced with those types.
    return jx.zeros_of_type(aval)


def _dense(t, aval):
    if type(t) is SymbolicZero:
        return _zeros(t.aval)  # JAX's own type for the zero
    if t is None:
        return _zeros(aval)
    return t


def _layout_marker(index: int):
    """A zero-size residual whose shape ``(0, index)`` names the fwd layout its
    residuals were saved in.  A shape survives every transformation and staging
    between fwd and bwd (jit, scan, vmap, JAX's memoized fwd of a staged equation),
    where the residuals' tree does not (see ``build_custom_vjp``)."""
    # Made by an equation, not held as a constant: a fwd traced for one pattern
    # must not read a constant the others do not (frontend/staged_rules.py).
    return jax.lax.full((0, index), False)


def _marked_layout(marker) -> int:
    return int(np.shape(marker)[1])


def _real_directions(value):
    """The real directions of ``value`` as a basis of shape ``(m, *shape)``: one per
    element, and for a complex value also ``1j`` per element (m = 2n)."""
    shape, dtype = jnp.shape(value), jnp.result_type(value)
    n = int(np.prod(shape))
    eye = jnp.eye(n, dtype=jnp.finfo(dtype).dtype).reshape((n, *shape))
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return jnp.concatenate([eye.astype(dtype), (1j * eye).astype(dtype)])
    return eye.astype(dtype)


def _direction_weights(tangent):
    """A tangent's coordinates in ``_real_directions``: its real parts, then (complex)
    its imaginary parts, flat."""
    t = jnp.ravel(jnp.asarray(tangent))
    if jnp.issubdtype(t.dtype, jnp.complexfloating):
        return jnp.concatenate([jnp.real(t), jnp.imag(t)])
    return t


def _jacobian_columns(f, wrt):
    """``(*xs) -> columns``: for each input index in ``wrt`` and each output of ``f``,
    the output's jvp along every real direction of that input, stacked on a leading
    axis (``(m, *out_shape)``), all by forward mode."""
    def columns(*xs):
        out = []
        for k in wrt:
            def along(direction, k=k):
                probe = [jnp.zeros_like(x) if is_inexact(jx.typeof(x)) else
                         np.zeros(jnp.shape(x), jax.dtypes.float0) for x in xs]
                probe[k] = direction
                return list(jax.jvp(f, tuple(xs), tuple(probe))[1])
            out.extend(jax.vmap(along)(_real_directions(xs[k])))
        return out
    return columns


# How many orders of a ``forward_only`` function are custom rules when it is staged
# as a first-order rule (``levels``).  Each level's Jacobian columns are a vmapped
# jvp of the level below, so the staged size grows about 14x per level through a
# while_loop (newton_sqrt's adjoint: 281 equations, then 3942): one level gives a
# closed-over value's cotangent, its jvp (a third derivative of a fixed point
# through vjp-to-jvp) and every forward-mode order; one more reverse order runs the
# columns' own jvp, and fails on a while_loop as JAX does.
FORWARD_ONLY_LEVELS = 2
# A level below the first stays a rule only while its columns (the body its own jvp
# would differentiate once more, ~14x larger) have at most this many equations;
# otherwise it is plain forward mode, as the last level is.
FORWARD_ONLY_MAX_EQUATIONS = 1000


def forward_only(f, levels: int | None = None, traced: dict | None = None):
    """``f`` (flat arrays -> flat arrays) as a function whose derivatives of every
    order are formed by forward mode (an integer or bool output has none).

    Its jvp is the Jacobian's columns (forward mode, see ``_jacobian_columns``)
    contracted with the tangents: linear in the tangents, so reverse mode transposes
    the contraction and never the forward-mode pass itself, which may run through a
    while_loop.  The columns are ``forward_only`` again, so the next derivative, in
    either mode, is formed the same way: one more forward-mode pass per order.

    ``levels=None``: a JAX ``custom_jvp`` made level by level as JAX differentiates
    (any order; for rules JAX runs, never staged into a program).  ``levels=k``: a
    first-order rule (``JVPRule``) that a program can hold, save and emit: ``k``
    levels of rules, the last level's columns plain forward mode (see
    ``FORWARD_ONLY_LEVELS``); ``0`` is ``f`` itself."""
    if levels is not None:
        return _forward_only_first_order(f, levels, traced=traced)
    g = jax.custom_jvp(f)

    def jvp(primals, tangents):
        outs = g(*primals)
        hot = [k for k, t in enumerate(tangents)
               if type(t) is not SymbolicZero and is_inexact(jx.typeof(primals[k]))]
        inexact = [j for j, o in enumerate(outs) if is_inexact(jx.typeof(o))]
        t_outs = [jnp.zeros(jnp.shape(o), jnp.result_type(o)) if j in inexact
                  else np.zeros(jnp.shape(o), jax.dtypes.float0) for j, o in enumerate(outs)]
        if hot:
            cols = forward_only(_jacobian_columns(_outputs(f, inexact), hot))(*primals)
            it = iter(cols)
            for k in hot:
                w = _direction_weights(tangents[k])
                for j in inexact:
                    col = next(it)
                    t_outs[j] = t_outs[j] + jnp.tensordot(w.astype(col.dtype), col, axes=1)
        return outs, t_outs

    g.defjvp(jvp, symbolic_zeros=True)
    setattr(jvp, jx.KEPT_IN_PARTIAL_EVAL, True)  # its primal may be a while_loop
    # It closes over jaxprs only: a trace session leaves it to JAX, as it does the
    # functions rebuilt from first-order rules.  ``closure-convert`` meeting it staged
    # in JAX's form (each conversion would stage the next level, ~14x larger, with
    # no end) makes it first-order instead (``forward_only_target``).
    g._jaxpr_cc_rebuilt = True
    g._jaxpr_cc_forward_only = f

    def call(*xs):
        # The types ``f`` is called at (per example, under jax.vmap: a tracer's
        # type): ``closure-convert`` meeting the call batched reads which operands
        # carry the batch axis from them (``forward_only_avals``).
        g._jaxpr_cc_forward_only_avals = tuple(jx.typeof(x) for x in xs)
        return g(*xs)
    return call


def _outputs(f, which: list[int]):
    """``f`` returning only its outputs ``which``."""
    def picked(*xs):
        got = f(*xs)
        return [got[j] for j in which]
    return picked


def forward_only_target(g):
    """The ``f`` of a ``forward_only(f)`` custom_jvp, or None."""
    return getattr(g, "_jaxpr_cc_forward_only", None)


def forward_only_avals(g):
    """The types the ``f`` of a ``forward_only(f)`` custom_jvp was called at, or None."""
    return getattr(g, "_jaxpr_cc_forward_only_avals", None)


def _count_equations(jaxpr, limit: int) -> int:
    """Equations of ``jaxpr`` and the jaxprs in its params, counting up to ``limit``."""
    seen, stack, n = set(), [jaxpr], 0
    while stack and n <= limit:
        j = stack.pop()
        if id(j) in seen:
            continue
        seen.add(id(j))
        for eqn in j.eqns:
            n += 1
            stack.extend(jx.subjaxprs_of(eqn))
    return n


def _forward_only_first_order(f, levels: int, first: bool = True, traced: dict | None = None):
    """``traced``: rules already made for this ``f`` (by argument types), to reuse
    when the caller stages the same ``f`` into several bodies (one per cotangent
    pattern of a rule's transpose): tracing ``f`` is the cost."""
    def apply(*xs):
        if levels <= 0:
            return list(f(*xs))
        avals = tuple(jx.typeof(x) for x in xs)
        hit = traced.get(avals) if traced is not None else None
        if hit is not None:
            g, consts = hit
            return list(g(*consts, *xs))
        jaxpr, consts, _ = jx.trace_flat(lambda *vs: list(f(*vs)), list(avals), "forward_only")
        if not first and _count_equations(jaxpr, FORWARD_ONLY_MAX_EQUATIONS) \
                > FORWARD_ONLY_MAX_EQUATIONS:
            return run(jx.ClosedJaxpr(jaxpr, list(consts)), *xs)
        g = build_custom_jvp(forward_only_rule(jx.ClosedJaxpr(jaxpr, []), len(consts), levels))
        if traced is not None and not any(isinstance(c, jx.Tracer) for c in consts):
            traced[avals] = (g, consts)
        return list(g(*consts, *xs))
    return apply


# ``closed`` -> the same body with forward mode through the custom_vjp rules it
# calls: vjp-to-jvp's rewrite, a layer above, which the package root registers
# (``register_forward_mode_body``) before any rule can be traced.
_FORWARD_MODE_BODY: list = []


def register_forward_mode_body(rewrite) -> None:
    _FORWARD_MODE_BODY[:] = [rewrite]


def _forward_mode_body(closed):
    return _FORWARD_MODE_BODY[0](closed)


# body -> its rewrite (a body holding no custom_vjp is its own: not stored, so the
# entry does not keep its key alive).
_FORWARD_MODE_BODIES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def with_forward_mode(call):
    """``call`` (a rule body) with forward mode through the custom_vjp rules it calls,
    made once per body: what forward mode through a rule's primal runs (the
    Jacobian columns of a closed-over value), so that a primal calling a custom_vjp
    (a diffrax adjoint inside a solver) can be differentiated that way."""
    closed = body(call)
    got = _FORWARD_MODE_BODIES.get(closed)
    if got is None:
        got = _forward_mode_body(closed)
        if got is not closed:
            _FORWARD_MODE_BODIES[closed] = got
    return got


def forward_only_rule(call, num_consts: int, levels: int, info: "RuleInfo | None" = None):
    """The first-order rule of ``forward_only(f, levels)`` for ``f`` traced as ``call``
    ((c, x) -> y, its own constants ``c`` the ``num_consts`` leading operands).

    Its jvp is a function of ``call`` alone, so a program holds only ``call`` and
    ``levels`` (``forward_only_levels``); the jvp body, a vmapped jvp of ``call``
    that may be far larger (through a while_loop, ~14x), is traced when JAX first
    differentiates the rule (``LazyJaxpr``)."""
    nc = num_consts
    avals = call.in_avals
    arg_avals = avals[nc:]
    out_avals = call.out_avals
    hot = [k for k, a in enumerate(arg_avals) if is_inexact(a)]

    with_forward_mode: list = []

    def plain(*vs):  # f at (c, x)
        # Differentiated in forward mode by the jvp below: through the custom_vjp
        # rules ``call`` holds too (a solver whose update calls another solver).
        if not with_forward_mode:
            with_forward_mode.append(_forward_mode_body(call))
        return run(with_forward_mode[0], *vs)

    inexact = [j for j, a in enumerate(out_avals) if is_inexact(a)]

    def jvp_body(*ops):  # -> outputs, then the inexact outputs' tangents
        c, x, t = ops[:nc], ops[nc:nc + len(arg_avals)], ops[nc + len(arg_avals):]
        outs = g(*c, *x)
        t_outs = [jnp.zeros(out_avals[j].shape, out_avals[j].dtype) for j in inexact]
        if hot:
            def columns_of(*vs):
                return _jacobian_columns(_outputs(lambda *xv: plain(*vs[:nc], *xv), inexact),
                                         hot)(*vs[nc:])
            cols = iter(_forward_only_first_order(columns_of, levels - 1, False)(*c, *x))
            for tangent in t:
                w = _direction_weights(tangent)
                for j in range(len(inexact)):
                    col = next(cols)
                    t_outs[j] = t_outs[j] + jnp.tensordot(w.astype(col.dtype), col, axes=1)
        return [*outs, *t_outs]

    def make_jvp():
        t_avals = [arg_avals[k].to_tangent_aval() for k in hot]
        j, j_consts, _ = jx.trace_flat(jvp_body, [*avals, *t_avals], "forward_only_jvp")
        if j_consts:  # values of f's own trace: constants of the rule body
            return jx.ClosedJaxpr(_pe_bind_consts(j, len(j_consts)), list(j_consts))
        return jx.ClosedJaxpr(j, [])

    if info is None:
        info = RuleInfo(name="forward_only", source="<jacobian columns>",
                        const_names=tuple(f"const{i}" for i in range(nc)),
                        closed_over="forward", max_forward_size=1 << 62, reverse_ok=False)
    rule = JVPRule(info=info, call=call, jvp=LazyJaxpr(make_jvp), num_consts=nc,
                   forward_only_levels=levels)
    g = build_custom_jvp(rule)
    return rule


def _pe_bind_consts(jaxpr, n: int):
    """A jaxpr whose first ``n`` invars are its constants, with them as constvars."""
    return jx.Jaxpr(list(jaxpr.invars[:n]), list(jaxpr.invars[n:]), jaxpr.outvars, jaxpr.eqns,
                    jaxpr.effects, jx.fit_debug_info(jaxpr.debug_info, len(jaxpr.invars) - n,
                                                     len(jaxpr.outvars)))


def _forward_const_cotangents(call, consts, args, hot, cts, out_avals, levels=None,
                              traced: dict | None = None):
    """Cotangents of the perturbed closed-over values by forward mode: the Jacobian's
    columns (one jvp per real direction of each value, vmapped), paired with the
    output cotangents.  Works through while_loop, where reverse mode does not; the
    columns come from ``forward_only``, so this is differentiable again, to any order.

    JAX pairs a cotangent with a tangent by ``Re(sum(ct * t))`` (no conjugate), so a
    complex value ``v`` has two directions per element, ``1`` and ``1j``, and its
    cotangent is ``pair(1) - 1j * pair(1j)``.  Each value's pairings accumulate in
    its own real dtype (float64 under ``jax_enable_x64``).  ``levels``: as in
    ``forward_only`` (an int when the result is staged into a program); ``traced``:
    as in ``_forward_only_first_order``, for one ``call`` and ``hot``.
    """
    nc = len(consts)
    inexact_outs = [j for j, a in enumerate(out_avals) if is_inexact(a)]

    outputs = _outputs(partial(run, with_forward_mode(call)), inexact_outs)
    cols = iter(forward_only(_jacobian_columns(outputs, list(hot)), levels,
                             traced)(*consts, *args))
    out = []
    for i in hot:
        value = consts[i]
        shape, dtype = jnp.shape(value), jnp.result_type(value)
        real_dtype = jnp.finfo(dtype).dtype
        n = int(np.prod(shape))
        pairs = jnp.zeros((2 * n if jnp.issubdtype(dtype, jnp.complexfloating) else n,),
                          real_dtype)
        for j in inexact_outs:
            col, ct = next(cols), cts[j]
            if ct is not None:
                paired = jnp.real(jnp.sum(col * ct, axis=tuple(range(1, col.ndim))))
                pairs = pairs + paired.astype(real_dtype)
        if jnp.issubdtype(dtype, jnp.complexfloating):
            ct_value = pairs[:n] - 1j * pairs[n:].astype(dtype)
        else:
            ct_value = pairs
        ct_value = ct_value.reshape(shape).astype(dtype)
        if getattr(jax.typeof(value), "weak_type", False):
            # JAX's cotangent of a weakly typed value (a Python scalar) is weakly
            # typed too, as reverse mode through the same function gives it.
            ct_value = jx.weakly_typed(ct_value)
        out.append(ct_value)
    return out


def _jacobian_tangents(call, ops, hot, tangents, out_avals):
    """``jvp(call)`` at ``ops`` along ``tangents`` of the operands ``hot``, as ``J @ t``:
    the Jacobian's columns by forward mode (``forward_only``: one per real direction;
    complex values have ``1`` and ``1j`` per element), contracted with the real and
    imaginary parts of the tangents: linear in the tangents, and differentiable again
    to any order.  Every operand is passed explicitly: ``forward_only`` traces its
    derivative later, when the caller's trace may have ended."""
    inexact_outs = [j for j, a in enumerate(out_avals) if is_inexact(a)]

    outputs = _outputs(partial(run, call), inexact_outs)
    cols = iter(forward_only(_jacobian_columns(outputs, list(hot)))(*ops))
    extra = [jnp.zeros(a.shape, a.dtype) if is_inexact(a) else None for a in out_avals]
    for tangent in tangents:
        w = _direction_weights(tangent)
        for j in inexact_outs:
            col = next(cols)
            extra[j] = extra[j] + jnp.tensordot(w.astype(col.dtype), col, axes=1)
    return extra


def _unmask(values, zeros: tuple, symbolic):
    """``values`` with those ``zeros`` marks replaced by ``symbolic`` (one value, or
    a list aligned with ``values``)."""
    if not zeros:
        return list(values)
    if not isinstance(symbolic, list):
        symbolic = [symbolic] * len(values)
    return [s if z else v for v, z, s in zip(values, zeros, symbolic)]


def build_custom_vjp(rule: VJPRule):
    """A ``jax.custom_vjp`` function of ``(*c, *x)`` that runs the rule's jaxprs."""
    info, nc, nr = rule.info, rule.num_consts, rule.num_res
    in_avals = rule.call.in_avals
    out_avals = rule.call.out_avals
    n_out = len(out_avals)
    arg_avals = in_avals[nc:]
    const_avals = in_avals[:nc]

    def primal(*ops):
        return run(rule.call, *ops)

    primal.__name__ = primal.__qualname__ = info.name
    g = jax.custom_vjp(primal)
    fwd_by_pattern = {pattern: (f, n) for pattern, f, n in rule.fwd_variants}

    # Which fwd ran, and what bwd needs to know about it, travels in the residuals'
    # values, not in their pytree structure: JAX stages a custom_vjp equation once
    # and memoizes its fwd per perturbation pattern, but hands bwd the residual tree
    # of whichever pattern was traced last.  An equation staged by make_jaxpr (as
    # equinox's closure conversion does) and then differentiated with patterns A, B,
    # A runs A's fwd and B's bwd (equinox's nested checkpointed loops: diffrax's
    # Runge-Kutta stage loop).  So the tree is one flat tuple whose layout does not
    # depend on the pattern -- a layout marker, every input, then the residuals of
    # the rule's own -- and the marker's shape names the layout (``layouts``).
    layouts: list = []
    layout_index: dict = {}
    n_in = len(in_avals)

    def fwd(*prims):
        vals = [p.value for p in prims]
        mode = info.const_mode("vjp", [p.perturbed for p in prims[:nc]], const_avals)
        # The user's fwd as traced with exactly these arguments perturbed, if it was.
        family = tuple(p.perturbed for p, a in zip(prims[nc:], arg_avals) if is_inexact(a))
        if family in fwd_by_pattern:
            chosen = fwd_by_pattern[family][0]
        else:
            # A pattern no variant was traced for: traced now, by JAX's pattern.
            made = (rule.pattern_rules.get(("fwd", family), const_avals)
                    if rule.pattern_rules is not None and family != rule.pattern_rules.main
                    else None)
            chosen, family = (made[0], ("made", family)) if made is not None else (rule.fwd, ())
        outs_res = run(chosen, *vals)
        outs, res = outs_res[:n_out], outs_res[n_out:]
        hot = tuple(i for i, p in enumerate(prims[:nc]) if p.perturbed)
        args_hot = any(p.perturbed for p in prims[nc:])
        # Inputs are saved whatever the pattern (JAX forwards them, so they cost no
        # fwd output), and a residual that is an input is read from them: the
        # residuals JAX forwards are then the same for every pattern too.
        position = {id(v): k for k, v in enumerate(vals)}
        res_from = tuple(position.get(id(r)) for r in res)
        own = [r for r, k in zip(res, res_from) if k is None]
        layout = (mode, hot, args_hot, family, res_from)
        index = layout_index.get(layout)
        if index is None:
            index = layout_index[layout] = len(layouts)
            layouts.append(layout)
        return list(outs), (_layout_marker(index), *vals, *own)

    def bwd(saved, cts):
        mode, hot, args_hot, family, res_from = layouts[_marked_layout(saved[0])]
        inputs, own = list(saved[1:1 + n_in]), iter(saved[1 + n_in:])
        saved_consts, saved_args = inputs[:nc], inputs[nc:]
        saved_res = [next(own) if k is None else inputs[k] for k in res_from]
        ct_pattern = tuple(type(c) is not SymbolicZero for c, a in zip(cts, out_avals)
                           if is_inexact(a))
        cts = [_dense(c, a.to_cotangent_aval() if hasattr(a, "to_cotangent_aval") else a)
               if is_inexact(a) else None for c, a in zip(cts, out_avals)]
        dense_cts = [c for c in cts if c is not None]
        arg_cts: list = [None] * len(arg_avals)
        if args_hot:  # as in JAX, the user's bwd runs only for perturbed arguments
            full = (True,) * len(dense_cts)
            made_for = family[1] if family[:1] == ("made",) else None
            # (Read from the rule now: a bwd traced late replaces its variants.)
            bwd_by_pattern = {(fam, ct): b for fam, ct, b in rule.bwd_variants}
            rule_bwd = None if made_for is not None else bwd_by_pattern.get((family, ct_pattern))
            if rule_bwd is None and rule.pattern_rules is not None and (
                    made_for is not None or ct_pattern != full):
                in_pattern = made_for if made_for is not None else (
                    family or rule.pattern_rules.main)
                rule_bwd = rule.pattern_rules.get(("bwd", in_pattern, ct_pattern), const_avals)
            if rule_bwd is None:
                rule_bwd = bwd_by_pattern[(family, full)] if family else rule.bwd
            got = run(rule_bwd, *saved_consts, *saved_res, *dense_cts)
            # A cotangent the user's bwd returned as None or SymbolicZero goes back
            # to JAX as a symbolic zero (None), as from the user's own rule.
            it = iter(_unmask(got, symbolic_outputs(rule_bwd), None))
            arg_cts = [next(it) if is_inexact(a) else None for a in arg_avals]
        const_cts: list = [None] * nc
        if mode == "reverse":
            def f(*cs):
                return run(rule.call, *cs, *saved_args)
            _, vjp_fn = jax.vjp(f, *saved_consts)
            full_cts = [c if c is not None else _zeros(a) for c, a in zip(cts, out_avals)]
            got = vjp_fn(list(full_cts))
            for i in hot:
                const_cts[i] = got[i]
        elif mode == "forward":
            got = _forward_const_cotangents(rule.call, list(saved_consts), list(saved_args), hot,
                                            cts, out_avals)
            for i, v in zip(hot, got):
                const_cts[i] = v
        return tuple(const_cts + arg_cts)

    g.defvjp(fwd, bwd, symbolic_zeros=True)
    bwd._jaxpr_cc_rule = rule  # lets the IR recognise this equation's first-order rule
    g._jaxpr_cc_rebuilt = True
    return g


def build_forward_mode_on_demand(rule: VJPRule, make):
    """A ``jax.custom_jvp`` function of ``(*c, *x)`` computing ``rule``'s primal,
    whose jvp is that of ``make(consts_perturbed)`` -- the rule rewritten for
    forward mode (vjp-to-jvp), a ``jax.custom_jvp`` function of the same
    operands -- made when JAX first differentiates it: a call JAX never
    differentiates never builds it (for a diffrax adjoint, a vmapped jvp of the
    whole backward solve).  ``make`` returning None means the rewrite kept the
    custom_vjp: JAX's own custom_vjp semantics then (reverse mode runs bwd,
    forward mode raises).  It keeps one whose policy refuses derivatives along
    its closed-over values (too many forward columns) only when JAX perturbs
    them (``consts_perturbed``): the rewritten rule's reverse mode is the vjp
    rule's along the arguments."""
    in_avals = list(rule.call.in_avals)
    nc = rule.num_consts

    def primal(*ops):
        return run(rule.call, *ops)

    primal.__name__ = primal.__qualname__ = rule.info.name
    g = jax.custom_jvp(primal)
    made: dict = {}

    def jvp(primals, tangents):
        consts_perturbed = any(type(t) is not SymbolicZero for t in tangents[:nc])
        if consts_perturbed not in made:
            made[consts_perturbed] = make(consts_perturbed)
        rewritten = made[consts_perturbed]
        if rewritten is None:
            # Only the operands JAX perturbs get tangents: a closed-over value it
            # does not (a constant weight) stays unperturbed for the custom_vjp.
            hot = [i for i, t in enumerate(tangents) if type(t) is not SymbolicZero]
            vjp_rule = build_custom_vjp(rule)

            def along_hot(*hot_values):
                full = list(primals)
                for i, v in zip(hot, hot_values):
                    full[i] = v
                return vjp_rule(*full)

            return jax.jvp(along_hot, tuple(primals[i] for i in hot),
                           tuple(tangents[i] for i in hot))
        if not rewritten.symbolic_zeros:
            tangents = [_dense(t, a.to_tangent_aval()) for t, a in zip(tangents, in_avals)]
        return rewritten.jvp(tuple(primals), tuple(tangents))

    g.defjvp(jvp, symbolic_zeros=True)
    setattr(jvp, jx.OWNED_RULE, True)
    g._jaxpr_cc_rebuilt = True
    return g


def build_custom_jvp(rule: JVPRule):
    """A ``jax.custom_jvp`` function of ``(*c, *x)`` that runs the rule's jaxprs."""
    info, nc = rule.info, rule.num_consts
    in_avals = rule.call.in_avals
    out_avals = rule.call.out_avals
    const_avals, arg_avals = in_avals[:nc], in_avals[nc:]
    n_out = len(out_avals)

    def primal(*ops):
        return run(rule.call, *ops)

    primal.__name__ = primal.__qualname__ = info.name
    g = jax.custom_jvp(primal)
    variants = dict(rule.variants)

    def jvp(primals, tangents):
        consts, args = list(primals[:nc]), list(primals[nc:])
        t_consts, t_args = tangents[:nc], tangents[nc:]
        perturbed = [type(t) is not SymbolicZero for t in t_consts]
        mode = info.const_mode("jvp", perturbed, const_avals)
        hot = [i for i, p in enumerate(perturbed) if p]
        # A jvp through the primal's while_loop cannot be transposed, so grad would
        # fail: the closed-over tangent is then formed from Jacobian columns.
        by_columns = mode != "none" and not info.reverse_ok and sum(
            int(np.prod(const_avals[i].shape)) for i in hot) <= info.max_forward_size
        if all(type(t) is SymbolicZero for t in t_args):
            # As in JAX, the user's rule runs only when an argument is perturbed.
            if by_columns:
                # So must the outputs' own derivatives at the next order be: not a
                # reverse pass through the primal's while_loop.
                outs = forward_only(partial(run, with_forward_mode(rule.call)))(*consts, *args)
            else:
                outs = run(rule.call, *consts, *args)
            t_outs = [SymbolicZero(a.to_tangent_aval()) if is_inexact(a)
                      else _zeros(a.to_tangent_aval()) for a in out_avals]
        else:
            dense = [_dense(t, a) for t, a in zip(t_args, arg_avals) if is_inexact(a)]
            # The user's rule as traced with exactly these inputs perturbed (it saw
            # SymbolicZero for the others, as JAX would give it).
            pattern = tuple(type(t) is not SymbolicZero
                            for t, a in zip(t_args, arg_avals) if is_inexact(a))
            chosen = variants.get(pattern)
            if chosen is None and rule.pattern_rules is not None:
                chosen = rule.pattern_rules.get(pattern, const_avals)  # traced now if new
            chosen = chosen if chosen is not None else rule.jvp
            if info.written_as == "vjp":
                # A custom_vjp rewritten for forward mode: its tangent map is a
                # linear_call of the transposed bwd, which JAX's symbolic zeros
                # reach (the unperturbed arguments' terms are never formed).
                inexact_t = [t for t, a in zip(t_args, arg_avals) if is_inexact(a)]
                sym = [None if type(t) is SymbolicZero else d for t, d in zip(inexact_t, dense)]
                res = run_with_symbolic_zeros(chosen, [*consts, *args, *sym])
            else:
                res = run(chosen, *consts, *args, *dense)
            # The tangents as the rule returned them: a dense zero stays dense, as
            # JAX passes it on (a rule downstream may read it as perturbed), and a
            # symbolic zero stays symbolic.
            outs = res[:n_out]
            t_in = iter(_unmask(res[n_out:], symbolic_outputs(chosen),
                                [SymbolicZero(a.to_tangent_aval()) for a in out_avals
                                 if is_inexact(a)]))
            t_outs = [next(t_in) if is_inexact(a) else np.zeros(a.shape, jax.dtypes.float0)
                      for a in out_avals]
            if info.written_as == "vjp" and mode == "none":
                t_outs = _zero_forward_where_unreached(chosen, len(primals), pattern, t_outs,
                                                      out_avals)
        if mode != "none":
            def f(*hv):
                full = list(consts)
                for i, v in zip(hot, hv):
                    full[i] = v
                return run(with_forward_mode(rule.call), *full, *args)
            if by_columns:
                # Applied to the tangents by a contraction: linear and transposable.
                extra = _jacobian_tangents(with_forward_mode(rule.call), [*consts, *args],
                                           hot, [t_consts[i] for i in hot], out_avals)
            else:
                _, extra = jax.jvp(f, tuple(consts[i] for i in hot),
                                   tuple(t_consts[i] for i in hot))
            t_outs = [(e if type(t) is SymbolicZero else t + e) if is_inexact(a) else t
                      for t, e, a in zip(t_outs, extra, out_avals)]
        return list(outs), t_outs

    g.defjvp(jvp, symbolic_zeros=True)
    jvp._jaxpr_cc_rule = rule
    setattr(jvp, jx.OWNED_RULE, True)
    if rule.forward_only_levels:
        # Partial evaluation keeps it: its primal may be a while_loop that the next
        # order would otherwise reverse-differentiate (``jax_adapter``).
        setattr(jvp, jx.KEPT_IN_PARTIAL_EVAL, True)
    g._jaxpr_cc_rebuilt = True
    return g


def _zero_forward_where_unreached(chosen, n_primals: int, pattern: tuple, t_outs: list,
                                  out_avals) -> list:
    """``t_outs`` with each tangent that no perturbed input reaches through the jvp
    rule ``chosen`` (a custom_vjp's transposed bwd: an output whose cotangent its
    bwd never reads) made a symbolic zero in forward mode only
    (``jax_adapter.forward_zero``: reverse mode keeps the value, so the user's bwd
    gets the cotangents JAX gives it)."""
    from .transpose import reaches
    reached = reaches(body(chosen).jaxpr, [False] * n_primals + list(pattern))
    t_reached = iter(reached[len(out_avals):])
    out = []
    for t, a in zip(t_outs, out_avals):
        if is_inexact(a) and not next(t_reached) and type(t) is not SymbolicZero:
            t = jx.forward_zero(t)
        out.append(t)
    return out


class _TransposeThunk:
    """``linear_call``'s transpose thunk for a first-order rule."""

    def __init__(self, rule: LinearRule):
        self._jaxpr_cc_rule = rule

    def __call__(self):
        return body(self._jaxpr_cc_rule.transpose), []

    def symbolic_outputs(self) -> tuple:
        """Which of the transpose's outputs its rule returned as symbolic zeros."""
        return symbolic_outputs(self._jaxpr_cc_rule.transpose)

    def swapped(self) -> "_TransposeThunk":
        """The thunk of the transposed call (callee and transpose exchanged)."""
        rule = self._jaxpr_cc_rule
        return _TransposeThunk(LinearRule(info=rule.info, callee=body(rule.transpose),
                                          transpose=rule.callee, num_res=rule.num_res))

    def for_cotangents(self, pattern: tuple) -> "_TransposeThunk":
        """The thunk whose transpose was traced for exactly these nonzero output
        cotangents (``LinearRule.transpose_variants``), or this one."""
        rule = self._jaxpr_cc_rule
        chosen = dict(rule.transpose_variants).get(tuple(pattern))
        if chosen is None and rule.pattern_rules is not None:
            chosen = rule.pattern_rules.get(tuple(pattern),
                                            list(body(rule.callee).in_avals)[:rule.num_res])
        if chosen is None:
            return self
        return _TransposeThunk(LinearRule(info=rule.info, callee=rule.callee, transpose=chosen,
                                          num_res=rule.num_res))


#: rule -> {kept linear inputs: the rule restricted to them} (restricted_linear_rule).
_RESTRICTED: "weakref.WeakKeyDictionary[LinearRule, dict]" = weakref.WeakKeyDictionary()


def restricted_linear_rule(rule: LinearRule, keep: tuple) -> LinearRule | None:
    """``rule``'s linear map restricted to the linear inputs ``keep`` marks, the
    others being symbolic zeros: its transpose is the rule's transpose giving
    cotangents for those inputs only, and its callee that transpose's transpose
    (so the terms of the zero inputs are never formed, as JAX's own symbolic
    zeros would leave them out).  None when the rule picks its transpose per
    cotangent pattern (a symbolic-zeros custom_vjp's bwd), whose variants the
    restriction would have to follow too, when it refuses forward mode (its
    refusal is the answer), and when its transpose is not linear."""
    if rule.transpose_variants or rule.pattern_rules is not None or \
            jx.refuses_forward_mode(body(rule.callee)):
        return None
    made = _RESTRICTED.setdefault(rule, {})
    if keep not in made:
        from .transpose import NotTransposableError, transpose_linear
        transpose = body(rule.transpose)
        kept, _ = jx.dce_jaxpr(transpose.jaxpr, list(keep), instantiate=True)
        kept = jx.ClosedJaxpr(kept, transpose.consts)
        n_ct = len(kept.in_avals) - rule.num_res
        try:
            callee = transpose_linear(kept, [False] * rule.num_res + [True] * n_ct,
                                      what=f"the transpose of rule '{rule.info.name}'",
                                      linear_name="its cotangent")
        except NotTransposableError:
            # A callee that is not the transpose's transpose (a bwd that is not
            # linear, whose forward mode is the primal's jvp): used as it is.
            callee = None
        made[keep] = None if callee is None else LinearRule(
            info=rule.info, callee=callee, transpose=kept, num_res=rule.num_res)
    return made[keep]


def run_with_symbolic_zeros(closed, args):
    """``run`` with ``None`` for symbolic-zero inputs: a ``linear_call`` of a
    first-order rule whose linear operands include such zeros is bound
    restricted to the others (``restricted_linear_rule``); elsewhere the zeros
    are made dense.  Outputs are values (a linear_call whose linear operands are
    all zero gives zeros)."""
    closed = body(closed)
    j = closed.jaxpr
    env = {}

    def read(v):
        return v.val if isinstance(v, jx.Literal) else env[v]

    for var, val in zip(j.constvars, closed.consts):
        env[var] = val
    for var, val in zip(j.invars, args):
        env[var] = val
    for eqn in j.eqns:
        invals = [read(v) for v in eqn.invars]
        outs = None
        if any(v is None for v in invals) and eqn.primitive.name == "linear_call":
            rule = rule_of(eqn.params, "linear_call")
            n_lead = eqn.params["num_callee_consts"] + eqn.params["num_res"]
            lead, lin = invals[:n_lead], invals[n_lead:]
            if rule is not None and eqn.params["num_callee_consts"] == 0 and \
                    all(v is not None for v in lead):
                keep = tuple(v is not None for v in lin)
                if not any(keep):
                    outs = [None] * len(eqn.outvars)
                else:
                    restricted = restricted_linear_rule(rule, keep)
                    if restricted is not None:
                        outs = bind_linear_rule(restricted,
                                                [*lead, *[v for v in lin if v is not None]])
        if outs is None:
            invals = [_zeros(v.aval) if x is None else x for x, v in zip(invals, eqn.invars)]
            outs = jx.eval_equation(eqn, invals)
        for var, val in zip(eqn.outvars, outs):
            env[var] = val
    return [_zeros(v.aval) if read(v) is None else read(v) for v in j.outvars]


def bind_linear_rule(rule: LinearRule, operands):
    """Bind ``linear_call`` for a first-order rule on ``(*r, *x)``."""
    return jx.bind_linear_call(list(operands), callee=rule.callee,
                               transpose_thunk=_TransposeThunk(rule),
                               num_callee_consts=0, num_res=rule.num_res)


def rule_of(eqn_params: dict, prim_name: str):
    """The first-order rule a JAX custom equation was built from, if it was ours."""
    if prim_name == "custom_vjp_call":
        return getattr(jx.wrapped_fun_target(eqn_params.get("bwd")), "_jaxpr_cc_rule", None)
    if prim_name == "custom_jvp_call":
        fn = jx.find_tagged_function(eqn_params.get("jvp_jaxpr_fun"), "_jaxpr_cc_rule")
        return getattr(fn, "_jaxpr_cc_rule", None)
    if prim_name == "linear_call":
        return getattr(eqn_params.get("transpose_thunk"), "_jaxpr_cc_rule", None)
    return None



# Rebuilt rules bind linear_call, which JAX 0.10.2 cannot batch (and whose jvp and
# transpose rules assert things custom_jvp tangents violate): jaxpr-cc's rules for it
# are registered whenever rules can be re-bound.
jx.register_linear_call_batching()
