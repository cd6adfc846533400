"""Concrete values a program holds: constants, bound parameters, literal operands.

A *host value* is written as ``{"kind": K, ...}``, where K records the Python type so
the value reads back as the same type (JAX treats ``TypedNdArray``, ``jax.Array``
and plain numpy arrays differently):

=================  ===========================================  =================
kind               Python type                                  weak_type kept
=================  ===========================================  =================
``ndarray``        ``numpy.ndarray``                            no
``typed_ndarray``  JAX's host ``TypedNdArray`` (literals)       yes
``jax``            ``jax.Array``                                yes
``key``            ``jax.Array`` of PRNG keys (``key<impl>``)    no
``numpy_scalar``   ``numpy.generic`` (``np.float32(1)``)        no
``python``         ``bool`` / ``int`` / ``float`` / ``complex``  no
``typed_scalar``   JAX's ``TypedInt`` / ``TypedFloat`` / ...     (always weak)
=================  ===========================================  =================

Scalars are written inline, ``{"kind", "dtype", "value"}`` (plus ``"weak_type":
true`` where kept and set); arrays with at least one dimension go to the *array
table* (``program.json`` ``"arrays"``, one ``consts/NNNNNN.npy`` entry each) and are
written ``{"kind", "array": INDEX}``.  The same array object held in several places
is stored once and reads back as one object.  A ``jax`` or ``key`` value placed
with a NamedSharding over a mesh of devices also records ``"sharding"`` and reads
back placed the same way (format version 3).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..jax_adapter import TypedComplex, TypedFloat, TypedInt, TypedNdArray, weak_device_array
from ..storage import dtypes
from ..storage.errors import FormatError, SaveError
from ..storage.npy import decode_npy, encode_npy

_PYTHON_DTYPE = {bool: "bool", int: "int64", float: "float64", complex: "complex128"}
_TYPED = {TypedInt: int, TypedFloat: float, TypedComplex: complex}
_TYPED_BY_BASE = {int: TypedInt, float: TypedFloat, complex: TypedComplex}
_MAX_ARRAY_BYTES = 1 << 40


def _is_jax_array(x) -> bool:
    import jax
    return isinstance(x, jax.Array)


def _is_key_array(x) -> bool:
    import jax
    return _is_jax_array(x) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


class ArrayTable:
    """Arrays of one save: (descriptor, .npy bytes) by first appearance."""

    def __init__(self):
        self.descriptors: list[dict] = []
        self.entries: list[bytes] = []
        self._index: dict[int, int] = {}
        self._keep: list[Any] = []  # keep objects alive so ids stay unique

    def add(self, x: Any, stored: np.ndarray, dtype_name: str, shape: tuple) -> int:
        """Index of ``x`` in the table; ``stored`` is its data in a storage dtype."""
        i = self._index.get(id(x))
        if i is not None:
            return i
        i = len(self.descriptors)
        self._index[id(x)] = i
        self._keep.append(x)
        self.descriptors.append({"dtype": dtype_name, "shape": list(shape)})
        self.entries.append(encode_npy(stored))
        return i


def _dtype_name(dtype, where: str) -> str:
    name = dtypes.dtype_name(dtype)
    if name is None:
        raise SaveError(f"{where}: dtype {dtype} cannot be saved")
    return name


def encode_host_value(x: Any, table: ArrayTable, where: str) -> dict:
    t = type(x)
    if t in _PYTHON_DTYPE:
        if t is int and not -(1 << 63) <= x < (1 << 63):
            raise SaveError(f"{where}: integer constant {x} does not fit in 64 bits")
        return {"kind": "python", "dtype": _PYTHON_DTYPE[t],
                "value": dtypes.encode_scalar(x, np.dtype(_PYTHON_DTYPE[t]))}
    if t in _TYPED:
        base = _TYPED[t]
        return {"kind": "typed_scalar", "dtype": _dtype_name(x.dtype, where),
                "value": dtypes.encode_scalar(base(x), np.dtype(_PYTHON_DTYPE[base]))}
    if isinstance(x, np.generic):
        return {"kind": "numpy_scalar", "dtype": _dtype_name(x.dtype, where),
                "value": dtypes.encode_scalar(x, x.dtype)}
    if t is TypedNdArray:
        return _array_value("typed_ndarray", x, np.asarray(x).view(np.ndarray),
                            bool(x.weak_type), table, where)
    if t is np.ndarray:
        return _array_value("ndarray", x, x, None, table, where)
    if _is_key_array(x):
        import jax
        name = _dtype_name(x.dtype, where)
        data = np.asarray(jax.random.key_data(x))
        return _with_sharding({"kind": "key", "array": table.add(x, data, name, tuple(x.shape))},
                              x, where)
    if _is_jax_array(x):
        return _with_sharding(_array_value("jax", x, np.asarray(x), bool(x.weak_type), table,
                                           where), x, where)
    raise SaveError(f"{where}: a value of type {t.__module__}.{t.__qualname__} cannot be saved")


def _with_sharding(out: dict, x, where: str) -> dict:
    """``out`` plus ``"sharding"`` when the jax.Array ``x`` is placed with a
    NamedSharding over a concrete mesh (a sharded array the program closes over):
    under Explicit mesh axes its sharding is part of its type, and the program's
    results depend on it.  Arrays on one device keep no sharding (they read back on
    the default device, as before the field existed)."""
    import jax
    sharding = getattr(x, "sharding", None)
    if not isinstance(sharding, jax.sharding.NamedSharding) or \
            not isinstance(sharding.mesh, jax.sharding.Mesh):
        return out
    from . import shardings
    encoded = shardings.encode_named_sharding(sharding, f"{where} sharding")
    if shardings.decode_named_sharding(encoded) != sharding:
        raise SaveError(f"{where}: its sharding {sharding} cannot be saved exactly")
    return {**out, "sharding": encoded}


def _array_value(kind: str, x, host: np.ndarray, weak: bool | None, table, where) -> dict:
    name = _dtype_name(host.dtype, where)
    if host.ndim == 0:
        out = {"kind": kind, "dtype": name, "value": dtypes.encode_scalar(host[()], host.dtype)}
    else:
        out = {"kind": kind, "array": table.add(x, dtypes.to_storage(host), name, host.shape)}
    if weak:
        out["weak_type"] = True
    return out


# ------------------------------------------------------------------ decode
class ArraySource:
    """The array table of one load: descriptors from program.json, data from the
    archive's .npy entries (read lazily, checked against the descriptor)."""

    def __init__(self, descriptors: Any, entries: list, names: list[str], *,
                 materialize: bool = True):
        if not isinstance(descriptors, list) or len(descriptors) != len(entries):
            raise FormatError(f"program.json lists {len(descriptors) if isinstance(descriptors, list) else '?'} "
                              f"arrays but the archive holds {len(entries)}")
        self.descriptors = descriptors
        self.entries = entries
        self.names = names
        # False: check every array but hand out shape/dtype stand-ins instead of
        # copies (save's read-back check needs no second copy of the constants).
        self.materialize = materialize
        self._host: dict[int, np.ndarray] = {}
        self._objects: dict[tuple, Any] = {}

    def _index(self, i: Any) -> int:
        if type(i) is not int or not 0 <= i < len(self.descriptors):
            raise FormatError(f"reference to array {str(i)[:20]} which does not exist")
        return i

    def dtype_and_shape(self, i: int):
        d = self.descriptors[i]
        if not isinstance(d, dict) or set(d) != {"dtype", "shape"}:
            raise FormatError(f"array {i}: malformed descriptor")
        shape = d["shape"]
        if not (isinstance(shape, list) and all(type(s) is int and s >= 0 for s in shape)):
            raise FormatError(f"array {i}: malformed shape")
        return dtypes.dtype_from_name(d["dtype"]), tuple(shape)

    def host(self, i: int) -> np.ndarray:
        """The stored data of array ``i`` in its logical dtype (key data for keys)."""
        got = self._host.get(i)
        if got is not None:
            return got
        dtype, shape = self.dtype_and_shape(i)
        storage_dtype, storage_shape = dtypes.storage_layout(dtype, shape)
        count = 1
        for s in storage_shape:
            count *= s
        if count * storage_dtype.itemsize > min(len(self.entries[i]), _MAX_ARRAY_BYTES):
            raise FormatError(f"array {i}: declared {dtypes.dtype_name(dtype)}{list(shape)} needs "
                              f"{count * storage_dtype.itemsize} bytes but its entry holds "
                              f"{len(self.entries[i])}")
        stored = decode_npy(self.entries[i], name=self.names[i])
        if stored.dtype != storage_dtype or stored.shape != storage_shape:
            raise FormatError(f"{self.names[i]}: holds {stored.dtype}{list(stored.shape)}, but "
                              f"program.json declares {dtypes.dtype_name(dtype)}{list(shape)}")
        host = stored if dtypes.is_key_dtype(dtype) else dtypes.from_storage(stored, dtype)
        self._host[i] = host
        return host

    def object(self, kind: str, i: Any, weak: bool, sharding: Any = None):
        i = self._index(i)
        key = (kind, i, weak, None if sharding is None else repr(sharding))
        got = self._objects.get(key)
        if got is not None:
            return got
        dtype, shape = self.dtype_and_shape(i)
        host = self.host(i)
        if kind not in ("key", "ndarray", "typed_ndarray", "jax"):
            raise FormatError(f"unknown value kind {kind[:40]!r}")
        if not self.materialize:
            import jax
            return jax.ShapeDtypeStruct(shape, dtype)
        if kind == "key":
            if not dtypes.is_key_dtype(dtype) or weak:
                raise FormatError(f"array {i}: kind 'key' needs a key dtype")
            import jax
            impl = dtypes.dtype_name(dtype)[4:-1]
            out = jax.random.wrap_key_data(np.array(host), impl=impl)
        elif dtypes.is_key_dtype(dtype):
            raise FormatError(f"array {i}: key data must have kind 'key'")
        else:
            out = _from_host(kind, np.array(host), weak)
        out = _place(out, sharding)
        self._objects[key] = out
        return out


