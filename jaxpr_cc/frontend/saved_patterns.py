"""A symbolic-zeros rule's bodies for every perturbation pattern, before a program
leaves the process.

In-process, a symbolic-zeros ``custom_vjp`` / ``custom_jvp`` rule (and the
``linear_call`` that vjp-to-jvp makes of its bwd) traces the body for a pattern of
perturbed inputs / nonzero output cotangents the first time JAX gives that pattern
(``rules.PatternRules``, the ``pattern_rules`` param); only a small budget of
patterns is traced up front (``session._MAX_PATTERN_INPUTS``,
``session._MAX_VJP_VARIANTS``).  A saved program or an emitted module has no Python
rule left to trace: it has the variant regions only, and a pattern they do not
list runs the main body, with dense zeros where JAX gives the rule a
``SymbolicZero``: a rule that skips a zero term to avoid ``0 * inf`` would give NaN
where JAX gives a number.

``complete_patterns(program)`` therefore traces, while tracing is still possible,
every pattern JAX can give each such rule and adds it to the rule's variant
regions, on a copy of the program.  The patterns JAX can give: inputs among those
perturbable when the rule was traced (the rest are constants of the traced
function, never perturbed), any nonempty subset of them; output cotangents: any
subset of the outputs the program uses (an output nothing reads never gets a
cotangent).  At most ``MAX_SAVED_PATTERNS`` bodies per rule are traced: a rule
needing more keeps the patterns traced up front, and a ``SavedPatternsWarning``
names it (the other patterns run its main rule, as before).
"""
from __future__ import annotations

import warnings
from itertools import product

from ..closure.ir_rules import (FIRST_ORDER_KEYS, SYMBOLIC_ZERO_OUTPUTS,
                                forward_mode_as_regions, is_first_order_custom,
                                symbolic_zero_masks)
from ..closure.rules import body, is_inexact, symbolic_outputs
from ..ir.layouts import closed_over_count

#: Bodies traced at save / emit time per rule, at most (each is one trace of the
#: user's rule and one region in the file).  A rule needing more keeps the patterns
#: traced up front, with a ``SavedPatternsWarning`` naming it: equinox's rules take
#: every array leaf of their arguments (optimistix's root finders: 9 perturbable
#: inputs, 511 patterns; diffrax's adjoints: over 1,700), which would make every
#: save trace them hundreds of times.
MAX_SAVED_PATTERNS = 128


class SavedPatternsWarning(UserWarning):
    """A rule has more perturbation patterns than a saved program keeps: the ones not
    traced up front run its main rule."""


def complete_patterns(program):
    """``program``, or a copy of it whose symbolic-zeros rules list a body for every
    pattern JAX can give them (see the module doc).  The program itself is not
    changed: its printed form stays the same."""
    if not _has_pattern_rules(program.body):
        return program
    from ..closure.session import session
    program = program.copy()
    memo: dict = {}
    # A body traced now that calls a custom function (a rule calling itself, as
    # ``fixed_point``'s fwd does) must hold that call first-order, as the bodies
    # traced with the program do: a session is active while they are traced.
    completed: dict = {}
    live: dict = {}
    with session(**_session_options(program.body)), forward_mode_as_regions():
        # A custom_jvp's jvp bodies traced now (patterns of a rule vjp-to-jvp made)
        # hold linear_calls with patterns of their own: complete those next.
        while True:
            todo = [(region, eqn) for region, eqn in _first_order_equations(program.body)
                    if "pattern_rules" in eqn.params]
            if not todo:
                break
            # Every equation of one rule lists the same patterns (below), so each
            # lists the cotangent patterns of the outputs any of them has read.
            for region, eqn in todo:
                if eqn.prim.name in ("custom_vjp_call", "linear_call"):
                    live.setdefault(_same_rule_key(eqn.params), set()).update(
                        j for j, v in enumerate(eqn.outputs)
                        if region.has_users(v) or any(v is o for o in region.outvars))
            for region, eqn in todo:
                if "pattern_rules" not in eqn.params:
                    continue  # met again through a shared region: completed already
                before = dict(eqn.params)
                _complete(eqn, memo, live.get(_same_rule_key(before), set()))
                for key in _rule_keys(before):
                    completed.setdefault(key, eqn.params)
    # A rule that calls itself holds the call in its own bodies: the same rule (the
    # same body regions, or, in a body traced late, the same in-process rule), which
    # must list the same patterns, or the call would be another custom function in
    # an emitted module, its bodies emitted again, and a loaded program would run
    # its main body for every pattern at the next order.
    for _, eqn in program.body.walk():
        if "pattern_rules" in eqn.params:
            same_regions, same_rule = _rule_keys(eqn.params)
            if same_regions in completed:
                done = completed[same_regions]
                eqn.params = {**{k: v for k, v in eqn.params.items() if k != "pattern_rules"},
                              **{k: v for k, v in done.items() if k in _VARIANT_PARAMS}}
            elif same_rule in completed:
                # The same rule, its bodies converted to other regions: it takes the
                # completed equation's bodies and table (its operands are laid out
                # the same way).
                eqn.params = dict(completed[same_rule])
    # A body traced now from a rule JAX staged (a custom function called under vmap)
    # holds the custom functions it calls in JAX's form, as JAX staged them: make
    # them first-order too, as closure conversion did the program's.
    if _has_jax_form_rules(program.body):
        from .staged_rules import convert_program
        convert_program(program, **_session_options(program.body))
    return program


