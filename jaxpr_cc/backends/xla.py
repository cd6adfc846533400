"""XLA backend: compile a Program into an :class:`Executable`; save and load them.

``compile(program)`` emits the program's jaxpr, lowers it with ``jax.jit`` at the
program's argument types and compiles it with XLA right away.  The hoisted
parameters (``program.params``) are inputs of the compiled computation, bound to
the executable: ``with_params`` swaps them without recompiling.

Saved executables hold the program as ``jax.export`` serialized it (versioned
StableHLO) plus data only; see :mod:`jaxpr_cc.backends.xla_archive`.  Loading
compiles at load time.
"""
from __future__ import annotations

import functools
import re
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
from jax import tree_util
from jax.experimental.layout import Format

from ..ir.calling_convention import check_argument_types, layout_in_type
from ..ir import program_services
from ..ir.program import Program
from .. import jax_adapter as jx
from ..jax_adapter import (closed_over_ref_inputs, compiled_argument_shardings,
                           compiled_fast_call, compiled_result_shardings, jaxpr_as_fun,
                           named_sharding_from_hlo)
from . import xla_archive
from .xla_archive import LoadError, SaveError

__all__ = ["Executable", "LoadError", "SaveError", "compile", "compile_flat", "emit_function",
           "is_executable_file", "load_executable", "save_executable"]

TEXT_KINDS = ("stablehlo", "hlo")


# ------------------------------------------------------------------- emission
def emit_function(program: Program, *, forward_mode: bool = False) -> Callable[..., list]:
    """The program as ``f(*params, *arg_leaves) -> list of output leaves``;
    ``forward_mode``: with forward mode through its custom_vjp rules
    (``passes.vjp_to_jvp.forward_mode_jaxpr``)."""
    eval_closed = jaxpr_as_fun(program_services.forward_mode_jaxpr(program) if forward_mode
                               else program.to_jaxpr())

    def flat_fun(*flat):
        return eval_closed(*flat)
    _name_function(flat_fun, program.name)
    return flat_fun


def _name_function(fun, name: str) -> None:
    # jax.jit names the XLA module after the function ("jit_<name>").
    fun.__name__ = fun.__qualname__ = re.sub(r"\W", "_", name) or "program"


def _specs(avals, weak_types=None) -> list:
    if weak_types is None:
        weak_types = [getattr(a, "weak_type", False) for a in avals]
    return [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=w, **_typed_sharding(a))
            for a, w in zip(avals, weak_types)]


def _typed_sharding(aval) -> dict:
    """``{"sharding": ...}`` when ``aval``'s type carries a sharding (a mesh set with
    ``jax.set_mesh`` and Explicit axes), so the program is lowered at the sharded
    types it was traced at; else ``{}``."""
    sharding = getattr(aval, "sharding", None)
    if sharding is None or sharding.mesh.empty:
        return {}
    return {"sharding": sharding}


def _lowering_specs(program: Program, avals, in_flat) -> list:
    """One ShapeDtypeStruct per compiled input.  An input whose type carries a
    mesh (it was traced from an array sharded over a mesh, or under jax.set_mesh)
    is lowered at a concrete sharding of that mesh: the one it is placed with,
    else the context mesh's (jax.set_mesh) at the traced spec.  JAX cannot lower
    an abstract mesh on its own."""
    context = jax.sharding.get_mesh()
    # Concrete meshes the program's other inputs are placed on (its saved argument
    # shardings): a parameter typed on the same abstract mesh but not placed (a
    # file written before values kept their sharding) is lowered on that mesh.
    known = [s.mesh for s in in_flat if isinstance(s, jax.sharding.NamedSharding)
             and isinstance(s.mesh, jax.sharding.Mesh)]
    specs = []
    for i, (aval, placed) in enumerate(zip(avals, in_flat)):
        if isinstance(aval, jax.ref.AbstractRef):
            # A jax.Ref input: jax.jit lowers at the Ref type itself (a
            # ShapeDtypeStruct would be a plain array the program cannot write).
            specs.append(aval)
            continue
        weak = getattr(aval, "weak_type", False)
        typed = _typed_sharding(aval).get("sharding")
        if typed is not None and placed is None and i < len(program.params) and \
                not layout_in_type(aval):
            # A bound parameter with no placement (see _param_shardings) whose type
            # names no layout: read where the computation runs, as jax.jit reads
            # the constant it was; its mesh must not pull the computation onto it.
            typed = None
        if typed is None:
            specs.append(jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=weak))
            continue
        if isinstance(placed, jax.sharding.Sharding):
            sharding = placed
        elif not context.empty and context.abstract_mesh == typed.mesh:
            sharding = jax.sharding.NamedSharding(context, typed.spec)
        elif isinstance(typed.mesh, jax.sharding.Mesh):
            sharding = typed
        elif any(m.abstract_mesh == typed.mesh for m in known):
            mesh = next(m for m in known if m.abstract_mesh == typed.mesh)
            sharding = jax.sharding.NamedSharding(mesh, typed.spec)
        else:
            n_params = len(program.params)
            what = (f"parameter {i}" if i < n_params else f"argument leaf {i - n_params}")
            raise ValueError(
                f"jaxpr_cc.compile({program.name}): {what} has type "
                f"{aval.str_short(short_dtypes=True)} on mesh {typed.mesh} but no concrete mesh "
                f"of that shape is known; compile under `with jax.set_mesh(mesh):` or pass "
                f"in_shardings")
        specs.append(jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=weak,
                                          sharding=sharding))
    return specs


