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
        import jax.extend.core
        import jax.numpy  # noqa: F401  (modules that define primitives)
        import jax.random  # noqa: F401
        for module in list(sys.modules.values()):
            if getattr(module, "__name__", "").startswith("jax"):
                for value in list(vars(module).values()):
                    if isinstance(value, jax.extend.core.Primitive):
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
    "_import_callable": '''
def _import_callable(module_name, qualname, path):
    """A Python function the program calls back into: by module name, else from its file."""
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
HELPER_IMPORTS = {"_bind": ("sys",), "_mesh": (), "_dense": (), "_import_callable": ("importlib", "sys")}


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
