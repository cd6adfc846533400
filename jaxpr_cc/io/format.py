"""The container of a saved program: a canonical, uncompressed zip archive.

Layout (in this order, nothing else)::

    manifest.json        format name and version, JAX version, sha256 of every entry
    program.json         the program's structure (see docs/format.md)
    consts/000000.npy    one .npy per array the program holds (constants, literals)
    consts/000001.npy
    ...

(``atomic.py`` writes the file; this module lays out its bytes.)  Entries are
*stored* (not compressed), have a fixed timestamp (1980-01-01 00:00) and
fixed attributes, and appear in the order above, so the same program always gives
the same bytes, on any machine.  The reader accepts exactly the bytes this writer
produces: it re-derives every header from the entry names and contents and compares
byte for byte, so a flipped bit anywhere in the file is caught (in a header by the
comparison, in an entry's content by its CRC-32 and its sha256).  Because nothing is
compressed, there is nothing to decompress: an archive that asks for decompression
is refused before any of it is read.
"""
from __future__ import annotations

import hashlib
import json
import struct
import zlib
from typing import BinaryIO, Callable, Sequence

from ..storage.errors import FormatError, SaveError

FORMAT_NAME = "jaxpr-cc saved program"
FORMAT_VERSION = 3  # the newest version this code writes and reads (2: shared param sets; 3: sharded values)

MANIFEST = "manifest.json"
PROGRAM = "program.json"

MAX_ENTRIES = 1 << 22          # constants per program
MAX_MANIFEST_BYTES = 1 << 30   # ~4M entries of ~100 bytes fit well below this

# Fixed header fields.  DOS date 1980-01-01 = ((1980-1980) << 9) | (1 << 5) | 1.
_DOS_TIME, _DOS_DATE = 0, 0x21
_VERSION_PLAIN, _VERSION_ZIP64 = 20, 45
_UNIX = 3
_FILE_MODE = 0o100644 << 16
_U16_MAX, _U32_MAX = 0xFFFF, 0xFFFFFFFF

_LOCAL = struct.Struct("<IHHHHHIIIHH")       # 30 bytes
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")  # 46 bytes
_EOCD = struct.Struct("<IHHHHIIH")           # 22 bytes
_EOCD64 = struct.Struct("<IQHHIIQQQQ")       # 56 bytes
_LOCATOR = struct.Struct("<IIQI")            # 20 bytes
_SIG_LOCAL, _SIG_CENTRAL = 0x04034B50, 0x02014B50
_SIG_EOCD, _SIG_EOCD64, _SIG_LOCATOR = 0x06054B50, 0x06064B50, 0x07064B50


def const_entry_name(index: int) -> str:
    return f"consts/{index:06d}.npy"


# ------------------------------------------------------------------ headers
def _local_header(name: bytes, crc: int, size: int, zip64: bool) -> bytes:
    if zip64:
        extra = struct.pack("<HHQQ", 1, 16, size, size)
        return _LOCAL.pack(_SIG_LOCAL, _VERSION_ZIP64, 0, 0, _DOS_TIME, _DOS_DATE, crc,
                           _U32_MAX, _U32_MAX, len(name), len(extra)) + name + extra
    return _LOCAL.pack(_SIG_LOCAL, _VERSION_PLAIN, 0, 0, _DOS_TIME, _DOS_DATE, crc,
                       size, size, len(name), 0) + name


def _central_header(name: bytes, crc: int, size: int, offset: int, zip64: bool) -> bytes:
    if zip64:
        extra = struct.pack("<HHQQQ", 1, 24, size, size, offset)
        return _CENTRAL.pack(_SIG_CENTRAL, (_UNIX << 8) | _VERSION_ZIP64, _VERSION_ZIP64, 0, 0,
                             _DOS_TIME, _DOS_DATE, crc, _U32_MAX, _U32_MAX, len(name),
                             len(extra), 0, 0, 0, _FILE_MODE, _U32_MAX) + name + extra
    return _CENTRAL.pack(_SIG_CENTRAL, (_UNIX << 8) | _VERSION_PLAIN, _VERSION_PLAIN, 0, 0,
                         _DOS_TIME, _DOS_DATE, crc, size, size, len(name), 0, 0, 0, 0,
                         _FILE_MODE, offset) + name


