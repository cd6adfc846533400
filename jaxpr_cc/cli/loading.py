"""Turning CLI arguments into Programs: ``file.py:fun`` / ``pkg.mod:fun`` plus an
argument spec such as ``'f32[3], i32[2,2], f32[]'``."""
from __future__ import annotations

import importlib
import importlib.util
import os
import re

from .errors import CliError

_DTYPES = {
    "f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64",
    "c64": "complex64", "c128": "complex128", "i8": "int8", "i16": "int16", "i32": "int32",
    "i64": "int64", "u8": "uint8", "u16": "uint16", "u32": "uint32", "u64": "uint64",
    "bool": "bool",
}
_SPEC = re.compile(r"^\s*([a-z0-9]+)\[([0-9,\s]*)\]\s*$")


def parse_args_spec(spec: str) -> tuple:
    """``'f32[3], f32[]'`` -> ShapeDtypeStructs."""
    import jax
    import jax.numpy as jnp
    out = []
    for i, part in enumerate(_split_top(spec)):
        m = _SPEC.match(part)
        if not m or m.group(1) not in _DTYPES:
            raise CliError(f"--args: argument {i} {part.strip()!r} is not of the form DTYPE[DIMS] "
                           f"(DTYPE one of {', '.join(sorted(_DTYPES))}), e.g. 'f32[3,4]'")
        dims = tuple(int(d) for d in m.group(2).replace(" ", "").split(",") if d)
        out.append(jax.ShapeDtypeStruct(dims, jnp.dtype(_DTYPES[m.group(1)])))
    return tuple(out)


def _split_top(spec: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in spec:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return parts


def import_function(target: str):
    """``path/to/file.py:fun`` or ``package.module:fun`` -> (function, module)."""
    if ":" not in target:
        raise CliError(f"{target!r}: expected MODULE_OR_FILE:FUNCTION, e.g. model.py:loss")
    where, _, name = target.rpartition(":")
    if where.endswith(".py") or os.sep in where:
        if not os.path.isfile(where):
            raise CliError(f"{where}: no such file")
        spec = importlib.util.spec_from_file_location(
            "jaxpr_cc_user_" + re.sub(r"\W", "_", os.path.basename(where)[:-3]), where)
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as e:
            raise CliError(f"{where}: importing failed: {type(e).__name__}: {e}") from e
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as e:
            raise CliError(f"{where}: cannot import module: {e}") from e
    fun = getattr(module, name, None)
    if fun is None or not callable(fun):
        raise CliError(f"{where}: has no function {name!r}")
    return fun, module


def load_program_arg(target: str, args_spec: str | None):
    """A PROGRAM command-line argument -> Program."""
    import jaxpr_cc
    if ":" in target and not os.path.exists(target):
        fun, module = import_function(target)
        if args_spec is not None:
            example = parse_args_spec(args_spec)
        elif hasattr(module, "example_args"):
            example = tuple(module.example_args())
        else:
            raise CliError(f"{target}: give example arguments with --args "
                           f"(or define example_args() in the module)")
        try:
            return jaxpr_cc.trace(fun, *example)
        except Exception as e:
            raise CliError(f"{target}: tracing failed: {type(e).__name__}: {e}") from e
    if os.path.isdir(target):
        raise CliError(f"{target}: is a directory, expected a saved program")
    if not os.path.exists(target):
        raise CliError(f"{target}: no such file")
    load = getattr(jaxpr_cc, "load", None)
    if load is None:
        raise CliError(f"{target}: reading saved programs is not available in this build")
    try:
        return load(target)
    except ValueError as e:
        raise CliError(str(e)) from e