def _has_jax_form_rules(region) -> bool:
    return any(eqn.prim.name in FIRST_ORDER_KEYS
               and not is_first_order_custom(eqn.prim.name, eqn.params)
               for _, eqn in region.walk())


_BODY_PARAMS = ("fwd_jaxpr", "bwd_jaxpr", "jvp_jaxpr", "transpose_jaxpr")
_VARIANT_PARAMS = frozenset({"fwd_variant_patterns", "fwd_variants", "bwd_variant_patterns",
                             "bwd_variants", "jvp_variant_patterns", "jvp_variants",
                             "transpose_variant_patterns", "transpose_variants",
                             SYMBOLIC_ZERO_OUTPUTS})


def _rule_keys(params: dict) -> list[tuple]:
    """Keys an equation of one rule shares with the rule's other equations: its body
    regions, and its in-process rule (a call in a body traced late binds the rule
    the session cached, whose bodies become other regions in that body)."""
    return [_same_rule_key(params), ("pattern_rules", id(params["pattern_rules"]))]


def _same_rule_key(params: dict) -> tuple:
    """Equations of one rule: the same body regions (objects)."""
    return tuple((k, id(params[k])) for k in _BODY_PARAMS if k in params)


def _first_order_equations(top):
    """``(region, eqn)`` for the equations with patterns to complete that a first
    derivative of the program runs: those of the program's regions (loop and branch
    bodies, calls), and the ``linear_call`` in a jvp rule vjp-to-jvp made (its
    transpose is the reverse mode of the user's bwd).  Rules called inside another
    rule's bodies run at higher orders only: they keep the patterns traced up front
    (docs/closure.md)."""
    seen, stack = {id(top)}, [top]
    while stack:
        region = stack.pop()
        for eqn in region.equations:
            if "pattern_rules" in eqn.params:
                yield region, eqn
            name = eqn.prim.name
            for key, _, sub in eqn.regions():
                if name == "custom_jvp_call" and key in ("jvp_jaxpr", "jvp_variants"):
                    for inner in sub.equations:
                        if inner.prim.name == "linear_call" and "pattern_rules" in inner.params:
                            yield sub, inner
                    continue
                if name in ("custom_jvp_call", "custom_vjp_call", "linear_call"):
                    continue
                if id(sub) not in seen:
                    seen.add(id(sub))
                    stack.append(sub)


def _session_options(region) -> dict:
    """The options the program's rules were traced with (their closed-over policy)."""
    for _, eqn in region.walk():
        if "pattern_rules" in eqn.params and "closed_over" in eqn.params:
            return {"closed_over": eqn.params["closed_over"],
                    "max_forward_size": eqn.params["max_forward_size"]}
    return {}


def _has_pattern_rules(region) -> bool:
    return any("pattern_rules" in eqn.params for _, eqn in region.walk())


def _complete(eqn, memo, live: set) -> None:
    """``live``: the outputs that equations of this rule have readers of."""
    p = eqn.params
    name = eqn.prim.name
    if name == "custom_jvp_call":
        new = _jvp_params(eqn, p, memo)
    elif name == "custom_vjp_call":
        new = _vjp_params(eqn, p, memo, live)
    elif name == "linear_call":
        new = _linear_params(eqn, p, memo, live)
    else:
        return
    params = {k: v for k, v in p.items() if k != "pattern_rules"}
    params.update(new)
    eqn.params = params


