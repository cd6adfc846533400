"""Program -> a readable Python module of plain JAX calls (built with libcst).

The module holds one ``def <program name>(...)`` with the original calling
convention (positional arguments, keyword-only arguments, pytrees of arrays) that
returns the original output pytree.  Each equation becomes one ``lax``/``jax`` call
chosen by the rule table in :mod:`.python_rules`; nested regions become local
functions handed to ``lax.cond``/``lax.switch``/``lax.while_loop``/``lax.scan``/
``jax.jit``/``jax.checkpoint``/``jax.shard_map``; custom differentiation rules become
``@jax.custom_jvp``/``@jax.custom_vjp`` functions and
``jax.custom_derivatives.linear_call`` (see :mod:`.python_custom`).  Primitives without a public spelling are
applied with a ``_bind`` helper and marked ``# jaxpr-cc: no public spelling``.

Constants with at most ``inline_limit`` elements are written inline; larger ones are
loaded from a sidecar ``.npz`` next to the module when a sidecar name is given.

API:

* ``emit_python(program)`` -> ``str``: a self-contained module (all constants inline).
* ``emit_python(program, sidecar_name="m.npz")`` -> ``(source, arrays)``: large
  constants are read from ``m.npz`` beside the module; ``arrays`` maps each key of
  that file to its array (``numpy.savez`` them, or use ``write_python``).
* ``write_python(program, path)`` writes ``path`` and, when needed, its sidecar
  ``path.with_suffix(".npz")`` atomically; returns the paths written.

Forward mode: ``forward_mode=True`` emits the program after the rewrite a
differentiated ``Program`` call evaluates (``passes/vjp_to_jvp.with_forward_mode``):
each custom_vjp whose bwd is linear becomes a ``@jax.custom_jvp`` whose tangent is a
``linear_call`` of the transposed bwd (reverse mode still runs the user's bwd), and a
reverse-only rule refuses forward mode with the Program's one-line message.  It is
off by default: such a module imports ``jaxpr_cc.passes.vjp_to_jvp``, whose ``linear_call`` rules
(batching, transposition with known linear operands, perturbed residuals;
``jax_adapter``) it runs -- plain JAX 0.10.2 lacks them.
"""
from __future__ import annotations

import dataclasses
import keyword
import os
import pathlib
import re
import sys
import unicodedata
import zipfile
from typing import Any, Sequence

import jax
import libcst as cst
import numpy as np

from ..ir.equation import Equation
from ..ir.printer import _is_function
from ..ir.region import Region
from ..ir.value import Value, is_literal
from .python_names import ModuleNamer, to_identifier
from .python_rules import FOLDS, NO_SPELLING, RULES, Call
from .python_custom import CustomRulesMixin
from .python_spelling import (SpellingError, array_literal_source, dtype_object_source,
                              dtype_source, library_primitive_source, literal_source,
                              param_source, restore_expression, sidecar_array)
from .python_text import (HELPER_DEPS, HELPER_IMPORTS, HELPER_NAMES, HELPERS, Function,
                          PythonEmitError, flat_return, layout, render_call, stmt, tuple_src)

__all__ = ["INLINE_LIMIT", "PythonEmitError", "PythonModule", "emit_python",
           "emit_python_module", "write_python"]

INLINE_LIMIT = 64  # constants with more elements go to the sidecar (when there is one)


def _mesh_placement(value: Any):
    """The NamedSharding of a committed array on a device mesh, else None
    (single-device placements are not kept: emitted modules stay portable)."""
    sharding = getattr(value, "sharding", None)
    if isinstance(value, jax.Array) and getattr(value, "committed", False) and isinstance(
            sharding, jax.sharding.NamedSharding) and not sharding.mesh.empty:
        return sharding
    return None


@dataclasses.dataclass(frozen=True)
class PythonModule:
    """An emitted module: its source and the arrays it loads from ``sidecar_name``."""
    source: str
    sidecar_name: str | None
    arrays: dict


def emit_python(program, *, sidecar_name: str | None = None, inline_limit: int = INLINE_LIMIT,
                forward_mode: bool = False):
    """Python source for ``program`` (see the module docstring for the two forms and
    for ``forward_mode``)."""
    module = emit_python_module(program, sidecar_name=sidecar_name, inline_limit=inline_limit,
                                forward_mode=forward_mode)
    if sidecar_name is None:
        return module.source
    return module.source, dict(module.arrays)


