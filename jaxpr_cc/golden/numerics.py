"""The ``numerics.txt`` view: values (and gradients) as readable, exact text.

Each output leaf is a header ``value[0]: float32[2,3]`` (path, dtype, shape)
followed by its elements, one line per chunk of a row of the last axis, labelled
with the index of the chunk's first element::

    value[0]: float32[2,3]
      [0,0] -0.75 0.25 1.5
      [1,0] 2 -0.125 0.1

Floats are printed with the shortest text that reads back to the same value in
their own precision (so the file is exact); complex numbers as ``re+imj``,
booleans as ``true``/``false``, PRNG keys as their raw key data.

:func:`compare_numerics` reads two such texts and compares them leaf by leaf:
paths, dtypes and shapes exactly; integers, booleans and keys exactly; floats
with a tolerance that depends on the dtype (:data:`RTOL`): ``|actual - expected|
<= rtol * |expected| + rtol * max(largest |expected| in the leaf, 1)``, NaN only
equal to NaN and infinities only to themselves.  So a golden written on one CPU holds on
another, whose vector units may sum in a different order.
"""
from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Mapping

import numpy as np

__all__ = ["RTOL", "NumericsParseError", "compare_numerics", "format_leaves",
           "format_value", "parse_numerics", "rtol_for"]

#: Relative tolerance per dtype name (other float dtypes: 8 machine epsilons).
RTOL = {
    "float64": 1e-12, "complex128": 1e-12,
    "float32": 1e-6, "complex64": 1e-6,
    "float16": 1e-2, "bfloat16": 1e-2,
}
CHUNK = 8  # elements per line
MAX_REPORTED = 8  # element mismatches listed per leaf

_HEADER = re.compile(r"^(?P<path>\S.*): (?P<dtype>[A-Za-z0-9_<>]+)\[(?P<shape>[0-9,]*)\]$")
_ROW = re.compile(r"^  \[(?P<index>[0-9,]*)\]( (?P<values>.*))?$")
_ERROR = re.compile(r"^(?P<path>\S.*): error: (?P<message>.*)$")


class NumericsParseError(ValueError):
    """A numerics text that does not follow the format."""


def _float_dtype(dtype: np.dtype) -> np.dtype:
    """The float type whose shortest repr is exact for ``dtype``'s values: numpy
    formats float16/32/64 natively; narrower ml_dtypes floats read back exactly
    from a float32 repr."""
    if dtype in (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)):
        return dtype
    return np.dtype(np.float32)


def format_float(x: Any, dtype: np.dtype) -> str:
    value = float(x)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    target = _float_dtype(dtype)
    if target == np.dtype(np.float64):
        return repr(value)
    scalar = target.type(value)
    magnitude = abs(value)
    if magnitude != 0.0 and (magnitude < 1e-4 or magnitude >= 1e16):
        return np.format_float_scientific(scalar, unique=True, trim="-")
    return np.format_float_positional(scalar, unique=True, trim="-")


def format_value(x: Any, dtype: np.dtype) -> str:
    """One element as text (see the module docstring)."""
    kind = dtype.kind
    if kind == "b":
        return "true" if bool(x) else "false"
    if kind in "iu":
        return str(int(x))
    if kind == "c":
        part = np.dtype(np.float64 if dtype.itemsize == 16 else np.float32)
        real, imag = format_float(x.real, part), format_float(x.imag, part)
        return f"{real}{imag if imag.startswith('-') else '+' + imag}j"
    if kind == "f" or _is_ml_float(dtype):
        return format_float(x, dtype)
    raise TypeError(f"numerics: cannot format elements of dtype {dtype}")


def _is_ml_float(dtype: np.dtype) -> bool:
    try:
        import ml_dtypes
        ml_dtypes.finfo(dtype)
        return True
    except Exception:
        return False


def _leaf_text(path: str, leaf: Any) -> list[str]:
    import jax
    dtype_label = None
    if hasattr(leaf, "dtype") and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        dtype_label = f"key<{jax.random.key_impl(leaf)}>"
        shape = tuple(leaf.shape)
        data = np.asarray(jax.random.key_data(leaf))
    else:
        data = np.asarray(leaf)
        shape = data.shape
    dtype = data.dtype
    dtype_label = dtype_label or dtype.name
    lines = [f"{path}: {dtype_label}[{','.join(map(str, shape))}]"]
    rows = data.reshape(1, 1) if data.ndim == 0 else data.reshape(-1, data.shape[-1])
    if rows.shape[-1] == 0 or rows.shape[0] == 0:
        return lines
    lead_shape = data.shape[:-1] if data.ndim else ()
    for r, row in enumerate(rows):
        lead = np.unravel_index(r, lead_shape) if lead_shape else ()
        for start in range(0, len(row), CHUNK):
            index = [int(i) for i in lead] + ([start] if data.ndim else [])
            values = " ".join(format_value(v, dtype) for v in row[start:start + CHUNK])
            lines.append(f"  [{','.join(map(str, index))}] {values}")
    return lines