def _from_host(kind: str, host: np.ndarray, weak: bool):
    if kind == "ndarray":
        if weak:
            raise FormatError("numpy arrays carry no weak type")
        return host
    if kind == "typed_ndarray":
        from ..jax_adapter import ShapedArray
        return TypedNdArray(host, ShapedArray(host.shape, host.dtype, weak))
    if kind == "jax":
        import jax
        return weak_device_array(host) if weak else jax.device_put(host)
    raise FormatError(f"unknown value kind {kind[:40]!r}")


def _place(value, sharding):
    """A decoded jax.Array placed with its saved sharding (``None``: as decoded)."""
    if sharding is None:
        return value
    import jax
    return jax.device_put(value, sharding)


def _decode_sharding(obj: dict, kind: Any):
    """The saved NamedSharding of a ``jax``/``key`` value, or None.  A mesh over
    devices this process does not have reads back as None (the value is placed on
    the default device): such a process can still load and inspect the program."""
    if "sharding" not in obj:
        return None
    if kind not in ("jax", "key"):
        raise FormatError(f"a value of kind {str(kind)[:40]!r} carries no sharding")
    from . import shardings
    try:
        return shardings.decode_named_sharding(obj["sharding"])
    except shardings.MissingDevicesError:
        return None


_SCALAR_KEYS = {"kind", "dtype", "value"}
_ARRAY_KEYS = {"kind", "array"}