def _to_region(closed, memo):
    """One Region per body (a body two patterns share is one region in the file)."""
    from .from_jaxpr import region_from_closed_jaxpr
    closed = body(closed)
    hit = memo.get(("made", id(closed)))
    if hit is None or hit[0] is not closed:
        hit = memo[("made", id(closed))] = (closed, region_from_closed_jaxpr(closed, None, memo))
    return hit[1]


def _subsets(universe: list[int], n: int, nonempty: bool = True):
    """Patterns of length ``n`` over the positions ``universe`` (others False)."""
    for bits in product((False, True), repeat=len(universe)):
        if nonempty and not any(bits):
            continue
        pattern = [False] * n
        for i, b in zip(universe, bits):
            pattern[i] = b
        yield tuple(pattern)


def _within_limit(eqn, p, count: int, what: str) -> bool:
    """Whether the rule's missing patterns are traced; if not, say so (a warning)."""
    if count <= MAX_SAVED_PATTERNS:
        return True
    rule = p.get("name", eqn.prim.name)
    source = p.get("source", "")
    where = f" ({source})" if source else ""
    warnings.warn(
        f"symbolic-zeros rule '{rule}'{where} has {count} {what}, more than a saved program "
        f"keeps (jaxpr_cc.frontend.saved_patterns.MAX_SAVED_PATTERNS={MAX_SAVED_PATTERNS}): "
        f"the saved or emitted program runs its main rule, with dense zeros, for the "
        f"patterns not traced up front; pass fewer differentiable inputs to it (constants, "
        f"stop_gradient, nondiff_argnums) or raise MAX_SAVED_PATTERNS",
        SavedPatternsWarning, stacklevel=2)
    return False


def _arg_inexact(eqn, nc: int) -> list[int]:
    return [i for i, a in enumerate(eqn.inputs[nc:]) if is_inexact(a.aval)]


def _input_universe(rules, n_inexact: int) -> list[int]:
    """Positions (over the inexact arguments) JAX may perturb: those perturbable
    when the rule was traced (``rules.main``); a pattern longer than ``main`` has
    leading positions the user's rule never sees (a vjp-to-jvp rule's closed-over
    values, ordinary inputs there), each free."""
    main = rules.main
    if main is None or len(main) > n_inexact:
        return list(range(n_inexact))
    lead = n_inexact - len(main)
    return list(range(lead)) + [lead + i for i, q in enumerate(main) if q]


def _live_outputs(live: set, positions: list[int]) -> list[int]:
    """Which of ``positions`` (output indices) are in ``live`` (read by some equation
    of the rule): only those can get a nonzero cotangent."""
    return [k for k, j in enumerate(positions) if j in live]


def _jvp_params(eqn, p, memo) -> dict:
    rules, nc = p["pattern_rules"], closed_over_count(eqn)
    const_avals = [a.aval for a in eqn.inputs[:nc]]
    n = len(_arg_inexact(eqn, nc))
    have = [tuple(q) for q in p.get("jvp_variant_patterns", ())]
    wanted = [q for q in _subsets(_input_universe(rules, n), n) if q not in set(have)]
    if not _within_limit(eqn, p, len(wanted), "patterns of perturbed inputs"):
        return {}
    patterns, regions = list(have), list(p.get("jvp_variants", ()))
    masks = symbolic_zero_masks(p, 1 + len(regions))
    for q in wanted:
        made = rules.get(q, const_avals)
        if made is not None:  # None: the main body is the one for q
            patterns.append(q)
            regions.append(_to_region(made, memo))
            masks.append(symbolic_outputs(made))
    if len(patterns) == len(have):
        return {}
    return {"jvp_variant_patterns": tuple(patterns), "jvp_variants": tuple(regions),
            **_masks_param(masks)}


def _masks_param(masks: list) -> dict:
    """``symbolic_zero_outputs`` for bodies with these masks (main body first), or
    nothing when no body has a symbolic-zero output."""
    masks = tuple(tuple(bool(z) for z in m) for m in masks)
    return {SYMBOLIC_ZERO_OUTPUTS: masks} if any(masks) else {}