def _end_records(count: int, cd_offset: int, cd_size: int, zip64: bool) -> bytes:
    if zip64:
        eocd64_offset = cd_offset + cd_size
        return (_EOCD64.pack(_SIG_EOCD64, 44, (_UNIX << 8) | _VERSION_ZIP64, _VERSION_ZIP64,
                             0, 0, count, count, cd_size, cd_offset)
                + _LOCATOR.pack(_SIG_LOCATOR, 0, eocd64_offset, 1)
                + _EOCD.pack(_SIG_EOCD, 0, 0, _U16_MAX, _U16_MAX, _U32_MAX, _U32_MAX, 0))
    return _EOCD.pack(_SIG_EOCD, 0, 0, count, count, cd_size, cd_offset, 0)


def _needs_zip64(entries: Sequence[tuple[str, bytes]]) -> bool:
    if len(entries) >= _U16_MAX:
        return True
    total = sum(30 + 46 + 2 * len(n) + len(d) for n, d in entries) + 22
    return total >= _U32_MAX


# ------------------------------------------------------------------- writer
def write_archive(out: BinaryIO, entries: Sequence[tuple[str, bytes]], *,
                  zip64: bool | None = None) -> None:
    """Write ``entries`` (name, content) as a canonical stored zip archive."""
    if zip64 is None:
        zip64 = _needs_zip64(entries)
    central = []
    offset = 0
    for name, data in entries:
        raw_name = name.encode("ascii")
        crc = zlib.crc32(data)
        head = _local_header(raw_name, crc, len(data), zip64)
        out.write(head)
        out.write(data)
        central.append(_central_header(raw_name, crc, len(data), offset, zip64))
        offset += len(head) + len(data)
    cd = b"".join(central)
    out.write(cd)
    out.write(_end_records(len(entries), offset, len(cd), zip64))


def pack_archive(entries: Sequence[tuple[str, bytes]], *, zip64: bool | None = None) -> bytes:
    import io
    buf = io.BytesIO()
    write_archive(buf, entries, zip64=zip64)
    return buf.getvalue()


# ------------------------------------------------------------------- reader
_FOREIGN_MAGIC = (
    (b"\x93NUMPY", "a numpy .npy file"),
    (b"\x80", "a Python pickle (saved programs never contain pickles)"),
    (b"\x1f\x8b", "a gzip file"),
    (b"\x89PNG", "a PNG image"),
    (b"%PDF", "a PDF document"),
    (b"\x7fELF", "an executable (ELF)"),
    (b"PK\x05\x06", "an empty zip archive"),
)


def _describe_foreign(data: bytes) -> str:
    for magic, what in _FOREIGN_MAGIC:
        if data.startswith(magic):
            return what
    head = data[:64].lstrip()
    if head[:1] in (b"{", b"["):
        return "a JSON or text document"
    if head.startswith((b"import ", b"from ", b"def ", b"#")):
        return "Python source or text"
    return "not a zip archive"


