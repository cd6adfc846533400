"""Per-primitive rules of the Python source backend.

A rule turns one equation into one call of JAX's public API that stages exactly
that equation again: the same primitive with the same parameters (the test suite
re-traces every emitted corpus program and compares the printed IR).  A rule
returns a :class:`Call`, or ``None`` when this particular equation has a parameter
value its public spelling cannot express; the driver then uses the default rule, a
``_bind`` of the primitive by name, marked in the source.

Rules see the equation through a context (``python_source._EqnContext``):
``ctx.ins`` (source of each operand), ``ctx.param(v)``, ``ctx.dtype(d)``, and the
function-building helpers that control-flow rules use for nested regions.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from ..ir.layouts import loop_of, structural_params
from ..ir.value import is_literal


@dataclasses.dataclass
class Call:
    """``func(*args, **kwargs)``; ``multiple`` when it returns a sequence of results
    even for a single result."""
    func: str
    args: list[str]
    kwargs: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    multiple: bool = False
    comment: str | None = None
    hint: str | None = None  # a name for the results, when the values have none


Rule = Callable[[Any, Any], "Call | None"]
RULES: dict[str, Rule] = {}
# Rules may fold the single-use producer of an operand into their own call (lax.cond
# stages its own predicate conversion); ``FOLDS[name](eqn)`` names those producers.
FOLDS: dict[str, Callable[[Any], list]] = {}

NO_SPELLING = "jaxpr-cc: no public spelling"


def rule(*names: str):
    def register(fn: Rule) -> Rule:
        for n in names:
            RULES[n] = fn
        return fn
    return register


class _Spec:
    """Parameter handling of a simple rule.

    ``pos``: params passed positionally after the operands; ``kw``: passed by keyword
    (``public_name`` may differ); ``omit``: params left out when equal to the given
    default (the public function supplies that value); ``derived``: params the public
    function computes from its operands, never passed.  An equation with any other
    param, or with an ``omit`` param that differs from its default, has no spelling
    through this function and goes to the default rule.
    """

    def __init__(self, func, pos=(), kw=(), omit=None, derived=(), nin=None, multiple=False,
                 operands_as_sequence=False, operands_after_params=False, elides=None):
        self.func = func
        self.pos = tuple(pos)
        self.kw = tuple((k, k) if isinstance(k, str) else k for k in kw)
        self.omit = dict(omit or {})
        self.derived = frozenset(derived)
        self.nin = nin
        self.multiple = multiple
        self.operands_as_sequence = operands_as_sequence
        self.operands_after_params = operands_after_params
        # elides(eqn): the public function would return its operand unchanged for this
        # equation (no equation staged), so it cannot spell it.
        self.elides = elides

    def __call__(self, ctx, eqn) -> Call | None:
        params = eqn.params
        known = set(self.pos) | {k for k, _ in self.kw} | set(self.omit) | self.derived
        if set(params) - known:
            return None
        if self.nin is not None and len(eqn.inputs) != self.nin:
            return None
        for k, default in self.omit.items():
            if k in params and not _same(params[k], default):
                return None
        if self.elides is not None and self.elides(eqn):
            return None
        operands = list(ctx.ins)
        if self.operands_as_sequence:
            operands = ["(" + ", ".join(operands) + ("," if len(operands) == 1 else "") + ")"]
        pos = [ctx.param(params[k]) for k in self.pos]
        args = pos + operands if self.operands_after_params else operands + pos
        kwargs = []
        for k, public in self.kw:
            if k in params and params[k] is not None:
                kwargs.append((public, ctx.param(params[k])))
        return Call(self.func, args, kwargs, multiple=self.multiple)


def _same(a, b) -> bool:
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:
        return False


def simple(name: str, func: str, **spec) -> None:
    RULES[name] = _Spec(func, **spec)


def _same_type(eqn) -> bool:
    """Operand and result have the same shape, dtype and weak type."""
    a, b = eqn.inputs[0].aval, eqn.outputs[0].aval
    return (a.shape == b.shape and a.dtype == b.dtype
            and getattr(a, "weak_type", False) == getattr(b, "weak_type", False))


def _identity_transpose(eqn) -> bool:
    return tuple(eqn.params["permutation"]) == tuple(range(len(eqn.params["permutation"])))


# ------------------------------------------------------------ elementwise
for _name in ("abs", "neg", "sign", "floor", "ceil", "is_finite", "population_count",
              "real", "imag", "erf_inv", "erf", "erfc", "lgamma", "digamma", "square",
              "clz", "asinh", "acosh", "atanh", "sinh", "cosh", "asin", "acos", "atan",
              "stop_gradient"):
    simple(_name, f"lax.{_name}", nin=1)
simple("not", "lax.bitwise_not", nin=1)
simple("conj", "lax.conj", nin=1, derived=("input_dtype",))
for _name in ("sin", "cos", "tan", "exp", "exp2", "log", "log1p", "expm1", "tanh",
              "logistic", "sqrt", "rsqrt", "cbrt"):
    simple(_name, f"lax.{_name}", nin=1, kw=("accuracy",))
simple("round", "lax.round", nin=1, pos=("rounding_method",))
for _name in ("add", "sub", "div", "rem", "pow", "max", "min", "atan2", "nextafter",
              "eq", "ne", "lt", "le", "gt", "ge", "shift_left", "shift_right_logical",
              "shift_right_arithmetic", "complex", "igamma", "igammac", "polygamma", "zeta"):
    simple(_name, f"lax.{_name}", nin=2)
simple("mul", "lax.mul", nin=2, kw=("out_dtype",))
simple("and", "lax.bitwise_and", nin=2)
simple("or", "lax.bitwise_or", nin=2)
simple("xor", "lax.bitwise_xor", nin=2)
simple("integer_pow", "lax.integer_pow", nin=1, pos=("y",))
simple("select_n", "lax.select_n")
simple("clamp", "lax.clamp", nin=3)
simple("convert_element_type", "lax.convert_element_type", nin=1, pos=("new_dtype",),
       omit={"weak_type": False, "sharding": None}, elides=_same_type)
simple("bitcast_convert_type", "lax.bitcast_convert_type", nin=1, pos=("new_dtype",))
simple("reduce_precision", "lax.reduce_precision", nin=1, pos=("exponent_bits", "mantissa_bits"))

# ------------------------------------------------------------ structural
simple("broadcast_in_dim", "lax.broadcast_in_dim", nin=1, pos=("shape", "broadcast_dimensions"),
       kw=(("sharding", "out_sharding"),), elides=_same_type)
simple("reshape", "lax.reshape", nin=1, pos=("new_sizes", "dimensions"),
       kw=(("sharding", "out_sharding"),), elides=_same_type)
simple("iota", "lax.broadcasted_iota", nin=0, pos=("dtype", "shape", "dimension"),
       kw=(("sharding", "out_sharding"),))
simple("squeeze", "lax.squeeze", nin=1, pos=("dimensions",))
simple("transpose", "lax.transpose", nin=1, pos=("permutation",), elides=_identity_transpose)
simple("rev", "lax.rev", nin=1, pos=("dimensions",))
simple("slice", "lax.slice", nin=1, pos=("start_indices", "limit_indices", "strides"))
simple("pad", "lax.pad", nin=2, pos=("padding_config",))
simple("concatenate", "lax.concatenate", pos=("dimension",), operands_as_sequence=True)
simple("split", "lax.split", nin=1, pos=("sizes", "axis"), multiple=True)
simple("sort", "lax.sort", kw=("dimension", "is_stable", "num_keys"), multiple=True,
       operands_as_sequence=True)

# ------------------------------------------------------------- reductions
simple("reduce_sum", "lax.reduce_sum", nin=1, pos=("axes",), kw=("out_sharding",))
for _name in ("reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or",
              "reduce_xor"):
    simple(_name, f"lax.{_name}", nin=1, pos=("axes",), omit={"out_sharding": None})
for _name in ("cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp"):
    simple(_name, f"lax.{_name}", nin=1, kw=("axis", "reverse"))


@rule("argmax", "argmin")
def _argminmax(ctx, eqn):
    p = eqn.params
    if set(p) != {"axes", "index_dtype"} or len(p["axes"]) != 1:
        return None
    return Call(f"lax.{eqn.prim.name}", [ctx.ins[0], ctx.param(p["axes"][0]),
                                          ctx.dtype(p["index_dtype"])])


# ---------------------------------------------------------- linear algebra
simple("dot_general", "lax.dot_general", nin=2, pos=("dimension_numbers",),
       kw=("precision", "preferred_element_type", "out_sharding"))
simple("conv_general_dilated", "lax.conv_general_dilated", nin=2,
       pos=("window_strides", "padding"),
       kw=("lhs_dilation", "rhs_dilation", "dimension_numbers", "feature_group_count",
           "batch_group_count", "precision", "preferred_element_type", "out_sharding"))
# lax.fft wraps the primitive in a jax.jit of its own: fft goes through the default rule.

# --------------------------------------------------------------- indexing
simple("gather", "lax.gather", nin=2, pos=("dimension_numbers", "slice_sizes"),
       kw=("unique_indices", "indices_are_sorted", "mode", "fill_value"))
for _name, _func in (("scatter", "lax.scatter"), ("scatter-add", "lax.scatter_add"),
                     ("scatter-mul", "lax.scatter_mul"), ("scatter-min", "lax.scatter_min"),
                     ("scatter-max", "lax.scatter_max"), ("scatter-sub", "lax.scatter_sub")):
    # update_jaxpr/update_consts are rebuilt by the lax function from its combiner.
    simple(_name, _func, nin=3, pos=("dimension_numbers",),
           kw=("indices_are_sorted", "unique_indices", "mode"),
           derived=("update_jaxpr", "update_consts"))


@rule("dynamic_slice")
def _dynamic_slice(ctx, eqn):
    if set(eqn.params) != {"slice_sizes"}:
        return None
    x, *idx = ctx.ins
    # The IR already holds any negative-index normalisation as separate equations.
    return Call("lax.dynamic_slice", [x, _seq(idx), ctx.param(eqn.params["slice_sizes"])],
                [("allow_negative_indices", "False")])


@rule("dynamic_update_slice")
def _dynamic_update_slice(ctx, eqn):
    if eqn.params:
        return None
    x, upd, *idx = ctx.ins
    return Call("lax.dynamic_update_slice", [x, upd, _seq(idx)],
                [("allow_negative_indices", "False")])


def _seq(items: list[str]) -> str:
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


# ----------------------------------------------------------------- random
def _per_key(eqn, func: str, extra: str = "") -> str | None:
    """``func`` applied to each key of the equation's key array: the primitives take
    a batch of keys (``jax.vmap`` over per-example keys stages one), ``jax.random``'s
    functions a single key.  Other operands (fold_in's messages) broadcast against
    the keys from the right; None when one does so through a size-1 axis."""
    keys = eqn.inputs[0].aval.shape
    shapes = [a.aval.shape for a in eqn.inputs]
    if any(tuple(keys[len(keys) - len(s):]) != tuple(s) for s in shapes if s):
        return None
    names = ", ".join(f"k{i}" for i in range(len(shapes)))
    if not keys:
        return f"(lambda {names}: {func}({names}{extra}))" if extra else func
    src = f"lambda {names}: {func}({names}{extra})"
    for level in range(len(keys) - 1, -1, -1):  # innermost first
        axes = tuple(0 if len(s) >= len(keys) - level else None for s in shapes)
        src = f"jax.vmap({src})" if all(a == 0 for a in axes) else \
            f"jax.vmap({src}, in_axes={axes!r})"
    return src


@rule("random_bits")
def _random_bits(ctx, eqn):
    p = eqn.params
    if set(p) != {"bit_width", "shape"}:
        return None
    shape, dtype = ctx.param(tuple(p["shape"])), f"np.uint{p['bit_width']}"
    if eqn.inputs[0].aval.ndim:
        return Call(_per_key(eqn, "jax.random.bits", f", {shape}, {dtype}"), [ctx.ins[0]])
    return Call("jax.random.bits", [ctx.ins[0], shape, dtype])


@rule("random_split")
def _random_split(ctx, eqn):
    if set(eqn.params) != {"shape"}:
        return None
    shape = ctx.param(tuple(eqn.params["shape"]))
    if eqn.inputs[0].aval.ndim:
        return Call(_per_key(eqn, "jax.random.split", f", {shape}"), [ctx.ins[0]])
    return Call("jax.random.split", [ctx.ins[0], shape])


@rule("random_fold_in")
def _random_fold_in(ctx, eqn):
    if eqn.params:
        return None
    func = _per_key(eqn, "jax.random.fold_in")
    return None if func is None else Call(func, list(ctx.ins))


@rule("random_wrap")
def _random_wrap(ctx, eqn):
    if set(eqn.params) != {"impl"}:
        return None
    # A PRNG implementation goes by its registered name (``str(impl)`` is its short
    # tag, e.g. 'fry', which jax.random does not accept).
    return Call("jax.random.wrap_key_data", [ctx.ins[0]],
                [("impl", repr(eqn.params["impl"].name))])


@rule("random_seed")
def _random_seed(ctx, eqn):
    seed = eqn.inputs[0].aval
    # jax.random.key stages random_seed alone only for a scalar int32 seed.
    if set(eqn.params) != {"impl"} or seed.shape != () or seed.dtype != np.int32:
        return None
    return Call("jax.random.key", [ctx.ins[0]], [("impl", repr(eqn.params["impl"].name))])


@rule("device_put")
def _device_put(ctx, eqn):
    p = eqn.params
    if set(p) != {"devices", "srcs", "copy_semantics"}:
        return None
    kinds = {c.name for c in p["copy_semantics"]}
    if len(kinds) != 1:
        return None
    # jax.device_put's flags for each copy semantics: REUSE_INPUT is the default.
    flags = {"REUSE_INPUT": [], "ALWAYS_COPY": [("may_alias", "False")],
             "DONATE_INPUT": [("donate", "True")]}.get(kinds.pop())
    if flags is None:
        return None
    ins = list(ctx.ins)
    devices = _placements_source(ctx, p["devices"])
    srcs = _placements_source(ctx, p["srcs"])
    if devices is False or srcs is False:
        return None
    args = [ins[0] if len(ins) == 1 else "(" + ", ".join(ins) + ")"]
    if devices is not None:
        args.append(devices)
    if srcs is not None:
        flags = [("src", srcs), *flags]
    return Call("jax.device_put", args, flags, multiple=len(ins) != 1)


def _placements_source(ctx, placements) -> str | None | bool:
    """device_put's ``device``/``src`` argument for one placement per operand:
    None when every one is None (the argument is left out), False when it has no
    spelling (a mix of None and placements: jax.device_put takes a pytree prefix,
    in which None is an empty subtree)."""
    if all(d is None for d in placements):
        return None
    if any(d is None for d in placements):
        return False
    spelled = []
    for d in placements:
        text = _placement_source(ctx, d)
        if text is None:
            return False
        spelled.append(text)
    return spelled[0] if len(spelled) == 1 else "(" + ", ".join(spelled) + ")"


def _placement_source(ctx, placement) -> str | None:
    """A device as ``_device(platform, id)``, found again in ``jax.devices()`` when
    the module runs (a Device object has no source form); a single-device
    sharding around it; any other placement (a NamedSharding, a memory space) as
    its parameter spelling; None when it has none."""
    import jax

    from .python_spelling import SpellingError
    from .python_text import PythonEmitError
    if isinstance(placement, jax.Device):
        ctx.emitter.use_helper("_device")
        return f"_device({placement.platform!r}, {int(placement.id)})"
    if isinstance(placement, jax.sharding.SingleDeviceSharding):
        (device,) = placement.device_set
        return (f"jax.sharding.SingleDeviceSharding({_placement_source(ctx, device)}, "
                f"memory_kind={placement.memory_kind!r})")
    try:
        return ctx.param(placement)
    except (SpellingError, PythonEmitError):
        return None


@rule("random_unwrap")
def _random_unwrap(ctx, eqn):
    if eqn.params:
        return None
    return Call("jax.random.key_data", [ctx.ins[0]])


# ---------------------------------------------------------------- effects
@rule("debug_print")
def _debug_print(ctx, eqn):
    p = eqn.params
    tree = p.get("in_tree")
    if tree is None or p.get("static_args") or p.get("logging_record") is not None \
            or p.get("partitioned"):
        return None
    args_tree, kwargs_tree = tree.children()
    _, keys = kwargs_tree.node_data()
    if args_tree.num_leaves + kwargs_tree.num_leaves != len(eqn.inputs) or any(
            c.num_leaves != 1 or c.num_nodes != 1 for c in args_tree.children() +
            kwargs_tree.children()):
        return None
    if not all(isinstance(k, str) and k.isidentifier() for k in keys or ()):
        return None
    # jax.debug.print captures numpy's print options when it is traced; the public
    # call can only reproduce options equal to the ones in force at emission time.
    current = tuple(np.get_printoptions().items())
    if p.get("np_printoptions") is not None and tuple(p["np_printoptions"]) != current:
        return None
    n_pos = args_tree.num_leaves
    kwargs = [(k, v) for k, v in zip(keys or (), ctx.ins[n_pos:])]
    if p.get("ordered"):
        kwargs.insert(0, ("ordered", "True"))
    return Call("jax.debug.print", [repr(p["fmt"])] + list(ctx.ins[:n_pos]), kwargs)


@rule("shard_alike")
def _shard_alike(ctx, eqn):
    if eqn.params:
        return None
    return Call("jax.experimental.shard_alike.shard_alike", list(ctx.ins), multiple=True)


@rule("pure_callback")
def _pure_callback(ctx, eqn):
    if set(eqn.params) - {"callback", "result_avals", "sharding", "vmap_method"}:
        return None
    return ctx.host_callback(eqn, "pure")


@rule("io_callback")
def _io_callback(ctx, eqn):
    if set(eqn.params) - {"callback", "result_avals", "sharding", "ordered"}:
        return None
    return ctx.host_callback(eqn, "io")


@rule("debug_callback")
def _debug_callback(ctx, eqn):
    return ctx.debug_callback(eqn)


# ---------------------------------------------------------------- sharding
@rule("sharding_constraint")
def _sharding_constraint(ctx, eqn):
    p = eqn.params
    if p.get("layout") is not None or p.get("unconstrained_dims"):
        return None
    return Call("jax.lax.with_sharding_constraint", [ctx.ins[0], ctx.param(p["sharding"])])


@rule("pvary")
def _pvary(ctx, eqn):
    if set(eqn.params) != {"axes"} or len(eqn.inputs) != 1:
        return None
    return Call("lax.pcast", [ctx.ins[0], ctx.param(tuple(eqn.params["axes"]))],
                [("to", "'varying'")])


@rule("psum_invariant")
def _psum_invariant(ctx, eqn):
    if set(eqn.params) != {"axes"} or len(eqn.inputs) != 1:
        return None
    return Call("lax.psum", [ctx.ins[0], ctx.param(tuple(eqn.params["axes"]))])


@rule("name")
def _checkpoint_name(ctx, eqn):
    # jax.ad_checkpoint.checkpoint_name: a remat policy made from names reads it.
    if set(eqn.params) != {"name"} or len(eqn.inputs) != 1:
        return None
    return Call("jax.ad_checkpoint.checkpoint_name", [ctx.ins[0], repr(eqn.params["name"])])


# ----------------------------------------------------------- control flow
def _cond_folds(eqn) -> list:
    """lax.cond stages ``convert_element_type(pred, int32)`` itself; lax.switch stages
    ``clamp(0, index, n - 1)``: fold those producers into the call."""
    index = eqn.inputs[0]
    if is_literal(index):
        return []
    producer = index.producer
    region = eqn.region
    if producer is None or producer is region.entry or not hasattr(producer, "prim"):
        return []
    if [c for c, _ in region.users(index)] != [eqn]:
        return []
    if producer.prim.name == "platform_index":
        # lax.platform_dependent stages platform_index then this cond.
        same = producer.params.get("platforms") == eqn.params.get("branches_platforms")
        return [producer] if same and set(producer.params) == {"platforms"} else []
    n = len(eqn.params["branches"])
    if (n == 2 and producer.prim.name == "convert_element_type"
            and np.dtype(producer.inputs[0].aval.dtype) == np.bool_
            and producer.params.get("weak_type") is False
            and producer.params.get("sharding") is None):
        return [producer]
    if producer.prim.name == "clamp":
        lo, idx, hi = producer.inputs
        if (is_literal(lo) and is_literal(hi) and int(lo.val) == 0 and int(hi.val) == n - 1
                and not is_literal(idx) and np.dtype(idx.aval.dtype) == np.int32
                and not getattr(idx.aval, "weak_type", False)):
            return [producer]
    return []


FOLDS["cond"] = _cond_folds


@rule("cond")
def _cond(ctx, eqn):
    branches = eqn.params["branches"]
    operands = ctx.ins[1:]
    folded = ctx.folded
    if set(eqn.params) == {"branches", "branches_platforms"}:
        if not (folded and folded[0].prim.name == "platform_index"):
            return None
        kwargs = []
        for i, (branch, platforms) in enumerate(zip(branches, eqn.params["branches_platforms"])):
            name = ctx.explicit_function(branch, f"branch_{i}")
            kwargs += [(p, name) for p in platforms] if platforms is not None \
                else [("default", name)]
        return Call("lax.platform_dependent", list(operands), kwargs)
    if set(eqn.params) != {"branches"}:
        return None
    if folded and folded[0].prim.name == "convert_element_type":
        names = [ctx.explicit_function(branches[0], "false_fun"),
                 ctx.explicit_function(branches[1], "true_fun")]
        pred = ctx.atom(folded[0].inputs[0])
        return Call("lax.cond", [pred, names[1], names[0], *operands])
    names = [ctx.explicit_function(b, f"branch_{i}") for i, b in enumerate(branches)]
    index = ctx.atom(folded[0].inputs[1]) if folded else ctx.ins[0]
    return Call("lax.switch", [index, "[" + ", ".join(names) + "]", *operands])


@rule("while")
def _while(ctx, eqn):
    if set(eqn.params) - structural_params(eqn):
        return None
    loop = loop_of(eqn)
    (cond_slot, cond_group), = loop.tests
    ins = eqn.inputs
    cond_consts = ins[loop.groups[cond_group].start:loop.groups[cond_group].stop]
    step_group = loop.groups[loop.step_group]
    body_consts = ins[step_group.start:step_group.stop]
    init = ins[loop.carry_start:loop.carry_start + loop.n_carry]
    cond = cond_slot.region(eqn)
    cond_fn = ctx.carry_function(cond, "cond_fun", cond_consts, [len(init)],
                                 result="single")
    body_fn = ctx.carry_function(loop.step.region(eqn), "body_fun", body_consts, [len(init)],
                                 result=[len(init)])
    if cond.outvars[0].aval.shape:
        # vmap stages a batched exit test, which lax.while_loop does not accept.
        ctx.emitter.use_helper("_batched_while_loop")
        return Call("_batched_while_loop", [cond_fn, body_fn, ctx.seq(init)], multiple=True)
    return Call("lax.while_loop", [cond_fn, body_fn, ctx.seq(init)], multiple=True)


@rule("reduce")
def _reduce(ctx, eqn):
    # A user-written reducer (JAX's monoid ones are reduce_sum etc.): operands and
    # initial values go in as tuples, so the reducer takes and returns tuples whatever
    # their number, and lax.reduce stages this same primitive.
    p = eqn.params
    if set(p) != {"jaxpr", "dimensions"}:
        return None
    n = len(eqn.inputs) // 2
    reducer = ctx.carry_function(p["jaxpr"], "reducer", [], [n, n], result=[n])
    return Call("lax.reduce", [ctx.seq(eqn.inputs[:n]), ctx.seq(eqn.inputs[n:]), reducer,
                               ctx.param(p["dimensions"])], multiple=True)


_WINDOW_OPTIONS = ("window_dimensions", "window_strides", "padding", "base_dilation",
                   "window_dilation")


@rule("reduce_window")
def _reduce_window(ctx, eqn):
    p = eqn.params
    # (A reducer closing over an array cannot be traced in JAX 0.10: its consts
    # param must be hashable.)
    if set(p) != {"jaxpr", "consts", *_WINDOW_OPTIONS} or p["consts"]:
        return None
    n = len(eqn.inputs) // 2
    reducer = ctx.carry_function(p["jaxpr"], "reducer", [], [n, n], result=[n])
    return Call("lax.reduce_window",
                [ctx.seq(eqn.inputs[:n]), ctx.seq(eqn.inputs[n:]), reducer,
                 *(ctx.param(p[k]) for k in _WINDOW_OPTIONS)], multiple=True)


@rule("scan")
def _scan(ctx, eqn):
    p = eqn.params
    # The layout covers the body, its counts and the per-operand linearity (which
    # lax.scan recomputes); these are the options lax.scan takes.
    if set(p) - structural_params(eqn) - {"length", "reverse", "unroll", "_split_transpose"} \
            or p.get("_split_transpose"):
        return None
    loop = loop_of(eqn)
    ncarry = loop.n_carry
    ins = eqn.inputs
    group = loop.groups[loop.step_group]
    consts = ins[group.start:group.stop]
    init = ins[loop.carry_start:loop.carry_start + ncarry]
    xs = ins[loop.xs.start:loop.xs.stop]
    body = ctx.carry_function(loop.step.region(eqn), "scan_body", consts, [len(init), len(xs)],
                              result=[ncarry, len(eqn.outputs) - ncarry])
    kwargs = [("length", ctx.param(p["length"]))]
    if p["reverse"]:
        kwargs.append(("reverse", "True"))
    if p["unroll"] != 1:
        kwargs.append(("unroll", ctx.param(p["unroll"])))
    call = Call("lax.scan", [body, ctx.seq(init), ctx.seq(xs) if xs else "None"], kwargs)
    ctx.unpack = [ncarry, len(eqn.outputs) - ncarry]
    return call


_JIT_DEFAULTS = {"inline": False, "keep_unused": False, "compiler_options_kvs": ()}


@rule("jit", "pjit")
def _jit(ctx, eqn):
    p = eqn.params
    known = {"jaxpr", "name", "in_shardings", "out_shardings", "in_layouts", "out_layouts",
             "donated_invars", "ctx_mesh", "keep_unused", "inline", "compiler_options_kvs"}
    if set(p) - known:
        return None
    if any(x is not None for x in p.get("in_layouts", ())) or \
            any(x is not None for x in p.get("out_layouts", ())):
        return None
    fn = ctx.explicit_function(p["jaxpr"], p.get("name") or "jitted", exact_name=p.get("name"))
    hint = p.get("name")
    kwargs = []
    if p.get("inline"):
        kwargs.append(("inline", "True"))
    if p.get("keep_unused"):
        kwargs.append(("keep_unused", "True"))
    donated = tuple(i for i, d in enumerate(p.get("donated_invars", ())) if d)
    if donated:
        kwargs.append(("donate_argnums", ctx.param(donated)))
    for key in ("in_shardings", "out_shardings"):
        shardings = p.get(key, ())
        if any(not _unspecified(s) for s in shardings):
            if any(_unspecified(s) for s in shardings):
                return None
            # The function takes positional arguments and returns a bare value for one
            # output, so shardings follow that structure.
            if key == "out_shardings" and len(shardings) == 1:
                kwargs.append((key, ctx.param(shardings[0])))
            else:
                kwargs.append((key, ctx.param(tuple(shardings))))
    if p.get("compiler_options_kvs"):
        kwargs.append(("compiler_options", ctx.param(dict(p["compiler_options_kvs"]))))
    return Call(f"jax.jit({fn}{''.join(f', {k}={v}' for k, v in kwargs)})", list(ctx.ins),
                hint=hint)


def _unspecified(s) -> bool:
    return type(s).__name__ == "UnspecifiedValue"


@rule("composite")
def _composite(ctx, eqn):
    from .. import jax_adapter as jx
    p = eqn.params
    if set(p) - {"name", "attributes", "version", "jaxpr"}:
        return None
    # The decomposition was traced with the attributes bound (they are constants of
    # its body); lax.composite passes them to it again, so it takes and drops them.
    fn = ctx.explicit_function(p["jaxpr"], "decomposition")
    attributes = jx.composite_attributes(p["attributes"])
    call = f"lax.composite(lambda *args, **_: {fn}(*args), {p['name']!r}, {int(p['version'])})"
    if not attributes:
        return Call(call, list(ctx.ins))
    kwargs = "{" + ", ".join(f"{k!r}: {_attribute_source(ctx, v)}"
                             for k, v in attributes.items()) + "}"
    return Call(f"(lambda *args: {call}(*args, **{kwargs}))", list(ctx.ins))


def _attribute_source(ctx, value) -> str:
    """A composite attribute, its type kept: the attribute's MLIR type follows it
    (``np.int8(-3)`` is ``i8``, a Python int ``i64``)."""
    from .python_spelling import array_literal_source
    if isinstance(value, np.generic):
        return f"{array_literal_source(np.asarray(value))}[()]"
    if isinstance(value, np.dtype):  # a dtype, not its scalar type
        return f"np.dtype({ctx.dtype(value)})"
    if type(value) in (tuple, list):
        items = [_attribute_source(ctx, v) for v in value]
        return f"({', '.join(items)}{',' if len(items) == 1 else ''})" if type(value) is tuple \
            else f"[{', '.join(items)}]"
    if type(value) is dict:
        return "{" + ", ".join(f"{k!r}: {_attribute_source(ctx, v)}" for k, v in value.items()) + "}"
    return ctx.param(value)


@rule("remat2", "checkpoint")
def _remat(ctx, eqn):
    p = eqn.params
    # ``differentiated`` (the recomputation JAX stages when it differentiates a
    # checkpoint inside the traced function) has no public spelling: it only tells
    # JAX's lowering the block is already differentiated; values and derivatives
    # of the block are those of jax.checkpoint of the same function.
    if set(p) - {"jaxpr", "prevent_cse", "differentiated", "policy"}:
        return None
    policy = ctx.checkpoint_policy(p.get("policy"))
    if policy is False:
        return None
    fn = ctx.explicit_function(p["jaxpr"], "checkpointed")
    kwargs = [] if p.get("prevent_cse", True) else [("prevent_cse", "False")]
    if policy is not None:
        kwargs.append(("policy", policy))
    return Call(f"jax.checkpoint({fn}{''.join(f', {k}={v}' for k, v in kwargs)})", list(ctx.ins))


@rule("shard_map")
def _shard_map(ctx, eqn):
    p = eqn.params
    if set(p) - {"mesh", "in_specs", "out_specs", "jaxpr", "check_vma", "newly_manual_axes",
                 "manual_axes", "auto"}:
        return None
    mesh = p["mesh"]
    manual = p.get("newly_manual_axes", p.get("manual_axes"))
    fn = ctx.explicit_function(p["jaxpr"], "shard_body")
    out_specs = tuple(p["out_specs"])
    kwargs = [("mesh", ctx.param(mesh)), ("in_specs", ctx.param(tuple(p["in_specs"]))),
              ("out_specs", ctx.param(out_specs[0] if len(out_specs) == 1 else out_specs))]
    if manual is not None and frozenset(manual) != frozenset(mesh.axis_names):
        kwargs.append(("axis_names", ctx.param(frozenset(manual))))
    if not p.get("check_vma", True):
        kwargs.append(("check_vma", "False"))
    # The body returns a bare array for one output, so out_specs is then a bare spec.
    return Call(f"jax.shard_map({fn}{''.join(f', {k}={v}' for k, v in kwargs)})", list(ctx.ins))


# --------------------------------------------------------- custom rules
@rule("custom_jvp_call")
def _custom_jvp(ctx, eqn):
    return ctx.custom_jvp(eqn)


@rule("custom_vjp_call", "custom_vjp_call_jaxpr")
def _custom_vjp(ctx, eqn):
    return ctx.custom_vjp(eqn)


@rule("custom_vmap_call")
def _custom_vmap(ctx, eqn):
    return ctx.custom_vmap(eqn)


@rule("custom_linear_solve")
def _custom_linear_solve(ctx, eqn):
    return ctx.custom_linear_solve(eqn)


@rule("linear_call")
def _linear_call(ctx, eqn):
    return ctx.linear_call(eqn)


@rule("jaxpr_cc_forward_mode_refused")
def _forward_mode_refused(ctx, eqn):
    # The tangent map of a reverse-only custom_vjp rule (passes/vjp_to_jvp.py): the
    # module's own copy of the primitive (python_text's helper).
    from .python_text import PythonEmitError, tuple_src
    p = eqn.params
    if any(p.get("out_varying") or ()):
        raise PythonEmitError(f"{ctx._where()}: a reverse-only rule inside shard_map (outputs "
                              f"varying over manual axes) has no source form; emit with "
                              f"forward_mode=False")
    ctx.emitter.use_helper("_forward_mode_refused")
    shapes = tuple_src([repr(tuple(int(d) for d in s)) for s in p["out_shapes"]])
    dtypes = tuple_src([ctx.dtype(d) for d in p["out_dtypes"]])
    return Call("_forward_mode_refused", list(ctx.ins),
                [("message", repr(p["message"])), ("out_shapes", shapes), ("out_dtypes", dtypes)],
                multiple=True)
