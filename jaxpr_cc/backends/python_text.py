"""Text building blocks of the Python source backend: statements, calls, layout, and
the small helpers an emitted module may need (added only when it uses them)."""
from __future__ import annotations

from typing import Sequence

import libcst as cst

from .python_rules import Call

LINE_LIMIT = 99


class PythonEmitError(ValueError):
    """The program holds something that has no Python source form."""


# Helpers an emitted module may define, with the standard modules they import.
HELPERS = {
    "_bind": '''
def _bind(name, *args, **params):
    """Apply the JAX primitive called ``name`` (jaxpr-cc: for primitives with no public API)."""
    return _primitive(name).bind(*args, **params)


_PRIMITIVES = {}


def _primitive(name):
    if not _PRIMITIVES:
        # (jax.numpy and jax.random define primitives; jax is the module's import.)
        primitive_type = importlib.import_module("jax.extend.core").Primitive
        importlib.import_module("jax.numpy")
        importlib.import_module("jax.random")
        for module in list(sys.modules.values()):
            if getattr(module, "__name__", "").startswith("jax"):
                for value in list(vars(module).values()):
                    if isinstance(value, primitive_type):
                        _PRIMITIVES.setdefault(value.name, value)
    if name not in _PRIMITIVES:
        raise LookupError(f"this JAX ({jax.__version__}) has no primitive named {name!r}")
    return _PRIMITIVES[name]
''',
    "_dense": '''
def _dense(t):
    """A symbolic zero (rules declared with symbolic_zeros=True) as an array of zeros."""
    if isinstance(t, jax.custom_derivatives.SymbolicZero):
        return jnp.zeros(t.shape, t.dtype)
    return t
''',
    "_mesh": '''
def _mesh(shape, axis_names, device_ids, axis_types):
    """The device mesh the program was traced with, rebuilt from its device ids."""
    by_id = {device.id: device for device in jax.devices()}
    devices = np.array([by_id[i] for i in device_ids], dtype=object).reshape(shape)
    return jax.sharding.Mesh(devices, axis_names, axis_types=axis_types)
''',
    "_device": '''
def _device(platform, device_id):
    """The device the program was traced with, by platform and id in this process."""
    try:
        found = {device.id: device for device in jax.devices(platform)}
    except RuntimeError:
        found = {}
    if device_id not in found:
        raise RuntimeError(f"this program places a value on {platform} device {device_id}, "
                           f"which this process does not have (it has: {jax.devices()}); "
                           f"run it where that device exists")
    return found[device_id]
''',
    "_import_callable": '''
def _import_callable(module_name, qualname, path):
    """A Python function the program calls back into: by module name, else from its file.
    A script's function (``__main__`` when the module was emitted) is loaded from the
    script, under another name, when this process's ``__main__`` is another program."""
    module = sys.modules.get(module_name)
    if module_name == "__main__" and path is not None and (
            module is None or getattr(module, "__file__", None) is None
            or os.path.realpath(module.__file__) != os.path.realpath(path)):
        module_name = "_jaxpr_cc_script_" + "".join(c if c.isalnum() else "_" for c in path)
        module = sys.modules.get(module_name)
    if module is None:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            if path is None:
                raise
            spec = importlib.util.spec_from_file_location(module_name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            spec.loader.exec_module(module)
    target = module
    for part in qualname.split("."):
        target = getattr(target, part)
    return target
''',
}
HELPER_IMPORTS = {"_bind": ("importlib", "sys"), "_mesh": (), "_device": (), "_dense": (), "_import_callable": ("importlib", "os", "sys")}


def stmt(code: str) -> cst.BaseStatement:
    return cst.parse_statement(code if code.endswith("\n") else code + "\n")


def tuple_src(items: Sequence[str]) -> str:
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def render_call(call: Call, target: str | None, depth: int) -> str:
    items = list(call.args) + [f"{k}={v}" for k, v in call.kwargs]
    head = f"{target} = " if target else ""
    comment = f"  # {call.comment}" if call.comment else ""
    flat = f"{head}{call.func}({', '.join(items)}){comment}"
    if 4 * depth + len(flat) <= LINE_LIMIT or not items:
        return flat
    body = "".join(f"    {item},\n" for item in items)
    return f"{head}{call.func}({comment}\n{body})"


class Function:
    """A function being emitted: its statements and indentation depth."""

    def __init__(self, depth: int):
        self.depth = depth
        self.body: list[cst.BaseStatement] = []

    def add(self, code: str) -> None:
        self.body.append(stmt(code))


def inexact(aval) -> bool:
    import jax.numpy as jnp
    return bool(jnp.issubdtype(aval.dtype, jnp.inexact))


def flat_return(outs: list[str]) -> str:
    return outs[0] if len(outs) == 1 else tuple_src(outs)


