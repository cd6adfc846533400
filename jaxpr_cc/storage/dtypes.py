"""Dtype names in saved programs, and exact JSON forms of scalar values.

A dtype is written by name: numpy's names (``float32``, ``bool``), the ml_dtypes
names JAX uses (``bfloat16``, ``float8_e4m3fn``, ``int4``), ``float0``, and
``key<IMPL>`` for PRNG key arrays (``key<threefry2x32>``; IMPL names one of JAX's
registered PRNG implementations).  Reading looks names up in this table only.

Arrays are stored in .npy entries as a *storage* dtype that plain numpy knows:
standard dtypes as themselves, the ml_dtypes as the unsigned integer of the same
width (their raw bits), keys as their key data (``uint32``) with the
implementation's trailing key shape.
"""
from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from .errors import FormatError

_STANDARD = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
             "float16", "float32", "float64", "complex64", "complex128")
_ML_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
              "float8_e4m3b11fnuz", "float8_e3m4", "float8_e4m3", "float8_e8m0fnu",
              "float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn", "int4", "uint4", "int2",
              "uint2", "int1", "uint1")
_KEY_NAME = re.compile(r"key<([a-z0-9_]{1,64})>")
_UNSIGNED_OF_SIZE = {1: np.dtype("uint8"), 2: np.dtype("uint16"), 4: np.dtype("uint32"),
                     8: np.dtype("uint64")}


def _build_tables():
    import jax
    import jax.numpy as jnp
    by_name: dict[str, Any] = {}
    for name in _STANDARD:
        by_name[name] = np.dtype(name)
    for name in _ML_DTYPES:
        try:
            by_name[name] = jnp.dtype(name)
        except TypeError:  # an ml_dtypes release without this type
            continue
    by_name["float0"] = np.dtype(jax.dtypes.float0)
    names = {dt: name for name, dt in by_name.items()}
    category = {}
    for name in by_name:
        if name == "bool":
            category[name] = "bool"
        elif name == "float0":
            category[name] = "float0"
        elif name.startswith("complex"):
            category[name] = "complex"
        elif name.startswith(("float", "bfloat")):
            category[name] = "float"
        else:
            category[name] = "int"
    return by_name, names, category


_BY_NAME, _NAMES, _CATEGORY = _build_tables()


def category(dtype) -> str:
    """bool, int, float, complex or float0 (ml_dtypes all have numpy kind 'V')."""
    return _CATEGORY[_NAMES[np.dtype(dtype)]]


def dtype_name(dtype) -> str | None:
    """The saved-program name of ``dtype``, or None if the format has none."""
    name = _NAMES.get(dtype)
    if name is not None:
        return name
    from ..jax_adapter import key_dtype_impl_name
    impl = key_dtype_impl_name(dtype)
    if impl is not None:
        return f"key<{impl}>"
    return None


def dtype_from_name(name: Any):
    dtype = _BY_NAME.get(name) if isinstance(name, str) else None
    if dtype is not None:
        return dtype
    m = _KEY_NAME.fullmatch(name) if isinstance(name, str) else None
    if m:
        from ..jax_adapter import key_dtype, prng_impls
        if m.group(1) in prng_impls():
            return key_dtype(m.group(1))
        raise FormatError(f"unknown PRNG implementation {m.group(1)!r} in dtype {name!r}")
    raise FormatError(f"unknown dtype {str(name)[:60]!r}")


def is_key_dtype(dtype) -> bool:
    from ..jax_adapter import key_dtype_impl_name
    return key_dtype_impl_name(dtype) is not None


def storage_layout(dtype, shape: tuple) -> tuple[np.dtype, tuple]:
    """(numpy dtype, shape) of the .npy data holding an array of ``dtype``/``shape``."""
    if is_key_dtype(dtype):
        import jax
        sample = jax.random.key_data(jax.random.key(0, impl=dtype_name(dtype)[4:-1]))
        return np.dtype(sample.dtype), tuple(shape) + tuple(sample.shape)
    if dtype == _BY_NAME["float0"]:
        return np.dtype(bool), tuple(shape)
    if dtype.name in _STANDARD:
        return np.dtype(dtype), tuple(shape)
    return _UNSIGNED_OF_SIZE[dtype.itemsize], tuple(shape)


