"""``Program``: a top-level region plus the Python calling convention around it."""
from __future__ import annotations

from typing import Any, Sequence

import jax
from jax import tree_util

from . import program_services  # what the layers above ir serve Program (see there why)
from .region import Region
from .calling_convention import layout_in_type
from .value import Value


class Program:
    """A traced program in graph-IR form.

    ``body`` is the top-level region.  Its inputs are, in order, the hoisted
    parameters bound to the program (``params``; empty until a pass such as
    ``hoist-consts`` creates some) followed by the flattened user arguments.
    ``in_tree`` is the pytree structure of ``(args, kwargs)`` and ``out_tree`` the
    structure of the result, so ``program(*args, **kwargs)`` follows the original
    function's calling convention.

    ``arg_shardings`` is None, or one ``jax.sharding.Sharding`` (or None) per flat
    user-argument leaf: the shardings of the committed sharded arrays the program
    was traced with.  ``jaxpr_cc.compile`` places those arguments the same way
    unless told otherwise, as ``jax.jit(f).trace(*args).lower()`` does.
    """

    def __init__(self, body: Region, in_tree, out_tree, *, name: str = "program",
                 params: Sequence[Any] = (), arg_shardings: Sequence[Any] | None = None):
        self.body = body
        self.in_tree = in_tree
        self.out_tree = out_tree
        self.name = name
        self.params = tuple(params)
        self.arg_shardings = None if arg_shardings is None else tuple(arg_shardings)

    # --------------------------------------------------------- construction
    @classmethod
    def from_jaxpr(cls, closed_jaxpr, *, in_tree=None, out_tree=None, name: str | None = None,
                   arg_names: Sequence[str | None] | None = None) -> "Program":
        """Hold ``closed_jaxpr`` as a Program.

        Without trees, the program takes the jaxpr's inputs as positional arguments
        and returns a list of its outputs, like ``jax.core.jaxpr_as_fun``.
        """
        jaxpr = closed_jaxpr.jaxpr
        n_in, n_out = len(jaxpr.invars), len(jaxpr.outvars)
        if in_tree is None:
            in_tree = tree_util.tree_structure((tuple(range(n_in)), {}))
        if out_tree is None:
            out_tree = tree_util.tree_structure(list(range(n_out)))
        if in_tree.num_leaves != n_in or out_tree.num_leaves != n_out:
            raise ValueError(
                f"pytree structures do not fit the jaxpr: in_tree has {in_tree.num_leaves} leaves "
                f"for {n_in} inputs, out_tree {out_tree.num_leaves} leaves for {n_out} outputs")
        if arg_names is None and jaxpr.debug_info is not None and jaxpr.debug_info.arg_names:
            arg_names = list(jaxpr.debug_info.arg_names)
        body = program_services.region_from_closed_jaxpr(closed_jaxpr, arg_names)
        if name is None:
            dbg = jaxpr.debug_info
            name = dbg.func_name if dbg is not None and dbg.func_name else "program"
        return cls(body, in_tree, out_tree, name=_clean_name(name))

    def to_jaxpr(self):
        """Emit a ``ClosedJaxpr`` whose inputs are ``params`` then the flat arguments."""
        return program_services.region_to_closed_jaxpr(self.body)

    def copy(self) -> "Program":
        from .clone import clone_region
        return Program(clone_region(self.body), self.in_tree, self.out_tree, name=self.name,
                       params=self.params, arg_shardings=self.arg_shardings)

    def replace(self, **changes) -> "Program":
        """A shallow copy with some fields changed (the body is shared unless given)."""
        fields = dict(body=self.body, in_tree=self.in_tree, out_tree=self.out_tree,
                      name=self.name, params=self.params, arg_shardings=self.arg_shardings)
        fields.update(changes)
        body = fields.pop("body")
        in_tree = fields.pop("in_tree")
        out_tree = fields.pop("out_tree")
        return Program(body, in_tree, out_tree, **fields)

    def with_params(self, *values) -> "Program":
        """A program bound to new values of its hoisted parameters (``params``).

        The body is shared, not copied: only the bound values differ, so a
        compiled form of the program can be reused with them as arguments.  Each
        value must have the shape and dtype of the parameter it replaces.
        """
        if len(values) != len(self.params):
            raise ValueError(
                f"{self.name}: with_params got {len(values)} values for {len(self.params)} hoisted "
                f"parameters; pass one array per entry of program.params, in order")
        for i, (value, var) in enumerate(zip(values, self.body.invars)):
            aval = var.aval
            shape = tuple(getattr(value, "shape", ()))
            dtype = getattr(value, "dtype", None)
            if dtype is None:
                import numpy as np
                dtype = np.asarray(value).dtype
                shape = np.shape(value)
            if shape != tuple(aval.shape) or dtype != aval.dtype:
                got = f"{dtype}[{','.join(map(str, shape))}]"
                hint = f" ({var.name})" if var.name else ""
                raise ValueError(
                    f"{self.name}: hoisted parameter {i}{hint} is {aval.str_short()}, got {got}; "
                    f"pass an array of that shape and dtype (e.g. np.asarray(value, "
                    f"dtype='{aval.dtype}'))")
        return self.replace(params=tuple(values))

    # ------------------------------------------------------------ calling
    @property
    def arg_values(self) -> list[Value]:
        """The body inputs that correspond to user arguments (after the params)."""
        return self.body.invars[len(self.params):]

    def flatten_args(self, args: tuple, kwargs: dict) -> list[Any]:
        """The argument leaves of a call, after checking the call against the traced
        signature: the pytree structure, then each leaf's shape, dtype and weak type
        (see :mod:`jaxpr_cc.ir.calling_convention`).  Raises ``TypeError`` naming the
        argument that does not fit."""
        from .calling_convention import check_argument_types
        args_and_kwargs = (tuple(args), dict(kwargs))
        flat, tree = tree_util.tree_flatten(args_and_kwargs)
        if tree != self.in_tree:
            self._check_structure(tree)
        check_argument_types(self.name, flat, [v.aval for v in self.arg_values],
                             args_and_kwargs)
        return flat

    def _check_structure(self, tree) -> None:
        from .calling_convention import structure_mismatch
        from ..storage.pytrees import same_saved_structure
        # A loaded program holds custom pytree nodes as data (storage/pytrees.py); the
        # caller's own objects fit when they flatten to the same node types, keys
        # and children.
        if same_saved_structure(tree, self.in_tree):
            return
        raise TypeError(
            f"{self.name}: {structure_mismatch(tree, self.in_tree)}; the program was traced "
            f"with arguments of structure {self.in_tree}: pass arguments of that structure")

    def __call__(self, /, *args, **kwargs):
        from ..jax_adapter import eval_jaxpr
        flat = self.flatten_args(args, kwargs)
        from ..jax_adapter import evaluated_eagerly
        if not evaluated_eagerly(flat):
            # Traced (differentiated now, or staged by jit, vmap, scan, checkpoint...,
            # which forward mode may reach later): custom_vjp rules get a forward
            # mode (passes/vjp_to_jvp.py), built when JAX first differentiates them.
            closed = program_services.forward_mode_jaxpr(self)
        else:
            closed = self.to_jaxpr()
        from ..jax_adapter import evaluating_program
        flat = _placed_as_traced(flat, self.arg_shardings)
        mesh = _argument_mesh(flat, [self.body.has_users(v) for v in self.arg_values])
        params = _params_where_arguments_are(self.params, self.body.invars, mesh)
        with evaluating_program():  # custom_vjp rules in eager shard_map bodies
            outs = eval_jaxpr(closed.jaxpr, closed.consts, *params, *flat)
        # Literal and constant outputs come back from the evaluator as numpy-like
        # values, and passed-through inputs as given: return jax.Arrays, as jax.jit does
        # (jnp.asarray keeps the dtype and weak type).  Tracers are jax.Arrays already.
        import jax.numpy as jnp
        outs = [o if isinstance(o, jax.Array) else jnp.asarray(o) for o in outs]
        outs = _constants_where_arguments_are(outs, [*params, *closed.consts], mesh)
        return tree_util.tree_unflatten(self.out_tree, outs)

    # --------------------------------------------------------- inspection
    def __str__(self) -> str:
        from .printer import print_program
        return print_program(self)

    def __repr__(self) -> str:
        return (f"<Program {self.name}: {len(self.arg_values)} inputs, "
                f"{sum(1 for _ in self.body.walk())} equations, {len(self.body.outvars)} outputs>")

    def functions(self) -> dict:
        """The module's function table, ``{symbol: Region}``: the entry (named after
        the program) first, then every region called from more than one site or
        recursively, in the order they are first called (see ``ir/module.py``)."""
        from .module import functions
        return functions(self.body, self.name)

    def num_equations(self) -> int:
        """Equations in the body and every nested region."""
        return sum(1 for _ in self.body.walk())

    def verify(self) -> None:
        """Raise ``VerificationError`` if the program is malformed."""
        from .verifier import verify_program
        verify_program(self)

    def save(self, path) -> None:
        """Write this program to ``path`` in the saved-program format (docs/format.md);
        ``jaxpr_cc.load(path)`` reads it back."""
        program_services.save_program(self, path)

    def is_first_order(self) -> bool:
        """True when no parameter anywhere holds a Python callable and no nested region
        carries constants: the form the saved-program format requires."""
        from .verifier import first_order_violations
        return not first_order_violations(self)


