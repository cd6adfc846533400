"""Custom-rule equations between JAX's form and the IR's first-order form.

A table keyed by primitive name, used by the generic jaxpr <-> IR drivers:

* ``import_params(jaxpr_eqn, to_region)``: a ``custom_vjp_call`` / ``custom_jvp_call``
  / ``linear_call`` equation that jaxpr-cc re-bound (its rule callable carries a
  first-order rule) gets params that hold only Regions and plain data;
* ``export_params(eqn, in_avals, from_region)``: such an equation gets JAX's params
  back, by binding the rule through JAX's public custom-derivative APIs
  (``rules.build_*``), so AD, vmap and jit use the user's rules.

First-order params (every Region constant-free):

* custom_vjp_call: call_jaxpr, fwd_jaxpr, bwd_jaxpr, num_consts, num_res, symbolic_zeros,
  name, source, const_names, closed_over, max_forward_size, reverse_ok
* custom_vjp_call, symbolic-zeros rules traced per perturbation pattern, also:
  fwd_variants / fwd_variant_patterns ((in_pattern, num_res) each) and bwd_variants /
  bwd_variant_patterns ((family, ct_pattern) each: the in_pattern of the fwd whose
  residuals the bwd takes, () for fwd_jaxpr's; which output cotangents are nonzero)
* custom_jvp_call: call_jaxpr, jvp_jaxpr, num_consts, symbolic_zeros, + the same info fields;
  a ``forward_only`` rule has forward_only_levels instead of jvp_jaxpr (its jvp is made
  from call_jaxpr when JAX first differentiates it: ``rules.forward_only_rule``);
  a symbolic-zeros rule traced per perturbation pattern also has jvp_variants (Regions
  with jvp_jaxpr's layout) and jvp_variant_patterns (one tuple of bools per variant:
  which inexact arguments are perturbed)
* linear_call: callee, transpose_jaxpr, num_callee_consts (always 0), num_res; the
  tangent of a symbolic-zeros custom_vjp (vjp-to-jvp) also has transpose_variants /
  transpose_variant_patterns (its bwd traced per pattern of nonzero output cotangents)
* any of the three, when the user's rule returned a tangent or cotangent as a symbolic
  zero (``SymbolicZero``, or ``None`` from a bwd): ``symbolic_zero_outputs``, one tuple
  of bools per rule body -- the bwd bodies (bwd_jaxpr, then bwd_variants) of a
  custom_vjp, the jvp bodies (jvp_jaxpr, then jvp_variants) of a custom_jvp, the
  transposes (transpose_jaxpr, then transpose_variants) of a linear_call -- marking the
  body's tangent outputs (a jvp body's after its primal outputs) that were symbolic;
  ``()`` for a body with none.  The rebuilt rule gives JAX a symbolic zero there.

In-process only (``IN_PROCESS_PARAMS``: not printed, not saved): ``pattern_rules``, a
symbolic-zeros rule's bodies for the perturbation patterns no variant region lists,
traced from the user's Python rule when JAX first gives that pattern
(``rules.PatternRules``).  A loaded program has the variant regions only.

A rule that calls its own custom function holds a Region that (through its fwd, bwd,
jvp or transpose) contains that very equation again: recursion is a cycle.  So only the
primal (``call_jaxpr`` / ``callee``) is emitted when an equation is exported; the rule
bodies are emitted when JAX first runs them (``rules.LazyJaxpr``).
"""
from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Any, Callable

from .rules import (JVPRule, LazyJaxpr, LinearRule, RuleInfo, VJPRule, bind_linear_rule, body,
                    build_custom_jvp, build_custom_vjp, build_forward_mode_on_demand,
                    forward_only_rule, rule_of, symbolic_outputs)

FIRST_ORDER_KEYS = {
    "custom_vjp_call": "bwd_jaxpr",
    "custom_jvp_call": "jvp_jaxpr",
    "linear_call": "transpose_jaxpr",
}
#: A ``forward_only`` custom_jvp holds no jvp body: its jvp is made from call_jaxpr.
FORWARD_ONLY_PARAM = "forward_only_levels"
#: Params that hold in-process objects: never printed nor saved (see the module doc).
IN_PROCESS_PARAMS = frozenset({"pattern_rules"})
_INFO_FIELDS = ("name", "source", "const_names", "closed_over", "max_forward_size", "reverse_ok")
#: Which tangent outputs of each rule body the user's rule returned as symbolic zeros.
SYMBOLIC_ZERO_OUTPUTS = "symbolic_zero_outputs"


