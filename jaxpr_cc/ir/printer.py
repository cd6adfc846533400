"""A deterministic, readable text form of Programs, independent of JAX's printer.

Values are named in order of definition (``%0``, ``%1``, ...), inputs by their hint
where they have one, constants ``%c0``...  Parameters are printed sorted by name
through the parameter-type registry (``ir.param_types``); anything unknown falls back
to ``repr`` with memory addresses removed, so two processes print byte-identical text.
"""
from __future__ import annotations

import re
from typing import Any

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


class _Printer:
    def __init__(self):
        self.namer = Namer()
        self.lines: list[str] = []

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

    def equation(self, eqn: Equation, depth: int) -> None:
        region_keys = {k for k, _, _ in eqn.regions()}
        params = [f"{k}={format_param(v)}" for k, v in sorted(eqn.params.items())
                  if k not in region_keys]
        ins = ", ".join(self.namer.ref(a) for a in eqn.inputs)
        outs = ", ".join(f"{self.namer.define(v)}:{short_type(v.aval)}" for v in eqn.outputs)
        head = eqn.prim.name + (f"[{', '.join(params)}]" if params else "")
        effects = ""
        if eqn.effects:
            effects = " effects={" + ", ".join(sorted(_ADDRESS.sub("", str(e)) for e in eqn.effects)) + "}"
        lhs = f"{outs} = " if outs else ""
        subs = list(eqn.regions())
        self.emit(depth, f"{lhs}{head} {ins}{effects}".rstrip() + (" {" if subs else ""))
        for key, idx, sub in subs:
            label = key if idx is None else f"{key}[{idx}]"
            mark = len(self.lines)
            self.lines.append("")
            args = self.binders(sub, depth, use_hint=False)
            self.lines[mark] = "  " * (depth + 1) + f"{label}({args}) {{"
            self.region_body(sub, depth + 1)
            self.emit(depth + 1, "}")
        if subs:
            self.emit(depth, "}")


def print_region(region: Region, name: str = "region") -> str:
    p = _Printer()
    mark = len(p.lines)
    p.lines.append("")
    args = p.binders(region, 0, use_hint=True)
    outs = ", ".join(short_type(a.aval) for a in region.outvars)
    p.lines[mark] = f"func @{name}({args}) -> ({outs}) {{"
    p.region_body(region, 0)
    p.emit(0, "}")
    return "\n".join(p.lines) + "\n"


def print_program(program) -> str:
    header = [f"# in_tree: {program.in_tree}", f"# out_tree: {program.out_tree}"]
    if program.params:
        header.append(f"# bound params: {len(program.params)}")
    return "\n".join(header) + "\n" + print_region(program.body, program.name)


def _is_function(value: Any) -> bool:
    """Python functions and JAX's wrappers of them (custom rules, thunks)."""
    return param_types.is_python_callable(value)
