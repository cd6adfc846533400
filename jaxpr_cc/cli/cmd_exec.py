"""``jaxpr-cc exec``: run a saved program or a compiled executable on arrays.

    jaxpr-cc exec loss.jcc --inputs in.npz -o out.npz
    jaxpr-cc exec loss.xla --inputs in.npz -o -        # an executable from `jaxpr-cc compile`

Inputs: the ``.npz`` holds one array per flattened argument leaf, named either
``arg0``, ``arg1``, ... in the order of the flattened ``(args, kwargs)`` pytree, or
by the argument names ``jaxpr-cc show`` prints (``x``, ``params.w``; saved programs
only).  Dtypes and shapes must match the program exactly; key arrays are given as
their ``uint32`` key data; bfloat16/float8 values as arrays of that dtype (numpy
stores them as raw 2- or 1-byte void items), as the unsigned integers of their bits,
or as floats that convert exactly.  A program of one argument array also takes an
``.npy`` file (``--inputs x.npy``).

Outputs: ``out0``, ``out1``, ... for the flattened result leaves, in order (key
arrays as their key data).
"""
from __future__ import annotations

import io

from .errors import CliError


def register(sub) -> None:
    p = sub.add_parser("exec", help="run a saved program or compiled executable on arrays",
                       description="Run PROGRAM_OR_EXECUTABLE on the arrays of --inputs (arg0, "
                                   "arg1, ... per flattened argument leaf, or the argument "
                                   "names `show` prints) and write the result leaves as out0, "
                                   "out1, ... to an .npz file.")
    p.add_argument("program", metavar="PROGRAM_OR_EXECUTABLE")
    p.add_argument("--inputs", required=True, metavar="IN.npz",
                   help="input arrays (an .npy file for a program of one argument array)")
    p.add_argument("-o", "--output", required=True, metavar="OUT.npz",
                   help="where to write the outputs ('-' for stdout)")
    p.set_defaults(run=run)


def run(args) -> int:
    import numpy as np
    from jax import tree_util

    from ..storage.executables import is_executable
    from .loading import load_saved, read_input_bytes, read_npz
    from .output import check_writable, write_output

    check_writable(args.output, [(args.program, "the program"),
                                 (args.inputs, "the --inputs file")])
    arrays = read_npz(args.inputs, "--inputs", single_name=SINGLE_ARRAY)
    # Read once: the program may come from a pipe or FIFO (`<(cat p.jcc)`, `-`).
    data = read_input_bytes(args.program, "program")
    if not is_executable(data):
        # (a file that is neither gets the saved-program reader's precise complaint)
        program = load_saved(args.program, data)
        avals = [v.aval for v in program.arg_values]
        names = [v.name for v in program.arg_values]
        leaves = match_inputs(arrays, avals, names, args.inputs)
        # Compiled as `jaxpr-cc compile` does, and the executable run: what
        # `compile` + `exec EXE` and jax.jit give (op by op, JAX refuses what a
        # compiled program accepts, such as an uneven sharding constraint), and host
        # arrays from the file placed as the program was traced with.
        from ..backends.xla import compile as compile_program
        call = _compiled(args.program, compile_program, program)
        in_tree = program.in_tree
    else:
        exe = _load_executable(args.program, data)
        avals = list(exe.arg_avals)
        leaves = match_inputs(arrays, avals, [None] * len(avals), args.inputs)
        call, in_tree = exe, exe.in_tree
    call_args, call_kwargs = tree_util.tree_unflatten(in_tree, leaves)
    try:
        result = call(*call_args, **call_kwargs)
    except Exception as e:  # running can fail on this machine (devices, memory)
        raise CliError(f"{args.program}: running failed: {type(e).__name__}: "
                       f"{' '.join(str(e).split())[:300]}") from None
    outputs = {f"out{i}": _host(leaf) for i, leaf in enumerate(tree_util.tree_leaves(result))}
    buf = io.BytesIO()
    np.savez(buf, **outputs)
    write_output(args.output, buf.getvalue())
    return 0


def _compiled(path: str, compile_program, program):
    try:
        return compile_program(program)
    except Exception as e:  # compiling can fail on this machine (devices, memory)
        raise CliError(f"{path}: compiling failed: {type(e).__name__}: "
                       f"{' '.join(str(e).split())[:300]}") from None