def layout(groups: list[tuple[str, list[cst.BaseStatement]]]) -> str:
    """Render top-level statements in a fixed layout: the docstring and the import
    groups one blank line apart, everything else two; definitions set off by two blank
    lines; runs of simple statements kept together."""
    out: list[str] = []
    for kind, group in groups:
        prev_compound = False
        for si, stmt in enumerate(group):
            text = cst.Module(body=[stmt]).code.strip("\n")
            compound = not isinstance(stmt, cst.SimpleStatementLine)
            if out:
                if si == 0:
                    out.append("\n\n" if kind == "import" else "\n\n\n")
                else:
                    out.append("\n\n\n" if (compound or prev_compound) else "\n")
            out.append(text)
            prev_compound = compound
    return "".join(out) + "\n"


# Rules with closed-over operands (``num_consts`` > 0).  The emitted custom function
# takes those operands as leading explicit arguments, the way jax.closure_convert
# passes them, and its derivative with respect to them follows the rule's recorded
# ``closed_over`` policy exactly as jaxpr_cc.closure.rules.build_custom_vjp /
# build_custom_jvp do for the Program, so both are differentiable alike.
HELPERS["_closed_over"] = '''
class ClosedOverError(ValueError):
    """A custom rule's closed-over operand is differentiated and its policy forbids it."""


def _closed_over_mode(rule, kind, hot, consts):
    """How to differentiate w.r.t. the perturbed closed-over operands ``hot``:
    'none', 'reverse' or 'forward' (the policy the program was traced with)."""
    if not hot:
        return "none"
    mode = rule["closed_over"]
    size = sum(int(np.prod(jnp.shape(consts[i]))) for i in hot)
    if mode == "auto":
        if kind == "jvp":
            mode = "forward"
        elif rule["reverse_ok"]:
            mode = "reverse"
        elif size <= rule["max_forward_size"]:
            mode = "forward"
        else:
            mode = "error"
    names, first = rule["const_names"], hot[0]
    what = (f"'{names[first] if first < len(names) else f'const{first}'}' "
            f"({jax.typeof(consts[first]).str_short(short_dtypes=True)})")
    if mode == "forward" and kind == "vjp" and size > rule["max_forward_size"]:
        raise ClosedOverError(
            f"{kind} rule '{rule['name']}' ({rule['source']}) closes over {what}, which is being "
            f"differentiated; forward mode would need {size} jvp columns > "
            f"max_forward_size={rule['max_forward_size']}: raise max_forward_size or use "
            f"closed_over='reverse'")
    if mode == "reverse" and kind == "vjp" and not rule["reverse_ok"]:
        raise ClosedOverError(
            f"custom_{kind} rule '{rule['name']}' ({rule['source']}) closes over {what}, which is "
            f"being differentiated; closed_over='reverse' asks for the reverse-mode derivative "
            f"of its primal, which runs a while_loop that reverse mode cannot differentiate: "
            f"trace with closed_over='auto' or 'forward'")
    if mode == "error":
        raise ClosedOverError(
            f"custom_{kind} rule '{rule['name']}' ({rule['source']}) closes over {what}, which is "
            f"being differentiated, and its rule gives no derivative for it: pass it as an "
            f"argument, or trace with closed_over='auto' (or 'reverse' / 'forward')")
    return mode


def _zeros(shape, dtype):
    """Zeros of an output's cotangent type (float0 for integer and boolean outputs)."""
    if not jnp.issubdtype(dtype, jnp.inexact):
        return np.zeros(shape, jax.dtypes.float0)
    return jnp.zeros(shape, dtype)
'''

HELPERS["_layout_marker"] = '''
def _layout_marker(index):
    """A zero-size residual whose shape (0, index) names the layout the other
    residuals were saved in: a shape survives jit, scan, vmap and JAX's memoized
    fwd of a staged custom_vjp, which hands bwd the residual tree of the pattern
    traced last (a pytree's static data would then name the wrong layout)."""
    return jax.lax.full((0, index), False)
'''

