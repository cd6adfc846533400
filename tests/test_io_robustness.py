"""Malformed saved-program files are refused cleanly.

Thousands of malformed files are generated from valid ones -- truncations at every
byte (so at every kind of boundary), random byte flips, wrong versions, unknown
primitives, wrong dtype/shape metadata, a shape of 10^12 elements, pickle payloads,
entry names escaping the archive, a decompression bomb, an empty file, a directory,
files of other formats, and systematic damage to every field of the document (with
the checksums recomputed, so the structural checks themselves are exercised).
Every one must raise ``LoadError`` with a one-line message naming the file, within a
time bound, writing nothing and allocating little.  A representative subset goes
through the real command line (``jaxpr-cc show BAD``): exit code 2, one line on
stderr, no traceback.
"""
from __future__ import annotations

import collections
import concurrent.futures
import copy
import gzip
import io
import json
import os
import pickle
import random
import resource
import signal
import struct
import subprocess
import sys
import time
import tracemalloc
import zipfile
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_cc
from jaxpr_cc.io import LoadError, dumps, load
from jaxpr_cc.io import format as container
from jaxpr_cc.io.api import _versions

SECONDS_PER_CASE = 5.0   # generous for 2 busy cores; a typical case takes ~1 ms
MIN_CASES = 1000

# ------------------------------------------------------------- valid programs
Pt = collections.namedtuple("Pt", ["a", "b"])
TABLE = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
KEY = jax.random.key(3)


def program_a(p, x):
    h = jnp.tanh(x @ jnp.asarray(TABLE)) + p.a
    h = jax.lax.cond(h.sum() > 0, lambda v: v * 2.0, lambda v: v - 1.0, h)
    c, ys = jax.lax.scan(lambda c, r: (c + r, c * r), jnp.zeros(4), h)
    return Pt(c.astype(jnp.bfloat16), ys * p.b), x.sum()


def program_b(x):
    jax.debug.print("x={x}", x=x)
    return x + jax.random.uniform(KEY, x.shape), jnp.asarray([np.nan, 1.0], jnp.float32) * x[:2]


@jax.tree_util.register_pytree_node_class
class Pair:
    """A custom pytree node (saved as data in the calling convention)."""

    def __init__(self, first, second):
        self.first, self.second = first, second

    def tree_flatten(self):
        return (self.first, self.second), "aux"

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)


def program_c(p, x):
    return Pair(p.first * x, {"s": p.second - x})


def _custom_node_file() -> bytes:
    return dumps(jaxpr_cc.trace(program_c, Pair(jnp.ones(2), jnp.zeros(2)), jnp.ones(2)))


def _valid_files() -> dict[str, bytes]:
    a = jaxpr_cc.trace(program_a, Pt(jnp.ones(4), jnp.float32(2.0)), jnp.ones((5, 3)))
    b = jaxpr_cc.trace(program_b, jnp.arange(4.0))
    return {"a": dumps(a), "b": dumps(b)}


VALID = _valid_files()


# ------------------------------------------------------------------ helpers
def entries_of(data: bytes) -> list[tuple[str, bytes]]:
    return [(n, bytes(c)) for n, c in container.unpack_archive(data)]


def document_of(data: bytes) -> dict:
    return json.loads(entries_of(data)[1][1])


def repack(data: bytes, *, doc=None, program_json: bytes | None = None, arrays=None,
           manifest_edit=None) -> bytes:
    """The file with its document and/or arrays replaced, checksums recomputed:
    the container is valid, so what is wrong is only what was changed."""
    entries = entries_of(data)
    if program_json is None:
        # plain json.dumps: the writer's layout would tidy some damage away
        program_json = (json.dumps(doc, separators=(",", ":")).encode()
                        if doc is not None else entries[1][1])
    arrays = [c for _, c in entries[2:]] if arrays is None else arrays
    built = container.build_entries(program_json, arrays, _versions())
    if manifest_edit is not None:
        manifest = json.loads(built[0][1])
        manifest_edit(manifest)
        built[0] = (container.MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())
    return container.pack_archive(built)


def zip_with(members: list[tuple[str, bytes]], method=zipfile.ZIP_STORED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", method) as zf:
        for name, content in members:
            zf.writestr(zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0)), content, compress_type=method)
    return buf.getvalue()


# --------------------------------------------------------------- generators
def truncations():
    for label, data in VALID.items():
        for cut in range(len(data)):  # every byte: every kind of boundary is among them
            yield f"{label}: truncated to {cut} bytes", data[:cut]


def byte_flips():
    rng = random.Random(1234)
    for label, data in VALID.items():
        entries = container.unpack_archive(data)
        program_start = data.index(bytes(entries[1][1][:64]))
        regions = {"anywhere": (0, len(data)),
                   "program.json": (program_start, program_start + len(entries[1][1])),
                   "headers": (0, 30)}
        for region, (lo, hi) in regions.items():
            for _ in range({"anywhere": 300, "program.json": 120, "headers": 30}[region]):
                pos = rng.randrange(lo, hi)
                flipped = bytearray(data)
                flipped[pos] ^= rng.randrange(1, 256)
                yield f"{label}: byte {pos} ({region}) flipped", bytes(flipped)