def is_first_order_custom(name: str, params: dict) -> bool:
    key = FIRST_ORDER_KEYS.get(name)
    return key is not None and (key in params or FORWARD_ONLY_PARAM in params)


def _info_params(info: RuleInfo) -> dict:
    out = {f: getattr(info, f) for f in _INFO_FIELDS}
    if info.written_as is not None:  # a rule rewritten into another kind (vjp-to-jvp)
        out["written_as"] = info.written_as
    return out


def _info_from(params: dict) -> RuleInfo:
    return RuleInfo(**{f: params[f] for f in _INFO_FIELDS}, written_as=params.get("written_as"))


# ------------------------------------------------------------------ import
def _region_of(closed, to_region: Callable):
    """The region for a rule body: the one it was exported from, if any (see
    ``LazyJaxpr.source`` and ``_exported_call``), else the body imported."""
    if type(closed) is LazyJaxpr:
        source = closed.source
    else:
        hit = _CALL_SOURCES.get(id(closed))
        source = hit[1] if hit is not None and hit[0]() is closed else None
    return source if source is not None else to_region(body(closed))


# A rule's call (or callee) exported from a program's region -> that region, so the
# rule imports back to it, as its LazyJaxpr bodies do (keyed by id, with a weak
# reference that drops the entry with the jaxpr).
_CALL_SOURCES: dict[int, tuple[Any, Any]] = {}


def _exported_call(region, from_region: Callable):
    closed = from_region(region)
    key = id(closed)
    _CALL_SOURCES[key] = (weakref.ref(closed, lambda _, key=key: _CALL_SOURCES.pop(key, None)),
                          region)
    return closed


def _import_vjp(jparams: dict, rule: VJPRule, to_region: Callable) -> dict:
    p = {"call_jaxpr": _region_of(rule.call, to_region),
         "fwd_jaxpr": _region_of(rule.fwd, to_region),
         "bwd_jaxpr": _region_of(rule.bwd, to_region)}
    p.update(num_consts=rule.num_consts, num_res=rule.num_res,
             symbolic_zeros=rule.symbolic_zeros)
    p.update(_info_params(rule.info))
    if rule.fwd_variants:  # only symbolic-zeros rules have them: other params unchanged
        p["fwd_variant_patterns"] = tuple((_bools(pattern), int(n))
                                          for pattern, _, n in rule.fwd_variants)
        p["fwd_variants"] = tuple(_region_of(f, to_region) for _, f, _ in rule.fwd_variants)
    if rule.bwd_variants:
        p["bwd_variant_patterns"] = tuple((_bools(family), _bools(ct))
                                          for family, ct, _ in rule.bwd_variants)
        p["bwd_variants"] = tuple(_region_of(b, to_region) for _, _, b in rule.bwd_variants)
    _symbolic_zeros_param(p, [rule.bwd, *(b for _, _, b in rule.bwd_variants)])
    if rule.pattern_rules is not None:
        p["pattern_rules"] = rule.pattern_rules
    return p


def _bools(pattern) -> tuple:
    return tuple(bool(b) for b in pattern)


def _symbolic_zeros_param(p: dict, bodies) -> None:
    """Record the symbolic-zero outputs of ``bodies`` (the main body, then the
    variants), if any has one."""
    masks = tuple(_bools(symbolic_outputs(b)) for b in bodies)
    if any(masks):
        p[SYMBOLIC_ZERO_OUTPUTS] = masks


def symbolic_zero_masks(params: dict, n: int) -> list:
    """Per body (main, then variants): its symbolic-zero outputs, ``()`` for none."""
    masks = list(params.get(SYMBOLIC_ZERO_OUTPUTS, ()))
    return [tuple(m) for m in masks] + [()] * (n - len(masks))