# ------------------------------------------------------------------- compile
def compile(program: Program, *, in_shardings: Any = None, out_shardings: Any = None,
            donate_argnums: int | Sequence[int] = (),
            compiler_options: dict | None = None) -> "Executable":
    """Lower and compile ``program`` with XLA; returns an :class:`Executable` called
    like the program (same arguments, keyword arguments and result pytrees).

    ``in_shardings`` is a sharding or a pytree prefix of the positional arguments
    (as for ``jax.jit``; None entries let XLA choose), ``out_shardings`` a prefix
    of the result.  Bound parameters (hoisted constants) are read as jax.jit reads
    the constants they were: on a mesh, replicated, unless their type names their
    layout (Explicit axes), so results have jax.jit's shardings.  Without
    ``in_shardings`` the executable runs where its committed arguments are,
    compiling once for each new placement, as jax.jit does.
    ``donate_argnums`` are positional arguments whose buffers XLA may reuse.
    """
    if not isinstance(program, Program):
        hint = " (use jaxpr_cc.jit for Python functions)" if callable(program) else ""
        raise TypeError(f"jaxpr_cc.compile: expected a Program from jaxpr_cc.trace, got "
                        f"{type(program).__name__}{hint}")
    args_tree, kwargs_tree = program.in_tree.children()
    flat_in = _flat_arg_shardings(program, in_shardings, args_tree, kwargs_tree)
    if program.arg_shardings is not None and len(program.arg_shardings) == len(flat_in):
        # Arguments the program was traced with as committed sharded arrays keep
        # their layout unless in_shardings says otherwise (jax.jit's rule too).
        flat_in = [s if s is not None else t for s, t in zip(flat_in, program.arg_shardings)]
    donated = _donated_leaves(program, donate_argnums, args_tree)
    # Without in_shardings the executable follows its committed arguments, as
    # jax.jit does (the traced layouts above are only the first guess).
    return compile_flat(program, flat_in, out_shardings=out_shardings, donated=donated,
                        compiler_options=compiler_options,
                        follow_arguments=in_shardings is None)


def compile_flat(program: Program, arg_shardings: Sequence[Any] | None = None, *,
                 out_shardings: Any = None, donated: Sequence[int] = (),
                 compiler_options: dict | None = None,
                 follow_arguments: bool = False, on_device: Any = None,
                 keep_unused: bool = False) -> "Executable":
    """:func:`compile` with one sharding (or None) per flat argument leaf and
    ``donated`` as flat argument-leaf indices; ``jaxpr_cc.jit`` calls this.
    ``follow_arguments``: ``arg_shardings`` are defaults, not requirements -- a call
    with arguments committed to other shardings compiles for those (once each).
    ``on_device``: a SingleDeviceSharding every input, parameter and output is
    placed with (what jax.jit's deprecated ``device=``/``backend=`` mean).
    ``keep_unused``: jax.jit's keyword (unused arguments still decide where the
    computation runs)."""
    _check_x64(program)
    n_params = len(program.params)
    avals = [v.aval for v in program.body.invars]
    n_args = len(avals) - n_params
    if arg_shardings is None:
        arg_shardings = [None] * n_args
    # Format(layout, sharding) entries ask for a memory layout too: placement is
    # decided by their shardings, and jax.jit is handed the Formats.
    layouts = [None] * n_params + [s.layout if isinstance(s, Format) else None
                                   for s in arg_shardings]
    arg_shardings = [s.sharding if isinstance(s, Format) else s for s in arg_shardings]
    in_flat = _param_shardings(program, arg_shardings, keep_unused) + list(arg_shardings)
    if on_device is not None:
        in_flat = [on_device] * len(avals)
        out_shardings = on_device
    flat_fun = emit_function(program)
    out_tree = program.out_tree

    def tree_fun(*flat):
        # Returning the user's pytree lets the compiled call unflatten in C++.
        return tree_util.tree_unflatten(out_tree, flat_fun(*flat))
    _name_function(tree_fun, program.name)

    jit_kwargs: dict[str, Any] = {"keep_unused": True} if keep_unused else {}
    if any(s is not None for s in in_flat) or any(x is not None for x in layouts):
        jit_kwargs["in_shardings"] = tuple(s if layout is None else Format(layout, s)
                                           for s, layout in zip(in_flat, layouts))
    if out_shardings is not None:
        jit_kwargs["out_shardings"] = out_shardings
    if donated:
        jit_kwargs["donate_argnums"] = tuple(sorted(n_params + i for i in donated))
    specs = _lowering_specs(program, avals, in_flat)
    lowered = jax.jit(tree_fun, **jit_kwargs).lower(*specs)
    compiled = lowered.compile(compiler_options) if compiler_options else lowered.compile()

    def export(in_s, out_s) -> Any:
        fun = lambda *flat: tuple(flat_fun(*flat))  # noqa: E731  (flat trees in the file)
        _name_function(fun, program.name)
        kw = {} if in_s is None else {"in_shardings": tuple(in_s), "out_shardings": tuple(out_s)}
        return jax.export.export(jax.jit(fun, **kw))(*specs)

    unpinned = not jit_kwargs.get("in_shardings") and out_shardings is None
    follow = follow_arguments or unpinned
    param_in = in_flat[:n_params]
    if on_device is None and not jit_kwargs.get("in_shardings"):
        param_in = None  # decided for each placement of the arguments
    exe = Executable(name=program.name, compiled=compiled, lowered=lowered,
                     in_tree=program.in_tree, out_tree=out_tree, params=program.params,
                     input_avals=avals, n_params=n_params,
                     donated=tuple(sorted(donated)), exporter=export, program=program,
                     lower_on=(_lowerer_for_arguments(program, tree_fun, jit_kwargs, avals,
                                                      param_in, compiler_options, keep_unused)
                               if follow else None),
                     device=on_device)
    exe._lowered_at = [getattr(spec, "sharding", None) for spec in specs]
    return exe