def _manifest_variants():
    yield "format_version newer than the reader", lambda m: m.update(format_version=container.FORMAT_VERSION + 1)
    yield "format_version 99", lambda m: m.update(format_version=99)
    yield "format_version 0", lambda m: m.update(format_version=0)
    yield "format_version as string", lambda m: m.update(format_version="1")
    yield "format_version as float", lambda m: m.update(format_version=1.0)
    yield "format_version missing", lambda m: m.pop("format_version")
    yield "jax_version older", lambda m: m.update(jax_version="0.4.30")
    yield "jax_version newer", lambda m: m.update(jax_version="1.0.0")
    yield "jax_version garbage", lambda m: m.update(jax_version="banana")
    yield "jax_version number", lambda m: m.update(jax_version=10)
    yield "jax_version missing", lambda m: m.pop("jax_version")
    yield "other format name", lambda m: m.update(format="jaxpr-cc-executable")
    yield "format missing", lambda m: m.pop("format")
    yield "extra manifest field", lambda m: m.update(extra=1)
    yield "entries missing", lambda m: m.pop("entries")
    yield "entry sha wrong", lambda m: m["entries"][0].update(sha256="0" * 64)
    yield "entry size wrong", lambda m: m["entries"][0].update(size=m["entries"][0]["size"] + 1)
    yield "entry renamed", lambda m: m["entries"][0].update(name="other.json")
    yield "entry dropped", lambda m: m["entries"].pop()
    yield "jaxlib_version missing", lambda m: m.pop("jaxlib_version")


def wrong_versions():
    for label, data in VALID.items():
        for what, edit in _manifest_variants():
            yield f"{label}: manifest {what}", repack(data, manifest_edit=edit)
        entries = entries_of(data)
        yield f"{label}: manifest not JSON", container.pack_archive(
            [(container.MANIFEST, b"{not json")] + entries[1:])
        yield f"{label}: manifest is a list", container.pack_archive(
            [(container.MANIFEST, b"[]")] + entries[1:])


def _equations(doc):
    for r, region in enumerate(doc["regions"]):
        for k in range(len(region["eqns"])):
            yield r, k


def unknown_primitives():
    for label, data in VALID.items():
        doc = document_of(data)
        for r, k in _equations(doc):
            for bad in ("no_such_primitive_xyz", "", 5, None, ["sin"], "os.system"):
                d = copy.deepcopy(doc)
                d["regions"][r]["eqns"][k]["op"] = bad
                yield f"{label}: region {r} eqn {k} op {bad!r}", repack(data, doc=d)


def _retype(t, how):
    """A different, incompatible type string."""
    weak, rest = ("~", t[1:]) if t.startswith("~") else ("", t)
    dtype, dims = rest[:-1].split("[")
    shape = [int(d) for d in dims.split(",") if d]
    if how == "dim":
        shape = [s + 1 for s in shape] or [2]
    elif how == "rank":
        shape = shape + [3]
    elif how == "dtype":
        dtype = "int32" if dtype != "int32" else "float32"
    elif how == "bogus_dtype":
        dtype = "float33"
    elif how == "huge":
        shape = [10 ** 6] * 2
    return f"{weak}{dtype}[{','.join(map(str, shape))}]"


def wrong_types():
    for label, data in VALID.items():
        doc = document_of(data)
        for r, k in _equations(doc):
            eqn = doc["regions"][r]["eqns"][k]
            for j, t in enumerate(eqn["type"]):
                if not isinstance(t, str) or t == "token":
                    continue
                for how in ("dim", "rank", "dtype", "bogus_dtype", "huge"):
                    d = copy.deepcopy(doc)
                    d["regions"][r]["eqns"][k]["type"][j] = _retype(t, how)
                    yield f"{label}: region {r} eqn {k} result {j} type {how}", repack(data, doc=d)
            for j, a in enumerate(eqn["in"]):
                if isinstance(a, dict) and "lit" in a:
                    d = copy.deepcopy(doc)
                    d["regions"][r]["eqns"][k]["in"][j]["type"] = _retype(a["type"], "rank")
                    yield f"{label}: region {r} eqn {k} literal {j} shape", repack(data, doc=d)
                    d = copy.deepcopy(doc)
                    d["regions"][r]["eqns"][k]["in"][j]["lit"]["dtype"] = "int8"
                    yield f"{label}: region {r} eqn {k} literal {j} dtype", repack(data, doc=d)
        for r, region in enumerate(doc["regions"]):
            used = {a for e in region["eqns"] for a in e["in"] if isinstance(a, int)}
            used |= {a for a in region["outvars"] if isinstance(a, int)}
            for field in ("consts", "invars"):
                for j, binder in enumerate(region[field]):
                    if binder["id"] not in used:
                        continue  # an unused input may take any type
                    for how in ("dim", "dtype", "huge"):
                        d = copy.deepcopy(doc)
                        d["regions"][r][field][j]["type"] = _retype(binder["type"], how)
                        yield f"{label}: region {r} {field} {j} type {how}", repack(data, doc=d)
        for i, array in enumerate(doc["arrays"]):
            for change in ({"dtype": "float64"}, {"dtype": "int32"}, {"shape": [7]},
                           {"shape": array["shape"] + [1]}, {"shape": []},
                           {"shape": [10 ** 6, 10 ** 6]}, {"dtype": "object"}):
                if all(array.get(k) == v for k, v in change.items()):
                    continue  # not a change
                d = copy.deepcopy(doc)
                d["arrays"][i].update(change)
                yield f"{label}: array {i} declared {change}", repack(data, doc=d)


