"""Abstract values (types) as JSON.

The common case is a short string, ``DTYPE[DIMS]`` with a leading ``~`` for a weak
type: ``"float32[3,4]"``, ``"~float32[]"``, ``"key<threefry2x32>[2]"``; a token is
``"token"``.  An aval with a sharding, manual axes or a memory space other than the
defaults is an object ``{"dtype", "shape", "weak_type", "sharding",
"manual_axis_type", "memory_space"}``.  Encoding checks that decoding gives back the
identical (interned) aval, so nothing about a type is lost silently.
"""
from __future__ import annotations

import re
from typing import Any

from ..jax_adapter import AbstractToken, ManualAxisType, MemorySpace, ShapedArray, abstract_token
from ..storage import dtypes
from . import shardings
from ..storage.errors import FormatError, SaveError

_SHORT = re.compile(r"(~?)([a-z0-9_]+|key<[a-z0-9_]+>)\[((?:[0-9]{1,19}(?:,[0-9]{1,19})*)?)\]")
_X64_ONLY = {"int64", "uint64", "float64", "complex128"}


class AvalCodec:
    """Encodes avals for one save, or decodes them for one load, with caches (a
    program repeats a few types many times)."""

    def __init__(self):
        self._encoded: dict[Any, Any] = {}
        self._decoded: dict[str, Any] = {"token": abstract_token}
        import jax
        self._x64 = bool(jax.config.jax_enable_x64)

    # ------------------------------------------------------------ encode
    def encode(self, aval, where: str = "type") -> Any:
        try:
            return self._encoded[aval]
        except (KeyError, TypeError):
            pass
        out = self._encode_new(aval, where)
        back = self._decode_new(out, check_x64=False)
        if back is not aval:
            raise SaveError(f"{where}: the type {aval} cannot be saved exactly "
                            f"(it reads back as {back})")
        self._encoded[aval] = out
        return out

    def _encode_new(self, aval, where: str) -> Any:
        if isinstance(aval, AbstractToken):
            return "token"
        if type(aval) is not ShapedArray:
            raise SaveError(f"{where}: values of abstract type {type(aval).__name__} ({aval}) "
                            f"cannot be saved")
        name = dtypes.dtype_name(aval.dtype)
        if name is None:
            raise SaveError(f"{where}: dtype {aval.dtype} cannot be saved")
        if not all(type(d) is int for d in aval.shape):
            raise SaveError(f"{where}: symbolic shape {aval.shape} cannot be saved")
        if ShapedArray(aval.shape, aval.dtype, aval.weak_type) is aval:
            return f"{'~' if aval.weak_type else ''}{name}[{','.join(map(str, aval.shape))}]"
        mat = aval.manual_axis_type
        return {
            "dtype": name,
            "shape": list(aval.shape),
            "weak_type": bool(aval.weak_type),
            "sharding": {"mesh": shardings.encode_abstract_mesh(aval.sharding.mesh, where),
                         "spec": shardings.encode_pspec(aval.sharding.spec, where)},
            "manual_axis_type": {"varying": sorted(mat.varying), "unreduced": sorted(mat.unreduced),
                                 "reduced": sorted(mat.reduced)},
            "memory_space": aval.memory_space.name,
        }

    # ------------------------------------------------------------ decode
    def decode(self, obj: Any):
        if type(obj) is str:
            aval = self._decoded.get(obj)
            if aval is None:
                aval = self._decoded[obj] = self._decode_new(obj, check_x64=True)
            return aval
        return self._decode_new(obj, check_x64=True)

    def _dtype(self, name: Any, check_x64: bool):
        if check_x64 and not self._x64 and name in _X64_ONLY:
            raise FormatError(f"the program uses {name}, but this process runs with "
                              f"jax_enable_x64 disabled; set JAX_ENABLE_X64=1 to load it")
        return dtypes.dtype_from_name(name)

    def _decode_new(self, obj: Any, check_x64: bool):
        if type(obj) is str:
            if obj == "token":
                return abstract_token
            m = _SHORT.fullmatch(obj)
            if m is None:
                raise FormatError(f"malformed type {obj[:60]!r}")
            shape = tuple(int(d) for d in m.group(3).split(",")) if m.group(3) else ()
            return ShapedArray(shape, self._dtype(m.group(2), check_x64), bool(m.group(1)))
        if not isinstance(obj, dict) or set(obj) != {"dtype", "shape", "weak_type", "sharding",
                                                     "manual_axis_type", "memory_space"}:
            raise FormatError(f"malformed type {str(obj)[:60]}")
        shape = obj["shape"]
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
            raise FormatError(f"malformed shape {str(shape)[:60]}")
        if type(obj["weak_type"]) is not bool:
            raise FormatError("weak_type must be true or false")
        sharding = obj["sharding"]
        if not isinstance(sharding, dict) or set(sharding) != {"mesh", "spec"}:
            raise FormatError("malformed aval sharding")
        import jax
        named = jax.sharding.NamedSharding(shardings.decode_abstract_mesh(sharding["mesh"]),
                                           shardings.decode_pspec(sharding["spec"]))
        mat = obj["manual_axis_type"]
        if not isinstance(mat, dict) or set(mat) != {"varying", "unreduced", "reduced"}:
            raise FormatError("malformed manual_axis_type")
        axes = {k: frozenset(shardings._str_list(v, f"manual_axis_type {k}")) for k, v in mat.items()}
        try:
            space = MemorySpace[obj["memory_space"]] if type(obj["memory_space"]) is str else None
        except KeyError:
            space = None
        if space is None:
            raise FormatError(f"unknown memory space {str(obj['memory_space'])[:40]!r}")
        try:
            return ShapedArray(tuple(shape), self._dtype(obj["dtype"], check_x64), obj["weak_type"],
                               sharding=named, manual_axis_type=ManualAxisType(**axes),
                               memory_space=space)
        except (ValueError, TypeError, KeyError, AssertionError) as e:
            raise FormatError(f"invalid type: {e}") from None