def _lowerer_on_one_device(tree_fun, jit_kwargs: dict, specs: list) -> Callable:
    """For a loaded single-device executable saved without a layout:
    ``arg_shardings -> (lowered, compiled)`` on the one device its committed
    arguments are on (it was exported for one device, so it runs on one)."""
    def lower_on(arg_shardings):
        devices = {d for s in arg_shardings if s is not None for d in s.device_set}
        if len(devices) != 1:
            raise ValueError(f"the executable runs on one device; its arguments are on "
                             f"{len(devices)}")
        one = jax.sharding.SingleDeviceSharding(devices.pop())
        kw = dict(jit_kwargs, in_shardings=(one,) * len(specs))
        lowered = jax.jit(tree_fun, **kw).lower(*specs)
        return lowered, lowered.compile()
    return lower_on


def _lowerer_for_arguments(program: Program, tree_fun, jit_kwargs: dict, avals: list,
                           param_in: list | None, compiler_options: dict | None = None,
                           keep_unused: bool = False) -> Callable:
    """For an executable whose argument layouts were not asked for:
    ``arg_shardings -> (lowered, compiled)`` of the same function reading its
    arguments with those shardings (None: an uncommitted argument, placed where
    the others are).  jax.jit runs such a function where its committed arguments
    are; the executable does too, compiling on first use of each placement."""
    def lower_for(arg_shardings):
        params = (param_in if param_in is not None
                  else _param_shardings(program, arg_shardings, keep_unused))
        in_flat = list(params) + list(arg_shardings)
        if all(s is None for s in params):
            devices = {d for s in arg_shardings if s is not None for d in s.device_set}
            if len(devices) == 1:
                # Everything on the arguments' one device (parameters and
                # uncommitted arguments too), as jax.jit does.
                one = jax.sharding.SingleDeviceSharding(devices.pop())
                in_flat = [s if s is not None else one for s in in_flat]
        specs = _lowering_specs(program, avals, in_flat)
        kw = dict(jit_kwargs, in_shardings=tuple(in_flat))
        lowered = jax.jit(tree_fun, **kw).lower(*specs)
        return lowered, (lowered.compile(compiler_options) if compiler_options
                         else lowered.compile())
    return lower_for


_X64_ONLY = ("int64", "uint64", "float64", "complex128")


def _check_x64(program: Program) -> None:
    """A program traced under ``jax.enable_x64`` holds 64-bit types that JAX
    cannot build without it: say so in one line rather than fail inside lowering
    (loading such a file says the same)."""
    import numpy as np
    if jax.dtypes.canonicalize_dtype(np.float64) == np.float64:
        return

    def wide(values) -> str | None:
        for v in values:
            name = str(getattr(getattr(v, "aval", None), "dtype", ""))
            if name in _X64_ONLY:
                return name
        return None

    body = program.body
    found = wide(body.invars) or wide(body.outvars)
    if found is None:
        for region, eqn in body.walk():
            found = wide(eqn.outputs) or wide(region.invars)
            if found:
                break
    if found:
        raise TypeError(f"jaxpr_cc.compile: {program.name} uses {found} (it was traced with "
                        f"jax_enable_x64), but this process runs with jax_enable_x64 disabled; "
                        f"set JAX_ENABLE_X64=1 or compile inside `with jax.enable_x64(True):`")


def _param_shardings(program: Program, arg_shardings: Sequence[Any],
                     keep_unused: bool = False) -> list:
    """Where the compiled program reads its bound parameters.  jax.jit embeds the
    constants they were, so they never decide which devices the computation runs
    on: the arguments it keeps do (committed ones; unused arguments are dropped
    unless keep_unused).  When none of those spans several devices the parameters
    have no placement of their own (the computation runs where the arguments
    are, else on the default device); otherwise each is read as
    :func:`_param_sharding` says."""
    n_params = len(program.params)
    invars = program.body.invars
    arg_invars = invars[n_params:]
    spans_devices = any(
        s is not None and len(s.device_set) > 1 and (keep_unused or program.body.has_users(v))
        for s, v in zip(arg_shardings, arg_invars))
    if not spans_devices:
        return [None] * n_params
    # jax.jit embeds the constants the parameters were: every device of the
    # computation holds all of each, and the arguments decide where it runs and on
    # which mesh its results' layouts are named (the first sharded argument's).
    # A parameter whose type does not name its layout is read replicated on that
    # mesh, wherever it sits (one device, a larger mesh, the same devices under
    # other axis names): XLA then takes neither its devices nor its mesh.
    arg_mesh = next((s.mesh for s, v in zip(arg_shardings, arg_invars)
                     if isinstance(s, jax.sharding.NamedSharding)
                     and isinstance(s.mesh, jax.sharding.Mesh)
                     and (keep_unused or program.body.has_users(v))), None)
    shardings = []
    for value, v in zip(program.params, invars):
        sharding = _param_sharding(value, v.aval)
        if arg_mesh is not None and sharding is not None and not layout_in_type(v.aval):
            sharding = jax.sharding.NamedSharding(arg_mesh, jax.sharding.PartitionSpec(),
                                                  memory_kind=sharding.memory_kind)
        shardings.append(sharding)
    return shardings