def _clean_name(name: str) -> str:
    out = "".join(c if (c.isalnum() or c == "_") else "_" for c in name)
    return out or "program"


def _placed_as_traced(leaves: Sequence[Any], arg_shardings) -> list:
    """Arguments placed where the program was traced with them (``arg_shardings``:
    committed sharded arrays), when they are NumPy or unplaced arrays: its
    equations may be typed on that mesh (a sharding constraint named by a
    PartitionSpec under jax.set_mesh), as ``jaxpr_cc.compile`` places them too.
    Committed arrays and tracers stay as given."""
    if not arg_shardings:
        return list(leaves)
    placed = []
    for x, sharding in zip(leaves, arg_shardings):
        if (isinstance(sharding, jax.sharding.NamedSharding) and not isinstance(x, jax.core.Tracer)
                and not (isinstance(x, jax.Array) and x.committed) and hasattr(x, "shape")):
            x = jax.device_put(x, sharding)
        placed.append(x)
    return placed


def _argument_mesh(leaves: Sequence[Any], used: Sequence[bool]):
    """The mesh of the first argument the program reads (``used``) committed to a
    sharding over several devices, or None: where jax.jit would run the call
    (it drops unused arguments)."""
    for x, read in zip(leaves, used):
        if not read:
            continue
        sharding = getattr(x, "sharding", None) if isinstance(x, jax.Array) else None
        if (isinstance(sharding, jax.sharding.NamedSharding)
                and isinstance(sharding.mesh, jax.sharding.Mesh)
                and getattr(x, "committed", False) and len(sharding.device_set) > 1):
            return sharding.mesh
    return None


