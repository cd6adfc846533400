"""Turning CLI arguments into Programs and arrays.

A PROGRAM argument is a saved program file, ``-`` (a saved program on stdin), or
``path/to/file.py:fun`` / ``package.module:fun`` traced on example arguments given
by ``--args 'f32[3], i32[2,2], f32[]'`` (shapes and dtypes), ``--args-from
FILE.npz`` (concrete arrays ``arg0``, ``arg1``, ...) or, when neither is given, by
the module itself: ``example_args()`` (and optionally ``example_kwargs()``)
returning the arguments, or an ``EXAMPLE_ARGS`` tuple.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import math
import re
import sys

from .errors import CliError

_DTYPES = {
    "f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64",
    "c64": "complex64", "c128": "complex128", "i8": "int8", "i16": "int16", "i32": "int32",
    "i64": "int64", "u8": "uint8", "u16": "uint16", "u32": "uint32", "u64": "uint64",
    "bool": "bool",
}
_SPEC = re.compile(r"^\s*([a-z0-9]+)\[([0-9,\s]*)\]\s*$")
_ARG_KEY = re.compile(r"arg(0|[1-9][0-9]*)")
_MAX_ELEMENTS = 2**63 - 1


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
        # XLA counts dimensions and elements in int64: a larger shape traces (JAX
        # keeps Python ints) and only fails much later, when saved or lowered.
        if math.prod(dims) > _MAX_ELEMENTS or any(d > _MAX_ELEMENTS for d in dims):
            raise CliError(f"--args: argument {i} {part.strip()!r} has a dimension or element "
                           f"count above 2**63-1 (XLA counts them in int64); give smaller "
                           f"dimensions")
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


def read_npz(path: str, what: str, single_name: str | None = None) -> dict:
    """The arrays of an ``.npz`` file (numeric data only: pickles are refused).  A
    single-array ``.npy`` file is read as ``{single_name: array}`` when the caller
    takes one (``arg0``: a program of one argument)."""
    import io
    import zipfile

    import numpy as np
    raw = read_input_bytes(path, what)
    if not raw.startswith((b"PK\x03\x04", b"PK\x05\x06", b"\x93NUMPY")):
        # (np.load reads anything else as a pickle, and says the file holds one.)
        raise CliError(f"{path}: is not an .npz archive or .npy array ({what}); write one "
                       f"with numpy.savez or numpy.save")
    try:
        data = np.load(io.BytesIO(raw), allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, KeyError) as e:
        raise CliError(f"{path}: cannot read as an .npz archive or .npy array ({what}): "
                       f"{' '.join(str(e).split())[:200]}") from None
    if isinstance(data, np.ndarray):  # an .npy file: np.load has read it whole
        if single_name is None:
            raise CliError(f"{path}: is a single .npy array, expected an .npz archive ({what})")
        return {single_name: data}
    try:
        with data:
            return {name: data[name] for name in data.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, KeyError) as e:
        raise CliError(f"{path}: cannot read as an .npz archive of arrays ({what}): "
                       f"{' '.join(str(e).split())[:200]}") from None


def read_input_bytes(path: str, what: str) -> bytes:
    """The whole content of an input file, read once (``-`` is stdin): pipes, FIFOs
    and ``<(...)`` process substitutions work like regular files."""
    if path == "-":
        return sys.stdin.buffer.read()
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise CliError(f"{path}: no such file ({what})") from None
    except IsADirectoryError:
        raise CliError(f"{path}: is a directory, expected a file ({what})") from None
    except PermissionError:
        raise CliError(f"{path}: permission denied ({what})") from None
    except OSError as e:
        raise CliError(f"{path}: cannot read ({what}): {e.strerror or e}") from None


def positional_args_from_npz(path: str) -> tuple:
    """Arrays named ``arg0``, ``arg1``, ... of ``--args-from``, in order."""
    arrays = read_npz(path, "--args-from", single_name="arg0")
    bad = sorted(k for k in arrays if not _ARG_KEY.fullmatch(k))
    if bad:
        raise CliError(f"{path}: unexpected array name(s) {bad[:5]}; --args-from expects "
                       f"positional arguments named arg0, arg1, ...")
    n = len(arrays)
    missing = [f"arg{i}" for i in range(n) if f"arg{i}" not in arrays]
    if missing:
        raise CliError(f"{path}: missing {missing[0]} (arguments must be arg0..arg{n - 1})")
    return tuple(arrays[f"arg{i}"] for i in range(n))


def import_function(target: str):
    """``path/to/file.py:fun`` or ``package.module:fun`` -> (function, module)."""
    if ":" not in target:
        raise CliError(f"{target!r}: expected MODULE_OR_FILE:FUNCTION, e.g. model.py:loss")
    where, _, name = target.rpartition(":")
    if where.endswith(".py") or os.sep in where:
        if not os.path.isfile(where):
            raise CliError(f"{where}: no such file")
        module_name = "jaxpr_cc_user_" + re.sub(r"\W", "_", os.path.basename(where)[:-3])
        spec = importlib.util.spec_from_file_location(module_name, where)
        module = importlib.util.module_from_spec(spec)
        # As `python FILE.py` does: modules next to the file are importable, during the
        # import and later (a function may import lazily while it is traced).
        directory = os.path.dirname(os.path.abspath(where))
        if directory not in sys.path:
            sys.path.insert(0, directory)
        # Registered like any imported module (dataclasses and pickle look it up).
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except SystemExit as e:
            sys.modules.pop(module_name, None)
            raise CliError(f"{where}: importing it {exited(e)}") from e
        except Exception as e:
            sys.modules.pop(module_name, None)
            raise CliError(f"{where}: importing failed: {type(e).__name__}: {e}") from e
    else:
        # As `python -m` finds modules of the current directory (after installed ones,
        # so a local file never shadows a package).
        if os.getcwd() not in sys.path:
            sys.path.append(os.getcwd())
        try:
            module = importlib.import_module(where)
        except SystemExit as e:
            raise CliError(f"{where}: importing it {exited(e)}") from e
        except ImportError as e:
            raise CliError(f"{where}: cannot import module: {e}") from e
        except Exception as e:
            raise CliError(f"{where}: importing failed: {type(e).__name__}: "
                           f"{' '.join(str(e).split())[:300]}") from e
    fun = getattr(module, name, None)
    if fun is None or not callable(fun):
        raise CliError(f"{where}: has no function {name!r}")
    return fun, module


def exited(e: SystemExit) -> str:
    """How the user's code asked to exit (``sys.exit``/``raise SystemExit``): the
    command reports it as an error of that code instead of exiting with its status."""
    code = e.code
    if code is None or isinstance(code, int):
        return f"called sys.exit({code if code is not None else ''})"
    return f"called sys.exit({' '.join(str(code).split())[:200]!r})"


def example_arguments(target: str, module, args_spec: str | None, args_from: str | None):
    """(args, kwargs) to trace ``target`` with, from the options or the module."""
    if args_spec is not None and args_from is not None:
        raise CliError("give example arguments with either --args or --args-from, not both")
    if args_spec is not None:
        return parse_args_spec(args_spec), {}
    if args_from is not None:
        return positional_args_from_npz(args_from), {}
    make_args = getattr(module, "example_args", None)
    if callable(make_args):
        try:
            args = make_args()
            make_kwargs = getattr(module, "example_kwargs", None)
            kwargs = make_kwargs() if callable(make_kwargs) else {}
        except SystemExit as e:
            raise CliError(f"{target}: example_args() {exited(e)}") from e
        except Exception as e:
            raise CliError(f"{target}: example_args() failed: {type(e).__name__}: {e}") from e
        if not isinstance(args, tuple) or not isinstance(kwargs, dict):
            raise CliError(f"{target}: example_args() must return a tuple "
                           f"(and example_kwargs() a dict)")
        return args, kwargs
    args = getattr(module, "EXAMPLE_ARGS", None)
    if isinstance(args, tuple):
        return args, {}
    raise CliError(f"{target}: give example arguments with --args or --args-from "
                   f"(or define example_args() in the module)")


def trace_target(target: str, args_spec: str | None, args_from: str | None = None):
    """Trace ``MODULE_OR_FILE:FUNCTION`` into a Program."""
    import jaxpr_cc
    from .progress import progress
    # The user's code may change directory; the command's own paths (-o) stay
    # relative to where it started.
    start = os.getcwd()
    try:
        fun, module = import_function(target)
        args, kwargs = example_arguments(target, module, args_spec, args_from)
        with progress(f"tracing {target}"):
            return jaxpr_cc.trace(fun, *args, **kwargs)
    except SystemExit as e:
        raise CliError(f"{target}: tracing it {exited(e)}") from e
    except CliError:
        raise
    except Exception as e:
        raise CliError(f"{target}: tracing failed: {type(e).__name__}: "
                       f"{' '.join(str(e).split())[:600]}") from e
    finally:
        os.chdir(start)


def load_saved(target: str, data: bytes | None = None):
    """A saved program from a file (or ``-`` for stdin), or from ``data``, the bytes
    already read from ``target``."""
    import jaxpr_cc
    from jaxpr_cc.io import LoadError, loads
    from jaxpr_cc.storage.executables import is_executable
    from .progress import progress
    try:
        with progress(f"loading {target}"):
            if data is not None:
                return loads(data, name="<stdin>" if target == "-" else target)
            if target == "-":
                return loads(sys.stdin.buffer.read(), name="<stdin>")
            return jaxpr_cc.load(target)
    except LoadError as e:
        if target != "-" and is_executable(target if data is None else data):
            raise CliError(f"{target}: is a compiled executable (from `jaxpr-cc compile`), not a "
                           f"saved program; run it with `jaxpr-cc exec`") from e
        raise CliError(str(e)) from e


def load_program_arg(target: str, args_spec: str | None, args_from: str | None = None):
    """A PROGRAM command-line argument -> Program."""
    if target != "-" and ":" in target and not os.path.exists(target):
        return trace_target(target, args_spec, args_from)
    if args_spec is not None or args_from is not None:
        raise CliError(f"{target}: --args/--args-from apply to MODULE_OR_FILE:FUNCTION, not to "
                       f"a saved program")
    return load_saved(target)
