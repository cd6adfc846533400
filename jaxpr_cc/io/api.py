"""``save`` / ``load``: Programs to and from files (see docs/format.md)."""
from __future__ import annotations

import contextlib
import gc
import json
import os
import re

from ..storage.errors import FormatError, LoadError, SaveError
from . import format as container
from ..storage.atomic import write_bytes

_RELEASE = re.compile(r"(\d+)\.(\d+)\.(\d+)")


def _versions() -> dict:
    import jax
    import jaxlib

    from .. import __version__
    return {"jax_version": jax.__version__, "jaxlib_version": jaxlib.__version__,
            "jaxpr_cc_version": __version__}


def _release(version: str) -> tuple | None:
    m = _RELEASE.match(version) if isinstance(version, str) else None
    return tuple(int(x) for x in m.groups()) if m else None


def _check_versions(manifest: dict) -> None:
    import jax
    written = manifest.get("jax_version")
    if not isinstance(written, str) or _release(written) is None:
        raise FormatError(f"manifest.json: jax_version {str(written)[:40]!r} is not a version")
    if _release(written) != _release(jax.__version__):
        raise FormatError(f"written with JAX {written}, but this process has JAX "
                          f"{jax.__version__}; a saved program is read only by the JAX release "
                          f"that wrote it: re-trace the program with JAX {jax.__version__}")
    for key in ("jaxlib_version", "jaxpr_cc_version"):
        if not isinstance(manifest.get(key), str):
            raise FormatError(f"manifest.json: {key} must be a string")


