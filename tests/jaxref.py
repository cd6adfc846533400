"""Reference (pure JAX) results for corpus programs, and tree comparison helpers.

Conventions shared by every test that compares against JAX:

* keyword arguments (``prog.kwargs``) are held fixed: every transformation is
  applied to ``lambda *args: fn(*args, **prog.kwargs)``;
* ``grad`` differentiates :func:`scalarize` ``(fn)`` -- the float32 sum of the
  real parts of all inexact output leaves -- w.r.t. ``prog.grad_argnums``
  (always passed as a tuple, so the result is a tuple of gradients);
* ``jvp`` uses :func:`tangents_like` (ones for inexact leaves, float0 zeros for
  integer / bool / PRNG-key leaves) and returns ``(primals_out, tangents_out)``;
* ``vmap`` maps over a new leading axis of size 2 on every array leaf
  (:func:`batch_args`); Python scalars are not batched (``in_axes=None``);
* by default every transformed function is wrapped in ``jax.jit`` (arguments
  are passed in, not closed over); pass ``jit=False`` for op-by-op execution.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "TRANSFORMS",
    "apply_transform",
    "assert_trees_equal",
    "batch_args",
    "batch_in_axes",
    "reference_results",
    "scalarize",
    "tangents_like",
]

#: Transformations understood by :func:`apply_transform`.
TRANSFORMS = ("value", "grad", "jvp", "vmap", "jit")

_PY_SCALARS = (bool, int, float, complex)


def _is_key(leaf: Any) -> bool:
    dtype = getattr(leaf, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.extended)


def _is_inexact(leaf: Any) -> bool:
    if isinstance(leaf, bool):
        return False
    if isinstance(leaf, (float, complex)):
        return True
    if isinstance(leaf, int):
        return False
    if _is_key(leaf):
        return False
    dtype = getattr(leaf, "dtype", None)
    return dtype is not None and bool(jnp.issubdtype(dtype, jnp.inexact))


# --------------------------------------------------------------------------
# transformation inputs
# --------------------------------------------------------------------------

def scalarize(fun: Callable) -> Callable:
    """``fun`` -> function returning the float32 sum of all inexact output
    leaves (real part for complex).  Non-inexact outputs are ignored."""

    @functools.wraps(fun)
    def scalar_fun(*args, **kwargs):
        out = fun(*args, **kwargs)
        total = jnp.zeros((), jnp.float32)
        for leaf in jax.tree_util.tree_leaves(out):
            if _is_inexact(leaf):
                total = total + jnp.sum(jnp.real(jnp.asarray(leaf)).astype(jnp.float32))
        return total

    return scalar_fun


def _tangent(leaf: Any) -> Any:
    if _is_key(leaf):
        return np.zeros(np.shape(leaf), dtype=jax.dtypes.float0)
    if isinstance(leaf, bool) or isinstance(leaf, int):
        return np.zeros((), dtype=jax.dtypes.float0)
    if isinstance(leaf, float):
        return 1.0
    if isinstance(leaf, complex):
        return 1.0 + 0.0j
    if _is_inexact(leaf):
        return jnp.ones_like(leaf)
    return np.zeros(np.shape(leaf), dtype=jax.dtypes.float0)


def tangents_like(args: Any) -> Any:
    """Ones for inexact leaves, float0 zeros for int / bool / PRNG-key leaves."""
    return jax.tree_util.tree_map(_tangent, args)


def _batch_leaf(leaf: Any, n: int) -> Any:
    if isinstance(leaf, _PY_SCALARS):
        return leaf  # Python scalars stay unbatched (in_axes=None)
    if _is_inexact(leaf):
        x = jnp.asarray(leaf)
        copies = [x * jnp.asarray(1.0 + i / 32.0, dtype=x.dtype) for i in range(n)]
        return jnp.stack(copies)
    # integers, bools and PRNG keys: identical copies (indices stay in range)
    return jnp.stack([jnp.asarray(leaf)] * n)


def batch_args(args: Any, n: int = 2) -> Any:
    """Stack ``n`` copies of every array leaf along a new leading axis.

    Copy ``i`` of an inexact leaf is scaled by ``1 + i/32`` (exact in every
    float format) so the batch rows differ; integer / bool / key leaves are
    repeated unchanged.  Python scalar leaves are left as they are."""
    return jax.tree_util.tree_map(functools.partial(_batch_leaf, n=n), args)


def batch_in_axes(args: Any) -> Any:
    """``in_axes`` for :func:`batch_args`: 0 per array leaf, None per Python scalar."""
    return jax.tree_util.tree_map(
        lambda leaf: None if isinstance(leaf, _PY_SCALARS) else 0, args)


# --------------------------------------------------------------------------
# reference results
# --------------------------------------------------------------------------

def _bound(prog, fn):
    fn = prog.fun if fn is None else fn
    kwargs = dict(prog.kwargs)
    if not kwargs:
        return fn
    return functools.partial(fn, **kwargs)


def apply_transform(prog, name: str, fn: Callable | None = None, *, jit: bool = True) -> Any:
    """Run one transformation (see :data:`TRANSFORMS`) of ``fn`` (default
    ``prog.fun``) on the program's example arguments and block on the result.

    With ``jit=True`` (the default) the transformed function is wrapped in
    ``jax.jit`` -- one XLA compilation instead of op-by-op dispatch, which is
    several times faster for the corpus; arguments are passed to the jitted
    function (never closed over), so nothing is constant-folded.  ``"value"``
    with ``jit=True`` is therefore the same computation as ``"jit"``."""
    f = _bound(prog, fn)
    args = tuple(prog.args)
    wrap = jax.jit if jit else (lambda g: g)
    if name == "value":
        out = wrap(f)(*args)
    elif name == "grad":
        # With no inexact argument, differentiate w.r.t. all of them so that
        # JAX itself reports why grad is unsupported.
        argnums = tuple(prog.grad_argnums) or tuple(range(len(args)))
        out = wrap(jax.grad(scalarize(f), argnums=argnums))(*args)
    elif name == "jvp":
        out = wrap(lambda primals, tangents: jax.jvp(f, primals, tangents))(
            args, tangents_like(args))
    elif name == "vmap":
        out = wrap(jax.vmap(f, in_axes=batch_in_axes(args)))(*batch_args(args))
    elif name == "jit":
        out = jax.jit(f)(*args)
    else:
        raise ValueError(f"unknown transformation {name!r}; expected one of {TRANSFORMS}")
    return jax.block_until_ready(out)


_REFERENCE_CACHE: dict = {}


def reference_results(prog, fn: Callable | None = None, *, transforms=None,
                      jit: bool = True) -> dict:
    """Results of ``fn`` (default ``prog.fun``) and of each transformation the
    program supports.

    Returns a dict with key ``"value"`` plus ``"grad"``, ``"jvp"`` and
    ``"vmap"`` for those listed in ``prog.supports``.  ``transforms`` selects
    an explicit list of names instead (``"jit"`` is available that way).
    ``jit=False`` runs the transformations op by op (needed when ``fn`` is
    not traceable by ``jax.jit``)."""
    if transforms is None:
        transforms = ("value",) + tuple(
            t for t in ("grad", "jvp", "vmap") if t in prog.supports)
    if fn is None:
        # JAX's results on the original never change within a test session, and many
        # suites compare against them: compute (and compile) each once.
        out = {}
        for name in transforms:
            key = (str(prog.path), name, jit)
            if key not in _REFERENCE_CACHE:
                _REFERENCE_CACHE[key] = apply_transform(prog, name, None, jit=jit)
            out[name] = _REFERENCE_CACHE[key]
        return out
    return {name: apply_transform(prog, name, fn, jit=jit) for name in transforms}


# --------------------------------------------------------------------------
# comparison
# --------------------------------------------------------------------------

_UINT_OF_SIZE = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _leaf_array(leaf: Any):
    """-> ("key", impl, data) for PRNG keys, else a numpy array."""
    if _is_key(leaf):
        return ("key", str(jax.random.key_impl(leaf)), np.asarray(jax.random.key_data(leaf)))
    if isinstance(leaf, _PY_SCALARS):
        return np.asarray(jnp.asarray(leaf))
    return np.asarray(leaf)


def _float_bits_equal(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Elementwise bitwise equality for real float arrays of one dtype, with
    NaN == NaN (any payload) and +0 == -0."""
    uint = _UINT_OF_SIZE[x.dtype.itemsize]
    nan_x, nan_y = np.isnan(x), np.isnan(y)
    same_bits = x.view(uint) == y.view(uint)
    both_zero = (x == 0) & (y == 0)
    return np.where(nan_x | nan_y, nan_x & nan_y, same_bits | both_zero)