def unpack_archive(data: bytes | memoryview) -> list[tuple[str, memoryview]]:
    """Split a saved-program archive into (name, content) pairs, refusing anything
    that is not byte for byte what :func:`write_archive` produces."""
    view = memoryview(data)
    n = len(view)
    if n == 0:
        raise FormatError("empty file, not a saved program")
    if bytes(view[:4]) != b"PK\x03\x04":
        raise FormatError(f"not a saved program: the file is {_describe_foreign(bytes(view[:64]))}")
    if n < 30 + 22:
        raise FormatError(f"truncated: {n} bytes is too short for a saved program")
    sig, disk, cd_disk, count_disk, count, cd_size, cd_offset, comment = _EOCD.unpack_from(view, n - 22)
    if sig != _SIG_EOCD:
        raise FormatError("truncated or damaged: no zip end record at the end of the file")
    if (disk, cd_disk, comment) != (0, 0, 0) or count_disk != count:
        raise FormatError("damaged zip end record (multi-disk archive or trailing comment)")
    zip64 = (count, cd_size, cd_offset) == (_U16_MAX, _U32_MAX, _U32_MAX)
    end_start = n - 22
    if zip64:
        if n < 22 + 20 + 56:
            raise FormatError("truncated zip64 end records")
        lsig, ldisk, eocd64_offset, ndisks = _LOCATOR.unpack_from(view, n - 42)
        end_start = n - 42 - 56
        if lsig != _SIG_LOCATOR or (ldisk, ndisks) != (0, 1) or eocd64_offset != end_start:
            raise FormatError("damaged zip64 end locator")
        (sig64, _size, _made, _need, _d, _cd, count_disk, count, cd_size,
         cd_offset) = _EOCD64.unpack_from(view, end_start)
        if sig64 != _SIG_EOCD64 or count_disk != count:
            raise FormatError("damaged zip64 end record")
    if count < 2 or count > MAX_ENTRIES + 2:
        raise FormatError(f"archive has {count} entries; a saved program has 2 to {MAX_ENTRIES + 2}")
    if cd_offset + cd_size != end_start:
        raise FormatError("damaged zip archive: the central directory does not end where the "
                          "end record begins (truncated or trailing data?)")
    # Read (name, crc, size) from the central directory, with bounds checks only; the
    # headers themselves are verified below by re-deriving them.
    listing = []
    pos = cd_offset
    for i in range(count):
        if pos + 46 > end_start:
            raise FormatError("truncated central directory")
        fields = _CENTRAL.unpack_from(view, pos)
        if fields[0] != _SIG_CENTRAL:
            raise FormatError(f"damaged central directory entry {i}")
        crc, name_len, extra_len, comment_len = fields[7], fields[10], fields[11], fields[12]
        size = fields[9]
        header_len = 46 + name_len + extra_len + comment_len
        if pos + header_len > end_start:
            raise FormatError("truncated central directory")
        raw_name = bytes(view[pos + 46: pos + 46 + name_len])
        if fields[4] != 0:
            raise FormatError(f"archive entry {raw_name[:80]!r} is compressed (method {fields[4]}); "
                              f"saved programs store every entry uncompressed")
        if zip64 and extra_len >= 12:
            size = struct.unpack_from("<Q", view, pos + 46 + name_len + 4)[0]
        listing.append((raw_name, crc, size))
        pos += header_len
    if pos != end_start:
        raise FormatError("damaged central directory (unexpected trailing bytes)")

    entries = []
    central = []
    offset = 0
    for i, (raw_name, crc, size) in enumerate(listing):
        name = _check_name(raw_name, i)
        head = _local_header(raw_name, crc, size, zip64)
        start = offset + len(head)
        if start + size > cd_offset:
            raise FormatError(f"entry {name!r} extends past the end of the data (truncated file?)")
        if bytes(view[offset:start]) != head:
            raise FormatError(f"damaged local header of entry {name!r}")
        content = view[start:start + size]
        if zlib.crc32(content) != crc:
            raise FormatError(f"entry {name!r} is corrupted (CRC-32 mismatch)")
        central.append(_central_header(raw_name, crc, size, offset, zip64))
        entries.append((name, content))
        offset = start + size
    if offset != cd_offset:
        raise FormatError("damaged zip archive: unexpected bytes between entries")
    if bytes(view[cd_offset:end_start]) != b"".join(central):
        raise FormatError("damaged central directory")
    if bytes(view[end_start:]) != _end_records(count, cd_offset, cd_size, zip64):
        raise FormatError("damaged zip end record")
    return entries


def _check_name(raw: bytes, index: int) -> str:
    try:
        name = raw.decode("ascii")
    except UnicodeDecodeError:
        raise FormatError(f"archive entry {index} has a non-ASCII name") from None
    expected = MANIFEST if index == 0 else PROGRAM if index == 1 else const_entry_name(index - 2)
    if name != expected:
        if "/" in name and (name.startswith("/") or ".." in name.split("/")):
            raise FormatError(f"archive entry name {name!r} points outside the archive")
        raise FormatError(f"unexpected archive entry {name!r} at position {index} "
                          f"(expected {expected!r})")
    return name