def _param_sharding(value: Any, aval: Any):
    """Where the compiled program reads a bound parameter.  Parameters are the
    traced function's constants (hoist-consts), which jax.jit embeds in the
    computation: every device holds all of it, so XLA takes no layout from it when
    it chooses the outputs' shardings.  A parameter sharded over a mesh is read
    replicated on that mesh, so outputs get jax.jit's shardings -- unless its type
    names its layout (Explicit mesh axes), which jax.jit keeps too."""
    sharding = _committed_sharding(value)
    if (isinstance(sharding, jax.sharding.NamedSharding) and not sharding.is_fully_replicated
            and not layout_in_type(aval)):
        return jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(),
                                          memory_kind=sharding.memory_kind)
    return sharding


def _committed_sharding(x: Any):
    """A committed array's sharding (it pins where XLA must read it), else None."""
    if isinstance(x, jax.Array) and getattr(x, "committed", False):
        return x.sharding
    return None


def _flat_arg_shardings(program: Program, in_shardings: Any, args_tree, kwargs_tree) -> list:
    n_arg_leaves = args_tree.num_leaves
    n_kw_leaves = kwargs_tree.num_leaves
    if in_shardings is None:
        return [None] * (n_arg_leaves + n_kw_leaves)
    PartitionSpec = jax.sharding.PartitionSpec
    if isinstance(in_shardings, (jax.sharding.Sharding, PartitionSpec, Format)):
        return [_resolve_spec(program, in_shardings)] * (n_arg_leaves + n_kw_leaves)
    if isinstance(in_shardings, list):
        in_shardings = tuple(in_shardings)
    skeleton = tree_util.tree_unflatten(args_tree, [0] * n_arg_leaves)

    def is_leaf(x):
        return x is None or isinstance(x, (jax.sharding.Sharding, PartitionSpec, Format))
    try:
        full = jax.tree.broadcast(in_shardings, skeleton, is_leaf=is_leaf)
        flat = args_tree.flatten_up_to(full)
    except (ValueError, TypeError) as e:
        raise ValueError(f"jaxpr_cc.compile({program.name}): in_shardings must be a sharding or "
                         f"a pytree prefix of the positional arguments {args_tree}: {e}") from None
    for s in flat:
        if s is not None and not isinstance(s, (jax.sharding.Sharding, PartitionSpec, Format)):
            raise TypeError(f"jaxpr_cc.compile({program.name}): in_shardings entries must be "
                            f"jax.sharding.Sharding, PartitionSpec, Format or None, got "
                            f"{type(s).__name__}")
    return [_resolve_spec(program, s) for s in flat] + [None] * n_kw_leaves


def _resolve_spec(program: Program, sharding: Any):
    """A PartitionSpec as jax.jit reads it: over the mesh set with jax.set_mesh."""
    if not isinstance(sharding, jax.sharding.PartitionSpec):
        return sharding
    mesh = jax.sharding.get_mesh()
    if mesh.empty:
        raise RuntimeError(f"jaxpr_cc.compile({program.name}): in_shardings holds the "
                           f"PartitionSpec {sharding} but no mesh is set; compile under "
                           f"`with jax.set_mesh(mesh):` or pass NamedSharding(mesh, spec)")
    return jax.sharding.NamedSharding(mesh, sharding)


def _donated_leaves(program: Program, donate_argnums, args_tree) -> list[int]:
    nums = (donate_argnums,) if isinstance(donate_argnums, int) else tuple(donate_argnums or ())
    children = args_tree.children()
    starts, pos = [], 0
    for child in children:
        starts.append(pos)
        pos += child.num_leaves
    leaves = []
    for i in nums:
        if not isinstance(i, int) or not -len(children) <= i < len(children):
            raise ValueError(f"jaxpr_cc.compile({program.name}): donate_argnums entry {i!r} is "
                             f"not a positional argument index (the program takes "
                             f"{len(children)} positional arguments)")
        i %= len(children)
        leaves.extend(range(starts[i], starts[i] + children[i].num_leaves))
    return sorted(set(leaves))


def _place(values: Sequence[Any], shardings: Sequence[Any]) -> tuple:
    """Parameters as device arrays laid out as the executable reads them, so a call
    transfers nothing."""
    out = []
    for v, s in zip(values, shardings):
        out.append(jax.device_put(v, s) if s is not None else jax.device_put(v))
    return tuple(out)


