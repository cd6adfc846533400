"""Pytree structures (``PyTreeDef``) as plain JSON.

Encoded node by node: ``"*"`` a leaf, ``null`` None, ``{"tuple": [...]}``,
``{"list": [...]}``, ``{"dict": [[key, child], ...]}`` (keys str or int),
``{"ordered_dict": [...]}``, ``{"defaultdict": FACTORY, "items": [...]}`` (FACTORY
one of a few builtin types) and ``{"namedtuple": NAME, "module": MOD, "fields": [...],
"children": [...]}``.  In the calling convention of a program (``in_tree``,
``out_tree``), a custom registered pytree node (an equinox Module, a class of
``register_pytree_node_class``) is saved as data: ``{"custom": QUALNAME, "module":
MOD, "keys": [KEY, ...], "children": [...]}``, KEY being the child's key-path entry
(``{"attr": NAME}``, ``{"key": K}``, ``{"index": I}``, ``{"flat": I}``).  Its
auxiliary data and its class are not saved (they may be arbitrary code); it reads
back as a :class:`SavedNode`.

Reading never imports a module.  A namedtuple is rebuilt as the *live* class when a
module of that name is already imported and defines, at that qualified name, a
namedtuple with the same fields; otherwise as an equivalent namedtuple class made
from the recorded name and fields (cached, so repeated loads share the class).
"""
from __future__ import annotations

import collections
import json
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
LEAF = _LEAF  # the placeholder leaf, for code that builds example structures


def is_custom_node_type(node_type) -> bool:
    """Whether pytree nodes of ``node_type`` are saved as custom-node data."""
    return not (node_type in (type(None), tuple, list, dict, collections.OrderedDict,
                              collections.defaultdict) or _is_namedtuple_class(node_type))


def _is_namedtuple_class(cls) -> bool:
    return isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields")


is_namedtuple_class = _is_namedtuple_class


def _encode_key(key: Any, where: str):
    if type(key) is str or type(key) is int:
        return key
    raise SaveError(f"{where}: dict key {key!r} of type {type(key).__name__} cannot be saved "
                    f"(keys must be str or int)")


def encode_treedef(treedef, where: str = "pytree", *, custom_nodes: bool = False) -> Any:
    """``treedef`` as JSON; ``custom_nodes`` allows custom nodes (saved as data)."""
    node_data = treedef.node_data()
    if node_data is None:
        return "*"
    node_type, aux = node_data
    children = [encode_treedef(c, where, custom_nodes=custom_nodes) for c in treedef.children()]
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
    if node_type is SavedNode:
        module, qualname, keys = aux
        return {"custom": qualname, "module": module, "keys": [dict([k]) for k in keys],
                "children": children}
    if custom_nodes:
        return {"custom": node_type.__qualname__, "module": node_type.__module__,
                "keys": [dict([k]) for k in custom_node_keys(treedef, where)],
                "children": children}
    raise SaveError(f"{where}: pytree node type {node_type.__module__}.{node_type.__qualname__} "
                    f"cannot be saved here; only tuples, lists, dicts, None and namedtuples can")


def custom_node_keys(treedef, where: str) -> tuple:
    """The key-path entry of each child of the custom node ``treedef``, as data:
    the node is rebuilt around placeholder leaves and flattened one level with keys."""
    node_type = treedef.node_data()[0]
    name = f"{node_type.__module__}.{node_type.__qualname__}"
    try:
        node = tree_util.tree_unflatten(treedef, [_LEAF] * treedef.num_leaves)
        pairs = tree_util.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)[0]
    except Exception as e:  # the node's own (un)flatten code failed on placeholders
        raise SaveError(f"{where}: cannot record the key paths of pytree node {name} "
                        f"({type(e).__name__}: {e})") from None
    if len(pairs) != len(treedef.children()):
        raise SaveError(f"{where}: pytree node {name} flattens to {len(pairs)} children with "
                        f"keys but {len(treedef.children())} without")
    return tuple(_key_data(path[0], name, where) for path, _ in pairs)