def _vjp_params(eqn, p, memo, live: set) -> dict:
    rules, nc = p["pattern_rules"], closed_over_count(eqn)
    const_avals = [a.aval for a in eqn.inputs[:nc]]
    n = len(_arg_inexact(eqn, nc))
    out_inexact = [j for j, v in enumerate(eqn.outputs) if is_inexact(v.aval)]
    m = len(out_inexact)
    main = tuple(rules.main) if rules.main is not None else (True,) * n
    full = (True,) * m
    fwd_have = {tuple(q): (r, k) for (q, k), r in zip(p.get("fwd_variant_patterns", ()),
                                                      p.get("fwd_variants", ()))}
    bwd_have = {(tuple(f), tuple(c)): r for (f, c), r in zip(p.get("bwd_variant_patterns", ()),
                                                             p.get("bwd_variants", ()))}
    main_mask, *old_masks = symbolic_zero_masks(p, 1 + len(bwd_have))
    mask_of = dict(zip(bwd_have, old_masks))
    in_patterns = [q for q in _subsets(_input_universe(rules, n), n) if q != main]
    ct_patterns = list(_subsets(_live_outputs(live, out_inexact), m, nonempty=False))
    # A family's bwd for every cotangent is what a loaded rule falls back to for a
    # cotangent pattern not listed: each family gets it even when some output is
    # never read (and so never in ``ct_patterns``).
    def family_cts(f):
        return ct_patterns if f == () or full in ct_patterns else [*ct_patterns, full]

    count = sum(1 for q in in_patterns if q not in fwd_have)
    count += sum(1 for f in [(), *in_patterns] for c in family_cts(f)
                 if (f, c) not in bwd_have and not (f == () and c == full))
    if not _within_limit(eqn, p, count, "patterns of perturbed inputs and output cotangents"):
        return {}
    fwd_new, bwd_new = dict(fwd_have), dict(bwd_have)
    families = [()]
    for q in in_patterns:
        if q not in fwd_new:
            made = rules.get(("fwd", q), const_avals)
            if made is None:  # the main fwd is the one for q (and its bwd family)
                continue
            fwd_new[q] = (_to_region(made[0], memo), made[1])
        families.append(q)
    for f in families:
        for c in family_cts(f):
            if (f, c) in bwd_new or (f == () and c == full):
                continue
            made = rules.get(("bwd", f or main, c), const_avals)
            if made is not None:
                bwd_new[(f, c)] = _to_region(made, memo)
                mask_of[(f, c)] = symbolic_outputs(made)
    # A family's bwd for every cotangent (what a loaded rule falls back to) must
    # be there, or the loaded rule would pair the family's residuals with another bwd.
    families_ok = {q for q in fwd_new if (q, full) in bwd_new}
    fwd_new = {q: v for q, v in fwd_new.items() if q in families_ok}
    bwd_new = {k: v for k, v in bwd_new.items() if k[0] == () or k[0] in families_ok}
    if fwd_new.keys() == fwd_have.keys() and bwd_new.keys() == bwd_have.keys():
        return {}
    return {"fwd_variant_patterns": tuple((q, int(k)) for q, (_, k) in fwd_new.items()),
            "fwd_variants": tuple(r for r, _ in fwd_new.values()),
            "bwd_variant_patterns": tuple(bwd_new),
            "bwd_variants": tuple(bwd_new.values()),
            **_masks_param([main_mask, *(mask_of[k] for k in bwd_new)])}


def _linear_params(eqn, p, memo, live: set) -> dict:
    rules, nr = p["pattern_rules"], p["num_res"]
    const_avals = [a.aval for a in eqn.inputs[:nr]]
    m = len(eqn.outputs)
    full = (True,) * m
    have = [tuple(c) for c in p.get("transpose_variant_patterns", ())]
    wanted = [c for c in _subsets(_live_outputs(live, list(range(m))), m, nonempty=False)
              if c != full and c not in set(have)]
    if not _within_limit(eqn, p, len(wanted), "patterns of output cotangents"):
        return {}
    patterns, regions = list(have), list(p.get("transpose_variants", ()))
    masks = symbolic_zero_masks(p, 1 + len(regions))
    for c in wanted:
        made = rules.get(c, const_avals)
        if made is not None:
            patterns.append(c)
            regions.append(_to_region(made, memo))
            masks.append(symbolic_outputs(made))
    if len(patterns) == len(have):
        return {}
    return {"transpose_variant_patterns": tuple(patterns),
            "transpose_variants": tuple(regions), **_masks_param(masks)}