HELPERS["_forward_only"] = '''
def _real_directions(value):
    """Every real direction of ``value``: 1 per element, and 1j for a complex one."""
    shape, dtype = jnp.shape(value), jnp.result_type(value)
    n = int(np.prod(shape))
    eye = jnp.eye(n, dtype=jnp.finfo(dtype).dtype).reshape((n, *shape))
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return jnp.concatenate([eye.astype(dtype), (1j * eye).astype(dtype)])
    return eye.astype(dtype)


def _jacobian_columns(f, hot):
    """``(*xs) -> columns``: for each input index in ``hot`` and each output of
    ``f``, the output's jvp along every real direction of that input, stacked on a
    leading axis, by forward mode."""
    def columns(*xs):
        out = []
        for k in hot:
            def along(direction, k=k):
                probe = [jnp.zeros_like(x) if jnp.issubdtype(jnp.result_type(x), jnp.inexact)
                         else np.zeros(jnp.shape(x), jax.dtypes.float0) for x in xs]
                probe[k] = direction
                return list(jax.jvp(f, tuple(xs), tuple(probe))[1])
            out.extend(jax.vmap(along)(_real_directions(xs[k])))
        return out
    return columns


def _forward_only(f):
    """``f`` (arrays -> list of arrays) whose derivatives of every order are formed
    by forward mode: its jvp is the Jacobian's columns (a vmapped jvp along every
    real direction of each perturbed input) contracted with the tangents' real (and
    imaginary) parts.  Linear in the tangents, so reverse mode transposes the
    contraction, never the forward pass, which may run through a while_loop; the
    columns are ``_forward_only`` again, so every further order works the same way.
    An integer or bool output has no derivative."""
    fun = jax.custom_jvp(f)

    def jvp(primals, tangents):
        outs = fun(*primals)
        hot = [k for k, t in enumerate(tangents)
               if type(t) is not jax.custom_derivatives.SymbolicZero]
        inexact = [j for j, o in enumerate(outs)
                   if jnp.issubdtype(jnp.result_type(o), jnp.inexact)]
        t_outs = [jnp.zeros(jnp.shape(o), jnp.result_type(o)) if j in inexact
                  else np.zeros(jnp.shape(o), jax.dtypes.float0) for j, o in enumerate(outs)]
        if hot:
            def inexact_outputs(*xs):
                got = f(*xs)
                return [got[j] for j in inexact]
            cols = iter(_forward_only(_jacobian_columns(inexact_outputs, tuple(hot)))(*primals))
            for k in hot:
                t = jnp.ravel(jnp.asarray(tangents[k]))
                if jnp.issubdtype(t.dtype, jnp.complexfloating):
                    t = jnp.concatenate([jnp.real(t), jnp.imag(t)])
                for j in inexact:
                    col = next(cols)
                    t_outs[j] = t_outs[j] + jnp.tensordot(t.astype(col.dtype), col, axes=1)
        return outs, t_outs

    fun.defjvp(jvp, symbolic_zeros=True)
    return fun


def _jacobian_tangents(f, operands, hot, tangents, outs):
    """``jvp(f)`` at ``operands`` along ``tangents`` of the operands ``hot``, through
    ``_forward_only``: every derivative of it, in either mode, is formed by forward
    mode.  Every operand is passed explicitly (a custom_jvp must not close over
    the tracers of the traces around it)."""
    inexact = [j for j, (_, dtype) in enumerate(outs) if jnp.issubdtype(dtype, jnp.inexact)]

    def inexact_outputs(*ops):
        got = f(*ops)
        return [got[j] for j in inexact]
    forward_only = _forward_only(inexact_outputs)

    def along_hot(*hot_values):
        ops = list(operands)
        for k, v in zip(hot, hot_values):
            ops[k] = v
        return forward_only(*ops)
    _, t_out = jax.jvp(along_hot, tuple(operands[k] for k in hot), tuple(tangents))
    extra = [None] * len(outs)
    for j, t in zip(inexact, t_out):
        extra[j] = t
    return extra
'''