def decode_host_value(obj: Any, arrays: ArraySource) -> Any:
    if not isinstance(obj, dict):
        raise FormatError(f"malformed value {str(obj)[:60]}")
    weak = obj.get("weak_type", False)
    if weak is not False and weak is not True:
        raise FormatError("weak_type must be true when present")
    keys = set(obj) - {"weak_type", "sharding"}
    if "weak_type" in obj and not weak:
        raise FormatError("weak_type is written only when true")
    kind = obj.get("kind")
    sharding = _decode_sharding(obj, kind)
    if keys == _ARRAY_KEYS:
        if kind not in ("ndarray", "typed_ndarray", "jax", "key"):
            raise FormatError(f"value kind {str(kind)[:40]!r} is not an array kind")
        if not arrays.materialize:
            return arrays.object(kind, obj["array"], weak)
        return arrays.object(kind, obj["array"], weak, sharding)
    if keys != _SCALAR_KEYS:
        raise FormatError(f"malformed value (fields {sorted(obj)[:8]})")
    dtype = dtypes.dtype_from_name(obj["dtype"])
    if kind == "python":
        base = {"bool": bool, "int64": int, "float64": float, "complex128": complex}.get(obj["dtype"])
        if base is None or weak:
            raise FormatError(f"a Python scalar cannot have dtype {obj['dtype']!r}")
        return base(dtypes.decode_scalar(obj["value"], dtype)[()])
    if kind == "typed_scalar":
        category = dtypes.category(dtype)
        base = {"int": int, "float": float, "complex": complex}.get(category)
        if base is None or weak:
            raise FormatError(f"a typed scalar cannot have dtype {obj['dtype']!r}")
        value = dtypes.decode_scalar(obj["value"], np.dtype(_PYTHON_DTYPE[base]))[()]
        return _TYPED_BY_BASE[base](base(value), dtype)
    if kind == "numpy_scalar":
        if weak:
            raise FormatError("numpy scalars carry no weak type")
        return dtypes.decode_scalar(obj["value"], dtype)[()]
    if dtypes.is_key_dtype(dtype):
        raise FormatError("key arrays are stored in the array table")
    return _place(_from_host(kind, dtypes.decode_scalar(obj["value"], dtype), weak), sharding)
