"""Array helpers shared by the printer, constant hoisting and the file format."""
from __future__ import annotations

import hashlib
from typing import Any

import numpy as np


def is_traced(x: Any) -> bool:
    """A value of an enclosing trace (a program traced inside another trace, e.g.
    ``jaxpr_cc.jit`` under a custom rule, closes over them): it has no bytes yet."""
    from ..jax_adapter import Tracer
    return isinstance(x, Tracer)


def is_mutable_ref(x: Any) -> bool:
    """A ``jax.Ref`` (``jax.new_ref``): mutable state the program reads and writes,
    not a value -- never hoisted, folded or deduplicated by content."""
    import jax
    return isinstance(x, jax.Ref)


def identity_only(x: Any) -> bool:
    """A constant compared by identity, never by content: a value of an enclosing
    trace (no bytes yet) or a mutable ``jax.Ref`` (its bytes change)."""
    return is_traced(x) or is_mutable_ref(x)


def placement_key(x: Any) -> Any:
    """Where a concrete array lives, as a hashable: its sharding for a ``jax.Array``,
    None for host values.  Two constants with equal bytes but different placements
    are different values (on an explicit mesh even different types), so content
    deduplication compares this too."""
    import jax
    if isinstance(x, jax.Array) and not is_traced(x):
        try:
            return x.sharding
        except Exception:  # an array whose buffers were deleted: compared by identity upstream
            return ("id", id(x))
    return None


def to_numpy(x: Any) -> np.ndarray:
    """A host numpy view of ``x``; PRNG key arrays become their raw key data."""
    import jax
    if is_mutable_ref(x):
        # np.asarray would index the Ref item by item forever (ref[i] never raises).
        raise TypeError(f"a mutable jax.Ref ({jax.typeof(x)}) has no fixed value to read "
                        f"as an array; a program closing over one can run, but not be "
                        f"saved, emitted or constant-folded")
    if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    return np.asarray(x)


def array_digest(x: Any, length: int = 12) -> str:
    """Content hash of dtype, shape and bytes: equal exactly when the arrays are
    identical bit for bit (the identity used for constant deduplication)."""
    import jax
    a = to_numpy(x)
    h = hashlib.sha256()
    dtype = getattr(x, "dtype", a.dtype)
    h.update(str(dtype).encode())
    h.update(repr(tuple(a.shape)).encode())
    h.update(np.ascontiguousarray(a).tobytes())
    del jax
    return h.hexdigest()[:length]


def nbytes(x: Any) -> int:
    n = getattr(x, "nbytes", None)
    if n is not None:
        return int(n)
    return to_numpy(x).nbytes