HELPERS["_custom_vjp_with_consts"] = '''
def _forward_const_cotangents(primal, consts, args, hot, cts, outs):
    """Cotangents of the perturbed closed-over operands by forward mode (works
    through while_loop, where reverse mode does not): the Jacobian's columns along
    every real direction of each operand (``_forward_only``, so every further
    derivative is formed by forward mode too), paired with the output cotangents as
    JAX pairs them, Re(sum(ct * t)); a complex operand has directions 1 and 1j per
    element and gets pair(1) - 1j * pair(1j).  Pairings accumulate in the
    operand's real dtype."""
    inexact = [j for j, (_, dtype) in enumerate(outs)
               if jnp.issubdtype(dtype, jnp.inexact) and cts[j] is not None]
    operands = [*consts, *args]

    def inexact_outputs(*ops):
        got = primal(*ops)
        return [got[j] for j in inexact]
    got = []
    for i in hot:
        value = consts[i]
        shape, dtype = jnp.shape(value), jnp.result_type(value)
        real_dtype = jnp.finfo(dtype).dtype
        n = int(np.prod(shape))
        cols = _forward_only(_jacobian_columns(inexact_outputs, (i,)))(*operands)
        complex_value = jnp.issubdtype(dtype, jnp.complexfloating)
        pairs = jnp.zeros((2 * n if complex_value else n,), real_dtype)
        for col, j in zip(cols, inexact):
            ct = cts[j]
            pairs = pairs + jnp.real(jnp.sum(col * ct, axis=tuple(range(1, col.ndim)))
                                     ).astype(real_dtype)
        ct_value = pairs[:n] - 1j * pairs[n:].astype(dtype) if complex_value else pairs
        got.append(ct_value.reshape(shape).astype(dtype))
    return got


def _custom_vjp_with_consts(primal, fwd, bwd, *, num_consts, outs, args_inexact, rule,
                            forward_primal=None, fwd_variants=None, bwd_variants=None):
    """``jax.custom_vjp(primal)`` for a rule whose first ``num_consts`` arguments are
    closed-over operands.  ``fwd(*c, *x)`` returns the outputs then the residuals;
    ``bwd(*c, *r, *ct_y)`` the cotangents of the inexact arguments (None for one the
    user's bwd returned as a symbolic zero); ``outs`` holds
    each output's (shape, dtype).  ``forward_primal`` is the primal with a forward
    mode through the custom_vjp functions it calls, for forward-mode derivatives.
    ``fwd_variants`` / ``bwd_variants``: a symbolic-zeros rule traced per pattern of
    perturbed arguments / (that pattern, nonzero output cotangents)."""
    fun = jax.custom_vjp(primal)
    forward_primal = forward_primal or primal
    fwd_variants, bwd_variants = fwd_variants or {}, bwd_variants or {}
    # The residuals are one flat tuple whose layout does not depend on the
    # pattern -- a layout marker, every argument, the rule's own residuals that
    # are not arguments -- and the marker's shape indexes `layouts`.
    layouts, layout_index = [], {}

    def fwd_with_consts(*primals):
        values = [p.value for p in primals]
        hot = tuple(i for i, p in enumerate(primals[:num_consts]) if p.perturbed)
        mode = _closed_over_mode(rule, "vjp", hot, values[:num_consts])
        family = tuple(p.perturbed for p, inexact in zip(primals[num_consts:], args_inexact)
                       if inexact)
        family = family if family in fwd_variants else ()
        outs_res = (fwd_variants[family] if family else fwd)(*values)
        res = outs_res[len(outs):]
        position = {id(v): k for k, v in enumerate(values)}
        res_from = tuple(position.get(id(r)) for r in res)
        layout = (mode, hot, family, res_from)
        if layout not in layout_index:
            layout_index[layout] = len(layouts)
            layouts.append(layout)
        own = [r for r, k in zip(res, res_from) if k is None]
        return list(outs_res[:len(outs)]), (_layout_marker(layout_index[layout]), *values, *own)

    def bwd_with_consts(residuals, cts):
        mode, hot, family, res_from = layouts[int(np.shape(residuals[0])[1])]
        values, own = list(residuals[1:1 + len(args_inexact) + num_consts]), \
            iter(residuals[1 + len(args_inexact) + num_consts:])
        saved_consts, saved_args = values[:num_consts], values[num_consts:]
        saved_res = [next(own) if k is None else values[k] for k in res_from]
        ct_pattern = tuple(type(c) is not jax.custom_derivatives.SymbolicZero
                           for c, (_, dtype) in zip(cts, outs) if jnp.issubdtype(dtype, jnp.inexact))
        rule_bwd = bwd_variants.get((family, ct_pattern))
        if rule_bwd is None:
            rule_bwd = bwd_variants[(family, (True,) * len(ct_pattern))] if family else bwd
        # Outputs with no cotangent contribute nothing to the closed-over operands'
        # cotangents (forward mode then needs no tangent of them).
        nonzero = [jnp.issubdtype(dtype, jnp.inexact)
                   and type(c) is not jax.custom_derivatives.SymbolicZero
                   for c, (_, dtype) in zip(cts, outs)]
        cts = [_dense(c) if jnp.issubdtype(dtype, jnp.inexact) else None
               for c, (_, dtype) in zip(cts, outs)]
        got = iter(rule_bwd(*saved_consts, *saved_res, *[c for c in cts if c is not None]))
        arg_cts = [next(got) if inexact else None for inexact in args_inexact]
        const_cts = [None] * num_consts
        if mode == "reverse":
            _, pullback = jax.vjp(lambda *c: primal(*c, *saved_args), *saved_consts)
            full = pullback([c if c is not None else _zeros(shape, dtype)
                             for c, (shape, dtype) in zip(cts, outs)])
            for i in hot:
                const_cts[i] = full[i]
        elif mode == "forward":
            got = _forward_const_cotangents(forward_primal, saved_consts, saved_args, hot,
                                            [c if nz else None for c, nz in zip(cts, nonzero)],
                                            outs)
            for i, v in zip(hot, got):
                const_cts[i] = v
        return tuple(const_cts + arg_cts)

    fun.defvjp(fwd_with_consts, bwd_with_consts, symbolic_zeros=True)
    return fun
'''