def emit_python_module(program, *, sidecar_name: str | None = None,
                       inline_limit: int = INLINE_LIMIT, forward_mode: bool = False) -> PythonModule:
    if sidecar_name is not None and (os.sep in sidecar_name or not sidecar_name.endswith(".npz")):
        raise ValueError(f"sidecar_name {sidecar_name!r}: expected a bare file name ending in .npz "
                         f"(it is resolved next to the emitted module)")
    if not isinstance(forward_mode, bool):
        raise TypeError(f"emit_python: forward_mode must be True or False, got "
                        f"{type(forward_mode).__name__}")
    if forward_mode:
        # The module is differentiable like the Program: emit what a differentiated
        # Program call evaluates (its custom_vjp rules with a forward mode).
        from ..ir import program_services
        program = program_services.with_forward_mode(program)
    # The module has no Python rule to trace a symbolic-zeros rule's patterns from
    # later: every pattern JAX can give is traced now (frontend.saved_patterns).
    from ..frontend.saved_patterns import complete_patterns
    program = complete_patterns(program)
    # The linear_call rules forward mode runs (batching, transposition with known
    # linear operands) are registered by importing jaxpr_cc: the module imports it.
    emitter = _ModuleEmitter(program, sidecar_name, inline_limit, imports_jaxpr_cc=forward_mode)
    source = emitter.build()
    return PythonModule(source, sidecar_name if emitter.arrays else None, emitter.arrays)


def write_python(program, path, *, inline_limit: int = INLINE_LIMIT,
                 forward_mode: bool = False) -> list[pathlib.Path]:
    """Write the module to ``path`` and its constants to ``path.with_suffix('.npz')``
    (only when some constant is larger than ``inline_limit`` elements).
    ``forward_mode``: as for ``emit_python``."""
    path = pathlib.Path(path)
    if path.suffix != ".py":
        raise ValueError(f"{path}: the emitted module needs a .py file name")
    if path.is_symlink():
        # The module is written to the link's target; its sidecar goes beside it,
        # where the module looks for it.
        path = pathlib.Path(os.path.realpath(path))
    sidecar = path.with_suffix(".npz")
    module = emit_python_module(program, sidecar_name=sidecar.name, inline_limit=inline_limit,
                                forward_mode=forward_mode)
    written = []
    if module.arrays:
        # The user never named the sidecar: only one written for this module may be
        # replaced (it holds SIDECAR_MARK naming the module), never their own .npz.
        _check_sidecar_is_ours(sidecar, path.name)
        marked = {**module.arrays, SIDECAR_MARK: np.array(path.name)}
        _atomic_write(sidecar, lambda f: np.savez(f, **marked))
        written.append(sidecar)
    try:
        _atomic_write(path, lambda f: f.write(module.source.encode()))
    except BaseException:
        for done in written:  # (the sidecar it wrote is its own)
            done.unlink(missing_ok=True)
        raise
    written.append(path)
    return written


#: The key of a sidecar's array naming the module it was written for.
SIDECAR_MARK = "jaxpr_cc_sidecar_of"


def _check_sidecar_is_ours(sidecar: pathlib.Path, module_name: str) -> None:
    """Refuse (SaveError) to replace a file at ``sidecar`` that is not the
    constants file jaxpr-cc wrote for ``module_name``."""
    from ..storage.errors import SaveError
    if not os.path.lexists(sidecar):
        return
    if sidecar.is_symlink() or not sidecar.is_file():
        # A link (perhaps to another module's sidecar), a FIFO, a device, a
        # directory: not a file written for this module.
        raise SaveError(f"{sidecar}: exists and is not a regular file; the module's large "
                        f"constants go there: move it away or choose another output name")
    owner = None
    try:
        loaded = np.load(sidecar, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):
        loaded = None  # not an .npz: the user's
    if isinstance(loaded, np.lib.npyio.NpzFile):
        with loaded:
            if SIDECAR_MARK in loaded.files:
                owner = str(loaded[SIDECAR_MARK])
    if owner != module_name:
        raise SaveError(f"{sidecar}: exists and is not the constants file jaxpr-cc wrote for "
                        f"{module_name}; the module's large constants go there: move it away "
                        f"or choose another output name")


def _atomic_write(path: pathlib.Path, write) -> None:
    from ..storage.atomic import write_file  # jaxpr-cc's one file writer
    path.parent.mkdir(parents=True, exist_ok=True)
    write_file(path, write)