def peek_format_version(data: bytes | memoryview) -> int | None:
    """The format version the first entry's manifest declares, read before the
    archive layout is checked (a newer version may lay the archive out differently,
    and must be refused as newer, not as damaged).  None when it cannot be read;
    the manifest's CRC-32 must match, so a damaged byte never reads as a version."""
    view = memoryview(data)
    if len(view) < 30 or bytes(view[:4]) != b"PK\x03\x04":
        return None
    fields = _LOCAL.unpack_from(view, 0)
    method, crc, size, name_len, extra_len = fields[3], fields[6], fields[8], fields[9], fields[10]
    start = 30 + name_len + extra_len
    if method != 0 or bytes(view[30:30 + name_len]) != MANIFEST.encode():
        return None
    if size == _U32_MAX and extra_len >= 12:
        size = struct.unpack_from("<Q", view, 30 + name_len + 4)[0]
    if size > MAX_MANIFEST_BYTES or start + size > len(view):
        return None
    content = view[start:start + size]
    if zlib.crc32(content) != crc:
        return None
    try:
        doc = json.loads(bytes(content).decode("ascii"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT_NAME:
        return None
    version = doc.get("format_version")
    return version if type(version) is int else None


def check_not_newer(version: int | None) -> None:
    if version is not None and version > FORMAT_VERSION:
        raise FormatError(f"written in format version {version}, newer than this jaxpr-cc "
                          f"reads (versions 1 to {FORMAT_VERSION}): upgrade jaxpr-cc")


# ---------------------------------------------------------------- manifest
def sha256_hex(data) -> str:
    return hashlib.sha256(data).hexdigest()


def make_manifest(entries: Sequence[tuple[str, bytes]], versions: dict) -> bytes:
    doc = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        **versions,
        "entries": [{"name": n, "sha256": sha256_hex(d), "size": len(d)} for n, d in entries],
    }
    return (json.dumps(doc, indent=1, sort_keys=True, ensure_ascii=True) + "\n").encode("ascii")


def build_entries(program_json: bytes, arrays: Sequence[bytes], versions: dict
                  ) -> list[tuple[str, bytes]]:
    body = [(PROGRAM, program_json)] + [(const_entry_name(i), a) for i, a in enumerate(arrays)]
    if len(arrays) > MAX_ENTRIES:
        raise SaveError(f"program holds {len(arrays)} constants; the format allows {MAX_ENTRIES}")
    return [(MANIFEST, make_manifest(body, versions))] + body


def parse_manifest(content: memoryview, check_versions: Callable[[dict], None]
                   ) -> dict:
    if len(content) > MAX_MANIFEST_BYTES:
        raise FormatError("manifest.json is implausibly large")
    try:
        text = bytes(content).decode("ascii")
    except UnicodeDecodeError:
        raise FormatError("manifest.json is not ASCII text") from None
    from .api import strict_json
    doc = strict_json(text, "manifest.json")
    if not isinstance(doc, dict):
        raise FormatError("manifest.json is not a JSON object")
    if doc.get("format") != FORMAT_NAME:
        raise FormatError(f"manifest.json does not describe a saved program "
                          f"(format {doc.get('format')!r}, expected {FORMAT_NAME!r})")
    version = doc.get("format_version")
    if type(version) is not int:
        raise FormatError(f"manifest.json: format_version {version!r} is not an integer")
    check_not_newer(version)
    if version < 1:
        raise FormatError(f"format version {version} does not exist (versions start at 1)")
    check_versions(doc)
    expected = {"format", "format_version", "entries", "jax_version", "jaxlib_version",
                "jaxpr_cc_version"}
    if set(doc) != expected:
        extra, missing = sorted(set(doc) - expected), sorted(expected - set(doc))
        raise FormatError(f"manifest.json has unexpected fields {extra} / lacks {missing}")
    return doc


def verify_entries(manifest: dict, entries: Sequence[tuple[str, memoryview]]) -> None:
    listed = manifest["entries"]
    if not isinstance(listed, list) or len(listed) != len(entries) - 1:
        raise FormatError(f"manifest.json lists {len(listed) if isinstance(listed, list) else '?'} "
                          f"entries but the archive holds {len(entries) - 1}")
    for item, (name, content) in zip(listed, entries[1:]):
        if not isinstance(item, dict) or set(item) != {"name", "sha256", "size"}:
            raise FormatError(f"manifest.json: malformed entry for {name!r}")
        if item["name"] != name:
            raise FormatError(f"manifest.json lists {item['name']!r} where the archive holds {name!r}")
        if item["size"] != len(content):
            raise FormatError(f"entry {name!r} has {len(content)} bytes, manifest says {item['size']}")
        if item["sha256"] != sha256_hex(content):
            raise FormatError(f"entry {name!r} is corrupted (sha256 mismatch)")