HELPERS["_custom_jvp_with_consts"] = '''
def _custom_jvp_with_consts(primal, jvp, *, num_consts, outs, args_inexact, rule,
                            forward_primal=None, variants=None):
    """``jax.custom_jvp(primal)`` for a rule whose first ``num_consts`` arguments are
    closed-over operands.  ``jvp(*c, *x, *t_x)`` returns the outputs then the tangents
    of the inexact outputs (tangents exist for inexact arguments only; None for one
    the user's rule returned as a symbolic zero); ``outs``
    holds each output's (shape, dtype).  ``forward_primal`` is the primal with a
    forward mode through the custom_vjp functions it calls; ``variants`` maps a
    pattern of perturbed inexact arguments to the rule traced for it."""
    fun = jax.custom_jvp(primal)
    forward_primal = forward_primal or primal

    def jvp_with_consts(primals, tangents):
        consts, args = list(primals[:num_consts]), list(primals[num_consts:])
        t_consts, t_args = tangents[:num_consts], tangents[num_consts:]
        hot = tuple(i for i, t in enumerate(t_consts)
                    if type(t) is not jax.custom_derivatives.SymbolicZero)
        mode = _closed_over_mode(rule, "jvp", hot, consts)
        size = sum(int(np.prod(jnp.shape(consts[i]))) for i in hot)
        # A jvp through the primal's while_loop cannot be transposed, so grad would
        # fail: the closed-over tangent is then formed from Jacobian columns.
        by_columns = mode != "none" and not rule["reverse_ok"] and size <= rule["max_forward_size"]
        dense = [_dense(t) for t, inexact in zip(t_args, args_inexact) if inexact]
        pattern = tuple(type(t) is not jax.custom_derivatives.SymbolicZero
                        for t, inexact in zip(t_args, args_inexact) if inexact)
        if by_columns and not any(pattern):
            # No argument is perturbed: the outputs' own derivatives at the next
            # order are formed by forward mode too, not by reverse through the loop.
            res = [*_forward_only(forward_primal)(*consts, *args),
                   *(jnp.zeros(shape, dtype) for shape, dtype in outs
                     if jnp.issubdtype(dtype, jnp.inexact))]
        else:
            res = (variants or {}).get(pattern, jvp)(*consts, *args, *dense)
        it = iter(res[len(outs):])
        t_outs = [next(it) if jnp.issubdtype(dtype, jnp.inexact) else _zeros(shape, dtype)
                  for shape, dtype in outs]
        # None: a tangent the user's rule returned as a symbolic zero.
        t_outs = [jax.custom_derivatives.zero_from_primal(y, symbolic_zeros=True)
                  if t is None else t for t, y in zip(t_outs, res[:len(outs)])]
        if mode != "none":
            def f(*values):
                full = list(consts)
                for i, v in zip(hot, values):
                    full[i] = v
                return forward_primal(*full, *args)
            if by_columns:  # Jacobian columns by forward mode, then a contraction
                extra = _jacobian_tangents(forward_primal, [*consts, *args], hot,
                                           [t_consts[i] for i in hot], outs)
            else:
                _, extra = jax.jvp(f, tuple(consts[i] for i in hot),
                                   tuple(t_consts[i] for i in hot))
            t_outs = [(e if type(t) is jax.custom_derivatives.SymbolicZero else t + e)
                      if jnp.issubdtype(dtype, jnp.inexact) else t
                      for t, e, (_, dtype) in zip(t_outs, extra, outs)]
        return list(res[:len(outs)]), t_outs

    fun.defjvp(jvp_with_consts, symbolic_zeros=True)
    return fun
'''
HELPERS["_vjp_by_pattern"] = '''
def _vjp_by_pattern(fwd, bwd, fwd_variants, bwd_variants, args_inexact, outs_inexact):
    """fwd and bwd of a symbolic-zeros custom_vjp traced per perturbation pattern:
    fwd picks the variant traced for which inexact arguments are perturbed, bwd the
    one for that pattern and which output cotangents are not SymbolicZero; other
    patterns use ``fwd`` / ``bwd``.  The pattern fwd was picked by travels as a
    layout marker's shape (see _layout_marker), not as pytree static data."""
    families = [()] + [family for family in fwd_variants if family]

    def by_pattern_fwd(*primals):
        family = tuple(p.perturbed for p, inexact in zip(primals, args_inexact) if inexact)
        family = family if family in fwd_variants else ()
        out, res = (fwd_variants[family] if family else fwd)(*primals)
        return out, (_layout_marker(families.index(family)), res)

    def by_pattern_bwd(saved, cts):
        marker, res = saved
        family = families[int(np.shape(marker)[1])]
        listed = list(cts) if len(outs_inexact) != 1 else [cts]
        ct_pattern = tuple(type(c) is not jax.custom_derivatives.SymbolicZero
                           for c, inexact in zip(listed, outs_inexact) if inexact)
        rule = bwd_variants.get((family, ct_pattern))
        if rule is None:
            rule = bwd_variants[(family, (True,) * len(ct_pattern))] if family else bwd
        return rule(res, cts)
    return by_pattern_fwd, by_pattern_bwd
'''
HELPERS["_jvp_by_pattern"] = '''
def _jvp_by_pattern(rule, variants, args_inexact):
    """A symbolic-zeros jvp rule traced per perturbation pattern: ``variants`` maps
    which inexact arguments have a tangent that is not a SymbolicZero to the rule
    traced for exactly those; other patterns use ``rule``."""
    def by_pattern(primals, tangents):
        pattern = tuple(type(t) is not jax.custom_derivatives.SymbolicZero
                        for t, inexact in zip(tangents, args_inexact) if inexact)
        return variants.get(pattern, rule)(primals, tangents)
    return by_pattern
'''
HELPERS["_prng_impl"] = '''
def _prng_impl(name):
    """The PRNG implementation JAX registers as ``name`` (a random_seed/random_wrap
    parameter), read from the equation jax.random.key stages for it."""
    return jax.make_jaxpr(lambda: jax.random.key(0, impl=name))().eqns[0].params["impl"]
'''