class _ModuleEmitter:
    def __init__(self, program, sidecar_name: str | None, inline_limit: int,
                 imports_jaxpr_cc: bool = False):
        self.program = program
        self.imports_jaxpr_cc = imports_jaxpr_cc
        self.sidecar_name = sidecar_name
        self.inline_limit = inline_limit
        # Every helper's name is reserved, used or not (a program or keyword argument
        # named like one would shadow it), and so is ``_``, the discard target.
        self.namer = ModuleNamer(reserved=(*HELPER_NAMES, "_"))
        self.env: dict[Value, str] = {}
        self.helpers: set[str] = set()
        self.imports: set[str] = set()
        self.constants: list[str] = []
        self.arrays: dict[str, np.ndarray] = {}
        self.module_defs: list[cst.BaseStatement] = []
        self.shared_functions: dict[int, str] = {}  # region id -> module-level def
        self._calls: dict[int, int] | None = None
        self.shared_constants: dict[int, tuple] = {}  # id(value) -> (value, name)
        self.namedtuples: dict[tuple, str] = {}
        self.imports_from: list[str] = []
        self.uses_partition_spec = False
        self.callables: dict[int, str] = {}
        self.custom_functions: dict[tuple, tuple[str, str]] = {}
        self._rule_keys = None  # ir.structural_key.KeyMaker, made on first use

    # ------------------------------------------------------------ top level
    def build(self) -> str:
        program = self.program
        fn_name = self.fn_name = self.namer.fresh(program.name, "program")
        params_src, prologue, arg_leaves = self._signature()
        public = None
        if any(key != inner for key, inner in self.kw_names):
            # A keyword argument named like something the module uses (a helper, an
            # import, a builtin, ``_``) would shadow it inside the function: the
            # function takes it under another name, behind a public def that only
            # forwards (and so reads none of those names).
            public, fn_name = fn_name, self.namer.fresh(f"_{fn_name}_body")
        top = Function(depth=1)
        for code in prologue:
            top.add(code)
        # Hoisted parameters and closed-over constants become module constants.
        for v, value in zip(program.body.invars[:len(program.params)], program.params):
            self.env[v] = self._constant(v.name or "param", value)
        for v, leaf_name in zip(program.arg_values, arg_leaves):
            self.env[v] = leaf_name
        self._bind_consts(program.body)
        outs = self._emit_equations(program.body, top)
        top.add(f"return {self._output_expr(program.out_tree, outs)}")
        fn = stmt(f"def {fn_name}({params_src}):\n    pass\n").with_changes(
            body=cst.IndentedBlock(body=[stmt(self._docstring())] + top.body))
        if public is None:
            return self._assemble([fn])
        positional = self.positional_params
        forwarded = ", ".join([*positional, *(f"{inner}={key}" for key, inner in self.kw_names)])
        public_params = ", ".join([*positional, *(["*"] if self.kw_names else []),
                                   *(key for key, _ in self.kw_names)])
        wrapper = stmt(f"def {public}({public_params}):\n"
                       f"    {self._docstring()}\n"
                       f"    return {fn_name}({forwarded})\n")
        return self._assemble([fn, wrapper])

    def _docstring(self) -> str:
        p = self.program
        return (f'"""{p.name}: emitted by jaxpr-cc.\n\n    Arguments: {p.in_tree}\n'
                f'    Returns: {p.out_tree}\n    """')

    def _assemble(self, fns: list[cst.BaseStatement]) -> str:
        renamed = ("" if self.fn_name == self.program.name else
                   f"Its function is ``{self.fn_name}`` (the program's name is not free here).\n")
        docstring = (f'"""Python emitted by jaxpr-cc from the traced program {self.program.name!r}.\n'
                     f'{renamed}\n'
                     f'Plain JAX: one call per equation of the program.  Regenerate it with\n'
                     f'``jaxpr-cc emit --to python`` rather than editing it.\n"""')
        stdlib = {"importlib": "import importlib.util"}
        modules = set(self.imports) | ({"os"} if self.arrays else set())
        imports = sorted(stdlib.get(m, f"import {m}") for m in modules)
        third_party = ["import jax", "import jax.numpy as jnp", "import numpy as np",
                       "from jax import lax"]
        if self.uses_partition_spec:
            third_party.append("from jax.sharding import PartitionSpec as P")
        third_party += sorted(self.imports_from)
        if self.imports_jaxpr_cc:
            # Importing the pass registers jaxpr-cc's linear_call rules with JAX.
            third_party.append("import jaxpr_cc.passes.vjp_to_jvp  # noqa: F401")
        helpers: list[cst.BaseStatement] = []
        for name in sorted(self.helpers):
            helpers.extend(cst.parse_module(HELPERS[name].strip() + "\n").body)
        constants = [stmt(c) for c in self.constants]
        if self.arrays:
            constants.insert(0, stmt(
                f"with np.load(os.path.join(os.path.dirname(os.path.abspath(__file__)), "
                f"{self.sidecar_name!r})) as _sidecar:\n"
                f"    _CONSTS = {{key: _sidecar[key] for key in _sidecar.files}}\n"))
        body = [("body", helpers), ("body", constants), ("body", self.module_defs),
                ("body", fns)]
        third_party += [f"import {m}" for m in _unloaded_jax_modules(
            layout([(kind, g) for kind, g in body if g]))]
        groups = [("doc", [stmt(docstring)]), ("import", [stmt(i) for i in imports]),
                  ("import", [stmt(i) for i in third_party]), *body]
        code = layout([(kind, g) for kind, g in groups if g])
        cst.parse_module(code)  # the emitted text must parse back
        compile(code, f"<jaxpr-cc {self.program.name}>", "exec")
        return code

    # ------------------------------------------------------------ signature
    def _signature(self) -> tuple[str, list[str], list[str]]:
        """``def`` parameters, statements unpacking pytree arguments, leaf names."""
        program = self.program
        args_tree, kwargs_tree = program.in_tree.children()
        _, kw_keys = kwargs_tree.node_data()
        kw_keys = list(kw_keys or [])
        hints = [v.name for v in program.arg_values]
        prologue: list[str] = []
        leaf_names: list[str] = []
        params: list[str] = []
        # Keyword-only parameters must keep their names exactly: claim them first.
        # A name the module uses is taken inside under another (``build``).
        self.kw_names: list[tuple[str, str]] = []  # (public name, name inside)
        for key in kw_keys:
            if not (isinstance(key, str) and key.isidentifier() and not keyword.iskeyword(key)
                    and key != "__debug__"):  # (an identifier no code may bind)
                raise PythonEmitError(
                    f"{program.name}: keyword argument {key!r} is not a Python identifier; "
                    f"rename it in the traced function")
            if unicodedata.normalize("NFKC", key) != key:
                # Python reads identifiers in source NFKC-normalized: no def can take it.
                raise PythonEmitError(
                    f"{program.name}: keyword argument {key!r} is read by Python as "
                    f"{unicodedata.normalize('NFKC', key)!r} in source; rename it in the "
                    f"traced function")
            inner = key if self.namer.claim(key) else self.namer.fresh(key, "kwarg")
            self.kw_names.append((key, inner))
        start = 0
        for i, child in enumerate(args_tree.children()):
            n = child.num_leaves
            heads = {(h or "").split(".")[0] for h in hints[start:start + n]}
            head = heads.pop() if len(heads) == 1 and n else f"arg{i}"
            name = self.namer.fresh(head, f"arg{i}")
            params.append(name)
            leaf_names += self._unpack_arg(name, child, hints[start:start + n], prologue)
            start += n
        self.positional_params = list(params)
        if kw_keys:
            params.append("*")
            for (_, inner), child in zip(self.kw_names, kwargs_tree.children()):
                params.append(inner)
                n = child.num_leaves
                leaf_names += self._unpack_arg(inner, child, hints[start:start + n], prologue)
                start += n
        return ", ".join(params), prologue, leaf_names

    def _unpack_arg(self, name: str, tree, hints, prologue: list[str]) -> list[str]:
        from jax import tree_util
        if tree_util.treedef_is_leaf(tree) and tree.num_nodes == 1 and tree.num_leaves == 1:
            return [name]
        paths = _leaf_paths(tree)
        leaf_names = [self.namer.fresh(h or f"{name}_{k}") for k, h in enumerate(hints)]
        if paths is None:
            if leaf_names:
                prologue.append(f"{tuple_src(leaf_names)} = jax.tree_util.tree_leaves({name})")
            return leaf_names
        for leaf, path in zip(leaf_names, paths):
            prologue.append(f"{leaf} = {name}{path}")
        return leaf_names

    def _output_expr(self, tree, outs: list[str]) -> str:
        """The output pytree as an expression; for a pytree node type with no source
        spelling (a registered class), the flat leaves, with the structure recorded in
        ``__jaxpr_cc_out_tree__`` (``jax.tree_util.tree_unflatten`` restores it)."""
        expr = self._tree_expr(tree, iter(outs))
        if expr is None:
            self.constants.append(f"__jaxpr_cc_out_tree__ = {str(tree)!r}  # returned flat")
            return tuple_src(outs)
        return expr

    def _tree_expr(self, tree, leaves) -> str | None:
        data = tree.node_data()
        if data is None:
            return next(leaves)
        kind, aux = data
        children = tree.children()
        if kind is type(None):
            return "None"
        parts = [self._tree_expr(c, leaves) for c in children]
        if any(p is None for p in parts):
            return None
        if kind is tuple:
            return tuple_src(parts)
        if kind is list:
            return "[" + ", ".join(parts) + "]"
        if kind is dict:
            return "{" + ", ".join(f"{k!r}: {p}" for k, p in zip(aux, parts)) + "}"
        if isinstance(kind, type) and issubclass(kind, tuple) and hasattr(kind, "_fields"):
            cls = self._namedtuple(kind)
            return f"{cls}(" + ", ".join(f"{f}={p}" for f, p in zip(kind._fields, parts)) + ")"
        return None

    def _namedtuple(self, kind) -> str:
        """The output namedtuple class: imported from its module when that module can
        be imported by name, else defined here with the same name and fields."""
        key = (kind.__module__, kind.__qualname__, tuple(kind._fields))
        if key in self.namedtuples:
            return self.namedtuples[key]
        if kind.__module__ == "__main__" and getattr(sys.modules["__main__"], kind.__qualname__,
                                                    None) is kind:
            # A script's class: taken from the script, as a script's function is.
            self.namedtuples[key] = self.callable_ref(kind, self.program.name)
            return self.namedtuples[key]
        name = self.namer.fresh(kind.__name__, "Record")
        if _importable(kind.__module__) and "." not in kind.__qualname__ \
                and kind.__qualname__.isidentifier():
            alias = "" if name == kind.__qualname__ else f" as {name}"
            self.imports_from.append(f"from {kind.__module__} import {kind.__qualname__}{alias}")
        else:
            self.imports.add("collections")
            self.module_defs.insert(0, stmt(
                f"{name} = collections.namedtuple({kind.__name__!r}, {list(kind._fields)!r})"))
        self.namedtuples[key] = name
        return name

    # ------------------------------------------------------------ constants
    def _constant(self, hint: str, value: Any) -> str:
        name = self.namer.fresh(hint.upper() if hint else "CONST", "CONST")
        size = int(np.size(value))
        if self.sidecar_name is not None and size > self.inline_limit:
            data, suffix = sidecar_array(value)
            self.arrays[name] = data
            src = restore_expression(f'_CONSTS[{name!r}]', suffix)
        else:
            try:
                src = array_literal_source(value)
            except SpellingError as e:
                raise PythonEmitError(f"{self.program.name}: constant {hint!r}: {e}") from None
        placement = _mesh_placement(value)
        if placement is not None:
            # A closed-over array laid out on a device mesh stays laid out so: the
            # layout of what the program computes from it follows (as in jax.jit).
            src = f"jax.device_put({src}, {self.param(placement)})"
        self.constants.append(f"{name} = {src}")
        return name

    def _bind_consts(self, region: Region) -> None:
        consts = region.consts if region.consts is not None else [None] * len(region.constvars)
        for v, value in zip(region.constvars, consts):
            if value is None:
                raise PythonEmitError(
                    f"{self.program.name}: a region holds an open constant binder with no value")
            self.env[v] = self._constant(v.name or "const", value)

    # ------------------------------------------------------------ equations
    def atom(self, a) -> str:
        if is_literal(a):
            try:
                return literal_source(a.val, a.aval)
            except SpellingError as e:
                raise PythonEmitError(f"{self.program.name}: literal {a}: {e}") from None
        return self.env[a]

    # ------------------------------------------------------------ custom rules
    def is_shared(self, region: Region) -> bool:
        """Whether the program calls ``region`` from more than one site."""
        if self._calls is None:
            from ..ir.module import call_counts
            self._calls = call_counts(self.program.body)
        return self._calls.get(id(region), 0) > 1

    def rule_key(self, eqn: Equation) -> tuple:
        """Structural identity of a custom equation's rule: its regions and params
        by ``ir.structural_key`` (exact: constants by bit pattern, so two rules
        differing only in a NaN's payload or a zero's sign stay two functions)."""
        from ..ir.structural_key import KeyMaker
        if self._rule_keys is None:
            self._rule_keys = KeyMaker()
        return (eqn.prim.name, self._rule_keys.params(
            {k: v for k, v in eqn.params.items() if k != "source"}))

    def closed_over(self, a, fn: Function) -> str:
        """A value a nested function closes over.  A literal operand there was a traced
        scalar constant in the original program (JAX writes those as literals outside the
        closure): stage one in ``fn`` so the closure captures a traced value again."""
        if not is_literal(a):
            return self.env[a]
        name = self.namer.fresh("closed")
        if getattr(a.aval, "weak_type", False) or np.ndim(a.val):
            fn.add(f"{name} = jnp.asarray({literal_source(a.val, a.aval)})")
        else:
            from .python_spelling import python_scalar_source
            scalar = np.asarray(a.val).reshape(()).item()
            fn.add(f"{name} = lax.convert_element_type({python_scalar_source(scalar)}, "
                   f"{dtype_source(a.aval.dtype)})")
        return name

    def _emit_equations(self, region: Region, fn: Function) -> list[str]:
        order = region.topo_order()
        folds: dict[Equation, list[Equation]] = {}
        folded: set[Equation] = set()
        for eqn in order:
            fold = FOLDS.get(eqn.prim.name)
            if fold is not None:
                found = [p for p in fold(eqn) if p not in folded]
                if found:
                    folds[eqn] = found
                    folded.update(found)
        for eqn in order:
            if eqn not in folded:
                self._emit_equation(eqn, fn, folds.get(eqn, []))
        return [self.atom(a) for a in region.outvars]

    def _emit_equation(self, eqn: Equation, fn: Function, folded: list[Equation]) -> None:
        ctx = _EqnContext(self, eqn, fn, folded)
        call = None
        rule = RULES.get(eqn.prim.name)
        if rule is not None:
            try:
                call = rule(ctx, eqn)
            except SpellingError:
                call = None
        if call is None:
            if folded:  # the folded producers must then be emitted on their own
                for producer in folded:
                    self._emit_equation(producer, fn, [])
            call = self._bind_call(eqn, ctx)
        target = self._targets(eqn, call, ctx.unpack)
        fn.add(render_call(call, target, fn.depth))

    def _targets(self, eqn: Equation, call: Call, unpack: list[int] | None) -> str | None:
        region = eqn.region
        names = []
        for v in eqn.outputs:
            if region is not None and not region.has_users(v):
                names.append("_")
                continue
            hint = v.name or call.hint or to_identifier(eqn.prim.name)
            self.env[v] = self.namer.fresh(hint)
            names.append(self.env[v])
        if unpack is not None:
            groups, k = [], 0
            for n in unpack:
                groups.append(tuple_src(names[k:k + n]))
                k += n
            return ", ".join(groups)
        if not names:
            return None
        if len(names) == 1 and not call.multiple:
            return names[0]
        if len(names) == 1:
            return f"{names[0]},"
        return ", ".join(names)

    def _bind_call(self, eqn: Equation, ctx: "_EqnContext") -> Call:
        kwargs = []
        for key, value in eqn.params.items():
            if isinstance(value, Region) or (isinstance(value, tuple) and value
                                              and isinstance(value[0], Region)):
                raise PythonEmitError(
                    f"{self.program.name}: primitive {eqn.prim.name!r} has nested regions "
                    f"(parameter {key!r}) and no emission rule")
            if _is_function(value):
                raise PythonEmitError(
                    f"{self.program.name}: primitive {eqn.prim.name!r}: parameter {key!r} is a "
                    f"Python callable; the program is not first-order (trace it with "
                    f"jaxpr_cc.trace so custom rules become regions)")
            try:
                kwargs.append((key, self.param(value, dtype_objects=True,
                                               held_jaxpr=self._held_jaxpr,
                                               shared=self._shared_constant)))
            except SpellingError as e:
                raise PythonEmitError(
                    f"{self.program.name}: primitive {eqn.prim.name!r}: parameter {key!r} has no "
                    f"Python spelling ({e})") from None
        library = library_primitive_source(eqn.prim)
        if library is not None:  # a numerical library's primitive, imported by name
            self.use_helper("_import_callable")
            return Call(f"{library}.bind", list(ctx.ins), kwargs,
                        multiple=bool(eqn.prim.multiple_results), comment=NO_SPELLING)
        self.helpers.add("_bind")
        self.imports.update(HELPER_IMPORTS["_bind"])
        return Call("_bind", [repr(eqn.prim.name)] + list(ctx.ins), kwargs,
                    multiple=bool(eqn.prim.multiple_results), comment=NO_SPELLING)

    def use_helper(self, name: str) -> None:
        """Define helper ``name`` (and the helpers it calls) in the module."""
        for dep in (name, *HELPER_DEPS.get(name, ())):
            self.helpers.add(dep)
            self.imports.update(HELPER_IMPORTS[dep])

    def _held_jaxpr(self, jaxpr) -> str:
        """A jaxpr a library primitive holds as data (lineax's closure-converted
        operator): a module-level function over its constants and inputs, staged again
        once by ``_held_jaxpr`` with the constants as constvars, as the library built
        it (one object however often it is held: libraries compare it by identity)."""
        from ..frontend.from_jaxpr import region_from_jaxpr
        from ..jax_adapter import ClosedJaxpr, jaxpr_consts_as_inputs
        known = self.shared_constants.get(id(jaxpr))
        if known is not None:
            return known[1]
        closed = isinstance(jaxpr, ClosedJaxpr)
        if closed and jaxpr.consts:
            raise SpellingError("a held ClosedJaxpr with constants has no Python spelling")
        open_jaxpr = jaxpr.jaxpr if closed else jaxpr
        region = region_from_jaxpr(jaxpr_consts_as_inputs(open_jaxpr), None)
        names = self.name_binders(region.invars, [None] * len(region.invars))
        fdef = self.function(region, self.namer.fresh("held_jaxpr_fn"), names, [], 0,
                             returns=tuple_src)
        self.module_defs.append(fdef)
        avals = ", ".join(f"({tuple(v.aval.shape)!r}, {dtype_object_source(v.aval.dtype)}, "
                          f"{bool(getattr(v.aval, 'weak_type', False))!r})"
                          for v in region.invars)
        self.use_helper("_held_jaxpr")
        return self._shared_constant(
            jaxpr, f"_held_jaxpr({fdef.name.value}, {len(open_jaxpr.constvars)}, ({avals},), "
                   f"{closed!r})", hint="held_jaxpr")

    def _shared_constant(self, value: Any, source: str, hint: str = "shared") -> str:
        """A module-level name bound once to ``source``, the spelling of ``value``."""
        known = self.shared_constants.get(id(value))
        if known is None:
            name = self.namer.fresh(hint)
            self._note_helpers(source)
            self.module_defs.append(stmt(f"{name} = {source}"))
            known = self.shared_constants[id(value)] = (value, name)
        return known[1]

    def param(self, value: Any, *, dtype_objects: bool = False, held_jaxpr=None,
              shared=None) -> str:
        src = param_source(value, dtype_objects=dtype_objects, held_jaxpr=held_jaxpr,
                           shared=shared)
        self._note_helpers(src)
        return src

    def _note_helpers(self, src: str) -> None:
        """Define the helpers the spelling ``src`` calls."""
        for call, helper in (("_mesh(", "_mesh"), ("_device(", "_device"), ("_prng_impl(", "_prng_impl"),
                             ("_copy_semantics(", "_copy_semantics"), ("_primitive(", "_bind"),
                             ("_import_callable(", "_import_callable"),
                             ("_treedef(", "_treedef"),
                             ("_library_instance(", "_library_instance"),
                             ("_partial(", "_partial")):
            if call in src:
                self.use_helper(helper)
        if "P(" in src:
            self.uses_partition_spec = True

    # ------------------------------------------------------------ functions
    def function(self, region: Region, name: str, params: list[str], prologue: list[str],
                 depth: int, *, returns) -> cst.BaseStatement:
        """A FunctionDef for ``region``; ``returns(outs)`` builds the return expression."""
        inner = Function(depth)
        for code in prologue:
            inner.add(code)
        self._bind_consts(region)
        outs = self._emit_equations(region, inner)
        inner.add(f"return {returns(outs)}")
        return stmt(f"def {name}({', '.join(params)}):\n    pass\n").with_changes(
            body=cst.IndentedBlock(body=inner.body))

    def callable_ref(self, target, where: str) -> str:
        """A module-level name bound to ``target`` through ``_import_callable``."""
        key = id(target)
        if key in self.callables:
            return self.callables[key]
        module = getattr(target, "__module__", None)
        qualname = getattr(target, "__qualname__", None)
        import sys
        mod = sys.modules.get(module) if isinstance(module, str) else None
        found = mod
        for part in (qualname or "<").split("."):
            found = getattr(found, part, None) if "<" not in part else None
        # As pickle does: the module and name must give back this very object (not a
        # function rebound since, a subclass's classmethod, a bound method).
        if mod is None or found is not target:
            raise PythonEmitError(f"{where}: function {target!r} is not importable by module "
                                  f"and name as the same object (a lambda, nested function, "
                                  f"partial, bound method or rebound name); make it a "
                                  f"module-level function")
        path = getattr(mod, "__file__", None)
        name = self.namer.fresh(qualname.split(".")[-1].lstrip("_") or "callback")
        self.helpers.add("_import_callable")
        self.imports.update(HELPER_IMPORTS["_import_callable"])
        self.constants.append(f"{name} = _import_callable({module!r}, {qualname!r}, {path!r})")
        self.callables[key] = name
        return name

    def name_binders(self, values: Sequence[Value], hints: Sequence[str | None]) -> list[str]:
        names = []
        for v, hint in zip(values, hints):
            self.env[v] = self.namer.fresh(hint or v.name or "a")
            names.append(self.env[v])
        return names