def huge_shapes():
    """A shape declaring 10^12 elements, in every place a shape can be declared."""
    for label, data in VALID.items():
        entries = entries_of(data)
        arrays = [c for _, c in entries[2:]]
        doc = document_of(data)
        if not arrays:
            continue
        # the .npy header declares 10^12 elements (data far shorter)
        lying = _npy_header("<f4", (10 ** 12,)) + bytes(48)
        yield f"{label}: npy declares 10^12 elements", repack(data, arrays=[lying] + arrays[1:])
        # both the table and the .npy agree on 10^12 elements, the data is not there
        d = copy.deepcopy(doc)
        d["arrays"][0] = {"dtype": "float32", "shape": [10 ** 6, 10 ** 6]}
        lying2 = _npy_header("<f4", (10 ** 6, 10 ** 6)) + bytes(48)
        yield f"{label}: table and npy declare 10^12", repack(data, doc=d, arrays=[lying2] + arrays[1:])
        # an input declared with 10^12 elements
        d = copy.deepcopy(doc)
        first = d["regions"][0]["invars"][0]
        first["type"] = "float32[1000000,1000000]"
        yield f"{label}: input of 10^12 elements", repack(data, doc=d)


def _npy_header(descr: str, shape: tuple) -> bytes:
    """A canonical .npy preamble and header declaring ``shape`` (data not included)."""
    from jaxpr_cc.storage.npy import _MAGIC, _header
    header = _header(descr, shape)
    return _MAGIC + struct.pack("<H", len(header)) + header


def pickles():
    class Payload:
        def __reduce__(self):
            return (os.system, ("echo pwned > pwned.txt",))
    bomb = pickle.dumps(Payload())
    obj_npy = (b"\x93NUMPY\x01\x00" + struct.pack("<H", 118)
               + b"{'descr': '|O', 'fortran_order': False, 'shape': (1,), }".ljust(117) + b"\n"
               + bomb)
    for label, data in VALID.items():
        entries = entries_of(data)
        arrays = [c for _, c in entries[2:]]
        if arrays:
            yield f"{label}: object-dtype npy", repack(data, arrays=[obj_npy] + arrays[1:])
            yield f"{label}: npy replaced by a pickle", repack(data, arrays=[bomb] + arrays[1:])
            buf = io.BytesIO()
            np.save(buf, np.array([Payload()], dtype=object), allow_pickle=True)
            yield f"{label}: numpy's own pickled npy", repack(data, arrays=[buf.getvalue()] + arrays[1:])
        yield f"{label}: program.json is a pickle", repack(data, program_json=bomb)
        yield f"{label}: manifest is a pickle", container.pack_archive(
            [(container.MANIFEST, bomb)] + entries[1:])
    yield "a bare pickle", bomb
    yield "a pickle of the program", pickle.dumps({"program": "x" * 100})


def escaping_names():
    for label, data in VALID.items():
        entries = entries_of(data)
        for name in ("../evil.npy", "/tmp/evil.npy", "consts/../../evil.npy", "consts/..\\evil",
                     "consts/000000.npy/../../x", "..", "manifest.json\x00.npy"):
            # in the canonical layout, in place of the first array and as an extra entry
            swapped = entries[:2] + [(name, b"x" * 10)] + entries[3:]
            yield f"{label}: entry named {name!r}", _raw_pack(swapped)
            if "\x00" not in name:  # zipfile itself cuts names at a NUL
                yield f"{label}: extra entry {name!r} (zipfile)", zip_with(entries + [(name, b"x")])


def _raw_pack(entries):
    """Canonical packing, but with names the writer itself would never produce."""
    out = io.BytesIO()
    container.write_archive(out, entries)
    return out.getvalue()


def bombs():
    zeros = b"\0" * (64 << 20)
    for label, data in VALID.items():
        entries = entries_of(data)
        # program.json deflated from 64 MiB of zeros (a 64 KiB entry in the file)
        yield f"{label}: deflate bomb in program.json", zip_with(
            [entries[0], ("program.json", zeros)] + entries[2:], zipfile.ZIP_DEFLATED)
        yield f"{label}: all entries deflated", zip_with(entries, zipfile.ZIP_DEFLATED)
        # a stored entry whose header claims 4 GiB
        raw = bytearray(data)
        pos = 30 + len(container.MANIFEST) + len(entries[0][1])
        struct.pack_into("<II", raw, pos + 18, 0xFFFFFFF0, 0xFFFFFFF0)
        yield f"{label}: header claims a 4 GiB entry", bytes(raw)
    nested = zlib.compress(zeros, 9)
    yield "a raw deflate stream", nested