def _import_jvp(jparams: dict, rule: JVPRule, to_region: Callable) -> dict:
    p = {"call_jaxpr": _region_of(rule.call, to_region)}
    if rule.forward_only_levels is not None:
        p[FORWARD_ONLY_PARAM] = rule.forward_only_levels
    else:
        p["jvp_jaxpr"] = _region_of(rule.jvp, to_region)
    p.update(num_consts=rule.num_consts, symbolic_zeros=rule.symbolic_zeros)
    p.update(_info_params(rule.info))
    if rule.variants:  # only symbolic-zeros rules have them: other params unchanged
        p["jvp_variant_patterns"] = tuple(tuple(bool(b) for b in pattern)
                                          for pattern, _ in rule.variants)
        p["jvp_variants"] = tuple(_region_of(v, to_region) for _, v in rule.variants)
    if rule.forward_only_levels is None:
        _symbolic_zeros_param(p, [rule.jvp, *(v for _, v in rule.variants)])
    if rule.pattern_rules is not None:
        p["pattern_rules"] = rule.pattern_rules
    return p


def _import_linear(jparams: dict, rule: LinearRule, to_region: Callable) -> dict:
    p = {"callee": _region_of(rule.callee, to_region),
         "transpose_jaxpr": _region_of(rule.transpose, to_region)}
    p.update(num_callee_consts=0, num_res=rule.num_res)
    if rule.transpose_variants:  # a symbolic-zeros bwd per cotangent pattern (vjp-to-jvp)
        p["transpose_variant_patterns"] = tuple(_bools(ct) for ct, _ in rule.transpose_variants)
        p["transpose_variants"] = tuple(_region_of(t, to_region)
                                        for _, t in rule.transpose_variants)
    _symbolic_zeros_param(p, [rule.transpose, *(t for _, t in rule.transpose_variants)])
    if rule.pattern_rules is not None:
        p["pattern_rules"] = rule.pattern_rules
    return p


_IMPORT = {"custom_vjp_call": _import_vjp, "custom_jvp_call": _import_jvp,
           "linear_call": _import_linear}


def import_params(name: str, jparams: dict, to_region: Callable) -> dict | None:
    """First-order params for a JAX custom equation, or None if it is not ours (or no
    longer matches our rule: JAX's DCE re-binds rules with fewer inputs/outputs)."""
    rule = rule_of(jparams, name)
    if rule is None:
        return None
    if name in ("custom_vjp_call", "custom_jvp_call") and jparams.get("num_consts", 0) != 0:
        return None  # JAX lifted values of its own: keep JAX's form (closure-convert handles it)
    ours = rule.callee if name == "linear_call" else rule.call
    theirs = jparams["callee" if name == "linear_call" else "call_jaxpr"]
    if (tuple(ours.in_avals) != tuple(theirs.in_avals)
            or tuple(ours.out_avals) != tuple(theirs.out_avals)):
        return None
    return _IMPORT[name](jparams, rule, to_region)