def _real_components(x: np.ndarray) -> list:
    if np.iscomplexobj(x):
        return [np.ascontiguousarray(x.real), np.ascontiguousarray(x.imag)]
    return [x]


def _compare_arrays(where: str, x: np.ndarray, y: np.ndarray, exact: bool,
                    rtol: float, atol: float) -> None:
    if x.dtype != y.dtype:
        raise AssertionError(f"{where}: dtype mismatch {x.dtype} != {y.dtype}")
    if x.shape != y.shape:
        raise AssertionError(f"{where}: shape mismatch {x.shape} != {y.shape}")
    if x.dtype == jax.dtypes.float0:
        return
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        if not np.array_equal(x, y):
            bad = int(np.sum(x != y))
            raise AssertionError(
                f"{where}: {bad}/{x.size} elements differ\n  a={x!r}\n  b={y!r}")
        return
    if exact:
        for cx, cy in zip(_real_components(x), _real_components(y)):
            eq = _float_bits_equal(np.ascontiguousarray(cx), np.ascontiguousarray(cy))
            if not np.all(eq):
                bad = int(np.sum(~eq))
                raise AssertionError(
                    f"{where}: {bad}/{x.size} elements not bitwise equal\n"
                    f"  a={x!r}\n  b={y!r}")
        return
    wide = np.complex128 if np.iscomplexobj(x) else np.float64
    np.testing.assert_allclose(
        x.astype(wide), y.astype(wide), rtol=rtol, atol=atol, equal_nan=True,
        err_msg=f"{where}: values differ beyond rtol={rtol}, atol={atol}")