HELPERS["_copy_semantics"] = '''
def _copy_semantics(name):
    """device_put's copy semantics ``name``, read from the equation jax.device_put
    stages with the matching flags."""
    flags = {"REUSE_INPUT": {}, "ALWAYS_COPY": {"may_alias": False},
             "DONATE_INPUT": {"donate": True}}[name]
    closed = jax.make_jaxpr(lambda x: jax.device_put(x, **flags))(np.float32(0))
    return closed.eqns[0].params["copy_semantics"][0]
'''

HELPERS["_batched_while_loop"] = '''
def _batched_while_loop(cond_fun, body_fun, init):
    """A while loop whose condition is a batch of booleans (what ``jax.vmap`` stages for
    a loop whose exit test depends on the mapped value): it runs while any element is
    active, and each carry keeps its old value where its element has stopped. The
    condition's shape is a prefix of every carry's shape."""
    def step(carry):
        active = cond_fun(carry)
        new = body_fun(carry)
        return tuple(
            lax.select(lax.broadcast_in_dim(active, jnp.shape(n), tuple(range(active.ndim))),
                       n, old)
            for n, old in zip(new, carry))

    return lax.while_loop(lambda carry: jnp.any(cond_fun(carry)), step, tuple(init))
'''

HELPERS["_linear_call_by_pattern"] = '''
def _linear_call_by_pattern(callee, transpose, transposes, residual_args, linear_args):
    """``jax.custom_derivatives.linear_call(callee, transpose, residual_args,
    linear_args)`` whose transposition runs ``transposes[pattern]`` (default
    ``transpose``), ``pattern`` telling which outputs' cotangents are not symbolic
    zeros: the tangent of a symbolic-zeros custom_vjp (vjp-to-jvp), whose bwd was
    traced per pattern of zero cotangents, transposes as JAX would run that bwd.
    A transpose returns None for a cotangent the user's bwd returned as a symbolic
    zero: JAX gets a symbolic zero there too."""
    prim = _primitive("linear_call")
    _transpose_picks_by_pattern(prim)
    res, lin = tuple(residual_args), tuple(linear_args)
    n_res = len(res)

    def as_list(out):
        return list(out) if isinstance(out, (tuple, list)) else [out]

    def shapes(values):
        return [jax.ShapeDtypeStruct(jnp.shape(v), jnp.result_type(v)) for v in values]
    callee_jaxpr, callee_consts = _open_jaxpr(
        lambda *xs: as_list(callee(xs[:n_res], xs[n_res:])), shapes([*res, *lin]))
    out_shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in callee_jaxpr.out_avals]
    single = len(out_shapes) == 1
    made = {}

    def transpose_for(pattern):
        fn = transposes.get(pattern, transpose)
        if fn not in made:
            zeros = []

            def flat(*xs):
                cts = xs[n_res:]
                out = as_list(fn(xs[:n_res], cts[0] if single else tuple(cts)))
                zeros[:] = [o is None for o in out]
                return [jnp.zeros(jnp.shape(x), jnp.result_type(x)) if o is None else o
                        for o, x in zip(out, lin)]
            made[fn] = (*_open_jaxpr(flat, [*shapes(res), *out_shapes]), tuple(zeros))
        return made[fn]
    outs = prim.bind(*callee_consts, *res, *lin, callee=callee_jaxpr,
                     transpose_thunk=_TransposeByPattern(transpose_for),
                     num_callee_consts=len(callee_consts), num_res=n_res)
    return outs[0] if single else tuple(outs)


def _open_jaxpr(fn, shapes):
    """``fn`` staged at ``shapes``: a constant-free ClosedJaxpr taking its constants as
    leading inputs, and the constants (linear_call's operand layout)."""
    closed = jax.make_jaxpr(fn)(*shapes)
    j = closed.jaxpr
    opened = jax.extend.core.Jaxpr((), [*j.constvars, *j.invars], j.outvars, j.eqns, j.effects)
    return jax.extend.core.ClosedJaxpr(opened, ()), list(closed.consts)


class _TransposeByPattern:
    """linear_call's transpose thunk: the transpose for a pattern of nonzero output
    cotangents (``for_cotangents``), every cotangent nonzero until one is picked."""

    def __init__(self, transpose_for, pattern=None):
        self._transpose_for, self._pattern = transpose_for, pattern

    def __call__(self):
        return self._transpose_for(self._pattern)[:2]

    def symbolic_outputs(self):
        """Which cotangents the transpose returned as None (symbolic zeros)."""
        zeros = self._transpose_for(self._pattern)[2]
        return zeros if any(zeros) else ()

    def for_cotangents(self, pattern):
        return _TransposeByPattern(self._transpose_for, tuple(pattern))


def _transpose_picks_by_pattern(prim):
    """Make JAX's transposition of linear_call ask a thunk with ``for_cotangents`` for
    the transpose of the cotangents it is given (which are symbolic zeros)."""
    from jax.interpreters import ad
    rule = ad.primitive_transposes[prim]
    if getattr(rule, "_picks_by_pattern", False):
        return

    def transpose(cts, *args, transpose_thunk, **params):
        pick = getattr(transpose_thunk, "for_cotangents", None)
        if pick is not None:
            transpose_thunk = pick(tuple(type(ct) is not ad.Zero for ct in cts))
        out = list(rule(cts, *args, transpose_thunk=transpose_thunk, **params))
        marks = getattr(transpose_thunk, "symbolic_outputs", None)
        zeros = marks() if marks is not None else ()
        if zeros:  # the linear operands' cotangents come last
            n = len(zeros)
            out[-n:] = [None if z else c for c, z in zip(out[-n:], zeros)]
        return out
    transpose._picks_by_pattern = True
    ad.primitive_transposes[prim] = transpose
'''