def _params_where_arguments_are(params: Sequence[Any], invars, mesh) -> list:
    """The bound parameters as the call reads them.  They are the traced
    function's constants, which jax.jit embeds: every device of the computation
    holds all of each, and the arguments decide where it runs.  Evaluated
    equation by equation they are arrays, so one committed to other devices than
    the arguments' ``mesh`` (a constant on one device, an argument on a
    sub-mesh) is read replicated on that mesh -- unless its type names its
    layout (Explicit axes), which jax.jit keeps too."""
    if not params or mesh is None:
        return list(params)
    devices = set(mesh.devices.flat)
    placed = []
    for value, var in zip(params, invars):
        sharding = value.sharding if isinstance(value, jax.Array) and value.committed else None
        if (sharding is not None and sharding.device_set != devices
                and not layout_in_type(var.aval)):
            value = jax.device_put(value, jax.sharding.NamedSharding(
                mesh, jax.sharding.PartitionSpec(), memory_kind=sharding.memory_kind))
        placed.append(value)
    return placed


def _constants_where_arguments_are(outs: list, params: Sequence[Any], mesh) -> list:
    """jax.jit computes on the arguments' ``mesh``: a result that reads no
    argument (a literal, a constant the evaluator made on the default device, a
    returned closed-over array) is a replicated copy there.  Without one (no
    argument read is sharded) a returned closed-over array sharded over several
    devices comes back on the default device, as jax.jit's embedded constant
    does.  Evaluated equation by equation such results sit where they were made."""
    bound = {id(p) for p in params}
    if mesh is None:
        default = jax.config.jax_default_device or jax.devices()[0]
        return [jax.device_put(o, default)
                if (id(o) in bound and isinstance(o, jax.Array)
                    and len(o.sharding.device_set) > 1 and not layout_in_type(jax.typeof(o)))
                else o for o in outs]
    devices = set(mesh.devices.flat)
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    placed = []
    for o in outs:
        sharding = getattr(o, "sharding", None) if isinstance(o, jax.Array) else None
        if sharding is not None and not isinstance(o, jax.core.Tracer) and (
                id(o) in bound or sharding.device_set != devices):
            if not (id(o) in bound and layout_in_type(jax.typeof(o))):
                o = jax.device_put(o, replicated)
        placed.append(o)
    return placed
