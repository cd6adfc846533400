"""Custom differentiation rules, callbacks and checkpoint policies in Python source.

A mixin of the per-equation context of :mod:`.python_source`: it spells
``custom_vjp_call`` / ``custom_jvp_call`` / ``linear_call`` equations in their
first-order form as ``@jax.custom_vjp`` / ``@jax.custom_jvp`` functions with
``defvjp`` / ``defjvp`` and ``jax.custom_derivatives.linear_call``, and
``debug_callback`` as ``jax.debug.callback``.
"""
from __future__ import annotations

from typing import Sequence

import libcst as cst
from jax import tree_util

from ..ir.equation import Equation
from ..ir.layouts import closed_over_count
from ..ir.printer import _is_function
from ..ir.program import Program
from ..ir.region import Region
from ..ir.value import is_literal
from ..closure.ir_rules import FORWARD_ONLY_PARAM, SYMBOLIC_ZERO_OUTPUTS
from ..closure.rules import body, forward_only_rule
from ..frontend.from_jaxpr import region_from_closed_jaxpr
from ..frontend.staged_rules import convert_program
from .jaxpr import region_to_closed_jaxpr
from .python_rules import Call
from .python_text import (PythonEmitError, flat_return, inexact, render_call, stmt,
                          tuple_src)


