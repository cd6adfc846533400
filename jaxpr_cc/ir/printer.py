"""A deterministic, readable text form of Programs, independent of JAX's printer.

Values are named in order of definition (``%0``, ``%1``, ...), inputs by their hint
where they have one, constants ``%c0``...  Parameters are printed sorted by name
through the parameter-type registry (``ir.param_types``); anything unknown falls back
to ``repr`` with memory addresses removed, so two processes print byte-identical text.
"""
from __future__ import annotations

import re
from typing import Any

from ..closure.ir_rules import IN_PROCESS_PARAMS
from . import param_types
from .equation import Equation
from .param_types import SMALL_ARRAY, format_array, format_scalar  # noqa: F401 (re-exported)
from .region import Region
from .value import Value, is_literal

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+|0x[0-9a-fA-F]{6,}")
_IDENT = re.compile(r"[^A-Za-z0-9_.]")


def short_type(aval) -> str:
    try:
        return aval.str_short(short_dtypes=True)
    except TypeError:
        return str(aval)


class Namer:
    def __init__(self):
        self.names: dict[Value, str] = {}
        self.taken: set[str] = set()
        self.counter = 0
        self.consts = 0

    def _unique(self, base: str) -> str:
        name, i = base, 1
        while name in self.taken:
            name = f"{base}_{i}"
            i += 1
        self.taken.add(name)
        return name

    def define(self, v: Value, *, const: bool = False, use_hint: bool = False) -> str:
        if const:
            name = self._unique(f"%c{self.consts}")
            self.consts += 1
        elif use_hint and v.name:
            name = self._unique("%" + _IDENT.sub("_", v.name))
        else:
            name = self._unique(f"%{self.counter}")
            self.counter += 1
        self.names[v] = name
        return name

    def ref(self, atom) -> str:
        if is_literal(atom):
            return f"{format_scalar(atom.val)}:{short_type(atom.aval)}"
        try:
            return self.names[atom]
        except KeyError:
            return "%<undefined>"


def format_param(value: Any) -> str:
    """Format a parameter value through the parameter-type registry."""
    return param_types.entry_for(value).print(value, format_param)


# Params a primitive's call sites almost always carry at their default values (a plain
# ``jax.jit`` call): not printed, so a call prints as what it calls and with what.
# ``name: text`` elides a param printed as ``text``; ``name: (text,)`` elides a tuple
# param all of whose entries print as ``text``.
_DEFAULT_PARAMS: dict[str, dict[str, Any]] = {
    "jit": {"compiler_options_kvs": "()", "ctx_mesh": "Mesh(axis_sizes=(), axis_names=())",
            "inline": "False", "keep_unused": "False", "donated_invars": ("False",),
            "in_layouts": ("None",), "out_layouts": ("None",),
            "in_shardings": ("UnspecifiedValue",), "out_shardings": ("UnspecifiedValue",)},
}


def _is_default(defaults: dict, key: str, value: Any) -> bool:
    want = defaults.get(key)
    if want is None:
        return False
    if type(want) is tuple:
        return type(value) is tuple and all(format_param(v) == want[0] for v in value)
    return format_param(value) == want