_JAX_PATH = re.compile(r"(?<![\w.])jax(?:\.[A-Za-z_]\w*)+")


def _unloaded_jax_modules(code: str) -> list[str]:
    """The ``jax`` modules ``code`` names (``jax.ad_checkpoint.checkpoint_name``: the
    longest prefix that is a module) that a bare ``import jax`` does not load."""
    import importlib.util

    from ..jax_adapter import MODULES_IMPORT_JAX_LOADS
    found = set()
    # (Names in import statements are imported where they stand: a helper's own.)
    used = "\n".join(line for line in code.splitlines()
                     if not line.lstrip().startswith(("import ", "from ")))
    for path in set(_JAX_PATH.findall(used)):
        parts = path.split(".")
        for k in range(len(parts), 1, -1):
            name = ".".join(parts[:k])
            try:
                is_module = importlib.util.find_spec(name) is not None
            except (ImportError, ValueError, AttributeError):
                is_module = False
            if is_module:
                if name not in MODULES_IMPORT_JAX_LOADS and not name.startswith("jax._src"):
                    found.add(name)
                break
    return sorted(found)


def _importable(module: str) -> bool:
    """Whether ``import module`` works in a fresh process: its top-level package is on
    sys.path (files loaded under made-up module names, like the corpus's, are not)."""
    import importlib.machinery
    parts = module.split(".")
    if module == "__main__" or not all(p.isidentifier() for p in parts):
        return False
    try:
        return importlib.machinery.PathFinder.find_spec(parts[0]) is not None
    except (ImportError, ValueError):
        return False

