"""Pytree structures (``PyTreeDef``) as plain JSON.

Encoded node by node: ``"*"`` a leaf, ``null`` None, ``{"tuple": [...]}``,
``{"list": [...]}``, ``{"dict": [[key, child], ...]}`` (keys str or int),
``{"ordered_dict": [...]}``, ``{"defaultdict": FACTORY, "items": [...]}`` (FACTORY
one of a few builtin types) and ``{"namedtuple": NAME, "module": MOD, "fields": [...],
"children": [...]}``.  Any other node type (custom registered pytree nodes) cannot
be saved.

Reading never imports a module.  A namedtuple is rebuilt as the *live* class when a
module of that name is already imported and defines, at that qualified name, a
namedtuple with the same fields; otherwise as an equivalent namedtuple class made
from the recorded name and fields (cached, so repeated loads share the class).
"""
from __future__ import annotations

import collections
import sys
import threading
import types
from typing import Any

from jax import tree_util

from .errors import FormatError, SaveError

_DEFAULT_FACTORIES = {"list": list, "dict": dict, "set": set, "int": int, "float": float,
                      "tuple": tuple, "str": str, None: None}
_FACTORY_NAMES = {v: k for k, v in _DEFAULT_FACTORIES.items()}
_MAX_DEPTH = 500


class _Leaf:
    """Stands for a leaf while a structure is rebuilt (JAX treats it as a leaf)."""
    __slots__ = ()


_LEAF = _Leaf()


def _is_namedtuple_class(cls) -> bool:
    return isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields")


def _encode_key(key: Any, where: str):
    if type(key) is str or type(key) is int:
        return key
    raise SaveError(f"{where}: dict key {key!r} of type {type(key).__name__} cannot be saved "
                    f"(keys must be str or int)")


def encode_treedef(treedef, where: str = "pytree") -> Any:
    node_data = treedef.node_data()
    if node_data is None:
        return "*"
    node_type, aux = node_data
    children = [encode_treedef(c, where) for c in treedef.children()]
    if node_type is type(None):
        return None
    if node_type is tuple:
        return {"tuple": children}
    if node_type is list:
        return {"list": children}
    if node_type is dict:
        return {"dict": [[_encode_key(k, where), c] for k, c in zip(aux, children)]}
    if node_type is collections.OrderedDict:
        return {"ordered_dict": [[_encode_key(k, where), c] for k, c in zip(aux, children)]}
    if node_type is collections.defaultdict:
        factory, keys = aux
        if factory not in _FACTORY_NAMES:
            raise SaveError(f"{where}: defaultdict with default_factory {factory!r} cannot be "
                            f"saved (allowed: {', '.join(str(k) for k in _DEFAULT_FACTORIES)})")
        return {"defaultdict": _FACTORY_NAMES[factory],
                "items": [[_encode_key(k, where), c] for k, c in zip(keys, children)]}
    if _is_namedtuple_class(node_type):
        return {"namedtuple": node_type.__qualname__, "module": node_type.__module__,
                "fields": list(node_type._fields), "children": children}
    raise SaveError(f"{where}: pytree node type {node_type.__module__}.{node_type.__qualname__} "
                    f"cannot be saved; only tuples, lists, dicts, None and namedtuples can "
                    f"(flatten custom nodes before tracing)")


# ------------------------------------------------------------------ decoding
_namedtuple_cache: dict[tuple, type] = {}
_cache_lock = threading.Lock()


def _live_class(module: str, qualname: str):
    """The class already defined at ``module.qualname`` in this process, found by
    dictionary lookups only (no import, no attribute hooks run)."""
    mod = sys.modules.get(module)
    if not isinstance(mod, types.ModuleType):
        return None
    namespace: Any = mod.__dict__
    obj = None
    for part in qualname.split("."):
        obj = namespace.get(part) if isinstance(namespace, (dict, types.MappingProxyType)) else None
        if not isinstance(obj, type):
            return None
        namespace = obj.__dict__
    return obj


def namedtuple_class(module: str, qualname: str, fields: tuple[str, ...]) -> type:
    live = _live_class(module, qualname)
    if _is_namedtuple_class(live) and tuple(live._fields) == fields:
        return live
    key = (module, qualname, fields)
    with _cache_lock:
        cls = _namedtuple_cache.get(key)
        if cls is None:
            name = qualname.rsplit(".", 1)[-1]
            try:
                cls = collections.namedtuple(name, fields, module=module)
            except (ValueError, TypeError) as e:
                raise FormatError(f"namedtuple {qualname!r}: {e}") from None
            cls.__qualname__ = qualname
            _namedtuple_cache[key] = cls
        return cls


def _check_str(value, what: str) -> str:
    if type(value) is not str or not value or len(value) > 1000:
        raise FormatError(f"pytree: {what} must be a non-empty string")
    return value


def _example(node: Any, depth: int) -> Any:
    """A pytree with this structure whose leaves are placeholders."""
    if depth > _MAX_DEPTH:
        raise FormatError("pytree nested too deeply")
    if node == "*":
        return _LEAF
    if node is None:
        return None
    if not isinstance(node, dict) or not node:
        raise FormatError(f"pytree: malformed node {str(node)[:60]}")
    kind = next(iter(node))
    if kind in ("tuple", "list") and len(node) == 1 and isinstance(node[kind], list):
        kids = [_example(c, depth + 1) for c in node[kind]]
        return tuple(kids) if kind == "tuple" else kids
    if kind in ("dict", "ordered_dict") and len(node) == 1:
        items = _items(node[kind], depth)
        if kind == "dict":
            if any(type(k) is not str for k, _ in items) and any(type(k) is not int for k, _ in items):
                raise FormatError("pytree: dict keys must all be str or all be int")
            out = dict(items)
            if list(out) != sorted(out):
                raise FormatError("pytree: dict keys are not in sorted order")
            return out
        return collections.OrderedDict(items)
    if kind == "defaultdict" and set(node) == {"defaultdict", "items"}:
        if node["defaultdict"] not in _DEFAULT_FACTORIES:
            raise FormatError(f"pytree: unknown defaultdict factory {node['defaultdict']!r}")
        out = collections.defaultdict(_DEFAULT_FACTORIES[node["defaultdict"]])
        out.update(_items(node["items"], depth))
        return out
    if kind == "namedtuple" and set(node) == {"namedtuple", "module", "fields", "children"}:
        qualname = _check_str(node["namedtuple"], "namedtuple name")
        module = _check_str(node["module"], "namedtuple module")
        fields = node["fields"]
        children = node["children"]
        if not (isinstance(fields, list) and all(type(f) is str for f in fields)
                and isinstance(children, list) and len(children) == len(fields)):
            raise FormatError(f"pytree: malformed namedtuple {qualname!r}")
        cls = namedtuple_class(module, qualname, tuple(fields))
        return cls(*[_example(c, depth + 1) for c in children])
    raise FormatError(f"pytree: unknown node {kind[:40]!r}")


def _items(pairs, depth):
    if not isinstance(pairs, list):
        raise FormatError("pytree: dict items must be a list of [key, child] pairs")
    out = []
    seen = set()
    for pair in pairs:
        if not (isinstance(pair, list) and len(pair) == 2) or type(pair[0]) not in (str, int):
            raise FormatError("pytree: dict items must be [key, child] pairs with str or int keys")
        if pair[0] in seen:
            raise FormatError(f"pytree: duplicate dict key {pair[0]!r}")
        seen.add(pair[0])
        out.append((pair[0], _example(pair[1], depth + 1)))
    return out


def decode_treedef(node: Any):
    example = _example(node, 0)
    return tree_util.tree_structure(example)