# ----------------------------------------------------------------- executable
class Executable:
    """A compiled program, called with the program's own signature.

    ``exe(*args, **kwargs)`` flattens the arguments with the program's ``in_tree``,
    prepends the bound parameters and runs the XLA executable.
    """

    def __init__(self, *, name: str, compiled, lowered, in_tree, out_tree, params: Sequence[Any],
                 input_avals: Sequence[Any], n_params: int, donated: tuple,
                 exporter: Callable, program: Program | None = None, placed: bool = False,
                 lower_on: Callable | None = None, device: Any = None):
        self.name = name
        # jax.jit's deprecated device=/backend=: the SingleDeviceSharding everything
        # runs on (arguments committed elsewhere are moved there, as jax.jit's
        # compiled call does); saved with the executable.  None otherwise.
        self.device = device
        # Compiled without asked-for layouts: ``lower_on(arg_shardings)`` compiles it
        # for arguments committed elsewhere; those executables by argument shardings.
        self._lower_on = lower_on
        self._on_device: dict = {}
        self.program = program
        self.in_tree = in_tree
        self.out_tree = out_tree
        self._compiled = compiled
        self._lowered = lowered
        self._input_avals = list(input_avals)
        self._arg_avals = self._input_avals[n_params:]
        self._n_params = n_params
        self._donated = donated
        self._exporter = exporter
        self._export_cache: tuple | None = None
        # Per input, the sharding it was lowered at (None: unknown or unplaced).
        self._lowered_at: list | None = None
        flat_in = self._flat_input_shardings()
        self.params = tuple(params) if placed else _place(params, flat_in[:n_params])
        # Everything a call needs is bound here: the C++ dispatcher and the parameters.
        call = compiled_fast_call(compiled)
        self._fast = functools.partial(call, *self.params) if self.params else call

    # -------------------------------------------------------------- calling
    def __call__(self, /, *args, **kwargs):
        leaves, tree = tree_util.tree_flatten((args, kwargs))
        if tree != self.in_tree:
            self._check_structure(tree)
        # XLA checks shapes and dtypes but not weak types; one checker for programs
        # and executables gives the same rule and the same message.
        check_argument_types(self.name, leaves, self._arg_avals, (args, kwargs),
                             what="executable", mesh_matters=self._lower_on is not None)
        try:
            return self._fast(*leaves)
        except ValueError as refused:
            # XLA refuses arguments laid out otherwise than it compiled for before
            # running anything: follow them when no placement was asked for.
            if self.device is not None:
                return self._fast(*jax.device_put(leaves, self.device))
            moved = self._moved_for(leaves, refused)
            if moved is None:
                raise
        return moved._fast(*leaves)

    def _moved_for(self, leaves: list, refused: Exception) -> "Executable | None":
        """This executable compiled for the shardings of the committed ``leaves``,
        when it was compiled without asked-for layouts; else None."""
        if self._lower_on is None:
            return None
        key = tuple(x.sharding if isinstance(x, jax.Array) and getattr(x, "committed", False)
                    else None for x in leaves)
        if all(s is None for s in key):
            return None
        moved = self._on_device.get(key)
        if moved is None:
            try:
                lowered, compiled = self._lower_on(key)
            except Exception as e:  # noqa: BLE001 -- a layout the program's types exclude
                raise refused from e
            moved = Executable(name=self.name, compiled=compiled, lowered=lowered,
                               in_tree=self.in_tree, out_tree=self.out_tree, params=self.params,
                               input_avals=self._input_avals, n_params=self._n_params,
                               donated=self._donated, exporter=self._exporter,
                               program=self.program)
            self._on_device[key] = moved
        return moved

    @property
    def call_flat(self) -> Callable:
        """``f(*argument_leaves)``: the executable on already-flattened arguments, with
        the parameters bound."""
        return self._fast

    def _check_structure(self, tree) -> None:
        # A loaded executable rebuilds namedtuples as fresh classes (the caller's own
        # namedtuple of the same name and fields has the same leaves in the same
        # order), and a loaded program holds custom nodes as data: both compared by
        # storage.pytrees; a live namedtuple class is compared as itself, as jax.jit does.
        from ..storage.pytrees import same_saved_structure
        if not same_saved_structure(tree, self.in_tree):
            from ..ir.calling_convention import structure_mismatch
            raise TypeError(f"{self.name}: {structure_mismatch(tree, self.in_tree)}; arguments "
                            f"have structure {tree}, but the executable was compiled for "
                            f"{self.in_tree}")

    def with_params(self, *values) -> "Executable":
        """The same compiled executable bound to new parameter values (no recompilation).
        Each value must have its parameter's shape and dtype."""
        if len(values) != self._n_params:
            raise TypeError(f"{self.name}: with_params takes {self._n_params} value(s), one per "
                            f"program parameter, got {len(values)}")
        for i, (v, want) in enumerate(zip(values, self._input_avals)):
            got = jax.typeof(v)
            if got.shape != want.shape or got.dtype != want.dtype:
                raise ValueError(f"{self.name}: parameter {i} must be "
                                 f"{want.str_short(short_dtypes=True)}, got "
                                 f"{got.str_short(short_dtypes=True)}")
        placed = _place(values, self._flat_input_shardings()[:self._n_params])
        return Executable(name=self.name, compiled=self._compiled, lowered=self._lowered,
                          in_tree=self.in_tree, out_tree=self.out_tree, params=placed,
                          input_avals=self._input_avals, n_params=self._n_params,
                          donated=self._donated, exporter=self._exporter, program=self.program,
                          placed=True)

    # ---------------------------------------------------------- inspection
    @property
    def compiled(self):
        """The underlying ``jax.stages.Compiled``."""
        return self._compiled

    def cost_analysis(self) -> Any:
        """XLA's cost estimates (flops, bytes accessed, ...)."""
        return self._compiled.cost_analysis()

    def memory_analysis(self) -> Any:
        """XLA's memory estimates (argument, output, temporary sizes in bytes)."""
        return self._compiled.memory_analysis()

    def as_text(self, kind: str = "hlo") -> str:
        """``"stablehlo"``: the module handed to XLA; ``"hlo"``: XLA's optimized HLO."""
        if kind == "stablehlo":
            return self._lowered.as_text()
        if kind == "hlo":
            return self._compiled.as_text()
        raise ValueError(f"{self.name}: as_text kind must be one of {TEXT_KINDS}, got {kind!r}")

    def _flat_input_shardings(self) -> list:
        # The compiled function takes flat inputs: input_shardings is ((s0, s1, ...), {}),
        # with None for inputs XLA found unused.
        return compiled_argument_shardings(self._compiled)

    def _flat_output_shardings(self) -> list:
        return compiled_result_shardings(self._compiled)

    @property
    def input_shardings(self):
        """Sharding of each argument leaf, in the arguments' pytree ``(args, kwargs)``."""
        flat = self._flat_input_shardings()[self._n_params:]
        return tree_util.tree_unflatten(self.in_tree, flat)

    @property
    def param_shardings(self) -> tuple:
        return tuple(self._flat_input_shardings()[:self._n_params])

    @property
    def output_shardings(self):
        """Sharding of each result leaf, in the result's pytree."""
        return tree_util.tree_unflatten(self.out_tree, self._flat_output_shardings())

    @property
    def devices(self) -> list:
        """The devices the executable runs on, by id."""
        found = {d for s in self._flat_input_shardings() + self._flat_output_shardings()
                 if s is not None for d in s.device_set}
        return sorted(found, key=lambda d: d.id)

    @property
    def arg_avals(self) -> list:
        """Abstract values of the flat argument leaves (after the parameters)."""
        return self._input_avals[self._n_params:]

    def __repr__(self) -> str:
        return (f"<Executable {self.name}: {len(self.arg_avals)} argument leaves, "
                f"{self._n_params} params, {self.out_tree.num_leaves} outputs>")

    # -------------------------------------------------------------- saving
    def _serialized(self, in_shardings, out_shardings) -> tuple[Any, bytes]:
        """(Exported, its bytes), exported once: JAX's MLIR locations can come out
        differently on a second lowering, and saving twice must write the same file."""
        if self._export_cache is None:
            exported = self._exporter(in_shardings, out_shardings)
            self._export_cache = (exported, bytes(exported.serialize()))
        return self._export_cache

    def save(self, path: str) -> None:
        """Write to ``path`` (atomically); read back with :func:`load_executable`."""
        save_executable(self, path)