def _leaf_paths(tree) -> list[str] | None:
    """Accessors (``["w"]``, ``[0]``, ``.pos``) of each leaf, or None when the tree has
    a node type other than tuple/list/dict/namedtuple/None."""
    data = tree.node_data()
    if data is None:
        return [""]
    kind, aux = data
    children = tree.children()
    if kind is type(None):
        return []
    if kind in (tuple, list):
        keys = [f"[{i}]" for i in range(len(children))]
    elif kind is dict:
        keys = [f"[{k!r}]" for k in aux]
    elif isinstance(kind, type) and issubclass(kind, tuple) and hasattr(kind, "_fields"):
        keys = [f".{f}" for f in kind._fields]
    else:
        return None
    paths = []
    for key, child in zip(keys, children):
        sub = _leaf_paths(child)
        if sub is None:
            return None
        paths += [key + s for s in sub]
    return paths


class _EqnContext(CustomRulesMixin):
    """What a rule sees of the emitter while spelling one equation."""

    def __init__(self, emitter: _ModuleEmitter, eqn: Equation, fn: Function,
                 folded: list[Equation]):
        self.emitter = emitter
        self.eqn = eqn
        self.fn = fn
        self.folded = folded
        self.unpack: list[int] | None = None
        self.rule_key: tuple | None = None
        # Operands produced by folded equations have no name; the rule spells them.
        # (Operands of a rule's twin equation elsewhere in the program have none here.)
        folded_values = {id(v) for e in folded for v in e.outputs}
        self.ins = [None if id(a) in folded_values or (not is_literal(a) and a not in emitter.env)
                    else emitter.atom(a) for a in eqn.inputs]

    def atom(self, a) -> str:
        return self.emitter.atom(a)

    def param(self, value) -> str:
        return self.emitter.param(value)

    def dtype(self, d) -> str:
        return dtype_source(d)

    def seq(self, atoms) -> str:
        return tuple_src([self.atom(a) for a in atoms])

    def _where(self) -> str:
        return f"{self.emitter.program.name}: {self.eqn.prim.name}"

    # -- nested regions as local functions --------------------------------
    def explicit_function(self, region: Region, hint: str, exact_name: str | None = None) -> str:
        """A local function taking every region input as a parameter (named after the
        operands passed in) and returning its outputs (a bare value for one)."""
        em = self.emitter
        shared = em.is_shared(region)
        if shared and id(region) in em.shared_functions:
            return em.shared_functions[id(region)]
        name = None
        if exact_name and exact_name.isidentifier() and em.namer.claim(exact_name):
            name = exact_name
        if name is None:
            name = em.namer.fresh(hint, "fn")
        operand_hints = [em.env.get(a) if not is_literal(a) else None for a in self.eqn.inputs]
        offset = len(self.eqn.inputs) - len(region.invars)
        hints = [operand_hints[offset + i] if 0 <= offset + i < len(operand_hints) else None
                 for i in range(len(region.invars))]
        params = em.name_binders(region.invars, hints)
        if shared:
            # A function called from several sites is one module-level def (it closes
            # over nothing), so JAX traces it once and shares its jaxpr as before.
            em.shared_functions[id(region)] = name
            em.module_defs.append(em.function(region, name, params, [], 1, returns=flat_return))
            if exact_name and name != exact_name:
                em.module_defs.append(stmt(f"{name}.__name__ = {exact_name!r}"))
            return name
        fdef = em.function(region, name, params, [], self.fn.depth + 1,
                           returns=flat_return)
        self.fn.body.append(fdef)
        if exact_name and name != exact_name:
            # jax.jit records the function's __name__ as the equation's name.
            self.fn.add(f"{name}.__name__ = {exact_name!r}")
        return name

    def carry_function(self, region: Region, hint: str, consts: Sequence[Any],
                       groups: list[int], result) -> str:
        """A local function for a loop body: the first ``len(consts)`` region inputs are
        the loop's closed-over values (referenced by their outer names), the rest come
        in tuple parameters of the given sizes (``carry``, ``x``)."""
        em = self.emitter
        name = em.namer.fresh(hint, "fn")
        invars = region.invars
        for v, outer in zip(invars[:len(consts)], consts):
            em.env[v] = em.closed_over(outer, self.fn)
        rest = invars[len(consts):]
        labels = ["carry", "x"] if len(groups) == 2 else ["carry"]
        params, prologue, k = [], [], 0
        outer_rest = list(self.eqn.inputs[len(self.eqn.inputs) - len(rest):])
        for label, n in zip(labels, groups):
            pname = em.namer.fresh(label)
            params.append(pname)
            hints = [em.env.get(a) if not is_literal(a) else None for a in outer_rest[k:k + n]]
            names = em.name_binders(rest[k:k + n], hints)
            if names:
                prologue.append(f"{tuple_src(names)} = {pname}")
            k += n
        if result == "single":
            returns = flat_return
        else:
            sizes = result

            def returns(outs, sizes=sizes):
                parts, j = [], 0
                for n in sizes:
                    parts.append(tuple_src(outs[j:j + n]))
                    j += n
                return parts[0] if len(parts) == 1 else ", ".join(parts)
        fdef = em.function(region, name, params, prologue, self.fn.depth + 1,
                           returns=returns)
        self.fn.body.append(fdef)
        return name