class CustomRulesMixin:
    """Needs ``self.emitter``, ``self.eqn``, ``self.fn``, ``self.ins``, ``self.rule_key``
    and ``self._where()`` from the equation context it is mixed into."""

    # -- custom differentiation rules -------------------------------------
    # First-order layouts (see jaxpr_cc/closure/rules.py): c = closed-over values (the
    # first num_consts operands), x = arguments, r = residuals; tangents/cotangents
    # exist for inexact leaves only.
    #   custom_vjp  call: (c, x) -> y   fwd: (c, x) -> (y, r)   bwd: (c, r, ct_y) -> ct_x
    #   custom_jvp  call: (c, x) -> y   jvp: (c, x, t_x) -> (y, t_y)
    #   linear_call callee: (r, x) -> y   transpose: (r, ct_y) -> ct_x
    # Rules that close over nothing become @jax.custom_vjp / @jax.custom_jvp functions
    # with the user's own signature.  Rules with closed-over values take them as
    # leading explicit arguments (as jax.closure_convert passes them) and are built by
    # the _custom_vjp_with_consts / _custom_jvp_with_consts helpers, which differentiate
    # w.r.t. those values under the rule's recorded policy, as the Program does: the
    # emitted code never closes over a traced value, so it is differentiable w.r.t.
    # every input.  Rule regions are closed, so every rule is a module-level function.
    def _require_rules(self, names: Sequence[str]) -> None:
        """Check the equation is first-order: every rule region is present."""
        for key, value in self.eqn.params.items():
            if _is_function(value):
                raise PythonEmitError(
                    f"{self._where()}: parameter {key!r} is a Python callable; the program is "
                    f"not first-order (trace it with jaxpr_cc.trace, which turns custom rules "
                    f"into regions)")
        missing = [n for n in names if not isinstance(self.eqn.params.get(n), Region)]
        if missing:
            raise PythonEmitError(f"{self._where()}: region parameters {missing!r} are missing")

    def _arg_hints(self, first: int) -> list[str | None]:
        em = self.emitter
        return [em.env.get(a) if not is_literal(a) else None for a in self.eqn.inputs[first:]]

    @staticmethod
    def _unpack(names: list[str], group: str, prologue: list[str]) -> None:
        """``a, _, b = group`` when any of ``names`` is read (``_`` for the unread)."""
        if any(n != "_" for n in names):
            prologue.append(f"{tuple_src(names)} = {group}")

    def _define(self, region: Region, name: str, params: list[str], prologue: list[str],
                returns, decorator: str | None = None) -> None:
        """A module-level function for ``region`` (rule regions are closed)."""
        fdef = self.emitter.function(region, name, params, prologue, 1, returns=returns)
        if decorator:
            fdef = fdef.with_changes(decorators=[cst.Decorator(cst.parse_expression(decorator))])
        self.emitter.module_defs.append(fdef)

    def _symbolic_zeros(self, region: Region) -> tuple:
        """Which outputs of the rule body ``region`` the user's rule returned as
        symbolic zeros (``symbolic_zero_outputs``: the main body, then its variants):
        the emitted body returns a symbolic zero there, as the user's rule did."""
        p = self.eqn.params
        masks = p.get(SYMBOLIC_ZERO_OUTPUTS)
        if not masks:
            return ()
        for main, variants in (("bwd_jaxpr", "bwd_variants"), ("jvp_jaxpr", "jvp_variants"),
                               ("transpose_jaxpr", "transpose_variants")):
            if main in p:
                for candidate, zeros in zip([p[main], *p.get(variants, ())], masks):
                    if candidate is region:
                        return tuple(zeros)
        return ()

    def _after(self, code: str) -> None:
        self.emitter.module_defs.append(stmt(code))

    def _rule_name(self, call: Region, kind: str) -> tuple[str, str]:
        """The Python name of the custom function and the name JAX records for it
        (``__name__``, kept even when the identifier is taken); registered for the
        rule before its bodies are emitted, since they may call it again."""
        em = self.emitter
        given = self.eqn.params.get("name")
        dbg = getattr(call, "debug_info", None)
        wanted = given if isinstance(given, str) and given else (
            getattr(dbg, "func_name", None) or f"{kind}_fun")
        name = wanted if wanted.isidentifier() and em.namer.claim(wanted) else \
            em.namer.fresh(wanted, f"{kind}_fun")
        em.custom_functions[self.rule_key] = (name, wanted)
        return name, wanted

    def _custom_function(self, region: Region, kind: str) -> tuple[str, str]:
        """The primal ``@jax.custom_vjp``/``@jax.custom_jvp`` function; its Python name
        and the name JAX records (``__name__``, kept even when the identifier is taken)."""
        em = self.emitter
        name, wanted = self._rule_name(region, kind)
        params = em.name_binders(region.invars, self._arg_hints(0))
        if name == wanted:
            self._define(region, name, params, [], flat_return, f"jax.{kind}")
        else:
            self._define(region, name, params, [], flat_return)
            self._after(f"{name}.__name__ = {wanted!r}")
            self._after(f"{name} = jax.{kind}({name})")
        return name, wanted

    def _dense(self, names: list[str], prologue: list[str]) -> None:
        """With symbolic_zeros, JAX may pass SymbolicZero objects: make them arrays."""
        self.emitter.helpers.add("_dense")
        for n in names:
            if n != "_":
                prologue.append(f"{n} = _dense({n})")

    def custom_vjp(self, eqn: Equation) -> Call:
        return self._custom(eqn, "_custom_vjp")

    def custom_jvp(self, eqn: Equation) -> Call:
        return self._custom(eqn, "_custom_jvp")

    def _custom(self, eqn: Equation, build: str) -> Call:
        """Rules that close over nothing are module-level functions, one per rule: equal
        equations share one, so JAX and jaxpr_cc.trace see one custom function object
        where the original program had one, and a rule that calls its own function
        (recursion) calls the module-level function by name."""
        em = self.emitter
        if closed_over_count(eqn):
            return self._custom_with_consts(eqn, build)
        key = em.rule_key(eqn)
        if key not in em.custom_functions:
            self.rule_key = key
            getattr(self, build)(eqn)
        name, wanted = em.custom_functions[key]
        return Call(name, list(self.ins), hint=wanted)

    def _custom_vjp(self, eqn: Equation) -> Call:
        self._require_rules(["call_jaxpr", "fwd_jaxpr", "bwd_jaxpr"])
        em, p = self.emitter, eqn.params
        num_res = p["num_res"]
        symbolic = bool(p.get("symbolic_zeros"))
        call = p["call_jaxpr"]
        out_avals = [a.aval for a in call.outvars]
        arg_avals = [v.aval for v in call.invars]
        n_out = len(out_avals)
        name, wanted = self._custom_function(call, "custom_vjp")
        sz = ", symbolic_zeros=True" if symbolic else ""
        fwd, bwd = p["fwd_jaxpr"], p["bwd_jaxpr"]

        def define_fwd(fwd, fwd_name):
            fwd_params = em.name_binders(fwd.invars, self._arg_hints(0))
            prologue: list[str] = []
            if symbolic:  # fwd then receives CustomVJPPrimal wrappers
                wrapped = [em.namer.fresh(f"{n}_primal") for n in fwd_params]
                prologue = [f"{n} = {w}.value" for n, w in zip(fwd_params, wrapped)]
                fwd_params = wrapped
            self._define(fwd, fwd_name, fwd_params, prologue,
                         lambda outs: f"{flat_return(outs[:n_out])}, {tuple_src(outs[n_out:])}")

        def bwd_returns_for(zeros):
            def bwd_returns(outs):
                it = iter(_masked(outs, zeros, lambda k: "None"))
                return tuple_src([next(it) if inexact(a) else "None" for a in arg_avals])
            return bwd_returns

        n_ct = sum(1 for a in out_avals if inexact(a))

        def define_bwd(bwd, bwd_name):
            prologue: list[str] = []
            n_res = len(bwd.invars) - n_ct
            res = self._group_binders(bwd.invars[:n_res], "residuals", prologue)
            cts = iter(bwd.invars[n_res:])
            ct_names = [em.name_binders([next(cts)], ["ct"])[0] if inexact(a) else "_"
                        for a in out_avals]
            if n_out == 1 and ct_names[0] != "_":
                g = ct_names[0]
            else:
                g = em.namer.fresh("cts")
                self._unpack(ct_names, g, prologue)
            if symbolic:
                self._dense(ct_names, prologue)
            self._define(bwd, bwd_name, [res, g], prologue,
                         bwd_returns_for(self._symbolic_zeros(bwd)))

        fwd_name = em.namer.fresh(f"{name}_fwd")
        define_fwd(fwd, fwd_name)
        bwd_name = em.namer.fresh(f"{name}_bwd")
        define_bwd(bwd, bwd_name)
        tables = self._vjp_variant_tables(name, define_fwd, define_bwd)
        if tables is not None:
            # The rule JAX runs picks the fwd and bwd traced for its perturbation pattern.
            em.use_helper("_vjp_by_pattern")
            fwd_table, bwd_table = tables
            args_inexact = tuple(bool(inexact(a)) for a in arg_avals)
            outs_inexact = tuple(bool(inexact(a)) for a in out_avals)
            chosen = em.namer.fresh(f"{name}_by_pattern")
            self._after(f"{chosen} = _vjp_by_pattern({fwd_name}, {bwd_name}, {fwd_table}, "
                        f"{bwd_table}, {args_inexact!r}, {outs_inexact!r})")
            fwd_name, bwd_name = f"{chosen}[0]", f"{chosen}[1]"
        self._after(f"{name}.defvjp({fwd_name}, {bwd_name}{sz})")
        return Call(name, list(self.ins), hint=wanted)

    def _vjp_variant_tables(self, name: str, define_fwd, define_bwd):
        """A symbolic-zeros custom_vjp traced per perturbation pattern: each fwd and
        bwd variant becomes a function (``define_*(region, name)``); returns the
        sources of ``{in_pattern: fwd}`` and ``{(family, ct_pattern): bwd}``, or None
        when there are none."""
        p = self.eqn.params
        if not p.get("fwd_variants") and not p.get("bwd_variants"):
            return None
        fwd_table, bwd_table = [], []
        for (pattern, _), region in zip(p.get("fwd_variant_patterns", ()),
                                        p.get("fwd_variants", ())):
            fn = self.emitter.namer.fresh(f"{name}_fwd_variant")
            define_fwd(region, fn)
            fwd_table.append(f"{tuple(bool(b) for b in pattern)!r}: {fn}")
        for (family, ct), region in zip(p.get("bwd_variant_patterns", ()),
                                        p.get("bwd_variants", ())):
            fn = self.emitter.namer.fresh(f"{name}_bwd_variant")
            define_bwd(region, fn)
            key = (tuple(bool(b) for b in family), tuple(bool(b) for b in ct))
            bwd_table.append(f"{key!r}: {fn}")
        return "{" + ", ".join(fwd_table) + "}", "{" + ", ".join(bwd_table) + "}"

    def _custom_jvp(self, eqn: Equation) -> Call:
        p = eqn.params
        self._require_rules(["call_jaxpr"] if FORWARD_ONLY_PARAM in p else
                            ["call_jaxpr", "jvp_jaxpr"])
        em = self.emitter
        symbolic = bool(p.get("symbolic_zeros"))
        call = p["call_jaxpr"]
        out_avals = [a.aval for a in call.outvars]
        arg_avals = [v.aval for v in call.invars]
        n_in, n_out = len(arg_avals), len(out_avals)
        name, wanted = self._custom_function(call, "custom_jvp")
        sz = ", symbolic_zeros=True" if symbolic else ""

        inexact_outs = [j for j, a in enumerate(out_avals) if inexact(a)]

        def returns_for(zeros):
            def returns(outs):
                it = iter(_masked(outs[n_out:], zeros, lambda k: (
                    f"jax.custom_derivatives.zero_from_primal({outs[inexact_outs[k]]}, "
                    f"symbolic_zeros=True)")))
                t_out = [next(it) if inexact(a) else
                         f"np.zeros({tuple(a.shape)!r}, dtype=jax.dtypes.float0)"
                         for a in out_avals]
                return f"{flat_return(outs[:n_out])}, {flat_return(t_out)}"
            return returns

        def define(jvp, fn_name):
            prologue: list[str] = []
            primals = self._group_binders(jvp.invars[:n_in], "primals", prologue)
            tangent_vars = iter(jvp.invars[n_in:])
            t_names = [em.name_binders([next(tangent_vars)], ["tangent"])[0] if inexact(a)
                       else "_" for a in arg_avals]
            tangents = em.namer.fresh("tangents")
            self._unpack(t_names, tangents, prologue)
            if symbolic:
                self._dense(t_names, prologue)
            self._define(jvp, fn_name, [primals, tangents], prologue,
                         returns_for(self._symbolic_zeros(jvp)))

        rule_name = em.namer.fresh(f"{name}_jvp")
        define(p["jvp_jaxpr"] if FORWARD_ONLY_PARAM not in p else _forward_only_jvp(p),
               rule_name)
        table = self._jvp_variant_table(name, define)
        if table is not None:
            em.use_helper("_jvp_by_pattern")
            chosen = em.namer.fresh(f"{name}_jvp_by_pattern")
            args_inexact = tuple(bool(inexact(a)) for a in arg_avals)
            self._after(f"{chosen} = _jvp_by_pattern({rule_name}, {table}, {args_inexact!r})")
            rule_name = chosen
        self._after(f"{name}.defjvp({rule_name}{sz})")
        return Call(name, list(self.ins), hint=wanted)

    def _jvp_variant_table(self, name: str, define) -> str | None:
        """A symbolic-zeros jvp rule traced per perturbation pattern (``jvp_variants``):
        each variant becomes a function like the main rule (``define(region, name)``);
        returns the source of ``{pattern: function}``, or None when there are none."""
        p = self.eqn.params
        variants = p.get("jvp_variants") or ()
        if not variants:
            return None
        table = []
        for pattern, region in zip(p["jvp_variant_patterns"], variants):
            fn = self.emitter.namer.fresh(f"{name}_jvp_variant")
            define(region, fn)
            table.append(f"{tuple(bool(b) for b in pattern)!r}: {fn}")
        return "{" + ", ".join(table) + "}"

    # -- rules with closed-over values ---------------------------------------
    def _custom_with_consts(self, eqn: Equation, build: str) -> Call:
        """``name(*c, *x)`` for a rule closing over ``c`` (its first ``num_consts``
        operands); equal rules share one function."""
        em = self.emitter
        key = em.rule_key(eqn)
        if key not in em.custom_functions:
            self.rule_key = key
            kind = "custom_vjp" if build == "_custom_vjp" else "custom_jvp"
            self._rule_with_consts(eqn, kind)
        name, wanted = em.custom_functions[key]
        return Call(name, list(self.ins), multiple=True, hint=wanted)

    def _rule_with_consts(self, eqn: Equation, kind: str) -> None:
        em, p = self.emitter, eqn.params
        regions = ["call_jaxpr"] + list(self._RULE_REGION_NAMES[kind])
        self._require_rules(regions)
        nc = closed_over_count(eqn)
        call = p["call_jaxpr"]
        n_call_out = len(call.outvars)
        name, wanted = self._rule_name(call, kind)
        hints = self._arg_hints(0)
        as_list = lambda outs: "[" + ", ".join(outs) + "]"  # noqa: E731
        self._define(call, name, em.name_binders(call.invars, hints), [], as_list)
        if name != wanted:
            self._after(f"{name}.__name__ = {wanted!r}")
        rule_fns, variant_table, vjp_tables = [], None, None
        for region_name in self._RULE_REGION_NAMES[kind]:
            fn_name = em.namer.fresh(f"{name}_{region_name.split('_')[0]}")
            rule_fns.append(fn_name)
            region = p[region_name]
            # fwd/jvp take (c, x, ...) and bwd takes (c, r, ct): name what matches.
            named = hints[:nc] if region_name == "bwd_jaxpr" else hints
            binder_hints = named + [None] * (len(region.invars) - len(named))
            self._define(region, fn_name, em.name_binders(region.invars, binder_hints), [],
                         self._flat_returns(region, 0 if kind == "custom_vjp" else n_call_out))
        if kind == "custom_vjp":
            def define_flat_vjp(region, fn):
                binder_hints = hints + [None] * (len(region.invars) - len(hints))
                self._define(region, fn, em.name_binders(region.invars, binder_hints), [],
                             self._flat_returns(region, 0))
            vjp_tables = self._vjp_variant_tables(name, define_flat_vjp, define_flat_vjp)
        if kind == "custom_jvp":
            def define_flat(region, fn):
                binder_hints = hints + [None] * (len(region.invars) - len(hints))
                self._define(region, fn, em.name_binders(region.invars, binder_hints), [],
                             self._flat_returns(region, n_call_out))
            variant_table = self._jvp_variant_table(name, define_flat)
        outs = tuple_src([f"({tuple(a.aval.shape)!r}, {self.dtype(a.aval.dtype)})"
                          for a in call.outvars])
        args_inexact = tuple(bool(inexact(v.aval)) for v in call.invars[nc:])
        rule = {f: p[f] for f in ("name", "source", "const_names", "closed_over",
                                  "max_forward_size", "reverse_ok")}
        helper = f"_{kind}_with_consts"
        em.use_helper(helper)
        options = [("num_consts", str(nc)), ("outs", outs),
                   ("args_inexact", tuple_src([repr(b) for b in args_inexact])),
                   ("rule", repr(rule))]
        if kind == "custom_jvp" and variant_table is not None:
            options.append(("variants", variant_table))
        if kind == "custom_vjp" and vjp_tables is not None:
            options += [("fwd_variants", vjp_tables[0]), ("bwd_variants", vjp_tables[1])]
        forward = _forward_mode_primal(call)
        if forward is not None:
            # The derivative w.r.t. the closed-over operands may be formed in forward
            # mode (jax.jvp of the primal); a primal that calls custom_vjp functions
            # needs them with a forward mode, as the Program's own evaluation under
            # autodiff has (passes/vjp_to_jvp.with_forward_mode).
            forward_name = em.namer.fresh(f"{name}_forward")
            self._define(forward, forward_name, em.name_binders(forward.invars, hints), [],
                         as_list)
            options.append(("forward_primal", forward_name))
        build = Call(helper, [name] + rule_fns, options)
        self._after(render_call(build, name, 0))

    def _flat_returns(self, region: Region, skip: int):
        """``tuple_src`` of a flat rule body, with ``None`` for each output after the
        first ``skip`` that the user's rule returned as a symbolic zero (the
        ``_custom_*_with_consts`` helpers hand JAX a symbolic zero for it)."""
        zeros = self._symbolic_zeros(region)
        if not zeros:
            return tuple_src
        return lambda outs: tuple_src(list(outs[:skip])
                                      + _masked(outs[skip:], zeros, lambda k: "None"))

    _RULE_REGION_NAMES = {"custom_vjp": ("fwd_jaxpr", "bwd_jaxpr"),
                          "custom_jvp": ("jvp_jaxpr",)}

    def linear_call(self, eqn: Equation) -> Call:
        self._require_rules(["callee", "transpose_jaxpr"])
        em, p = self.emitter, eqn.params
        if p.get("num_callee_consts", 0):
            raise PythonEmitError(f"{self._where()}: linear_call with closed-over callee values "
                                  f"(num_callee_consts={p['num_callee_consts']}) has no source form")
        callee, transpose = p["callee"], p["transpose_jaxpr"]
        num_res = p["num_res"]
        n_out = len(callee.outvars)
        base = em.namer.fresh("linear_fun")
        prologue: list[str] = []
        res = self._group_binders(callee.invars[:num_res], "residuals", prologue)
        lin = self._group_binders(callee.invars[num_res:], "linear", prologue)
        self._define(callee, base, [res, lin], prologue, flat_return)
        t_name = em.namer.fresh(f"{base}_transpose")
        prologue = []
        t_res = self._group_binders(transpose.invars[:num_res], "residuals", prologue)
        cts = transpose.invars[num_res:]
        if n_out == 1 and len(cts) == 1:
            ct = em.name_binders(cts, ["ct"])[0]
        else:
            ct = self._group_binders(cts, "cts", prologue)
        self._define(transpose, t_name, [t_res, ct], prologue, self._flat_returns(transpose, 0))
        args = [tuple_src(self.ins[:num_res]), tuple_src(self.ins[num_res:])]
        variants = p.get("transpose_variants") or ()
        if not variants and not p.get(SYMBOLIC_ZERO_OUTPUTS):
            return Call("jax.custom_derivatives.linear_call", [base, t_name, *args])
        # The tangent of a symbolic-zeros custom_vjp (vjp-to-jvp): its bwd per pattern
        # of output cotangents, picked when JAX transposes (as the Program does).
        table = []
        for pattern, region in zip(p.get("transpose_variant_patterns", ()), variants):
            fn = em.namer.fresh(f"{base}_transpose_variant")
            prologue = []
            v_res = self._group_binders(region.invars[:num_res], "residuals", prologue)
            v_cts = region.invars[num_res:]
            if n_out == 1 and len(v_cts) == 1:
                v_ct = em.name_binders(v_cts, ["ct"])[0]
            else:
                v_ct = self._group_binders(v_cts, "cts", prologue)
            self._define(region, fn, [v_res, v_ct], prologue, self._flat_returns(region, 0))
            table.append(f"{tuple(bool(b) for b in pattern)!r}: {fn}")
        em.use_helper("_linear_call_by_pattern")
        return Call("_linear_call_by_pattern", [base, t_name, "{" + ", ".join(table) + "}", *args])

    def _group_binders(self, values, label: str, prologue: list[str]) -> str:
        em = self.emitter
        pname = em.namer.fresh(label)
        names = em.name_binders(values, [None] * len(values))
        if names:
            prologue.append(f"{tuple_src(names)} = {pname}")
        return pname

    # -- linear solves -------------------------------------------------------
    def custom_linear_solve(self, eqn: Equation) -> Call:
        """``lax.custom_linear_solve(matvec, (b,...), solve, transpose_solve)``: each
        stored jaxpr becomes a local function closing over its leading operands
        (custom_linear_solve closure-converts them again, as the original did); ``b``
        is passed as a tuple of its leaves, so every function takes and returns one."""
        p = eqn.params
        lengths, jaxprs = p.get("const_lengths"), p.get("jaxprs")
        if set(p) != {"const_lengths", "jaxprs"} or jaxprs.matvec is None or jaxprs.solve is None:
            raise PythonEmitError(f"{self._where()}: parameters {sorted(p)} have no source form")
        starts, k = {}, 0
        for field in lengths._fields:
            starts[field] = k
            k += getattr(lengths, field)
        consts = {f: self.eqn.inputs[starts[f]:starts[f] + getattr(lengths, f)]
                  for f in lengths._fields}
        b = list(self.ins[k:])
        if len(eqn.outputs) != len(b):
            raise PythonEmitError(f"{self._where()}: a solve with auxiliary outputs has no "
                                  f"source form")

        def same(f, g):
            return (getattr(jaxprs, f) is not None and getattr(jaxprs, g) is not None
                    and str(getattr(jaxprs, f)) == str(getattr(jaxprs, g))
                    and list(consts[f]) == list(consts[g]))
        symmetric = same("vecmat", "matvec") and same("transpose_solve", "solve")
        em = self.emitter

        def function(field: str, takes_operator: bool) -> str:
            region = region_from_closed_jaxpr(getattr(jaxprs, field))
            n = len(consts[field])
            for v, outer in zip(region.invars[:n], consts[field]):
                em.env[v] = em.closed_over(outer, self.fn)
            x = em.namer.fresh("x")
            names = em.name_binders(region.invars[n:], [None] * (len(region.invars) - n))
            params = ([em.namer.fresh("operator")] if takes_operator else []) + [x]
            fdef = em.function(region, em.namer.fresh(field), params,
                               [f"{tuple_src(names)} = {x}"], self.fn.depth + 1,
                               returns=tuple_src)
            self.fn.body.append(fdef)
            return fdef.name.value

        matvec = function("matvec", False)
        solve = function("solve", True)
        kwargs = []
        if symmetric:
            kwargs.append(("symmetric", "True"))
            transpose_solve = solve
        elif jaxprs.transpose_solve is not None:
            transpose_solve = function("transpose_solve", True)
        else:
            transpose_solve = "None"
        return Call("lax.custom_linear_solve", [matvec, tuple_src(b), solve, transpose_solve],
                    kwargs, multiple=True)

    def custom_vmap(self, eqn: Equation) -> Call:
        """``jax.custom_batching.custom_vmap``: the batching rule is the user's Python
        function, imported by module and name as a callback is."""
        from ..jax_adapter import custom_vmap_rule_function
        p = eqn.params
        rule = custom_vmap_rule_function(p["rule"])
        if rule is None:
            raise PythonEmitError(f"{self._where()}: the batching rule is one JAX derived "
                                  f"(custom_vmap differentiated inside the traced function); "
                                  f"it has no source form")
        rule_name = self.emitter.callable_ref(rule, self._where())
        consts_tree, args_tree = p["in_tree"].children()
        fn = self.explicit_function(p["call"], "vmapped")
        self.emitter.use_helper("_custom_vmap_call")
        return Call("_custom_vmap_call",
                    [fn, rule_name, str(consts_tree.num_leaves), self.param(args_tree),
                     self.param(p["out_tree"]), *self.ins], multiple=True)

    # -- callbacks and policies --------------------------------------------
    def debug_callback(self, eqn: Equation) -> Call | None:
        from ..jax_adapter import debug_callback_parts, is_ordered_effect
        p = eqn.params
        parts = debug_callback_parts(p.get("callback"))
        if parts is None:
            raise PythonEmitError(f"{self._where()}: the callback is not one jax.debug.callback "
                                  f"made; it has no source form")
        target, in_tree, static_args = parts
        if static_args:
            raise PythonEmitError(f"{self._where()}: callbacks with static arguments have no "
                                  f"source form")
        fn = self.emitter.callable_ref(target, self._where())
        args_tree, kwargs_tree = in_tree.children()
        _, keys = kwargs_tree.node_data()
        n_pos = args_tree.num_leaves
        if any(c.num_nodes != 1 or c.num_leaves != 1
               for c in args_tree.children() + kwargs_tree.children()):
            raise PythonEmitError(f"{self._where()}: callbacks taking pytrees have no source form")
        kwargs = list(zip(keys or (), self.ins[n_pos:]))
        if is_ordered_effect(p.get("effect")):
            kwargs.append(("ordered", "True"))
        if p.get("partitioned"):
            kwargs.append(("partitioned", "True"))
        return Call("jax.debug.callback", [fn] + list(self.ins[:n_pos]), kwargs)

    def host_callback(self, eqn: Equation, kind: str) -> Call:
        """``jax.pure_callback`` / ``io_callback``: the user's function imported by module
        and name, called with its arguments rebuilt from the flat operands."""
        from ..jax_adapter import host_callback_parts
        p = eqn.params
        parts = host_callback_parts(p.get("callback"))
        if parts is None or p.get("sharding") is not None:
            raise PythonEmitError(f"{self._where()}: a callback not made by jax.pure_callback or "
                                  f"io_callback, or with a sharding, has no source form")
        target, in_tree = parts
        fn = self.emitter.callable_ref(target, self._where())
        avals = tuple_src([f"({tuple(int(d) for d in a.shape)!r}, {self.dtype(a.dtype)})"
                           for a in p["result_avals"]])
        kwargs = []
        if kind == "pure" and p.get("vmap_method") is not None:
            kwargs.append(("vmap_method", repr(p["vmap_method"])))
        if kind == "io":
            kwargs.append(("ordered", repr(bool(p.get("ordered")))))
        self.emitter.use_helper("_host_callback")
        return Call("_host_callback", [repr(kind), fn, self.param(in_tree), avals, *self.ins],
                    kwargs, multiple=True)

    def checkpoint_policy(self, policy):
        import jax

        from ..jax_adapter import is_made_checkpoint_policy, named_policy_types
        if policy is None:
            return None
        made_from_names = named_policy_types().get(type(policy))
        if made_from_names is not None:
            factory, field = made_from_names
            names = ", ".join(repr(n) for n in sorted(getattr(policy, field)))
            return f"jax.checkpoint_policies.{factory}({names})"
        for name in sorted(vars(jax.checkpoint_policies)):
            candidate = getattr(jax.checkpoint_policies, name)
            try:
                same = candidate is policy or (type(candidate) is type(policy) and candidate == policy)
            except Exception:
                same = False
            if same:
                return f"jax.checkpoint_policies.{name}"
        if is_made_checkpoint_policy(policy):
            raise PythonEmitError(f"{self._where()}: checkpoint policy {policy.__qualname__} is a "
                                  f"closure jax.checkpoint_policies made from other values (a "
                                  f"combination or an offloading policy); it has no source form")
        raise PythonEmitError(f"{self._where()}: checkpoint policy {policy!r} is not one of "
                              f"jax.checkpoint_policies; it has no source form")