# ------------------------------------------------------------ save and load
def save_executable(exe: Executable, path: str) -> None:
    """Serialize ``exe`` with ``jax.export`` into a jaxpr-cc executable file.

    Raises SaveError (a ValueError) when the program cannot be serialized (host callbacks, pytree
    node types that cannot be rebuilt without code, layouts without a named mesh).
    """
    import jaxlib
    from .. import __version__
    where = f"cannot save executable {exe.name}"
    refs = [i for i, a in enumerate(exe.arg_avals) if isinstance(a, jax.ref.AbstractRef)]
    if refs:
        # jax.export has no Ref inputs; checked first (the compiled object's output
        # shardings do not even line up with the results then).
        raise SaveError(f"{where}: argument leaf {refs[0]} is a jax.Ref "
                        f"({exe.arg_avals[refs[0]]}), which jax.export cannot serialize; "
                        f"pass its value as an array and return the new value instead")
    if exe.program is not None and closed_over_ref_inputs(exe._compiled):
        raise SaveError(f"{where}: the function closes over a jax.Ref, which jax.export "
                        f"cannot serialize; pass the Ref's value as an argument and return "
                        f"the new value instead")
    in_tree = xla_archive.encode_treedef(exe.in_tree, f"{where}: arguments")
    out_tree = xla_archive.encode_treedef(exe.out_tree, f"{where}: results")
    in_s = exe._flat_input_shardings()
    out_s = exe._flat_output_shardings()
    layout = None
    export_in = export_out = None
    if _device_count(in_s + out_s) > 1:
        mesh = _find_mesh(in_s + out_s, exe.program)
        if mesh is None:
            raise SaveError(f"{where}: it runs on several devices, but no named mesh describes "
                             f"its layout; give it NamedSharding in_shardings")
        out_avals = exe.out_tree.flatten_up_to(exe._compiled.out_info)
        # An input XLA found unused keeps the layout it was lowered at (the one the
        # arguments it was built for have; jax.export lowers at it again).
        if exe._lowered_at is not None and len(exe._lowered_at) == len(in_s):
            in_s = [t if s is None else s for s, t in zip(in_s, exe._lowered_at)]
        export_in = [_as_named(s, mesh, a, f"{where}: input {i}")
                     for i, (s, a) in enumerate(zip(in_s, exe._input_avals))]
        export_out = [_as_named(s, mesh, a, f"{where}: output {i}")
                      for i, (s, a) in enumerate(zip(out_s, out_avals))]
        try:
            layout = xla_archive.encode_shardings(export_in + export_out, mesh)
        except SaveError as e:
            raise SaveError(f"{where}: {e}") from None
        layout["n_inputs"] = len(export_in)
    try:
        exported, blob = exe._serialized(export_in, export_out)
    except NotImplementedError as e:
        raise SaveError(f"{where}: jax.export cannot serialize it ({e}); programs that call "
                         f"back into Python (jax.debug.print, debug.callback, pure_callback, "
                         f"io_callback) can be compiled but not saved") from None
    members = {xla_archive.EXPORTED: blob}
    params = []
    for i, p in enumerate(exe.params):
        try:
            entry, data = xla_archive.encode_array(p)
        except SaveError as e:
            raise SaveError(f"{where}: parameter {i}: {e}") from None
        entry["file"] = f"params/{i}.npy"
        members[entry["file"]] = data
        params.append(entry)
    manifest = {
        "format": xla_archive.FORMAT_NAME,
        "format_version": xla_archive.FORMAT_VERSION,
        "producer": {"jaxpr_cc": __version__, "jax": jax.__version__,
                     "jaxlib": jaxlib.__version__},
        "name": exe.name,
        "platforms": list(exported.platforms),
        "in_tree": in_tree,
        "out_tree": out_tree,
        "params": params,
        "weak_types": [bool(getattr(a, "weak_type", False)) for a in exe._input_avals],
        # Results that are Python scalars in jax.jit are weakly typed (jax.export drops it).
        "out_weak_types": jx.lowered_out_weak_types(exe._lowered),
        "donated": list(exe._donated),
        "layout": layout,
        "device": _encode_device(exe.device),
    }
    xla_archive.write_archive(path, manifest, members)