class _Printer:
    def __init__(self, functions: dict[int, str] | None = None):
        self.namer = Namer()
        self.lines: list[str] = []
        self.functions = functions or {}  # region id -> symbol, for named functions

    def emit(self, depth: int, text: str) -> None:
        self.lines.append("  " * depth + text)

    def binders(self, region: Region, depth: int, use_hint: bool) -> str:
        for v, c in zip(region.constvars, region.consts if region.consts is not None
                        else [None] * len(region.constvars)):
            name = self.namer.define(v, const=True)
            body = format_array(c) if c is not None else "<open>"
            self.emit(depth + 1, f"const {name}:{short_type(v.aval)} = {body}")
        return ", ".join(f"{self.namer.define(v, use_hint=use_hint)}:{short_type(v.aval)}"
                         for v in region.invars)

    def region_body(self, region: Region, depth: int) -> None:
        for eqn in region.equations:
            self.equation(eqn, depth + 1)
        outs = ", ".join(self.namer.ref(a) for a in region.outvars)
        self.emit(depth + 1, f"return {outs}")

    def function(self, region: Region, name: str, use_hint: bool) -> None:
        mark = len(self.lines)
        self.lines.append("")
        args = self.binders(region, 0, use_hint=use_hint)
        outs = ", ".join(short_type(a.aval) for a in region.outvars)
        self.lines[mark] = f"func @{name}({args}) -> ({outs}) {{"
        self.region_body(region, 0)
        self.emit(0, "}")

    def equation(self, eqn: Equation, depth: int) -> None:
        subs = list(eqn.regions())
        region_keys = {k for k, _, _ in subs}
        defaults = _DEFAULT_PARAMS.get(eqn.prim.name, {})
        params = [f"{k}={format_param(v)}" for k, v in sorted(eqn.params.items())
                  if k not in region_keys and k not in IN_PROCESS_PARAMS
                  and not _is_default(defaults, k, v)]
        # Calls of named functions are params (``jaxpr=@block``); only regions called
        # from this site alone are printed inline, in braces.
        called = {}
        for key, idx, sub in subs:
            symbol = self.functions.get(id(sub))
            if symbol is not None:
                called.setdefault(key, []).append((idx, "@" + symbol))
        for key, refs in called.items():
            if all(i is None for i, _ in refs):
                params.append(f"{key}={refs[0][1]}")
            elif len(refs) == len(eqn.params[key]):
                params.append(f"{key}=({', '.join(r for _, r in refs)},)")
            else:
                params.append(f"{key}={{{', '.join(f'{i}: {r}' for i, r in refs)}}}")
        params.sort()
        inline = [(k, i, sub) for k, i, sub in subs if id(sub) not in self.functions]
        ins = ", ".join(self.namer.ref(a) for a in eqn.inputs)
        outs = ", ".join(f"{self.namer.define(v)}:{short_type(v.aval)}" for v in eqn.outputs)
        head = eqn.prim.name + (f"[{', '.join(params)}]" if params else "")
        effects = ""
        if eqn.effects:
            effects = " effects={" + ", ".join(sorted(_ADDRESS.sub("", str(e)) for e in eqn.effects)) + "}"
        lhs = f"{outs} = " if outs else ""
        self.emit(depth, f"{lhs}{head} {ins}{effects}".rstrip() + (" {" if inline else ""))
        for key, idx, sub in inline:
            label = key if idx is None else f"{key}[{idx}]"
            mark = len(self.lines)
            self.lines.append("")
            args = self.binders(sub, depth, use_hint=False)
            self.lines[mark] = "  " * (depth + 1) + f"{label}({args}) {{"
            self.region_body(sub, depth + 1)
            self.emit(depth + 1, "}")
        if inline:
            self.emit(depth, "}")


def print_region(region: Region, name: str = "region", *, shared: bool = True) -> str:
    """The text of ``region`` as a module: its named functions (regions it calls
    from more than one site, or recursively), each once, then ``region`` itself.
    ``shared=False`` prints every non-recursive function inline at each call site
    (the same text whichever call sites JAX happened to share)."""
    from .module import function_names
    names = function_names(region, name, shared=shared)
    p = _Printer(names)
    for rid, fn_name in names.items():
        if rid != id(region):
            p.function(_find(region, rid), fn_name, use_hint=False)
    p.function(region, name, use_hint=True)
    return "\n".join(p.lines) + "\n"


def _find(entry: Region, rid: int) -> Region:
    for r in entry.regions():
        if id(r) == rid:
            return r
    raise KeyError(rid)


def print_program(program, *, shared: bool = True) -> str:
    header = [f"# in_tree: {program.in_tree}", f"# out_tree: {program.out_tree}"]
    if program.params:
        header.append(f"# bound params: {len(program.params)}")
    return "\n".join(header) + "\n" + print_region(program.body, program.name,
                                                     shared=shared)


def _is_function(value: Any) -> bool:
    """Python functions and JAX's wrappers of them (custom rules, thunks)."""
    return param_types.is_python_callable(value)