def _load_executable(path: str, data: bytes):
    """A compiled executable from ``data``, the bytes read from ``path``
    (``is_executable(data)`` holds: a bounded sniff, so no archive is decompressed
    before it is known to be one)."""
    import os
    import stat
    import tempfile
    try:
        from ..backends.xla import load_executable
    except ImportError as e:
        raise CliError(f"{path}: loading compiled executables is not available in this build "
                       f"({e})") from None
    try:
        if path != "-" and stat.S_ISREG(os.stat(path).st_mode):
            return load_executable(path)
        # The loader reads a file by name; bytes from a pipe are spooled to a private
        # temporary file, and its name is replaced by the user's in messages.
        with tempfile.TemporaryDirectory(prefix="jaxpr-cc-exec-") as tmp:
            spooled = os.path.join(tmp, "program.xla")
            with open(spooled, "wb") as f:
                f.write(data)
            try:
                return load_executable(spooled)
            except ValueError as e:
                raise ValueError(str(e).replace(spooled, path)) from None
    except ValueError as e:  # the XLA backend's LoadError is a ValueError
        raise CliError(" ".join(str(e).split())) from None
    except OSError as e:
        raise CliError(f"{path}: cannot read: {e.strerror or e}") from None


def _host(leaf):
    import jax
    import numpy as np
    if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        leaf = jax.random.key_data(leaf)
    return np.asarray(leaf)


SINGLE_ARRAY = "arg0"  # the name an .npy input (one array) stands for


def match_inputs(arrays: dict, avals: list, names: list, where: str) -> list:
    """The argument leaves, in order, from the arrays of an .npz file."""
    n = len(avals)
    if n != 1 and where.endswith(".npy") and set(arrays) == {SINGLE_ARRAY}:
        raise CliError(f"{where}: an .npy file holds one array, but the program takes {n} "
                       f"argument leaves; give an .npz archive with arrays arg0..arg{n - 1}")
    by_position = [f"arg{i}" for i in range(n)]
    keys = set(arrays)
    if keys == set(by_position):
        order = by_position
    elif all(names) and len(set(names)) == n and keys == set(names):
        order = list(names)
    else:
        expected = ", ".join(by_position[:6]) + (", ..." if n > 6 else "")
        named = (" or " + ", ".join(names[:6]) + (", ..." if n > 6 else "")) if all(names) else ""
        named_set = {name for name in names if name}
        extra = sorted(keys - set(by_position) - named_set)
        positional = sorted(keys & set(by_position))
        by_name = sorted(keys & named_set - set(by_position))
        if extra and not any(names):
            detail = (f"unexpected {extra[:4]} (argument names are kept in saved programs, "
                      f"not in executables: name the arrays by position)")
        elif extra:
            detail = f"unexpected {extra[:4]}"
        elif positional and by_name:
            detail = (f"it mixes positional names {positional[:4]} with argument names "
                      f"{by_name[:4]}; use one kind")
        else:
            scheme = names if by_name else by_position
            detail = f"missing {[k for k in scheme if k not in keys][:4]}"
        raise CliError(f"{where}: expected {n} arrays named {expected}{named}; {detail}")
    return [_weak_if_traced_so(_convert(arrays[key], aval, key, where), aval)
            for key, aval in zip(order, avals)]


def _weak_if_traced_so(value, aval):
    # An .npz cannot say "Python scalar"; an input traced as one is given as one
    # (programs check weak types like jax.jit's cache does).
    if getattr(aval, "weak_type", False):
        from ..jax_adapter import weak_device_array
        return weak_device_array(value)
    return value


def _convert(value, aval, key: str, where: str):
    import jax
    import numpy as np
    from ..storage import dtypes as storage_dtypes
    shape = tuple(aval.shape)
    dtype = aval.dtype
    impl = storage_dtypes.dtype_name(dtype)
    if impl is not None and impl.startswith("key<"):
        data_dtype, data_shape = storage_dtypes.storage_layout(dtype, shape)
        if value.dtype != data_dtype or value.shape != data_shape:
            raise CliError(f"{where}: {key} must be the key data of {impl}{list(shape)}: "
                           f"{data_dtype}{list(data_shape)}, got {value.dtype}{list(value.shape)}")
        return jax.random.wrap_key_data(value, impl=impl[4:-1])
    if value.shape != shape:
        raise CliError(f"{where}: {key} has shape {list(value.shape)}; the program expects "
                       f"{aval.str_short()}")
    if value.dtype == dtype:
        return value
    if jax.dtypes.canonicalize_dtype(value.dtype) == dtype:
        # As a Program call (and jax.jit) takes it: without x64 a float64 array is
        # a float32 argument.
        return value.astype(dtype)
    if value.dtype.itemsize == np.dtype(dtype).itemsize and value.dtype.kind == "V" \
            and np.dtype(dtype).kind == "V":
        # A .npy of bfloat16 / float8 stores the raw bits as a void dtype; an integer
        # array is numbers, never bits to reinterpret.
        return value.view(dtype)
    if np.dtype(dtype).kind == "V" and value.dtype.kind == "f":
        converted = value.astype(dtype)
        if np.array_equal(converted.astype(value.dtype), value, equal_nan=True):
            return converted
    raise CliError(f"{where}: {key} is {value.dtype}{list(value.shape)}; the program expects "
                   f"{aval.str_short()} (no conversions are made)")