def other_formats(tmp_path):
    data = VALID["a"]
    entries = entries_of(data)
    npz = io.BytesIO()
    np.savez(npz, x=np.ones(3))
    npy = io.BytesIO()
    np.save(npy, np.ones(3))
    yield "an empty file", b""
    yield "one byte", b"P"
    yield "the zip signature only", b"PK\x03\x04"
    yield "a PNG image", b"\x89PNG\r\n\x1a\n" + bytes(200)
    yield "a JSON document", entries[1][1]
    yield "Python source", b"import os\nos.system('echo hi')\n"
    yield "an .npz file", npz.getvalue()
    yield "an .npy file", npy.getvalue()
    yield "a gzip of the program", gzip.compress(data)
    yield "an empty zip", zip_with([])
    yield "random bytes", random.Random(5).randbytes(4096)
    yield "zip by zipfile, same entries", zip_with(entries)
    yield "entries in another order", _raw_pack([entries[0], *entries[2:], entries[1]])
    yield "program.json missing", _raw_pack([entries[0], *entries[2:]])
    yield "manifest missing", _raw_pack(entries[1:])
    yield "an entry twice", _raw_pack(entries + [entries[-1]])
    yield "trailing garbage", data + b"garbage"
    yield "leading garbage", b"garbage" + data
    yield "zip comment", data[:-2] + struct.pack("<H", 4) + b"note"
    yield "two files concatenated", data + VALID["b"]
    yield "the file twice", data + data