def _key_data(key, name: str, where: str) -> tuple:
    if isinstance(key, tree_util.GetAttrKey):
        return ("attr", key.name)
    if isinstance(key, tree_util.SequenceKey):
        return ("index", key.idx)
    if isinstance(key, tree_util.FlattenedIndexKey):
        return ("flat", key.key)
    if isinstance(key, tree_util.DictKey) and type(key.key) in (str, int):
        return ("key", key.key)
    raise SaveError(f"{where}: pytree node {name} names a child with key {key!r}, which cannot "
                    f"be saved (keys must be attribute names, str/int dict keys or indices)")


# key kind -> (allowed payload types, JAX key class)
_KEY_KINDS = {"attr": ((str,), tree_util.GetAttrKey), "key": ((str, int), tree_util.DictKey),
              "index": ((int,), tree_util.SequenceKey),
              "flat": ((int,), tree_util.FlattenedIndexKey)}


class SavedNode:
    """A custom pytree node of a loaded program's calling convention, held as data.

    ``type_name`` is the original node type (``module.qualname``), ``keys`` the
    key-path entry of each child (``("attr", "weight")``, ``("key", "w")``,
    ``("index", 0)``, ``("flat", 0)``) and ``children`` the children in the
    original order.  It flattens to the same leaves, in the same order and with the
    same key paths (``jax.tree_util.tree_flatten_with_path``) as the original node.
    Children are also reachable as ``node.NAME`` (attribute keys) and ``node[K]``
    (dict keys and indices).
    """
    __slots__ = ("module", "qualname", "keys", "children")

    def __init__(self, module: str, qualname: str, keys: tuple, children):
        self.module, self.qualname = module, qualname
        self.keys = tuple(keys)
        self.children = tuple(children)

    @property
    def type_name(self) -> str:
        return f"{self.module}.{self.qualname}"

    def __getattr__(self, name: str):
        if name in SavedNode.__slots__:  # not yet set
            raise AttributeError(name)
        for (kind, value), child in zip(self.keys, self.children):
            if kind == "attr" and value == name:
                return child
        raise AttributeError(f"SavedNode {self.type_name} has no child named {name!r}")

    def __getitem__(self, item):
        for (kind, value), child in zip(self.keys, self.children):
            if kind != "attr" and value == item:
                return child
        raise KeyError(item)

    def __repr__(self) -> str:
        inner = ", ".join(f"{_key_text(k)}={c!r}" for k, c in zip(self.keys, self.children))
        return f"SavedNode({self.type_name}: {inner})"


def _key_text(key: tuple) -> str:
    kind, value = key
    return {"attr": f".{value}", "key": f"[{value!r}]", "index": f"[{value}]",
            "flat": f"<{value}>"}[kind]


def _saved_flatten_with_keys(node: SavedNode):
    keys = [_KEY_KINDS[kind][1](value) for kind, value in node.keys]
    return list(zip(keys, node.children)), (node.module, node.qualname, node.keys)


def _saved_flatten(node: SavedNode):
    return node.children, (node.module, node.qualname, node.keys)


def _saved_unflatten(aux, children) -> SavedNode:
    return SavedNode(aux[0], aux[1], aux[2], children)


tree_util.register_pytree_with_keys(SavedNode, _saved_flatten_with_keys, _saved_unflatten,
                                    flatten_func=_saved_flatten)


def same_saved_structure(given, expected) -> bool:
    """Whether the caller's structure ``given`` fits ``expected``, a structure read
    from a file: equal, except that where ``expected`` holds a :class:`SavedNode`,
    ``given`` may hold the original node (same type name and keys, children that fit)
    and where it holds a namedtuple, a namedtuple class of the same name and fields."""
    try:
        return _fits(given, expected)
    except SaveError:  # the caller's node cannot be described as data: it does not fit
        return False


