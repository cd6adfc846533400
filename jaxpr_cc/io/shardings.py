"""Meshes, partition specs and shardings as plain JSON.

A concrete ``Mesh`` is recorded by its axis names, shape, axis types, device
platform and device ids; reading it back picks those devices from this process's
``jax.devices(platform)`` and fails clearly when they are not there.  An
``AbstractMesh`` (what avals carry) is recorded by axis sizes, names, types and its
abstract device description.  Each encoder checks that decoding gives back the
same object (meshes and specs are interned by JAX), so a value this module cannot
represent exactly is refused at save time.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..storage.errors import FormatError, SaveError


class MissingDevicesError(FormatError):
    """A well-formed mesh or device that names devices this process does not have."""


def _axis_name(name: Any, where: str) -> str:
    if type(name) is not str:
        raise SaveError(f"{where}: mesh axis name {name!r} is not a string")
    return name


def _names(values, where) -> list[str]:
    return [_axis_name(v, where) for v in values]


def _str_list(value: Any, what: str) -> list[str]:
    if not (isinstance(value, list) and all(type(v) is str for v in value)):
        raise FormatError(f"{what} must be a list of strings")
    return value


def _int_list(value: Any, what: str) -> list[int]:
    if not (isinstance(value, list) and all(type(v) is int and v >= 0 for v in value)):
        raise FormatError(f"{what} must be a list of non-negative integers")
    return value


def _fields(obj: Any, keys: set, what: str) -> dict:
    if not isinstance(obj, dict) or set(obj) != keys:
        raise FormatError(f"malformed {what}: expected fields {sorted(keys)}")
    return obj


# ------------------------------------------------------------- axis types
def _axis_type_names(types, where) -> list[str]:
    return [t.name for t in types]


def _axis_types(names: Any):
    import jax
    out = []
    for n in _str_list(names, "mesh axis_types"):
        try:
            out.append(jax.sharding.AxisType[n])
        except KeyError:
            raise FormatError(f"unknown mesh axis type {n!r}") from None
    return tuple(out)


# --------------------------------------------------------- abstract mesh
def encode_abstract_mesh(mesh, where: str) -> dict:
    dev = mesh.abstract_device
    return {
        "axis_sizes": [int(s) for s in mesh.axis_sizes],
        "axis_names": _names(mesh.axis_names, where),
        "axis_types": _axis_type_names(mesh.axis_types, where),
        "device": None if dev is None else {"device_kind": dev.device_kind,
                                            "num_cores": dev.num_cores,
                                            "platform": dev.platform},
    }


def decode_abstract_mesh(obj: Any):
    import jax
    from ..jax_adapter import AbstractDevice
    obj = _fields(obj, {"axis_sizes", "axis_names", "axis_types", "device"}, "abstract mesh")
    sizes = _int_list(obj["axis_sizes"], "abstract mesh axis_sizes")
    names = _str_list(obj["axis_names"], "abstract mesh axis_names")
    types = _axis_types(obj["axis_types"])
    if not len(sizes) == len(names) == len(types):
        raise FormatError("abstract mesh: axis sizes, names and types differ in length")
    dev = obj["device"]
    device = None
    if dev is not None:
        dev = _fields(dev, {"device_kind", "num_cores", "platform"}, "abstract device")
        if type(dev["device_kind"]) is not str or type(dev["platform"]) is not str or not (
                dev["num_cores"] is None or type(dev["num_cores"]) is int):
            raise FormatError("malformed abstract device")
        device = AbstractDevice(dev["device_kind"], dev["num_cores"], dev["platform"])
    return jax.sharding.AbstractMesh(tuple(sizes), tuple(names), types, abstract_device=device)


# ---------------------------------------------------------- concrete mesh
def encode_mesh(mesh, where: str) -> dict:
    devices = [d for d in mesh.devices.flat] if mesh.devices.size else []
    if len(devices) == 1 and devices[0] is None:
        devices = []  # the empty mesh holds a single None
    platforms = {d.platform for d in devices}
    if len(platforms) > 1:
        raise SaveError(f"{where}: mesh spans several platforms {sorted(platforms)}")
    return {
        "axis_names": _names(mesh.axis_names, where),
        "shape": [int(s) for s in mesh.devices.shape],
        "axis_types": _axis_type_names(mesh.axis_types, where),
        "platform": platforms.pop() if platforms else None,
        "device_ids": [int(d.id) for d in devices],
    }


def decode_mesh(obj: Any):
    import jax
    obj = _fields(obj, {"axis_names", "shape", "axis_types", "platform", "device_ids"}, "mesh")
    names = tuple(_str_list(obj["axis_names"], "mesh axis_names"))
    shape = tuple(_int_list(obj["shape"], "mesh shape"))
    types = _axis_types(obj["axis_types"])
    ids = _int_list(obj["device_ids"], "mesh device_ids")
    platform = obj["platform"]
    if not ids:
        if names or shape or platform is not None:
            raise FormatError("malformed empty mesh")
        return jax.sharding.Mesh(np.empty((), dtype=object), ())
    if type(platform) is not str:
        raise FormatError("mesh platform must be a string")
    if len(names) != len(shape) or len(types) != len(names) or int(np.prod(shape)) != len(ids):
        raise FormatError("mesh: axis names, shape and device ids do not fit together")
    if len(set(ids)) != len(ids):
        raise FormatError("mesh lists a device twice")
    try:
        ordered = list(jax.devices(platform))
    except RuntimeError:
        raise MissingDevicesError(f"the program runs on {platform} devices, which this "
                                  f"process does not have") from None
    available = {d.id: d for d in ordered}
    if all(i in available for i in ids):
        chosen = [available[i] for i in ids]
    elif max(ids) < len(ordered):
        # Other ids, enough devices (jax.distributed numbers a process's devices its
        # own way): the saved ids of a one-process host are positions in the global
        # device list, as executables' meshes are matched.
        chosen = [ordered[i] for i in ids]
    else:
        missing = [i for i in ids if i not in available]
        raise MissingDevicesError(
            f"the program's mesh uses {platform} devices {missing[:8]} but this process has "
            f"{len(available)} {platform} device(s); on CPU set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={max(ids) + 1}")
    devices = np.array(chosen, dtype=object).reshape(shape)
    return jax.sharding.Mesh(devices, names, axis_types=types)


# --------------------------------------------------------- partition spec
def _encode_partition(part, where):
    import jax
    if part is None:
        return None
    if part is jax.sharding.PartitionSpec.UNCONSTRAINED:
        return {"unconstrained": True}
    if isinstance(part, tuple):
        return _names(part, where)
    return _axis_name(part, where)


def encode_pspec(spec, where: str) -> dict:
    return {"partitions": [_encode_partition(p, where) for p in spec.partitions],
            "unreduced": sorted(_names(spec.unreduced, where)),
            "reduced": sorted(_names(spec.reduced, where))}


def _decode_partition(part):
    import jax
    if part is None or type(part) is str:
        return part
    if isinstance(part, list):
        return tuple(_str_list(part, "partition"))
    if part == {"unconstrained": True}:
        return jax.sharding.PartitionSpec.UNCONSTRAINED
    raise FormatError(f"malformed partition {str(part)[:60]}")


def decode_pspec(obj: Any):
    import jax
    obj = _fields(obj, {"partitions", "unreduced", "reduced"}, "partition spec")
    if not isinstance(obj["partitions"], list):
        raise FormatError("partition spec partitions must be a list")
    parts = [_decode_partition(p) for p in obj["partitions"]]
    return jax.sharding.PartitionSpec(
        *parts, unreduced=frozenset(_str_list(obj["unreduced"], "unreduced axes")),
        reduced=frozenset(_str_list(obj["reduced"], "reduced axes")))


# ----------------------------------------------------------- named sharding
def encode_any_mesh(mesh, where: str) -> dict:
    import jax
    if isinstance(mesh, jax.sharding.AbstractMesh):
        return {"abstract_mesh": encode_abstract_mesh(mesh, where)}
    if isinstance(mesh, jax.sharding.Mesh):
        return {"mesh": encode_mesh(mesh, where)}
    raise SaveError(f"{where}: mesh of type {type(mesh).__name__} cannot be saved")


def decode_any_mesh(obj: Any):
    if isinstance(obj, dict) and len(obj) == 1:
        if "abstract_mesh" in obj:
            return decode_abstract_mesh(obj["abstract_mesh"])
        if "mesh" in obj:
            return decode_mesh(obj["mesh"])
    raise FormatError("malformed mesh")


def encode_named_sharding(sharding, where: str) -> dict:
    ids = sharding._logical_device_ids
    return {"mesh": encode_any_mesh(sharding.mesh, where),
            "spec": encode_pspec(sharding.spec, where),
            "memory_kind": sharding.memory_kind,
            "logical_device_ids": None if ids is None else [int(i) for i in ids]}


def decode_named_sharding(obj: Any):
    import jax
    obj = _fields(obj, {"mesh", "spec", "memory_kind", "logical_device_ids"}, "named sharding")
    kind = obj["memory_kind"]
    if kind is not None and type(kind) is not str:
        raise FormatError("named sharding memory_kind must be a string or null")
    ids = obj["logical_device_ids"]
    if ids is not None:
        ids = tuple(_int_list(ids, "logical_device_ids"))
    try:
        return jax.sharding.NamedSharding(decode_any_mesh(obj["mesh"]), decode_pspec(obj["spec"]),
                                          memory_kind=kind, _logical_device_ids=ids)
    except (ValueError, TypeError) as e:
        raise FormatError(f"invalid named sharding: {e}") from None


def encode_single_device_sharding(sharding, where: str) -> dict:
    return {"device": encode_device(sharding._device, where), "memory_kind": sharding.memory_kind}


def decode_single_device_sharding(obj: Any):
    import jax
    obj = _fields(obj, {"device", "memory_kind"}, "single-device sharding")
    kind = obj["memory_kind"]
    if kind is not None and type(kind) is not str:
        raise FormatError("single-device sharding memory_kind must be a string or null")
    return jax.sharding.SingleDeviceSharding(decode_device(obj["device"]), memory_kind=kind)


def encode_device(device, where: str) -> dict:
    return {"platform": device.platform, "id": int(device.id)}


def decode_device(obj: Any):
    import jax
    obj = _fields(obj, {"platform", "id"}, "device")
    if type(obj["platform"]) is not str or type(obj["id"]) is not int:
        raise FormatError("malformed device")
    try:
        devices = {d.id: d for d in jax.devices(obj["platform"])}
    except RuntimeError:
        raise MissingDevicesError(f"the program uses a {obj['platform']} device, which this "
                                  f"process does not have") from None
    if obj["id"] not in devices:
        raise MissingDevicesError(f"the program uses {obj['platform']} device {obj['id']}, "
                                  f"which this process does not have")
    return devices[obj["id"]]