def damaged_documents():
    """Every field of the document removed or given a wrong type; references that do
    not resolve; JSON that is not what the writer writes."""
    wrong_values = (None, -1, "x", [], {}, 1.5, True)
    for label, data in VALID.items():
        doc = document_of(data)
        for key in list(doc):
            d = copy.deepcopy(doc)
            del d[key]
            yield f"{label}: document lacks {key}", repack(data, doc=d)
            for bad in wrong_values:
                if type(bad) is type(doc[key]) and not isinstance(bad, (list, dict)):
                    continue  # another value of the right type may be a valid program
                if doc[key] == bad or (key == "params" and bad == []):
                    continue
                d = copy.deepcopy(doc)
                d[key] = bad
                yield f"{label}: document {key} = {bad!r}", repack(data, doc=d)
        d = copy.deepcopy(doc)
        d["extra"] = 1
        yield f"{label}: unknown document field", repack(data, doc=d)
        for r, region in enumerate(doc["regions"]):
            for key in list(region):
                d = copy.deepcopy(doc)
                del d["regions"][r][key]
                yield f"{label}: region {r} lacks {key}", repack(data, doc=d)
                for bad in wrong_values:
                    if region[key] == bad or bad == [] and key in ("consts", "effects"):
                        continue
                    if key == "debug_info" and bad is None:
                        continue
                    if key in ("eqns", "outvars", "invars") and bad == [] and not region[key]:
                        continue
                    d = copy.deepcopy(doc)
                    d["regions"][r][key] = bad
                    yield f"{label}: region {r} {key} = {bad!r}", repack(data, doc=d)
            n_defined = len(region["consts"]) + len(region["invars"])
            for k, eqn in enumerate(region["eqns"]):
                n_defined += len(eqn["out"])  # a reference to this number is to the future
                for key in list(eqn):
                    if key in ("out", "type", "op", "in"):
                        d = copy.deepcopy(doc)
                        del d["regions"][r]["eqns"][k][key]
                        yield f"{label}: region {r} eqn {k} lacks {key}", repack(data, doc=d)
                    for bad in (None, "x", {}, 7):
                        d = copy.deepcopy(doc)
                        d["regions"][r]["eqns"][k][key] = bad
                        yield f"{label}: region {r} eqn {k} {key} = {bad!r}", repack(data, doc=d)
                for bad_ref in (n_defined, n_defined + 5, -1, True, 0.0, "0"):
                    if not eqn["in"]:
                        break
                    d = copy.deepcopy(doc)
                    d["regions"][r]["eqns"][k]["in"][0] = bad_ref
                    yield f"{label}: region {r} eqn {k} operand {bad_ref!r}", repack(data, doc=d)
                if eqn["out"]:
                    d = copy.deepcopy(doc)
                    d["regions"][r]["eqns"][k]["out"][0] += 1
                    yield (f"{label}: region {r} eqn {k} result numbered out of order",
                           repack(data, doc=d))
                d = copy.deepcopy(doc)
                d["regions"][r]["eqns"][k]["unknown"] = 1
                yield f"{label}: region {r} eqn {k} unknown field", repack(data, doc=d)
                shared = type(eqn.get("params")) is int
                if shared:  # the equation's params are a shared set (format version 2)
                    for bad_set in (len(doc["param_sets"]), -1, True):
                        d = copy.deepcopy(doc)
                        d["regions"][r]["eqns"][k]["params"] = bad_set
                        yield (f"{label}: region {r} eqn {k} param set {bad_set!r}",
                               repack(data, doc=d))
                params = doc["param_sets"][eqn["params"]] if shared else eqn.get("params", {})
                for key, value in params.items():
                    for bad in ({"$t": "bogus", "v": 1}, {"$t": "enum", "v": ["Precision", "NOPE"]},
                                {"$t": "dtype", "v": "float33"}, {"$t": "region", "v": 99},
                                {"$t": "region", "v": 0}, {"v": 1}, {"$t": "treedef", "v": "?"}):
                        d = copy.deepcopy(doc)
                        if shared:
                            d["param_sets"][eqn["params"]][key] = bad
                        else:
                            d["regions"][r]["eqns"][k]["params"][key] = bad
                        yield (f"{label}: region {r} eqn {k} param {key} = {bad!r}",
                               repack(data, doc=d))
        if len(doc["regions"]) > 1:
            d = copy.deepcopy(doc)
            d["regions"].append(copy.deepcopy(doc["regions"][1]))
            yield f"{label}: a region nothing uses", repack(data, doc=d)
            d = copy.deepcopy(doc)
            d["regions"] = d["regions"][:1]
            yield f"{label}: nested regions missing", repack(data, doc=d)
            d = copy.deepcopy(doc)
            for region in d["regions"][1:]:  # a region that contains itself
                for eqn in region["eqns"]:
                    if type(eqn.get("params")) is int:
                        eqn["params"] = copy.deepcopy(d["param_sets"][eqn["params"]])
                    eqn.setdefault("params", {})["loop"] = {"$t": "region", "v": 1}
            yield f"{label}: a region containing itself", repack(data, doc=d)
        if doc.get("param_sets"):
            d = copy.deepcopy(doc)
            d["param_sets"].append(copy.deepcopy(doc["param_sets"][0]))
            yield f"{label}: a parameter set nothing uses", repack(data, doc=d)
            d = copy.deepcopy(doc)
            d["param_sets"][0] = {}
            yield f"{label}: an empty parameter set", repack(data, doc=d)
        if doc["arrays"]:
            d = copy.deepcopy(doc)
            d["arrays"].append(copy.deepcopy(doc["arrays"][0]))
            arrays = [c for _, c in entries_of(data)[2:]]
            yield f"{label}: an array nothing uses", repack(data, doc=d, arrays=arrays + arrays[:1])
            yield f"{label}: fewer arrays than the table", repack(data, arrays=arrays[:-1])
        for tree in ("in_tree", "out_tree"):
            for bad in ("*", {"tuple": []}, {"namedtuple": "X", "module": "m", "fields": ["a"],
                                              "children": []}, {"custom": 1}):
                d = copy.deepcopy(doc)
                d[tree] = bad
                yield f"{label}: {tree} = {bad!r}", repack(data, doc=d)
        text = entries_of(data)[1][1]
        yield f"{label}: program.json not JSON", repack(data, program_json=text[:-10])
        yield f"{label}: program.json deeply nested", repack(
            data, program_json=b"[" * 100000 + b"]" * 100000)
        yield f"{label}: program.json with NaN", repack(
            data, program_json=text.replace(b'"out_tree":', b'"nan": NaN, "out_tree":', 1))
        yield f"{label}: program.json with a duplicate field", repack(
            data, program_json=text.replace(b'"name":', b'"name": "dup", "name":', 1))
        yield f"{label}: program.json not ASCII", repack(
            data, program_json=text.replace(b'"name": "', '"name": "\u00e9'.encode(), 1))
        yield f"{label}: program.json huge integer", repack(
            data, program_json=text.replace(b'"out":[', b'"out":[' + b"9" * 5000 + b",", 1))


def _nested_static(depth: int):
    value = "x"
    for _ in range(depth):
        value = {"tuple": [value]}
    return value


