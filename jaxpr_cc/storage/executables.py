"""Recognizing a compiled executable file by a bounded look at its manifest.

The XLA backend writes the format (backends/xla_archive.py); loading a program and the
CLI only need to recognize it, below the backends.
"""
from __future__ import annotations

#: The manifest format name of the XLA backend's executable files (backends/xla_archive).
EXECUTABLE_FORMAT = "jaxpr-cc-executable"


def is_executable(path_or_data: str | bytes) -> bool:
    """A bounded sniff for the XLA backend's executable files (a zip whose small
    manifest names that format: backends/xla_archive.py), given a path or the file's
    bytes; never decompresses more than 1 MiB."""
    import io
    import json
    import zipfile
    source = io.BytesIO(path_or_data) if isinstance(path_or_data, bytes) else path_or_data
    try:
        with zipfile.ZipFile(source) as zf:
            info = zf.getinfo("manifest.json")
            if info.file_size > (1 << 20):
                return False
            with zf.open(info) as f:
                manifest = json.loads(f.read(1 << 20))
    except Exception:  # any unreadable file is simply not an executable
        return False
    return isinstance(manifest, dict) and manifest.get("format") == EXECUTABLE_FORMAT