def _encode_device(device_sharding) -> dict | None:
    """The device a device=/backend= executable runs on, by platform and id (None:
    the executable was not compiled for one device)."""
    if device_sharding is None:
        return None
    (device,) = device_sharding.device_set
    return {"platform": str(device.platform), "id": int(device.id)}


def _decode_device(code: Any, path: str):
    """Inverse of :func:`_encode_device` on this process's devices; LoadError when the
    device is malformed or this process has no such device."""
    if code is None:
        return None
    try:
        platform, dev_id = str(code["platform"]), code["id"]
    except (KeyError, TypeError):
        raise LoadError(path, "malformed device in the manifest") from None
    if type(dev_id) is not int:
        raise LoadError(path, "malformed device in the manifest")
    try:
        local = jax.local_devices(backend=platform)
    except RuntimeError:
        local = []
    for device in local:
        if device.id == dev_id:
            return jax.sharding.SingleDeviceSharding(device)
    have = (f"its {platform} devices are ids {', '.join(str(d.id) for d in local)}" if local
            else f"it has no {platform} devices")
    raise LoadError(path, f"the executable was compiled for {platform} device {dev_id} "
                          f"(jit's device=/backend=), but this process cannot use it: {have}; "
                          f"load it where that device exists or compile it again without device=")


def _device_count(shardings) -> int:
    devices = set()
    for s in shardings:
        if s is not None:
            devices |= set(s.device_set)
    return len(devices)


def _find_mesh(shardings, program: Program | None):
    """The concrete mesh of the first NamedSharding among the executable's own
    shardings, else among the program's equation parameters (sharding constraints,
    shard_map, nested jit shardings)."""
    Mesh, NamedSharding = jax.sharding.Mesh, jax.sharding.NamedSharding
    for s in shardings:
        if isinstance(s, NamedSharding) and isinstance(s.mesh, Mesh) and s.mesh.size > 1:
            return s.mesh
    if program is None:
        return None
    for _, eqn in program.body.walk():
        for value in eqn.params.values():
            items = value if isinstance(value, tuple) else (value,)
            for item in items:
                if isinstance(item, Mesh) and item.size > 1:
                    return item
                if (isinstance(item, NamedSharding) and isinstance(item.mesh, Mesh)
                        and item.mesh.size > 1):
                    return item.mesh
    return None


def _as_named(s, mesh, aval, where: str):
    """``s`` as an equivalent NamedSharding over ``mesh``; unused inputs (no sharding)
    keep the layout their type names (Explicit mesh axes), else become replicated."""
    from jax.sharding import NamedSharding, PartitionSpec
    ndim = len(getattr(aval, "shape", ()))
    if s is None:
        typed = getattr(aval, "sharding", None)
        typed_mesh = getattr(typed, "mesh", None)
        if getattr(typed_mesh, "shape_tuple", None) == mesh.shape_tuple:
            return NamedSharding(mesh, typed.spec)
        return NamedSharding(mesh, PartitionSpec())
    if isinstance(s, NamedSharding) and s.mesh == mesh:
        return s
    if s.device_set == set(mesh.devices.flat) and s.is_fully_replicated:
        return NamedSharding(mesh, PartitionSpec(), memory_kind=s.memory_kind)
    candidate = None
    if isinstance(s, NamedSharding) and s.mesh.shape_tuple == mesh.shape_tuple:
        # Over mesh's devices, keeping s's axis types (Explicit in, Auto out).
        own = mesh if tuple(s.mesh.axis_types) == tuple(mesh.axis_types) else \
            jax.sharding.Mesh(mesh.devices, mesh.axis_names, axis_types=s.mesh.axis_types)
        candidate = NamedSharding(own, s.spec, memory_kind=s.memory_kind)
    else:  # another kind of sharding, or a mesh of another shape over the same devices
        candidate = named_sharding_from_hlo(s, mesh, ndim)
    if candidate is None or not candidate.is_equivalent_to(s, ndim):
        raise SaveError(f"{where} is laid out as {s}, which has no equivalent NamedSharding "
                         f"on mesh {dict(mesh.shape)}")
    return candidate


def is_executable_file(path: str) -> bool:
    """True when ``path`` is a jaxpr-cc executable file (by its manifest)."""
    return xla_archive.is_executable_archive(path)