def custom_node_damage():
    """A file whose arguments and result hold custom pytree nodes, with every field
    of a custom node damaged (checksums recomputed)."""
    data = _custom_node_file()
    doc = document_of(data)
    node = doc["in_tree"]["tuple"][0]["tuple"][0]
    assert node["custom"] == "Pair" and node["keys"] == [{"flat": 0}, {"flat": 1}]
    damages = {
        "name not a string": ("custom", 7), "empty name": ("custom", ""),
        "module missing": ("module", None), "keys not a list": ("keys", {"flat": 0}),
        "unknown key kind": ("keys", [{"slot": 0}, {"flat": 1}]),
        "key with two entries": ("keys", [{"flat": 0, "attr": "a"}, {"flat": 1}]),
        "attr key not a string": ("keys", [{"attr": 3}, {"flat": 1}]),
        "negative index": ("keys", [{"flat": -1}, {"flat": 1}]),
        "bool index": ("keys", [{"index": True}, {"flat": 1}]),
        "float dict key": ("keys", [{"key": 1.5}, {"flat": 1}]),
        "duplicate key": ("keys", [{"flat": 1}, {"flat": 1}]),
        "fewer keys than children": ("keys", [{"flat": 0}]),
        "children not a list": ("children", "*"),
        "one child fewer (leaf count)": ("children", ["*"]),
        "malformed child": ("children", ["*", {"custom": "X"}]),
        "extra field": ("aux", "x"),
        "static float not a number": ("static", {"float": "one"}),
        "static unknown tag": ("static", {"set": []}),
        "static with two tags": ("static", {"tuple": [], "list": []}),
        "static dict with a float key": ("static", {"dict": [[1.5, 1]]}),
        "static complex of one part": ("static", {"complex": ["1.0"]}),
        "static float as a number": ("static", {"float": 1.0}),
        "static nested too deeply": ("static", _nested_static(300)),
    }
    for label, (field, value) in damages.items():
        d = copy.deepcopy(doc)
        target = d["in_tree"]["tuple"][0]["tuple"][0]
        if value is None:
            del target[field]
        else:
            target[field] = value
        yield f"custom node: {label}", repack(data, doc=d)
    d = copy.deepcopy(doc)
    d["out_tree"]["children"] = ["*", "*", "*"]
    yield "custom node: result with more leaves than outputs", repack(data, doc=d)
    for cut in range(0, len(data), 97):
        yield f"custom node: truncated to {cut} bytes", data[:cut]


# ------------------------------------------- a seed holding every parameter type
def _every_param_type_program():
    """One program calling every parameter-type program (tests/param_type_programs.py:
    every lax family, PRNG impls, copy semantics, custom_linear_solve, shardings...)
    and a lineax solve (a library primitive: pytree nodes as data, library objects
    by name and by fields)."""
    import lineax as lx
    from param_type_programs import PROGRAMS
    names = sorted(PROGRAMS)
    matrix = jnp.array([[3.0, 1.0], [1.0, 2.0]])

    def every_param_type(*args):
        outs, k = [], 0
        for name in names:
            f, example = PROGRAMS[name]
            outs.append(f(*args[k:k + len(example)]))
            k += len(example)
        outs.append(lx.linear_solve(lx.MatrixLinearOperator(matrix), args[k], lx.LU()).value)
        return outs

    flat = [a for name in names for a in PROGRAMS[name][1]] + [jnp.array([1.0, -1.0])]
    return jaxpr_cc.trace(every_param_type, *flat)


_EVERY: dict[str, bytes] = {}


def every_param_type_file() -> bytes:
    if "file" not in _EVERY:
        _EVERY["file"] = dumps(_every_param_type_program())
    return _EVERY["file"]