def to_storage(host: np.ndarray) -> np.ndarray:
    """The storage view of a host array of a standard or ml_dtypes dtype."""
    dtype = host.dtype
    if dtype == _BY_NAME["float0"]:
        return np.zeros(host.shape, bool)
    if dtype.name in _STANDARD:
        return host
    return host.view(_UNSIGNED_OF_SIZE[dtype.itemsize])


def from_storage(stored: np.ndarray, dtype) -> np.ndarray:
    if dtype == _BY_NAME["float0"]:
        return np.zeros(stored.shape, dtype)
    if dtype.name in _STANDARD:
        return stored
    return stored.view(dtype)


# --------------------------------------------------------- scalar values
def _float_bits(x: np.generic) -> dict:
    raw = np.asarray(x).reshape(1).view(_UNSIGNED_OF_SIZE[x.dtype.itemsize])[0]
    return {"bits": format(int(raw), "x")}


def _encode_real(x: np.generic):
    value = float(x)
    if math.isfinite(value):
        return value
    return _float_bits(x)


def encode_scalar(x: Any, dtype) -> Any:
    """Exact JSON form of the scalar ``x`` of ``dtype``: booleans and integers as JSON
    numbers, finite floats as the shortest decimal that reads back to the same
    value, non-finite floats as their raw bits, complex numbers as [re, im]."""
    a = np.asarray(x, dtype=dtype) if not isinstance(x, np.generic) else x
    a = np.asarray(a).reshape(())
    kind = category(dtype)
    if kind == "bool":
        return bool(a)
    if kind == "int":
        return int(a)
    if kind == "complex":
        return [_encode_real(a.real[()]), _encode_real(a.imag[()])]
    if kind == "float0":
        return None
    return _encode_real(a[()])


def _decode_real(value: Any, dtype) -> np.ndarray:
    if isinstance(value, dict):
        bits = value.get("bits")
        if set(value) != {"bits"} or not isinstance(bits, str) or not re.fullmatch(r"[0-9a-f]{1,16}", bits):
            raise FormatError(f"malformed float bits {value!r}")
        storage = _UNSIGNED_OF_SIZE[np.dtype(dtype).itemsize]
        raw = int(bits, 16)
        if raw >= 1 << (8 * storage.itemsize):
            raise FormatError(f"float bits {bits!r} do not fit {dtype}")
        out = np.array(raw, storage).view(dtype)
        if math.isfinite(float(out)):
            raise FormatError(f"finite values are written as numbers, not bits ({bits!r})")
        return out
    if type(value) not in (float, int) or isinstance(value, bool):
        raise FormatError(f"expected a number for a {np.dtype(dtype).name} value, got {value!r}")
    out = np.array(value, dtype)
    if float(out) != value:
        raise FormatError(f"{value!r} is not exactly representable as {np.dtype(dtype).name}")
    return out


def decode_scalar(value: Any, dtype) -> np.ndarray:
    """A 0-d numpy array of ``dtype`` from :func:`encode_scalar`'s output."""
    dtype = np.dtype(dtype)
    kind = category(dtype)
    if kind == "bool":
        if type(value) is not bool:
            raise FormatError(f"expected true/false for a bool value, got {value!r}")
        return np.array(value, dtype)
    if kind == "int":
        if type(value) is not int:
            raise FormatError(f"expected an integer for a {dtype.name} value, got {value!r}")
        low, high = _int_range(dtype)
        if not low <= value <= high:
            raise FormatError(f"{value} is out of range for {dtype.name}")
        return np.array(value, dtype)
    if kind == "complex":
        if not (isinstance(value, list) and len(value) == 2):
            raise FormatError(f"expected [re, im] for a {dtype.name} value, got {value!r}")
        part = np.dtype(f"float{dtype.itemsize * 4}")
        re_, im_ = _decode_real(value[0], part), _decode_real(value[1], part)
        out = np.empty((), dtype)
        out.real, out.imag = re_, im_
        return out
    if kind == "float0":  # float0 carries no data
        if value is not None:
            raise FormatError("float0 values carry no data; expected null")
        return np.zeros((), dtype)
    return _decode_real(value, dtype)


def _int_range(dtype) -> tuple[int, int]:
    if dtype.name in _STANDARD:
        info = np.iinfo(dtype)
    else:
        import ml_dtypes
        info = ml_dtypes.iinfo(dtype)
    return int(info.min), int(info.max)