def load_executable(path: str) -> Executable:
    """Read an executable written by :func:`save_executable` and compile it for this
    process's devices.  Every failure raises :class:`LoadError`."""
    manifest, members = xla_archive.read_archive(path)
    written = manifest["producer"]["jax"]

    def bad(msg: str) -> LoadError:
        return LoadError(path, msg)
    try:
        exported = jax.export.deserialize(bytearray(members[xla_archive.EXPORTED]))
    except KeyError:
        raise bad(f"no {xla_archive.EXPORTED} member") from None
    except Exception as e:  # any failure of JAX's deserializer means the file is unusable
        raise bad(f"cannot deserialize the program (written with JAX {written}, this is JAX "
                  f"{jax.__version__}): {type(e).__name__}: {e}") from e
    backend = jax.default_backend()
    if backend not in exported.platforms:
        raise bad(f"compiled for {', '.join(exported.platforms)}, but this process runs on "
                  f"{backend}")
    name = manifest.get("name")
    if not isinstance(name, str):
        raise bad("manifest has no program name")
    in_tree = xla_archive.decode_treedef(manifest.get("in_tree"), path, "in_tree")
    out_tree = xla_archive.decode_treedef(manifest.get("out_tree"), path, "out_tree")
    out_avals = list(exported.out_avals)
    weak = manifest.get("weak_types")
    if not (isinstance(weak, list) and len(weak) == len(exported.in_avals)
            and all(isinstance(w, bool) for w in weak)):
        raise bad("manifest weak_types must list one bool per input")
    # jax.export keeps shapes and dtypes; Python-scalar arguments are weakly typed.
    in_avals = [a.update(weak_type=w) for a, w in zip(exported.in_avals, weak)]
    # Its 64-bit inputs or outputs cannot even be spelled without x64 (arrays become
    # 32-bit): say so, as loading such a saved program does, not fail in compiling.
    if jax.dtypes.canonicalize_dtype("float64") != "float64":
        wide = next((str(a.dtype) for a in (*in_avals, *out_avals)
                     if str(a.dtype) in _X64_ONLY), None)
        if wide is not None:
            raise bad(f"the executable uses {wide} (it was compiled with jax_enable_x64), but "
                      f"this process runs with jax_enable_x64 disabled; set JAX_ENABLE_X64=1 "
                      f"to run it")
    param_entries = manifest.get("params")
    if not isinstance(param_entries, list):
        raise bad("manifest has no params list")
    n_params = len(param_entries)
    if in_tree.num_leaves + n_params != len(in_avals) or out_tree.num_leaves != len(out_avals):
        raise bad(f"calling convention does not match the program: {n_params} params + "
                  f"{in_tree.num_leaves} argument leaves for {len(in_avals)} inputs, "
                  f"{out_tree.num_leaves} result leaves for {len(out_avals)} outputs")
    donated = manifest.get("donated")
    n_args = len(in_avals) - n_params
    if not (isinstance(donated, list)
            and all(isinstance(i, int) and 0 <= i < n_args for i in donated)):
        raise bad("manifest donated must list argument-leaf indices")
    params = []
    for i, entry in enumerate(param_entries):
        file = entry.get("file") if isinstance(entry, dict) else None
        if file not in members:
            raise bad(f"parameter {i} has no data member")
        value = xla_archive.decode_array(entry, members[file], path, f"parameter {i}")
        got = jax.typeof(value)
        if got.shape != in_avals[i].shape or got.dtype != in_avals[i].dtype:
            raise bad(f"parameter {i} is {got.str_short()}, the program expects "
                      f"{in_avals[i].str_short()}")
        params.append(value)

    jit_kwargs: dict[str, Any] = {}
    layout = manifest.get("layout")
    device = _decode_device(manifest.get("device"), path)  # older files: none
    if device is not None:
        if layout is not None or exported.nr_devices != 1:
            raise bad("manifest names both one device and a multi-device layout")
        jit_kwargs["in_shardings"] = (device,) * len(in_avals)
        jit_kwargs["out_shardings"] = device
    elif layout is not None:
        if not isinstance(layout, dict) or layout.get("n_inputs") != len(in_avals):
            raise bad("malformed device layout in the manifest")
        shardings = xla_archive.decode_shardings(layout, path)
        if len(shardings) != len(in_avals) + len(out_avals):
            raise bad("device layout does not list one sharding per input and output")
        if exported.nr_devices != len(shardings[0].device_set):
            raise bad(f"program was exported for {exported.nr_devices} devices but its layout "
                      f"names {len(shardings[0].device_set)}")
        jit_kwargs["in_shardings"] = tuple(shardings[:len(in_avals)])
        jit_kwargs["out_shardings"] = tree_util.tree_unflatten(out_tree, shardings[len(in_avals):])
    elif exported.nr_devices != 1:
        raise bad(f"program was exported for {exported.nr_devices} devices but the manifest "
                  f"has no device layout")
    if donated:
        jit_kwargs["donate_argnums"] = tuple(n_params + i for i in donated)

    out_weak = manifest.get("out_weak_types", [False] * len(out_avals))  # older files: none
    if not (isinstance(out_weak, list) and len(out_weak) == len(out_avals)
            and all(isinstance(w, bool) for w in out_weak)):
        raise bad("manifest out_weak_types must list one bool per output")

    # Inputs the saved computation never reads: the compiled call takes them but does
    # not pass them on, so (as in the executable that was saved) their placement does
    # not matter -- an unused argument sharded over a mesh is still accepted.
    unused = [i for i in set(range(len(in_avals))) - set(exported.module_kept_var_idx)
              if not jax.dtypes.issubdtype(in_avals[i].dtype, jax.dtypes.extended)]

    def tree_fun(*flat):
        if unused:
            flat = list(flat)
            for i in unused:
                flat[i] = jnp.zeros(in_avals[i].shape, in_avals[i].dtype)
        outs = [jx.weakly_typed(x) if w else x for x, w in zip(exported.call(*flat), out_weak)]
        return tree_util.tree_unflatten(out_tree, outs)
    _name_function(tree_fun, name)
    try:
        lowered = jax.jit(tree_fun, **jit_kwargs).lower(*_specs(in_avals))
        compiled = lowered.compile()
    except Exception as e:  # compiling deserialized StableHLO: any failure is a load failure
        raise bad(f"compiling the saved program failed (written with JAX {written}, this is "
                  f"JAX {jax.__version__}): {type(e).__name__}: {e}") from e
    return Executable(name=name, compiled=compiled, lowered=lowered, in_tree=in_tree,
                      out_tree=out_tree, params=params, input_avals=in_avals, n_params=n_params,
                      donated=tuple(donated), exporter=lambda in_s, out_s: exported,
                      lower_on=(_lowerer_on_one_device(tree_fun, jit_kwargs, _specs(in_avals))
                                if layout is None and device is None else None),
                      device=device)
