"""Array entries: numpy ``.npy`` version 1.0 files, written and read strictly.

Written by hand (the format is a 10-byte preamble and a Python-literal header) so
the bytes do not depend on the numpy version, and read by matching the exact header
this module writes: the declared dtype must be one of the plain numeric dtypes
(never ``object``, so no pickle can be involved), and the element count times the
item size must equal the bytes present *before* anything is allocated.
``numpy.load`` reads these files too.
"""
from __future__ import annotations

import re
import struct

import numpy as np

from .errors import FormatError

_MAGIC = b"\x93NUMPY\x01\x00"
_ALIGN = 64
_ALLOWED = {"|b1", "|i1", "|u1", "<i2", "<u2", "<f2", "<i4", "<u4", "<f4", "<i8", "<u8", "<f8",
            "<c8", "<c16"}
_HEADER = re.compile(r"\{'descr': '([<|][biufc][0-9]{1,2})', 'fortran_order': False, "
                     r"'shape': \(((?:[0-9]{1,19}, )*[0-9]{0,19}|[0-9]{1,19},)\), \} *\n")
MAX_NDIM = 64


def _little_endian(dtype: np.dtype) -> np.dtype:
    return dtype.newbyteorder("<") if dtype.itemsize > 1 else dtype


def _shape_text(shape: tuple) -> str:
    if len(shape) == 1:
        return f"({shape[0]},)"
    return "(" + ", ".join(str(d) for d in shape) + ")"


def encode_npy(array: np.ndarray) -> bytes:
    """``array`` (a plain numeric dtype) as .npy bytes, C order, little endian."""
    dtype = _little_endian(array.dtype)
    descr = dtype.str
    if descr not in _ALLOWED:
        raise ValueError(f"dtype {array.dtype} cannot be stored in an array entry")
    header = _header(descr, array.shape)
    data = np.ascontiguousarray(array, dtype=dtype).tobytes()
    return _MAGIC + struct.pack("<H", len(header)) + header + data


def _header(descr: str, shape: tuple) -> bytes:
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {_shape_text(shape)}, }}"
    pad = -(len(_MAGIC) + 2 + len(header) + 1) % _ALIGN
    return (header + " " * pad + "\n").encode("ascii")


def decode_npy(content: memoryview, *, name: str) -> np.ndarray:
    """Read an array entry, refusing anything :func:`encode_npy` would not write."""
    if len(content) < 10 or bytes(content[:8]) != _MAGIC:
        raise FormatError(f"{name}: not a .npy version 1.0 array")
    (header_len,) = struct.unpack_from("<H", content, 8)
    if 10 + header_len > len(content) or (10 + header_len) % _ALIGN:
        raise FormatError(f"{name}: malformed .npy header length")
    try:
        header = bytes(content[10:10 + header_len]).decode("ascii")
    except UnicodeDecodeError:
        raise FormatError(f"{name}: .npy header is not ASCII") from None
    m = _HEADER.fullmatch(header)
    if m is None:
        if "'O'" in header or "|O" in header:
            raise FormatError(f"{name}: holds Python objects (a pickle); only numeric arrays "
                              "are allowed")
        raise FormatError(f"{name}: unexpected .npy header {header.strip()[:80]!r}")
    descr = m.group(1)
    if descr not in _ALLOWED:
        raise FormatError(f"{name}: dtype {descr!r} is not allowed in an array entry")
    shape = tuple(int(d) for d in m.group(2).replace(" ", "").split(",") if d)
    if len(shape) > MAX_NDIM:
        raise FormatError(f"{name}: {len(shape)} dimensions (at most {MAX_NDIM})")
    if _header(descr, shape) != header.encode("ascii"):
        raise FormatError(f"{name}: .npy header is not in canonical form")
    dtype = np.dtype(descr)
    count = 1
    for d in shape:
        count *= d
    available = len(content) - 10 - header_len
    if count * dtype.itemsize != available:
        raise FormatError(f"{name}: header declares shape {shape} of {dtype.name} "
                          f"({count * dtype.itemsize} bytes) but {available} bytes are present")
    flat = np.frombuffer(content, dtype=dtype, count=count, offset=10 + header_len)
    return flat.reshape(shape)