def format_leaves(label: str, tree: Any) -> list[str]:
    """Lines for every leaf of ``tree``, paths prefixed by ``label``."""
    import jax
    lines = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        lines.extend(_leaf_text(label + jax.tree_util.keystr(path), leaf))
    if not lines:
        lines.append(f"{label}: (no array leaves)")
    return lines


# ---------------------------------------------------------------------------- parsing
@dataclasses.dataclass
class _Leaf:
    path: str
    dtype: str
    shape: tuple
    values: list
    line: int
    error: str | None = None


def parse_numerics(text: str) -> list[_Leaf]:
    """The leaves of a numerics text; comment lines (``#``) are skipped."""
    leaves: list[_Leaf] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        if line.startswith("  "):
            m = _ROW.match(line)
            if m is None or not leaves or leaves[-1].error is not None:
                raise NumericsParseError(f"line {number}: an element row outside a leaf: {line!r}")
            leaves[-1].values.extend((m.group("values") or "").split())
            continue
        m = _HEADER.match(line)
        if m is not None:
            shape = tuple(int(d) for d in m.group("shape").split(",") if d)
            leaves.append(_Leaf(m.group("path"), m.group("dtype"), shape, [], number))
            continue
        m = _ERROR.match(line)
        if m is not None:
            leaves.append(_Leaf(m.group("path"), "", (), [], number, error=m.group("message")))
            continue
        if line.endswith(": (no array leaves)"):
            continue
        raise NumericsParseError(f"line {number}: expected 'PATH: DTYPE[SHAPE]', got {line!r}")
    return leaves


def rtol_for(dtype_name: str, table: Mapping[str, float] | None = None) -> float:
    table = RTOL if table is None else {**RTOL, **table}
    if dtype_name in table:
        return table[dtype_name]
    try:
        import ml_dtypes
        return 8.0 * float(ml_dtypes.finfo(np.dtype(dtype_name)).eps)
    except Exception:
        return 0.0


def _parse_element(token: str, dtype_name: str) -> Any:
    if dtype_name == "bool":
        if token not in ("true", "false"):
            raise ValueError(token)
        return token == "true"
    if dtype_name.startswith(("int", "uint", "key<")):
        return int(token)
    if dtype_name.startswith("complex"):
        return complex(token)
    return float(token)


def _close(a: Any, e: Any, rtol: float, floor: float) -> bool:
    if isinstance(e, complex) or isinstance(a, complex):
        a, e = complex(a), complex(e)
        return (_close(a.real, e.real, rtol, floor) and _close(a.imag, e.imag, rtol, floor))
    if math.isnan(e) or math.isnan(a):
        return math.isnan(e) and math.isnan(a)
    if math.isinf(e) or math.isinf(a):
        return a == e
    return abs(a - e) <= rtol * abs(e) + floor


def _compare_leaf(exp: _Leaf, act: _Leaf, table: Mapping[str, float] | None) -> list[str]:
    where = exp.path
    if exp.error is not None or act.error is not None:
        if exp.error != act.error:
            return [f"{where}: expected {'error ' + repr(exp.error) if exp.error else 'values'}, "
                    f"got {'error ' + repr(act.error) if act.error else 'values'}"]
        return []
    if (exp.dtype, exp.shape) != (act.dtype, act.shape):
        return [f"{where}: expected {exp.dtype}{list(exp.shape)}, got {act.dtype}{list(act.shape)}"]
    if len(exp.values) != len(act.values):
        return [f"{where}: expected {len(exp.values)} elements, got {len(act.values)}"]
    try:
        e_vals = [_parse_element(t, exp.dtype) for t in exp.values]
        a_vals = [_parse_element(t, act.dtype) for t in act.values]
    except ValueError as err:
        return [f"{where}: unreadable element {err}"]
    exact = exp.dtype == "bool" or exp.dtype.startswith(("int", "uint", "key<"))
    problems = []
    if exact:
        bad = [i for i, (a, e) in enumerate(zip(a_vals, e_vals)) if a != e]
        for i in bad[:MAX_REPORTED]:
            problems.append(f"{where}{_index(i, exp.shape)}: expected {exp.values[i]}, "
                            f"got {act.values[i]} (compared exactly)")
    else:
        rtol = rtol_for(exp.dtype, table)
        finite = [abs(complex(e)) for e in e_vals
                  if not (isinstance(e, float) and (math.isnan(e) or math.isinf(e)))
                  and not (isinstance(e, complex) and not np.isfinite(e))]
        # Values that cancel to (nearly) zero, such as the gradient of a normalized
        # output, are rounding noise of the size of the values that cancelled; the
        # largest magnitude in the leaf, or 1, stands in for that size.
        floor = rtol * max(max(finite, default=0.0), 1.0)
        bad = [i for i, (a, e) in enumerate(zip(a_vals, e_vals)) if not _close(a, e, rtol, floor)]
        for i in bad[:MAX_REPORTED]:
            problems.append(f"{where}{_index(i, exp.shape)}: expected {exp.values[i]}, "
                            f"got {act.values[i]} (rtol {rtol:g} for {exp.dtype})")
    if len(bad) > MAX_REPORTED:
        problems.append(f"{where}: ... {len(bad) - MAX_REPORTED} more elements differ")
    return problems