@contextlib.contextmanager
def _gc_paused():
    """Reading or writing a program allocates a few objects per equation and frees
    none of them; the cyclic garbage collector would rescan the whole heap many
    times over for nothing (doubling the load time of a large program)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def dumps(program) -> bytes:
    """The saved-program file of ``program``, as bytes (deterministic).

    The file is read back (without the type checks) before it is returned, so a
    program the format cannot represent fails here, at save time, never later when
    the file is loaded."""
    from .encode import encode_program
    if not hasattr(program, "body") or not hasattr(program, "in_tree"):
        hint = ("; a compiled executable saves itself: executable.save(path)"
                if hasattr(program, "save") else "")
        raise SaveError(f"expected a jaxpr_cc.Program, got {type(program).__name__}{hint}")
    program = _with_every_pattern(program)
    with _gc_paused():
        program_json, arrays = encode_program(program)
        data = container.pack_archive(container.build_entries(program_json, arrays, _versions()))
        try:
            _decode(data, check_types=False, materialize=False)
        except (FormatError, LoadError) as e:
            raise SaveError(f"cannot save {program.name}: it would not read back: {e}") from None
        except Exception as e:  # reading back a just-written program must not fail at all
            raise SaveError(f"cannot save {program.name}: it would not read back "
                            f"({type(e).__name__}: {e})") from None
    return data


def _with_every_pattern(program):
    """``program`` with a body for every perturbation pattern of its symbolic-zeros
    rules: the file has no Python rule to trace one from later
    (``frontend.saved_patterns``)."""
    from ..frontend.saved_patterns import complete_patterns
    return complete_patterns(program)


def save(program, path) -> None:
    """Write ``program`` to ``path``: a regular file atomically, a device or FIFO in
    place, a symlink's target (see :mod:`jaxpr_cc.storage.atomic`).

    Raises ``SaveError`` (before anything is written) when the program holds
    something the format cannot represent, e.g. a Python callable in a parameter of
    a program that is not first-order."""
    data = dumps(program)
    path = os.fspath(path)
    try:
        write_bytes(path, data)
    except OSError as e:
        raise SaveError(f"{path}: cannot write: {e.strerror or e}") from None


def loads(data, *, name: str = "<bytes>", check_types: bool = True):
    """Read a program from the bytes of a saved-program file."""
    try:
        with _gc_paused():
            return _decode(data, check_types)
    except LoadError:
        raise
    except FormatError as e:
        raise LoadError(name, str(e)) from None
    except RecursionError:
        raise LoadError(name, "structure nested too deeply") from None
    except MemoryError:
        raise LoadError(name, "not enough memory to read the program") from None
    except Exception as e:  # the promise: only LoadError ever leaves load()
        raise LoadError(name, f"malformed program ({type(e).__name__}: {e})") from None


def load(path, *, check_types: bool = True, like=None, like_kwargs=None):
    """Read the program saved at ``path``.

    Returns exactly the program that was saved, or raises ``LoadError`` (a
    ``ValueError``) whose message names the file and the problem.  Nothing in the
    file is executed.  ``check_types=False`` skips JAX's type checks of the
    equations (the structural checks and checksums are always applied).

    Custom pytree nodes of the calling convention (equinox Modules, classes of
    ``register_pytree_node_class``) are saved as data and read back as
    :class:`jaxpr_cc.io.pytrees.SavedNode`; the program also accepts the original
    objects (same type name, keys, children and saved static data; a node whose
    static data is not plain data is refused: use ``like``).  ``like`` (a tuple or
    list of example positional arguments) and ``like_kwargs`` restore the caller's
    own structure: they must fit the saved arguments (same structure, static data
    and leaf types); the program then takes and returns the caller's types, a custom
    node of the result getting exactly the static data it was traced with (or
    ``LoadError`` when that cannot be rebuilt) and a namedtuple the example's class.
    """
    path = os.fspath(path)
    try:
        if os.path.isdir(path):
            raise LoadError(path, "is a directory, not a saved program")
        with open(path, "rb") as f:
            data = f.read()
    except LoadError:
        raise
    except FileNotFoundError:
        raise LoadError(path, "no such file") from None
    except OSError as e:
        raise LoadError(path, f"cannot read: {e.strerror or e}") from None
    from ..storage.executables import is_executable
    try:
        program = loads(data, name=path, check_types=check_types)
    except LoadError:
        if is_executable(data):
            raise LoadError(path, "is a compiled executable (jaxpr_cc.compile), not a saved "
                                  "program; load it with jaxpr_cc.backends.xla.load_executable"
                            ) from None
        raise
    if like is not None or like_kwargs is not None:
        program = restore_structure(program, like, like_kwargs, name=path)
    return program


def restore_structure(program, like=None, like_kwargs=None, *, name: str = "<program>"):
    """``program`` taking the structure of the example arguments ``like`` /
    ``like_kwargs`` (checked to fit its saved arguments) and returning, for each
    custom node or namedtuple of its result, the example's type of the same name
    and keys with the node's own saved static data (see ``pytrees.LiveIndex``;
    nodes of types absent from the example stay as loaded)."""
    from jax import tree_util

    from ..ir.calling_convention import check_argument_types, structure_mismatch
    from ..storage import pytrees
    if like is not None and not isinstance(like, (tuple, list)):
        raise LoadError(name, f"like must be a tuple of example positional arguments, got a "
                              f"{type(like).__name__} (for one argument write like=(x,))")
    if like_kwargs is not None and not isinstance(like_kwargs, dict):
        raise LoadError(name, f"like_kwargs must be a dict, got a {type(like_kwargs).__name__}")
    example = (tuple(like or ()), dict(like_kwargs or {}))
    leaves, live_in = tree_util.tree_flatten(example)
    if live_in != program.in_tree and not pytrees.same_saved_structure(
            live_in, program.in_tree, vouched=True):
        raise LoadError(name, f"like does not fit the saved arguments: "
                              f"{structure_mismatch(live_in, program.in_tree, vouched=True)} "
                              f"(the saved "
                              f"structure is {program.in_tree})")
    try:
        check_argument_types(program.name, leaves, [v.aval for v in program.arg_values], example,
                             what="saved program", accept_specs=True)
    except TypeError as e:
        raise LoadError(name, f"like does not fit the saved arguments: {e}") from None
    try:
        saved_out = pytrees.encode_treedef(program.out_tree, "out_tree", custom_nodes=True)
        out_tree = pytrees.restored_tree(saved_out, live_in)
    except (SaveError, FormatError) as e:
        raise LoadError(name, f"cannot restore the result structure from like: {e}") from None
    return program.replace(in_tree=live_in, out_tree=out_tree)


def _reject_constant(name: str):
    raise FormatError(f"{name} is not a JSON number (non-finite floats are written as bits)")


def _no_duplicates(pairs: list) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen = set()
        key = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise FormatError(f"field {key[:40]!r} appears twice in one object")
    return out


def strict_json(text: str, what: str):
    """JSON as the writer writes it: no NaN/Infinity tokens, no repeated fields."""
    try:
        return json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_no_duplicates)
    except FormatError as e:
        raise FormatError(f"{what}: {e}") from None
    except ValueError as e:
        raise FormatError(f"{what} is not valid JSON: {e}") from None


def _decode(data, check_types: bool, materialize: bool = True):
    from .decode import decode_program
    from .values import ArraySource
    container.check_not_newer(container.peek_format_version(data))
    entries = container.unpack_archive(data)
    manifest = container.parse_manifest(entries[0][1], _check_versions)
    container.verify_entries(manifest, entries)
    try:
        text = bytes(entries[1][1]).decode("ascii")
    except UnicodeDecodeError:
        raise FormatError("program.json is not ASCII text") from None
    doc = strict_json(text, "program.json")
    arrays = ArraySource(doc.get("arrays") if isinstance(doc, dict) else None,
                         [content for _, content in entries[2:]],
                         [name for name, _ in entries[2:]], materialize=materialize)
    program = decode_program(doc, arrays)
    if check_types:
        from .typecheck import check_program_types
        check_program_types(program)
    return program


def is_saved_program(path) -> bool:
    """Whether ``path`` looks like a saved program: its first archive entry is a
    stored manifest naming this format.  A cheap sniff (the manifest only, read with
    a size bound); ``load`` does the real checks."""
    import struct
    try:
        with open(path, "rb") as f:
            head = f.read(30 + len(container.MANIFEST))
            if len(head) < 30 or head[:4] != b"PK\x03\x04" or head[30:] != container.MANIFEST.encode():
                return False
            method, size, name_len, extra_len = (struct.unpack_from("<H", head, 8)[0],
                                                 struct.unpack_from("<I", head, 22)[0],
                                                 *struct.unpack_from("<HH", head, 26))
            extra = f.read(extra_len)
            if size == 0xFFFFFFFF and len(extra) >= 12:
                size = struct.unpack_from("<Q", extra, 4)[0]
            if method != 0 or size > _SNIFF_LIMIT:
                return False
            manifest = json.loads(f.read(size).decode("ascii"))
    except (OSError, ValueError, struct.error):
        return False
    return isinstance(manifest, dict) and manifest.get("format") == container.FORMAT_NAME


_SNIFF_LIMIT = 1 << 26