HELPER_IMPORTS.update({"_jvp_by_pattern": (), "_vjp_by_pattern": (), "_linear_call_by_pattern": (),
                       "_prng_impl": (), "_copy_semantics": (), "_batched_while_loop": (), "_closed_over": (), "_custom_vjp_with_consts": (),
                       "_custom_jvp_with_consts": (), "_layout_marker": (), "_forward_only": ()})
# A reverse-only custom_vjp rule (passes/vjp_to_jvp.py: its bwd is not linear in
# its cotangent) has as tangent map a value that raises when evaluated or compiled:
# staging it is fine (reverse mode transposes the linear_call around it and runs
# bwd), forward mode raises the rule's one-line message.  The emitted module defines
# its own primitive for it (jaxpr-cc's is not importable there), with the same rules
# as jax_adapter.forward_mode_refused_p, through JAX's public extension API.
HELPERS["_forward_mode_refused"] = '''
class ForwardModeRefusedError(TypeError):
    """Forward-mode differentiation reached a rule that only has a reverse mode."""


_FORWARD_MODE_REFUSED = []


def _forward_mode_refused_primitive():
    if _FORWARD_MODE_REFUSED:
        return _FORWARD_MODE_REFUSED[0]
    import jax.extend.core
    from jax.interpreters import ad, batching, mlir
    prim = jax.extend.core.Primitive("forward_mode_refused")
    prim.multiple_results = True

    def refuse(*_, message, **__):
        raise ForwardModeRefusedError(message)

    def abstract_eval(*_, out_shapes, out_dtypes, **__):
        return [jax.core.ShapedArray(tuple(s), d) for s, d in zip(out_shapes, out_dtypes)]

    def batcher(args, dims, *, out_shapes, **params):
        size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
        outs = prim.bind(*args, out_shapes=tuple((size, *s) for s in out_shapes), **params)
        return outs, [0] * len(outs)

    def jvp(primals, tangents, **params):
        dense = [ad.instantiate_zeros(t) for t in tangents]
        return prim.bind(*primals, **params), prim.bind(*dense, **params)
    prim.def_impl(refuse)
    prim.def_abstract_eval(abstract_eval)
    mlir.register_lowering(prim, refuse)
    batching.primitive_batchers[prim] = batcher
    ad.primitive_jvps[prim] = jvp
    _FORWARD_MODE_REFUSED.append(prim)
    return prim


def _forward_mode_refused(*operands, message, out_shapes, out_dtypes, out_varying=()):
    """Outputs of these shapes and dtypes that raise ``message`` when evaluated or
    compiled: the tangent map of a reverse-only custom_vjp rule."""
    return _forward_mode_refused_primitive().bind(
        *operands, message=message, out_shapes=tuple(out_shapes), out_dtypes=tuple(out_dtypes))
'''
HELPER_IMPORTS["_forward_mode_refused"] = ()