def _tagged_values(node, path=()):
    """(path, tagged value) of every tagged parameter value in a document."""
    if isinstance(node, dict):
        if set(node) == {"$t", "v"}:
            yield path, node
        for k, v in node.items():
            yield from _tagged_values(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _tagged_values(v, path + (i,))


def _replace_at(doc, path, value):
    d = copy.deepcopy(doc)
    target = d
    for k in path[:-1]:
        target = target[k]
    target[path[-1]] = value
    return d


# Names outside the libraries a file may name: never imported, always refused.
_FOREIGN_REFS = (["os", "system"], ["subprocess", "run"], ["builtins", "eval"],
                 ["equinox", "__class__"], ["equinox.nope_module", "x"],
                 ["lineax", "linear_solve.__globals__"], ["jax", "jit"], ["", ""])


# Payloads no tag accepts (lists aside: a list of one empty tuple is a valid list).
_BAD_PAYLOADS_FAST = ("x", ["os", "system"], {"$t": "bogus", "v": 1})
_BAD_PAYLOADS = (None, [], {}, "x", 7, -1.5, [[]], {"$t": "bogus", "v": 1},
                 ["os", "system"], {"class": ["os", "_wrap_close"], "state": []})
_LIST_TAGS = ("list", "set", "frozenset")


def every_param_type_damage(full: bool = False):
    """Each parameter type's payload (one occurrence of every tag; two and more
    payloads when ``full``) given wrong shapes, unknown tags, names outside the
    libraries."""
    data = every_param_type_file()
    doc = document_of(data)
    per_tag: dict[str, int] = collections.Counter()
    for path, tagged in _tagged_values(doc):
        tag = tagged["$t"]
        per_tag[tag] += 1
        if per_tag[tag] > (2 if full else 1):
            continue
        for bad in (_BAD_PAYLOADS if full else _BAD_PAYLOADS_FAST):
            if bad == tagged["v"] or (tag in _LIST_TAGS and isinstance(bad, list)):
                continue
            d = _replace_at(doc, path, {"$t": tag, "v": bad})
            yield f"every param type: {tag} at {path[-3:]} payload {bad!r}", d
        if tag in ("library_ref", "library_instance", "treedef_nodes"):
            for ref in _FOREIGN_REFS:
                if tag == "library_ref":
                    value = {"$t": tag, "v": ref}
                elif tag == "library_instance":
                    value = {"$t": tag, "v": {"class": ref, "state": []}}
                else:
                    value = {"$t": tag, "v": {"node": ref, "aux": None, "children": []}}
                yield (f"every param type: {tag} naming {ref}",
                       _replace_at(doc, path, value))


def every_param_type_files(full: bool = False):
    data = every_param_type_file()
    for label, d in every_param_type_damage(full):
        yield label, repack(data, doc=d)
    for cut in range(0, len(data), max(1, len(data) // (60 if full else 15))):
        yield f"every param type: truncated to {cut} bytes", data[:cut]


@pytest.mark.heavy
def test_every_param_type_seed_fully_damaged_is_refused(tmp_path):
    path = tmp_path / "bad.jcc"
    for label, data in every_param_type_files(full=True):
        path.write_bytes(data)
        refuse(path, label)


def test_the_every_param_type_seed_holds_every_param_type():
    """The seed holds every tag the parameter-type programs and a library primitive
    save (so the damage above reaches every decoder they use)."""
    from param_type_programs import PROGRAMS
    import test_realworld
    seen = {t["$t"] for _, t in _tagged_values(document_of(every_param_type_file()))}
    wanted = set()
    for f, args in PROGRAMS.values():
        saved = dumps(jaxpr_cc.trace(f, *args))
        wanted |= {t["$t"] for _, t in _tagged_values(document_of(saved))}
    lineax = dumps(jaxpr_cc.trace(test_realworld.lineax_lu, jnp.array([1.0, -1.0])))
    wanted |= {t["$t"] for _, t in _tagged_values(document_of(lineax))}
    assert {"treedef_nodes", "library_ref", "library_instance", "prng_impl", "enum",
            "LinearSolveTuple"} <= wanted
    assert wanted - seen == set()


GENERATORS = {
    "every_param_type": lambda tmp: every_param_type_files(),
    "custom_node": lambda tmp: custom_node_damage(),
    "truncation": lambda tmp: truncations(),
    "byte_flip": lambda tmp: byte_flips(),
    "wrong_version": lambda tmp: wrong_versions(),
    "unknown_primitive": lambda tmp: unknown_primitives(),
    "wrong_dtype_shape": lambda tmp: wrong_types(),
    "huge_shape": lambda tmp: huge_shapes(),
    "pickle": lambda tmp: pickles(),
    "escaping_name": lambda tmp: escaping_names(),
    "decompression_bomb": lambda tmp: bombs(),
    "other_format": other_formats,
    "damaged_document": lambda tmp: damaged_documents(),
}
_COUNTS: dict[str, int] = {}


# -------------------------------------------------------------------- checks
class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def refuse(path, label: str) -> str:
    """Load ``path``; it must raise LoadError, with a one-line message naming it."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(int(SECONDS_PER_CASE * 4))
    start = time.perf_counter()
    try:
        load(path)
    except LoadError as e:
        message = str(e)
    except _Timeout:
        pytest.fail(f"{label}: load did not finish in {SECONDS_PER_CASE * 4}s")
    except BaseException as e:  # noqa: B036 (any other exception type breaks the promise)
        pytest.fail(f"{label}: raised {type(e).__name__} instead of LoadError: {e}")
    else:
        pytest.fail(f"{label}: was loaded instead of refused")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    elapsed = time.perf_counter() - start
    assert elapsed < SECONDS_PER_CASE, f"{label}: took {elapsed:.1f}s"
    assert "\n" not in message and message.startswith(f"{path}: "), (label, message)
    assert len(message) < 600, (label, message)
    return message


@pytest.mark.parametrize("category", [
    pytest.param(c, marks=pytest.mark.heavy) if c == "every_param_type" else c for c in GENERATORS])
def test_malformed_files_are_refused(category, tmp_path):
    workdir = tmp_path / "work"
    workdir.mkdir()
    path = workdir / "bad.jcc"
    before_cwd = sorted(os.listdir("."))
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    count = 0
    for label, data in GENERATORS[category](tmp_path):
        path.write_bytes(data)
        refuse(path, label)
        count += 1
    assert sorted(os.listdir(workdir)) == ["bad.jcc"], "loading wrote a file"
    assert sorted(os.listdir(".")) == before_cwd, "loading wrote a file"
    assert not os.path.exists("pwned.txt")
    growth_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
    assert growth_mib < 400, f"peak memory grew by {growth_mib:.0f} MiB"
    assert count > 0
    _COUNTS[category] = count


def test_a_directory_and_a_missing_file_are_refused(tmp_path):
    assert "is a directory" in refuse(tmp_path, "a directory")
    assert "no such file" in refuse(tmp_path / "missing.jcc", "a missing file")


def test_at_least_a_thousand_malformed_files(tmp_path):
    total = 0
    for category, generate in GENERATORS.items():
        total += _COUNTS.get(category) or sum(1 for _ in generate(tmp_path))
    assert total >= MIN_CASES, total


@pytest.mark.parametrize("label,maker", [
    ("npy declares 10^12 elements", lambda: next(huge_shapes())[1]),
    ("deflate bomb", lambda: next(bombs())[1]),
])
def test_no_memory_blow_up(label, maker, tmp_path):
    data = maker()
    path = tmp_path / "bad.jcc"
    path.write_bytes(data)
    tracemalloc.start()
    try:
        refuse(path, label)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * len(data) + (16 << 20), f"{label}: peak {peak / 2**20:.0f} MiB"


_NEWER = container.FORMAT_VERSION + 1  # a version this reader does not know yet


def test_messages_say_what_is_wrong(tmp_path):
    path = tmp_path / "p.jcc"
    cases = {
        "newer format": (repack(VALID["a"], manifest_edit=lambda m: m.update(format_version=_NEWER)),
                         rf"format version {_NEWER}, newer than this jaxpr-cc reads "
                         rf"\(versions 1 to {_NEWER - 1}\)"),
        "newer format, other layout": (_newer_layout(VALID["a"]),
                                       rf"format version {_NEWER}, newer than this jaxpr-cc"),
        "other JAX": (repack(VALID["a"], manifest_edit=lambda m: m.update(jax_version="0.4.30")),
                      rf"written with JAX 0\.4\.30, but this process has JAX {jax.__version__}"),
        "bit flip": (_flip(VALID["a"], len(VALID["a"]) // 2), r"corrupted|damaged"),
        "truncated": (VALID["a"][:-7], r"truncated"),
        "pickle": (next(pickles())[1], r"Python objects \(a pickle\)"),
        "escaping": (next(escaping_names())[1], r"points outside the archive"),
        "bomb": (next(bombs())[1], r"compressed \(method 8\)"),
        "unknown primitive": (next(unknown_primitives())[1], r"unknown primitive 'no_such_primitive_xyz'"),
    }
    import re
    for what, (data, pattern) in cases.items():
        path.write_bytes(data)
        message = refuse(path, what)
        assert re.search(pattern, message), (what, message)


def _newer_layout(data: bytes) -> bytes:
    """A future version's file: the manifest first (as every version keeps it), then
    entries this version does not know."""
    entries = entries_of(data)
    manifest = json.loads(entries[0][1])
    manifest["format_version"] = _NEWER
    manifest["entries"].append({"name": "extras.bin", "sha256": "0" * 64, "size": 3})
    return _raw_pack([(container.MANIFEST, json.dumps(manifest).encode())] + entries[1:]
                     + [("extras.bin", b"new")])


def _flip(data: bytes, pos: int) -> bytes:
    out = bytearray(data)
    out[pos] ^= 0x40
    return bytes(out)


# ---------------------------------------------------------- through the CLI
def _cli_cases(tmp_path, per_category: int) -> list[tuple[str, object]]:
    picks = []
    for category, generate in GENERATORS.items():
        items = list(generate(tmp_path))
        step = max(1, len(items) // per_category)
        picks += [(f"{category}: {label}", data) for label, data in items[::step][:per_category]]
    picks.append(("a directory", tmp_path))
    return picks


def _run_cli_cases(tmp_path, cases) -> None:
    jobs = []
    for i, (label, data) in enumerate(cases):
        if isinstance(data, bytes):
            path = tmp_path / f"bad{i}.jcc"
            path.write_bytes(data)
        else:
            path = data
        jobs.append((label, str(path)))
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    script = os.path.join(os.path.dirname(sys.executable), "jaxpr-cc")
    command = [script] if os.path.exists(script) else [sys.executable, "-m", "jaxpr_cc.cli.main"]

    def run(job):
        label, path = job
        proc = subprocess.run(command + ["show", path], capture_output=True, text=True,
                              cwd=workdir, timeout=300)
        return label, path, proc

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        for label, path, proc in pool.map(run, jobs):
            assert proc.returncode == 2, (label, proc.returncode, proc.stderr[-500:])
            lines = proc.stderr.splitlines()
            assert len(lines) == 1 and path in lines[0], (label, proc.stderr[-500:])
            assert "Traceback" not in proc.stderr and proc.stdout == "", label
    assert os.listdir(workdir) == []


@pytest.mark.heavy  # one CLI process per malformed file (~25 s); the in-process loader checks stay default
def test_command_line_refuses_malformed_files(tmp_path):
    """One case of each kind through ``jaxpr-cc show`` (each start-up imports JAX)."""
    cases = _cli_cases(tmp_path, per_category=1)
    assert len(cases) >= 12
    _run_cli_cases(tmp_path, cases)


@pytest.mark.heavy
def test_command_line_refuses_many_malformed_files(tmp_path):
    cases = _cli_cases(tmp_path, per_category=4)
    assert len(cases) >= 40
    _run_cli_cases(tmp_path, cases)
