"""The on-disk form of a compiled executable: a zip archive of data, never code.

Members:

* ``manifest.json`` -- format name and version, the JAX/jaxlib versions that wrote
  it, the calling convention (pytree structures of arguments and results, argument
  types, donated inputs), the device layout (meshes and shardings, for programs
  that span several devices) and a sha256 checksum of every other member;
* ``exported.bin`` -- the program as ``jax.export`` serialized it (versioned
  StableHLO in a flatbuffer: no Python code, no pickles);
* ``params/N.npy`` -- the bound parameters, as ``.npy`` files read with
  ``allow_pickle=False``.

Reading a file imports nothing it names and evaluates nothing it contains: pytree
structures and arrays use the codecs the saved-program format uses too
(``jaxpr_cc.storage``), which rebuild namedtuples without importing and read ``.npy``
headers strictly.  Every
failure while reading is a :class:`LoadError` naming the file and what is wrong.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import zipfile
from typing import Any

import numpy as np

from ..storage.executables import EXECUTABLE_FORMAT, is_executable
from ..storage import dtypes as _dtypes
from ..storage import pytrees as _pytrees
from ..storage.errors import FormatError, LoadError, SaveError
from ..storage.atomic import write_file
from ..storage.npy import decode_npy, encode_npy

FORMAT_NAME = EXECUTABLE_FORMAT
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
EXPORTED = "exported.bin"

# Fixed member timestamps keep the archive bytes a function of its contents.
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)

# --------------------------------------------------------------------- archive
def write_archive(path: str, manifest: dict, members: dict[str, bytes]) -> None:
    """Write the archive with jaxpr-cc's one file writer (atomic for regular files:
    readers never see a half-written file; see :mod:`jaxpr_cc.storage.atomic`)."""
    manifest = dict(manifest)
    manifest["files"] = {name: hashlib.sha256(data).hexdigest()
                         for name, data in sorted(members.items())}
    # Not sort_keys: the pytree codec reads a node's kind from its first key.  The
    # manifest is built in a fixed order, so the bytes are deterministic anyway.
    text = json.dumps(manifest, indent=1).encode()

    def write(raw) -> None:
        with zipfile.ZipFile(raw, "w") as zf:
            _write_member(zf, MANIFEST, text, zipfile.ZIP_DEFLATED)
            for name, data in sorted(members.items()):
                # Arrays and bytecode barely compress; storing them keeps saving fast.
                _write_member(zf, name, data, zipfile.ZIP_STORED)
    write_file(path, write)


def _write_member(zf: zipfile.ZipFile, name: str, data: bytes, method: int) -> None:
    info = zipfile.ZipInfo(name, date_time=_ZIP_EPOCH)
    info.compress_type = method
    info.external_attr = 0o644 << 16
    zf.writestr(info, data)


def read_archive(path: str) -> tuple[dict, dict[str, bytes]]:
    """Read and check an archive: format, version, checksums.  -> (manifest, members)."""
    if not os.path.exists(path):
        raise LoadError(path, "no such file")
    if os.path.isdir(path):
        raise LoadError(path, "is a directory, expected a saved executable")
    try:
        zf = zipfile.ZipFile(path)
    except zipfile.BadZipFile as e:
        raise LoadError(path, f"not a jaxpr-cc executable (not a zip archive: {e})") from None
    except OSError as e:
        raise LoadError(path, f"cannot read: {e}") from None
    with zf:
        names = set(zf.namelist())
        if MANIFEST not in names:
            raise LoadError(path, f"not a jaxpr-cc executable (no {MANIFEST} inside)")
        manifest = _parse_manifest(path, _read_member(zf, path, MANIFEST))
        check_versions(path, manifest)
        files = manifest.get("files")
        if not isinstance(files, dict):
            raise LoadError(path, "manifest has no file checksums; the file is damaged")
        members = {}
        for name, digest in sorted(files.items()):
            if name not in names:
                raise LoadError(path, f"member {name!r} listed in the manifest is missing")
            data = _read_member(zf, path, name)
            if hashlib.sha256(data).hexdigest() != digest:
                raise LoadError(path, f"checksum mismatch in {name!r}; the file is corrupt, "
                                      f"save it again")
            members[name] = data
    return manifest, members


def _read_member(zf: zipfile.ZipFile, path: str, name: str) -> bytes:
    try:
        return zf.read(name)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
        # zipfile's own CRC check, a truncated file, a bad compressed stream
        raise LoadError(path, f"member {name!r} is damaged ({e}); save it again") from None


def is_executable_archive(path: str) -> bool:
    """True when ``path`` is a zip whose manifest names this format (any version)."""
    return is_executable(path)


def _parse_manifest(path: str, data: bytes) -> dict:
    try:
        manifest = json.loads(data)
    except ValueError as e:
        raise LoadError(path, f"{MANIFEST} is not valid JSON ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise LoadError(path, f"not a jaxpr-cc executable (format is {found!r}, expected "
                              f"{FORMAT_NAME!r})")
    return manifest


# -------------------------------------------------------------------- versions
def version_tuple(text: str) -> tuple[int, ...]:
    """'0.10.2' -> (0, 10, 2); a suffix such as '.dev1' or 'rc1' is ignored."""
    parts = []
    for piece in str(text).split("."):
        m = re.match(r"\d+", piece)
        if not m:
            break
        parts.append(int(m.group()))
    return tuple(parts)


def check_versions(path: str, manifest: dict) -> None:
    """Refuse files from a newer format, and programs serialized by a newer JAX:
    StableHLO is readable by the same or later JAX only."""
    import jax
    version = manifest.get("format_version")
    if not isinstance(version, int):
        raise LoadError(path, "manifest has no integer format_version")
    if version > FORMAT_VERSION:
        raise LoadError(path, f"written in executable format version {version}, but this "
                              f"jaxpr-cc reads versions up to {FORMAT_VERSION}; upgrade jaxpr-cc")
    producer = manifest.get("producer") or {}
    written = str(producer.get("jax", ""))
    if not written:
        raise LoadError(path, "manifest does not say which JAX version wrote it")
    if version_tuple(written) > version_tuple(jax.__version__):
        raise LoadError(path, f"written with JAX {written}, newer than this process's JAX "
                              f"{jax.__version__}; load it with JAX >= {written} or compile "
                              f"it again")


# ---------------------------------------------------------------------- pytrees
def encode_treedef(treedef, where: str) -> Any:
    """A PyTreeDef as JSON data (raises SaveError for node types that cannot be
    rebuilt without running code)."""
    return _pytrees.encode_treedef(treedef, where)


def decode_treedef(code: Any, path: str, what: str):
    try:
        return _pytrees.decode_treedef(code)
    except FormatError as e:
        raise LoadError(path, f"{what}: {e}") from None


# ----------------------------------------------------------------------- arrays
def encode_array(x: Any) -> tuple[dict, bytes]:
    """An array as (manifest entry, .npy bytes), with the saved-program format's
    dtype names and storage (raw bits for bfloat16 and friends, key data for PRNG
    keys)."""
    import jax
    dtype = x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype
    name = _dtypes.dtype_name(dtype)
    if name is None:
        raise SaveError(f"parameter of dtype {dtype} cannot be saved")
    if _dtypes.is_key_dtype(dtype):
        host = np.asarray(jax.random.key_data(x))
    else:
        host = _dtypes.to_storage(np.asarray(x))
    return {"dtype": name, "shape": [int(d) for d in np.shape(x)]}, encode_npy(host)


def decode_array(entry: Any, data: bytes, path: str, where: str):
    import jax
    from ..jax_adapter import key_dtype_impl_name
    if not isinstance(entry, dict) or not isinstance(entry.get("shape"), list):
        raise LoadError(path, f"{where}: malformed array entry")
    try:
        dtype = _dtypes.dtype_from_name(entry.get("dtype"))
        stored = decode_npy(memoryview(data), name=where)
        want_dtype, want_shape = _dtypes.storage_layout(dtype, tuple(entry["shape"]))
    except FormatError as e:
        raise LoadError(path, str(e)) from None
    if stored.dtype != want_dtype or stored.shape != want_shape:
        raise LoadError(path, f"{where}: stored as {stored.dtype}{list(stored.shape)}, the "
                              f"manifest says {entry.get('dtype')}{entry['shape']}")
    if _dtypes.is_key_dtype(dtype):
        return jax.random.wrap_key_data(np.array(stored), impl=key_dtype_impl_name(dtype))
    return _dtypes.from_storage(stored, dtype)


# -------------------------------------------------------------------- shardings
def encode_shardings(shardings: list, mesh) -> dict:
    """NamedShardings over ``mesh`` -> {"mesh": ..., "specs": [...]}."""
    import jax
    specs = []
    for s in shardings:
        # Over the program's mesh: its devices in its order and its axis names;
        # the axis types may differ (an Explicit input, an Auto output).
        if not isinstance(s, jax.sharding.NamedSharding) or \
                s.mesh.axis_names != mesh.axis_names or \
                s.mesh.devices.shape != mesh.devices.shape or \
                list(s.mesh.devices.flat) != list(mesh.devices.flat):
            raise SaveError(f"sharding {s} is not a NamedSharding over the program's mesh")
        for extra in ("unreduced", "reduced"):
            if getattr(s.spec, extra, None):
                raise SaveError(f"sharding {s} has {extra} axes, which cannot be saved")
        entries = []
        for e in s.spec:
            if e is None or isinstance(e, str):
                entries.append(e)
            elif isinstance(e, tuple) and all(isinstance(n, str) for n in e):
                entries.append(list(e))
            else:
                raise SaveError(f"partition spec entry {e!r} of {s} cannot be saved")
        entry = {"spec": entries, "memory_kind": s.memory_kind}
        if tuple(s.mesh.axis_types) != tuple(mesh.axis_types):
            entry["axis_types"] = [t.name for t in s.mesh.axis_types]
        specs.append(entry)
    return {
        "mesh": {
            "axis_names": [str(n) for n in mesh.axis_names],
            "axis_sizes": [int(n) for n in mesh.devices.shape],
            "axis_types": [t.name for t in mesh.axis_types],
            "device_ids": [int(d.id) for d in mesh.devices.flat],
            # Positions in jax.devices(): how the mesh is found again in a process
            # whose devices have other ids (jax.distributed numbers each process's
            # devices apart), as jax.make_mesh lays meshes out in that order.
            "device_positions": _device_positions(mesh),
        },
        "specs": specs,
    }


def _device_positions(mesh) -> list[int]:
    import jax
    position = {d: i for i, d in enumerate(jax.devices())}
    return [position[d] if d in position else -1 for d in mesh.devices.flat]


def decode_shardings(code: Any, path: str) -> list:
    """Inverse of :func:`encode_shardings`, on this process's devices: the saved
    device ids when this process has them all (the same machine), else the saved
    positions in ``jax.devices()`` (the global device list, which is what spans
    processes under ``jax.distributed``)."""
    import jax
    from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec
    try:
        mesh_code, specs = code["mesh"], code["specs"]
        names = [str(n) for n in mesh_code["axis_names"]]
        sizes = [int(n) for n in mesh_code["axis_sizes"]]
        types = [AxisType[t] for t in mesh_code["axis_types"]]
        ids = [int(i) for i in mesh_code["device_ids"]]
    except (KeyError, TypeError, ValueError) as e:
        raise LoadError(path, f"malformed device layout in the manifest ({e})") from None
    if not ids or int(np.prod(sizes)) != len(ids) or len(set(ids)) != len(ids):
        raise LoadError(path, f"malformed device layout (mesh {sizes} over devices {ids})")
    all_devices = jax.devices()
    devices = {d.id: d for d in all_devices}
    if all(i in devices for i in ids):
        chosen = [devices[i] for i in ids]
    else:
        positions = mesh_code.get("device_positions")
        if not (isinstance(positions, list) and len(positions) == len(ids)
                and all(type(p) is int and p >= 0 for p in positions)):
            positions = None
        if positions is None or max(positions) >= len(all_devices):
            need = max(positions) + 1 if positions else max(ids) + 1
            raise LoadError(
                path, f"the executable runs on {len(ids)} devices (ids {min(ids)}..{max(ids)}) "
                f"but this process sees {len(all_devices)} {jax.default_backend()} device(s); "
                f"on CPU set XLA_FLAGS=--xla_force_host_platform_device_count={need} before "
                f"importing jax (or spread the devices over jax.distributed processes)")
        chosen = [all_devices[p] for p in positions]
    mesh = Mesh(np.array(chosen, dtype=object).reshape(sizes),
                tuple(names), axis_types=tuple(types))
    out = []
    for entry in specs:
        try:
            parts = [tuple(e) if isinstance(e, list) else e for e in entry["spec"]]
            own = mesh
            if "axis_types" in entry:  # the same devices and names, other axis types
                own = Mesh(mesh.devices, mesh.axis_names,
                           axis_types=tuple(AxisType[t] for t in entry["axis_types"]))
            out.append(NamedSharding(own, PartitionSpec(*parts),
                                     memory_kind=entry.get("memory_kind")))
        except (KeyError, TypeError, ValueError) as e:
            raise LoadError(path, f"malformed sharding {entry!r} ({e})") from None
    return out