HELPERS["_custom_vmap_call"] = '''
def _custom_vmap_call(call, rule, n_consts, args_tree, out_tree, *operands):
    """``jax.custom_batching.custom_vmap`` of ``call`` with batching rule ``rule``,
    applied to ``operands`` (the values it closes over, then the leaves of its
    arguments): ``call`` takes both flat and returns a bare value for one output."""
    consts, leaves = operands[:n_consts], operands[n_consts:]

    def fun(*args):
        outs = call(*consts, *jax.tree_util.tree_leaves(args))
        outs = outs if out_tree.num_leaves != 1 else (outs,)
        return jax.tree_util.tree_unflatten(out_tree, list(outs))

    batched = jax.custom_batching.custom_vmap(fun)
    batched.def_vmap(rule)
    return jax.tree_util.tree_leaves(batched(*jax.tree_util.tree_unflatten(args_tree, leaves)))
'''
HELPER_IMPORTS["_custom_vmap_call"] = ()

HELPERS["_host_callback"] = '''
def _host_callback(kind, fn, in_tree, result_avals, *operands, **options):
    """``jax.pure_callback`` (``kind`` "pure") or ``io_callback`` ("io") of ``fn``, called
    with its arguments rebuilt from ``operands`` (``in_tree``: its positional and keyword
    arguments) and giving the leaves of its result, of ``result_avals`` (shape, dtype)."""
    def flat_fn(*flat):
        args, kwargs = jax.tree_util.tree_unflatten(in_tree, flat)
        return tuple(jax.tree_util.tree_leaves(fn(*args, **kwargs)))

    shapes = tuple(jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in result_avals)
    if kind == "pure":
        return jax.pure_callback(flat_fn, shapes, *operands, **options)
    from jax.experimental import io_callback
    return io_callback(flat_fn, shapes, *operands, **options)
'''
HELPER_IMPORTS["_host_callback"] = ()

HELPERS["_treedef"] = '''
def _treedef(node):
    """A pytree structure from its nodes: ``"*"`` a leaf, else (type, aux, children)."""
    if node == "*":
        return jax.tree_util.tree_structure(0)
    node_type, aux, children = node
    return jax.tree_util.PyTreeDef.from_node_data_and_children(
        jax.tree_util.default_registry, (node_type, aux), [_treedef(c) for c in children])
'''

HELPERS["_library_instance"] = '''
def _library_instance(cls, state):
    """An instance of a library class with these fields, made without ``__init__``
    (as pickle and tree_unflatten do)."""
    obj = cls.__new__(cls)
    for name, value in state.items():
        object.__setattr__(obj, name, value)
    return obj
'''

HELPERS["_partial"] = '''
def _partial(func, args, keywords):
    return functools.partial(func, *args, **keywords)
'''

HELPERS["_held_jaxpr"] = '''
def _held_jaxpr(fn, n_consts, avals, closed):
    """A jaxpr a library primitive holds as data, staged again from its function: the
    first ``n_consts`` inputs become its constvars, as the library built it."""
    import jax.extend.core
    staged = jax.make_jaxpr(fn)(*[jax.ShapeDtypeStruct(s, d, weak_type=w) for s, d, w in avals])
    if staged.consts:
        raise ValueError("a held jaxpr staged constants of its own")
    j = staged.jaxpr
    dbg = j.debug_info
    if dbg is not None and dbg.arg_names is not None:
        dbg = dbg._replace(arg_names=dbg.arg_names[n_consts:])
    held = jax.extend.core.Jaxpr(j.invars[:n_consts], j.invars[n_consts:], j.outvars, j.eqns,
                                 j.effects, dbg)
    return jax.extend.core.ClosedJaxpr(held, []) if closed else held
'''

HELPER_IMPORTS.update({"_held_jaxpr": (), "_treedef": (), "_library_instance": (), "_partial": ("functools",)})
# Helpers that call other helpers.
HELPER_DEPS = {"_linear_call_by_pattern": ("_bind",),
               "_custom_vjp_with_consts": ("_closed_over", "_dense", "_layout_marker",
                                           "_forward_only"),
               "_vjp_by_pattern": ("_layout_marker",),
               "_custom_jvp_with_consts": ("_closed_over", "_dense", "_forward_only")}


def _top_level_names(source: str) -> set[str]:
    import ast
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


#: Every name a helper binds at module level (a helper's own name, and the classes,
#: constants and functions its text defines beside it): an emitted module reserves
#: them all, so nothing of the program's replaces one.
HELPER_NAMES = frozenset(HELPERS).union(*(_top_level_names(text) for text in HELPERS.values()))