def _fits(given, expected) -> bool:
    g_data, e_data = given.node_data(), expected.node_data()
    if e_data is None or g_data is None:
        return g_data is None and e_data is None
    (g_type, g_aux), (e_type, e_aux) = g_data, e_data
    g_kids, e_kids = given.children(), expected.children()
    if len(g_kids) != len(e_kids):
        return False
    if e_type is SavedNode and g_type is not SavedNode:
        if (f"{g_type.__module__}.{g_type.__qualname__}" != f"{e_aux[0]}.{e_aux[1]}"
                or custom_node_keys(given, "arguments") != e_aux[2]):
            return False
    elif _is_namedtuple_class(e_type):
        if not (_is_namedtuple_class(g_type) and g_type.__qualname__ == e_type.__qualname__
                and g_type.__module__ == e_type.__module__ and g_type._fields == e_type._fields):
            return False
    elif g_type is not e_type or g_aux != e_aux:
        return False
    return all(g == e or _fits(g, e) for g, e in zip(g_kids, e_kids))


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


def canonical_json(node: Any) -> str:
    return json.dumps(node, sort_keys=True, separators=(",", ":"))


def _example(node: Any, depth: int, custom: bool | dict = False) -> Any:
    """A pytree with this structure whose leaves are placeholders.  ``custom``:
    whether custom nodes are allowed; a dict maps the canonical JSON of a custom
    node or namedtuple to a live pytree that stands for it."""
    if depth > _MAX_DEPTH:
        raise FormatError("pytree nested too deeply")
    if node == "*":
        return _LEAF
    if node is None:
        return None
    if not isinstance(node, dict) or not node:
        raise FormatError(f"pytree: malformed node {str(node)[:60]}")
    kind = next(iter(node))
    if isinstance(custom, dict) and kind in ("custom", "namedtuple"):
        live = custom.get(canonical_json(node))
        if live is not None:
            return live
    if kind in ("tuple", "list") and len(node) == 1 and isinstance(node[kind], list):
        kids = [_example(c, depth + 1, custom) for c in node[kind]]
        return tuple(kids) if kind == "tuple" else kids
    if kind in ("dict", "ordered_dict") and len(node) == 1:
        items = _items(node[kind], depth, custom)
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
        out.update(_items(node["items"], depth, custom))
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
        return cls(*[_example(c, depth + 1, custom) for c in children])
    if kind == "custom" and set(node) == {"custom", "module", "keys", "children"} and custom:
        qualname = _check_str(node["custom"], "custom node name")
        module = _check_str(node["module"], "custom node module")
        keys, children = node["keys"], node["children"]
        if not (isinstance(keys, list) and isinstance(children, list)
                and len(keys) == len(children)):
            raise FormatError(f"pytree: malformed custom node {qualname!r}")
        decoded = tuple(_decode_key(k, qualname) for k in keys)
        if len(set(decoded)) != len(decoded):
            raise FormatError(f"pytree: custom node {qualname!r} names a child twice")
        return SavedNode(module, qualname, decoded,
                         [_example(c, depth + 1, custom) for c in children])
    raise FormatError(f"pytree: unknown node {kind[:40]!r}")


def _decode_key(key, qualname: str) -> tuple:
    if isinstance(key, dict) and len(key) == 1:
        (kind, value), = key.items()
        if kind in _KEY_KINDS and type(value) in _KEY_KINDS[kind][0]:
            if kind in ("index", "flat") and value < 0:
                raise FormatError(f"pytree: custom node {qualname!r} has a negative key index")
            return (kind, value)
    raise FormatError(f"pytree: custom node {qualname!r} has a malformed key {str(key)[:60]}")


def _items(pairs, depth, custom=False):
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
        out.append((pair[0], _example(pair[1], depth + 1, custom)))
    return out


def decode_treedef(node: Any, *, custom_nodes: bool = False):
    """The ``PyTreeDef`` of a JSON pytree; ``custom_nodes`` allows custom nodes
    (read back as :class:`SavedNode`)."""
    example = _example(node, 0, custom_nodes)
    return tree_util.tree_structure(example)


def example_tree(node: Any, live: dict | None = None):
    """A pytree of the JSON structure ``node`` with placeholder leaves, where each
    custom node or namedtuple whose canonical JSON is a key of ``live`` is that live
    subtree instead."""
    return _example(node, 0, live if live else True)