def _index(flat: int, shape: tuple) -> str:
    if not shape:
        return ""
    return "[" + ",".join(str(int(i)) for i in np.unravel_index(flat, shape)) + "]"


def compare_numerics(expected: str, actual: str, *,
                     rtol: Mapping[str, float] | None = None) -> list[str]:
    """Differences between two numerics texts beyond tolerance (empty: they agree);
    ``rtol`` overrides entries of :data:`RTOL` by dtype name."""
    if expected == actual:
        return []
    try:
        exp_leaves = parse_numerics(expected)
    except NumericsParseError as e:
        return [f"the golden numerics file is malformed: {e}"]
    act_leaves = parse_numerics(actual)
    exp_paths = [leaf.path for leaf in exp_leaves]
    act_paths = [leaf.path for leaf in act_leaves]
    if exp_paths != act_paths:
        return [f"leaves differ: expected {exp_paths}, got {act_paths}"]
    problems = []
    for exp, act in zip(exp_leaves, act_leaves):
        problems.extend(_compare_leaf(exp, act, rtol))
    return problems


# ---------------------------------------------------------------------------- computing
HEADER = ("# jaxpr-cc golden numerics: the program's value (and the gradient of the float32 "
          "sum of its inexact outputs), under jax.jit on CPU")


def _scalar_sum(out: Any):
    """float32 sum of the real parts of every inexact leaf (what ``grad`` differentiates)."""
    import jax
    import jax.numpy as jnp
    total = jnp.zeros((), jnp.float32)
    for leaf in jax.tree_util.tree_leaves(out):
        dtype = getattr(leaf, "dtype", None)
        if dtype is None:
            leaf = jnp.asarray(leaf)
            dtype = leaf.dtype
        if jax.dtypes.issubdtype(dtype, jax.dtypes.extended):
            continue
        if jnp.issubdtype(dtype, jnp.inexact):
            total = total + jnp.sum(jnp.real(leaf).astype(jnp.float32))
    return total


def compute_numerics(program, args: tuple, kwargs: dict | None = None, *,
                     grad_argnums: tuple = (), aliases: dict | None = None) -> str:
    """The numerics text of ``program`` on ``args``: its value and, when
    ``grad_argnums`` is not empty, the gradient of :func:`_scalar_sum` of the value
    with respect to those positional arguments.  Both are computed in one
    ``jax.jit`` on the CPU; anything the program prints (``jax.debug.print``) is
    kept out of the caller's output."""
    import contextlib
    import io

    import jax

    from .sanitize import error_line
    kwargs = dict(kwargs or {})
    argnums = tuple(grad_argnums)
    aliases = aliases or {}

    def value(a, k):
        return program(*a, **k)

    def gradient(a, k):
        return jax.grad(lambda *xs: _scalar_sum(program(*xs, **k)), argnums=argnums)(*a)

    def both(a, k):
        return value(a, k), gradient(a, k)

    lines = [HEADER]
    cpu = jax.devices("cpu")[0]
    with jax.default_device(cpu), contextlib.redirect_stdout(io.StringIO()):
        try:
            if argnums:
                out, grads = jax.block_until_ready(jax.jit(both)(tuple(args), kwargs))
                lines += format_leaves("value", out) + format_leaves("grad", grads)
                return "\n".join(lines) + "\n"
        except Exception:  # noqa: BLE001 -- computed apart below to tell which one fails
            pass
        try:
            out = jax.block_until_ready(jax.jit(value)(tuple(args), kwargs))
            lines += format_leaves("value", out)
        except Exception as e:  # noqa: BLE001 -- recorded in the golden
            lines.append(f"value: error: {error_line(e, aliases)}")
        if argnums:
            try:
                grads = jax.block_until_ready(jax.jit(gradient)(tuple(args), kwargs))
                lines += format_leaves("grad", grads)
            except Exception as e:  # noqa: BLE001 -- recorded in the golden
                lines.append(f"grad: error: {error_line(e, aliases)}")
    return "\n".join(lines) + "\n"