def assert_trees_equal(a: Any, b: Any, *, exact: bool = True,
                       rtol: float = 1e-6, atol: float = 1e-6) -> None:
    """Assert two pytrees have the same structure, dtypes, shapes and values.

    ``exact=True`` compares floats bitwise (NaNs equal to NaNs, +0 == -0);
    ``exact=False`` uses ``assert_allclose`` with ``rtol``/``atol`` for
    inexact leaves (integers, bools and keys are always compared exactly)."""
    a_paths, a_def = jax.tree_util.tree_flatten_with_path(a)
    b_paths, b_def = jax.tree_util.tree_flatten_with_path(b)
    if a_def != b_def:
        raise AssertionError(f"tree structure mismatch:\n  {a_def}\n  {b_def}")
    for (path, la), (_, lb) in zip(a_paths, b_paths):
        where = "leaf " + (jax.tree_util.keystr(path) or "<root>")
        xa, xb = _leaf_array(la), _leaf_array(lb)
        a_key, b_key = isinstance(xa, tuple), isinstance(xb, tuple)
        if a_key != b_key:
            raise AssertionError(f"{where}: PRNG key vs non-key leaf")
        if a_key:
            if xa[1] != xb[1]:
                raise AssertionError(f"{where}: PRNG impl mismatch {xa[1]} != {xb[1]}")
            _compare_arrays(where + " (key data)", xa[2], xb[2], True, rtol, atol)
            continue
        _compare_arrays(where, xa, xb, exact, rtol, atol)