# ------------------------------------------------------------------ export
def _rule_from_params(name: str, params: dict, from_region: Callable):
    make = getattr(_on_demand, "make", None)

    def exported(region):
        # A body exported when JAX first runs it, as the program around it was:
        # the custom_vjp rules it calls get their forward mode on demand too.
        if make is None:
            return from_region(region)
        with forward_mode_on_demand(make):
            return from_region(region)

    def lazy(key, zeros=()):
        region = params[key]
        return LazyJaxpr(lambda: exported(region), zeros, source=region)

    def lazy_region(region, zeros=()):
        return LazyJaxpr(lambda: exported(region), zeros, source=region)

    if name == "custom_vjp_call":
        fwd_variants = tuple(
            (tuple(pattern), lazy_region(region), n)
            for (pattern, n), region in zip(params.get("fwd_variant_patterns", ()),
                                            params.get("fwd_variants", ())))
        regions = params.get("bwd_variants", ())
        masks = symbolic_zero_masks(params, 1 + len(regions))
        bwd_variants = tuple(
            (tuple(family), tuple(ct), lazy_region(region, zeros))
            for (family, ct), region, zeros in zip(params.get("bwd_variant_patterns", ()),
                                                   regions, masks[1:]))
        return VJPRule(info=_info_from(params),
                       call=_exported_call(params["call_jaxpr"], from_region),
                       fwd=lazy("fwd_jaxpr"), bwd=lazy("bwd_jaxpr", masks[0]),
                       num_consts=params["num_consts"], num_res=params["num_res"],
                       symbolic_zeros=params["symbolic_zeros"],
                       fwd_variants=fwd_variants, bwd_variants=bwd_variants,
                       pattern_rules=params.get("pattern_rules"))
    if name == "custom_jvp_call" and FORWARD_ONLY_PARAM in params:
        return forward_only_rule(_exported_call(params["call_jaxpr"], from_region),
                                 params["num_consts"],
                                 params[FORWARD_ONLY_PARAM], _info_from(params))
    if name == "custom_jvp_call":
        regions = params.get("jvp_variants", ())
        masks = symbolic_zero_masks(params, 1 + len(regions))
        variants = tuple(
            (tuple(pattern), lazy_region(region, zeros))
            for pattern, region, zeros in zip(params.get("jvp_variant_patterns", ()),
                                              regions, masks[1:]))
        return JVPRule(info=_info_from(params),
                       call=_exported_call(params["call_jaxpr"], from_region),
                       jvp=lazy("jvp_jaxpr", masks[0]), num_consts=params["num_consts"],
                       symbolic_zeros=params["symbolic_zeros"], variants=variants,
                       pattern_rules=params.get("pattern_rules"))
    info = RuleInfo(name="linear_call", source="<linear_call>", const_names=())
    regions = params.get("transpose_variants", ())
    masks = symbolic_zero_masks(params, 1 + len(regions))
    transpose_variants = tuple(
        (tuple(ct), lazy_region(region, zeros))
        for ct, region, zeros in zip(params.get("transpose_variant_patterns", ()), regions,
                                     masks[1:]))
    return LinearRule(info=info, callee=_exported_call(params["callee"], from_region),
                      transpose=lazy("transpose_jaxpr", masks[0]), num_res=params["num_res"],
                      transpose_variants=transpose_variants,
                      pattern_rules=params.get("pattern_rules"))


_on_demand = threading.local()


@contextlib.contextmanager
def _on_demand_setting(name: str, value):
    prev = getattr(_on_demand, name, None)
    setattr(_on_demand, name, value)
    try:
        yield
    finally:
        setattr(_on_demand, name, prev)


def forward_mode_on_demand(make: Callable):
    """Export every ``custom_vjp_call`` as a ``custom_jvp`` whose jvp is
    ``make(params, in_avals, consts_perturbed)`` (a ``jax.custom_jvp`` function,
    or None to keep JAX's custom_vjp semantics), made when JAX first
    differentiates the call (``rules.build_forward_mode_on_demand``)."""
    return _on_demand_setting("make", make)


def forward_mode_as_regions():
    """Rule bodies traced late inside (``saved_patterns.complete_patterns``) get
    their forward mode rewritten now, into regions a saved program or an emitted
    module can hold, rather than made on demand (``forward_mode_on_demand``: a
    Python callable, in-process only)."""
    return _on_demand_setting("as_regions", True)


def forward_mode_is_made_as_regions() -> bool:
    return bool(getattr(_on_demand, "as_regions", False))


def export_params(name: str, params: dict, in_avals, from_region: Callable) -> tuple[Any, dict]:
    """(primitive, JAX params) for a first-order custom equation."""
    from .. import jax_adapter as jx
    rule = _rule_from_params(name, params, from_region)
    make = getattr(_on_demand, "make", None)
    if name == "custom_vjp_call" and make is not None:
        g = build_forward_mode_on_demand(
            rule, lambda consts_perturbed: make(params, list(in_avals), consts_perturbed))
        name = "custom_jvp_call"
    elif name == "custom_vjp_call":
        g = build_custom_vjp(rule)
    elif name == "custom_jvp_call":
        g = build_custom_jvp(rule)
    else:
        g = lambda *ops: bind_linear_rule(rule, ops)  # noqa: E731
    jaxpr, consts, _ = jx.trace_flat(lambda *ops: list(g(*ops)), list(in_avals), f"emit {name}")
    eqns = [e for e in jaxpr.eqns if e.primitive.name == name]
    if len(eqns) != 1 or consts or len(jaxpr.eqns) != 1:
        raise RuntimeError(f"re-binding {name} produced {len(jaxpr.eqns)} equations; expected one")
    eqn = eqns[0]
    n_lead = len(eqn.invars) - len(in_avals)
    if n_lead != 0:
        raise RuntimeError(f"re-binding {name} added {n_lead} operands")
    return eqn.primitive, dict(eqn.params)