def _forward_mode_primal(call: Region) -> "Region | None":
    """``call`` with forward mode through the custom_vjp rules it calls (a rewritten
    copy, by the vjp-to-jvp pass, which sits above the backends: reached through
    ``ir/program_services``), or None when it calls none."""
    from ..ir import program_services
    return program_services.forward_mode_region(call)


def _forward_only_jvp(params: dict) -> Region:
    """The jvp body of a ``forward_only`` custom_jvp, which the program does not store
    (it is made from the primal): made now, since emitted code holds every rule."""
    rule = forward_only_rule(region_to_closed_jaxpr(params["call_jaxpr"]),
                             params["num_consts"], params[FORWARD_ONLY_PARAM])
    region = region_from_closed_jaxpr(body(rule.jvp))
    # Its columns are a vmapped jvp: rules the call holds are batched there by JAX
    # (a linear_call's transpose is then a JAX thunk), and are made first-order now.
    program = Program(region, tree_util.tree_structure((tuple(range(len(region.invars))), {})),
                      tree_util.tree_structure(list(range(len(region.outvars)))), name="jvp")
    convert_program(program)
    return program.body


def _masked(outs: list[str], zeros: tuple, spell) -> list[str]:
    """``outs`` with the ``k``-th replaced by ``spell(k)`` where ``zeros[k]``."""
    if not zeros:
        return list(outs)
    return [spell(k) if k < len(zeros) and zeros[k] else o for k, o in enumerate(outs)]
