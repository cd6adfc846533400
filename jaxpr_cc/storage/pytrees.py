"""Pytree structures (``PyTreeDef``) as plain JSON.

Encoded node by node: ``"*"`` a leaf, ``null`` None, ``{"tuple": [...]}``,
``{"list": [...]}``, ``{"dict": [[key, child], ...]}`` (keys str or int),
``{"ordered_dict": [...]}``, ``{"defaultdict": FACTORY, "items": [...]}`` (FACTORY
one of a few builtin types) and ``{"namedtuple": NAME, "module": MOD, "fields": [...],
"children": [...]}``.  In the calling convention of a program (``in_tree``,
``out_tree``), a custom registered pytree node (an equinox Module, a class of
``register_pytree_node_class``) is saved as data: ``{"custom": QUALNAME, "module":
MOD, "keys": [KEY, ...], "children": [...]}``, KEY being the child's key-path entry
(``{"attr": NAME}``, ``{"key": K}``, ``{"index": I}``, ``{"flat": I}``), and
``"static"``: its auxiliary data (equinox static fields, ``tree_flatten``'s aux) as
tagged data when it is made of Python scalars, strings, None, tuples, lists and
dicts (:func:`encode_static`), else ``{"opaque": TYPE}``.  Its class is not saved
(it is code); it reads back as a :class:`SavedNode`.

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
        module, qualname, keys, static = aux
        out = {"custom": qualname, "module": module, "keys": [dict([k]) for k in keys],
               "children": children}
        if static is not None:
            out["static"] = json.loads(static)
        return out
    if custom_nodes:
        return {"custom": node_type.__qualname__, "module": node_type.__module__,
                "keys": [dict([k]) for k in custom_node_keys(treedef, where)],
                "children": children, "static": encode_static(aux)}
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


# ------------------------------------------------------------ static data
# The auxiliary data of a custom node is what jax.jit compares (==) to decide
# whether a call can reuse a trace: an equinox static field, a register_dataclass
# meta field, tree_flatten's aux.  It is saved as tagged JSON when it is plain data,
# so a loaded program can refuse a call whose static data differs (the program
# computes what the traced static data chose), and a result node can get exactly
# the static data it was traced with.
_MAX_STATIC_DEPTH = 100


class _NotData(Exception):
    """The auxiliary data holds something that is not plain data (its type name)."""


def encode_static(aux: Any) -> Any:
    """``aux`` as tagged JSON: None, bools, ints and strings as themselves;
    ``{"float": REPR}``, ``{"complex": [RE, IM]}``, ``{"tuple": [...]}``,
    ``{"list": [...]}``, ``{"dict": [[KEY, VALUE], ...]}`` (str or int keys, sorted:
    dicts compare without order) and ``{"object": "module.qualname"}`` for a
    stateless instance (no fields, identity equality: a sentinel such as equinox's
    ``MISSING``).  Anything else makes the whole ``{"opaque": TYPE}``."""
    try:
        return _static_data(aux, 0)
    except _NotData as e:
        return {"opaque": str(e)[:200]}


def _type_name(cls) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _static_data(value: Any, depth: int) -> Any:
    if depth > _MAX_STATIC_DEPTH:
        raise _NotData("data nested too deeply")
    cls = type(value)
    if value is None or cls in (bool, int, str):
        return value
    if cls is float:
        return {"float": repr(value)}
    if cls is complex:
        return {"complex": [repr(value.real), repr(value.imag)]}
    if cls in (tuple, list):
        return {cls.__name__: [_static_data(v, depth + 1) for v in value]}
    if cls is dict:
        keys = list(value)
        if not (all(type(k) is str for k in keys) or all(type(k) is int for k in keys)):
            raise _NotData("dict with keys other than all str or all int")
        return {"dict": [[k, _static_data(value[k], depth + 1)] for k in sorted(keys)]}
    if _is_stateless(value):
        return {"object": _type_name(cls)}
    raise _NotData(_type_name(cls))


def _is_stateless(value: Any) -> bool:
    cls = type(value)
    try:  # arbitrary user objects: any failure to inspect one means "not data"
        if isinstance(value, type) or callable(value) or cls.__module__ == "builtins":
            return False
        if cls.__eq__ is not object.__eq__ or getattr(value, "__dict__", None) != {}:
            return False
        slots = [c.__dict__.get("__slots__", ()) for c in cls.__mro__]
        return not any(hasattr(value, slot) for group in slots
                       for slot in ((group,) if isinstance(group, str) else group))
    except Exception:
        return False


def static_text(static_json: Any) -> str:
    """The canonical text of saved static data (what is compared)."""
    return canonical_json(static_json)


def static_of(aux: Any) -> str:
    """The canonical text of the static data of a live node's auxiliary data."""
    return canonical_json(encode_static(aux))


def is_opaque_static(text: str | None) -> bool:
    return text is not None and text.startswith('{"opaque":')


def describe_static(text: str | None) -> str:
    """Saved static data, as Python would print it (for messages)."""
    if text is None:
        return "(not recorded)"
    try:
        return repr(_decode_static(json.loads(text), None, 0))[:120]
    except _NotData as e:
        return f"<{e}>"


def _check_static(value: Any, depth: int) -> None:
    """Raise FormatError unless ``value`` is well-formed tagged static data."""
    if depth > _MAX_STATIC_DEPTH:
        raise FormatError("pytree: static data nested too deeply")
    if value is None or type(value) in (bool, int, str):
        return
    if isinstance(value, dict) and len(value) == 1:
        (tag, body), = value.items()
        if tag in ("float", "opaque", "object") and type(body) is str:
            if tag == "float":
                _parse_float(body)
            return
        if tag == "complex" and isinstance(body, list) and len(body) == 2 \
                and all(type(b) is str for b in body):
            for b in body:
                _parse_float(b)
            return
        if tag in ("tuple", "list") and isinstance(body, list):
            for v in body:
                _check_static(v, depth + 1)
            return
        if tag == "dict" and isinstance(body, list) and all(
                isinstance(p, list) and len(p) == 2 and type(p[0]) in (str, int) for p in body):
            for _, v in body:
                _check_static(v, depth + 1)
            return
    raise FormatError(f"pytree: malformed static data {str(value)[:60]}")


def _parse_float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise FormatError(f"pytree: static float {text[:40]!r} is not a number") from None


def _decode_static(value: Any, objects: dict | None, depth: int) -> Any:
    """The Python value of checked static data; ``{"object": NAME}`` becomes the
    instance ``objects[NAME]`` (``objects`` None: a stand-in naming it)."""
    if value is None or type(value) in (bool, int, str):
        return value
    (tag, body), = value.items()
    if tag == "float":
        return float(body)
    if tag == "complex":
        return complex(float(body[0]), float(body[1]))
    if tag in ("tuple", "list"):
        items = [_decode_static(v, objects, depth + 1) for v in body]
        return tuple(items) if tag == "tuple" else items
    if tag == "dict":
        return {k: _decode_static(v, objects, depth + 1) for k, v in body}
    if tag == "object":
        if objects is None:
            return _ObjectName(body)
        if body not in objects:
            raise _NotData(f"an instance of {body}")
        return objects[body]
    raise _NotData(body)


class _ObjectName:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"<{self.name}>"

    # (Stateless objects are saved by type name; the same name is the same data.)
    def __eq__(self, other):
        return type(other) is _ObjectName and other.name == self.name

    def __hash__(self):
        return hash(self.name)


def stateless_objects(aux: Any, found: dict, depth: int = 0) -> None:
    """Collect into ``found`` (type name -> instance) the stateless objects in ``aux``."""
    if depth > _MAX_STATIC_DEPTH:
        return
    if type(aux) in (tuple, list):
        for v in aux:
            stateless_objects(v, found, depth + 1)
    elif type(aux) is dict:
        for v in aux.values():
            stateless_objects(v, found, depth + 1)
    elif aux is not None and type(aux) not in (bool, int, float, complex, str) \
            and _is_stateless(aux):
        found.setdefault(_type_name(type(aux)), aux)


def rebuild_static(text: str, objects: dict) -> Any:
    """The auxiliary data saved as ``text``, rebuilt exactly (checked by encoding it
    again), taking stateless objects from ``objects``; raises ``_NotData`` when that
    is impossible."""
    if text is None or is_opaque_static(text):
        raise _NotData("not saved as data" if text is None else json.loads(text)["opaque"])
    value = _decode_static(json.loads(text), objects, 0)
    if static_of(value) != text:
        raise _NotData("does not read back as saved")
    return value


NotStaticData = _NotData


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
    (dict keys and indices).  ``static`` is the canonical text of the node's saved
    static data (see :func:`encode_static`; None in files written before it was
    saved).
    """
    __slots__ = ("module", "qualname", "keys", "children", "static")

    def __init__(self, module: str, qualname: str, keys: tuple, children,
                 static: str | None = None):
        self.module, self.qualname = module, qualname
        self.keys = tuple(keys)
        self.children = tuple(children)
        self.static = static

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
    return list(zip(keys, node.children)), _saved_aux(node)


def _saved_aux(node: SavedNode) -> tuple:
    return (node.module, node.qualname, node.keys, node.static)


def _saved_flatten(node: SavedNode):
    return node.children, _saved_aux(node)


def _saved_unflatten(aux, children) -> SavedNode:
    return SavedNode(aux[0], aux[1], aux[2], children, aux[3])


tree_util.register_pytree_with_keys(SavedNode, _saved_flatten_with_keys, _saved_unflatten,
                                    flatten_func=_saved_flatten)


def same_saved_structure(given, expected, *, vouched: bool = False) -> bool:
    """Whether the caller's structure ``given`` fits ``expected``, a structure read
    from a file: equal, except that where ``expected`` holds a :class:`SavedNode`,
    ``given`` may hold the original node (same type name, keys and saved static data,
    children that fit) and where it holds a namedtuple class rebuilt from a file, a
    namedtuple class of the same name and fields.  (A namedtuple class no file named
    is compared as itself, as jax.jit does.)
    ``vouched``: ``given`` is a ``like=`` example, which vouches for static data
    that was not saved as data."""
    try:
        return _fits(given, expected, vouched)
    except SaveError:  # the caller's node cannot be described as data: it does not fit
        return False


def _fits(given, expected, vouched: bool = False) -> bool:
    g_data, e_data = given.node_data(), expected.node_data()
    if e_data is None or g_data is None:
        return g_data is None and e_data is None
    (g_type, g_aux), (e_type, e_aux) = g_data, e_data
    g_kids, e_kids = given.children(), expected.children()
    if len(g_kids) != len(e_kids):
        return False
    if e_type is SavedNode and g_type is not SavedNode:
        if saved_node_difference(given, e_aux, vouched) is not None:
            return False
    elif _is_namedtuple_class(e_type) and e_type is not g_type:
        if not (_is_rebuilt_namedtuple(e_type) and _is_namedtuple_class(g_type)
                and g_type.__qualname__ == e_type.__qualname__
                and g_type.__module__ == e_type.__module__ and g_type._fields == e_type._fields):
            return False
    elif g_type is not e_type or g_aux != e_aux:
        return False
    return all(g == e or _fits(g, e, vouched) for g, e in zip(g_kids, e_kids))


def saved_node_difference(given, saved_aux, vouched: bool = False) -> str | None:
    """How the live node ``given`` differs from the saved custom node with
    auxiliary data ``saved_aux`` (a phrase), or None when it fits (children aside)."""
    module, qualname, keys, static = saved_aux
    g_type, g_aux = given.node_data()
    if (g_type.__module__, g_type.__qualname__) != (module, qualname):
        return f"is a {_type_name(g_type)} where the saved program takes a {module}.{qualname}"
    try:
        g_keys = custom_node_keys(given, "arguments")
    except SaveError as e:
        return f"is a {module}.{qualname} whose children cannot be named ({e})"
    if g_keys != keys:
        return (f"has children {[_key_text(k) for k in g_keys]} where the saved "
                f"{module}.{qualname} has {[_key_text(k) for k in keys]}")
    if static is None:  # a file written before static data was saved
        return None
    if is_opaque_static(static):
        if vouched:
            return None
        return (f"is a {module}.{qualname} whose static data (a {json.loads(static)['opaque']}) "
                f"was not saved as data, so the loaded program cannot check it: load the "
                f"program with like=(example arguments) to vouch for it")
    given_static = static_of(g_aux)
    if given_static != static and not _equal_static(g_aux, static):
        return (f"is a {module}.{qualname} with static data {describe_static(given_static)} "
                f"where the program was traced with {describe_static(static)} (jax.jit would "
                f"trace again): pass a node with the traced static data, or trace the "
                f"function again")
    return None


def _equal_static(aux: Any, saved: str) -> bool:
    """Whether a live node's static data equals saved static data as Python compares
    them (``1 == 1.0 == True == np.int64(1)``): jax.jit compares a node's static data
    with ``==``, and so does a live program's calling convention."""
    try:
        return bool(_comparable(aux, 0) == _decode_static(json.loads(saved), None, 0))
    except (_NotData, ValueError, TypeError):
        return False


def _comparable(value: Any, depth: int) -> Any:
    """Live static data as ``_decode_static`` gives saved data back: containers
    rebuilt, a stateless object by its type's name, anything else itself."""
    if depth > _MAX_STATIC_DEPTH:
        raise _NotData("data nested too deeply")
    cls = type(value)
    if cls in (tuple, list):
        return cls(_comparable(v, depth + 1) for v in value)
    if cls is dict:
        return {k: _comparable(v, depth + 1) for k, v in value.items()}
    if value is not None and cls not in (bool, int, float, complex, str) and _is_stateless(value):
        return _ObjectName(_type_name(cls))
    return value


def _is_rebuilt_namedtuple(cls) -> bool:
    return cls in _rebuilt_classes


# ------------------------------------------------------------------ decoding
_namedtuple_cache: dict[tuple, type] = {}
_cache_lock = threading.Lock()
# The namedtuple classes a file named (made, or found live, when reading it): a
# loaded program compares them by module, name and fields; others by identity.
_rebuilt_classes: set = set()


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
        _rebuilt_classes.add(live)  # a loaded program compares it by name
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
            _rebuilt_classes.add(cls)
        return cls


def _check_str(value, what: str) -> str:
    if type(value) is not str or not value or len(value) > 1000:
        raise FormatError(f"pytree: {what} must be a non-empty string")
    return value


def canonical_json(node: Any) -> str:
    return json.dumps(node, sort_keys=True, separators=(",", ":"))


def _example(node: Any, depth: int, custom: "bool | LiveIndex" = False) -> Any:
    """A pytree with this structure whose leaves are placeholders.  ``custom``:
    whether custom nodes are allowed; a :class:`LiveIndex` rebuilds custom nodes and
    namedtuples as the live types of an example structure."""
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
        cls = custom.namedtuple(module, qualname, tuple(fields)) \
            if isinstance(custom, LiveIndex) else None
        cls = cls or namedtuple_class(module, qualname, tuple(fields))
        return cls(*[_example(c, depth + 1, custom) for c in children])
    if kind == "custom" and set(node) - {"static"} == {"custom", "module", "keys", "children"} \
            and custom:
        qualname = _check_str(node["custom"], "custom node name")
        module = _check_str(node["module"], "custom node module")
        keys, children = node["keys"], node["children"]
        if not (isinstance(keys, list) and isinstance(children, list)
                and len(keys) == len(children)):
            raise FormatError(f"pytree: malformed custom node {qualname!r}")
        decoded = tuple(_decode_key(k, qualname) for k in keys)
        if len(set(decoded)) != len(decoded):
            raise FormatError(f"pytree: custom node {qualname!r} names a child twice")
        static = None
        if "static" in node:
            _check_static(node["static"], 0)
            static = static_text(node["static"])
        kids = [_example(c, depth + 1, custom) for c in children]
        if isinstance(custom, LiveIndex):
            live = custom.custom_node(module, qualname, decoded, static, kids)
            if live is not None:
                return live
        return SavedNode(module, qualname, decoded, kids, static)
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


class LiveIndex:
    """The live node types of an example structure (``load(like=...)``), to rebuild
    the custom nodes and namedtuples of a saved result as the caller's types."""

    def __init__(self, treedef):
        self.nodes: dict = {}       # (module, qualname, keys) -> [(type, aux), ...]
        self.namedtuples: dict = {}  # (module, qualname, fields) -> class
        self.objects: dict = {}      # type name -> stateless instance
        self._collect(treedef)

    def _collect(self, treedef) -> None:
        node_data = treedef.node_data()
        if node_data is None:
            return
        node_type, aux = node_data
        if _is_namedtuple_class(node_type):
            self.namedtuples.setdefault(
                (node_type.__module__, node_type.__qualname__, tuple(node_type._fields)),
                node_type)
        elif is_custom_node_type(node_type) and node_type is not SavedNode:
            key = (node_type.__module__, node_type.__qualname__,
                   custom_node_keys(treedef, "like"))
            self.nodes.setdefault(key, []).append((node_type, aux))
            stateless_objects(aux, self.objects)
        for child in treedef.children():
            self._collect(child)

    def namedtuple(self, module: str, qualname: str, fields: tuple):
        return self.namedtuples.get((module, qualname, fields))

    def custom_node(self, module, qualname, keys, static, children):
        """The saved result node as the caller's type with exactly its saved static
        data; None when the example has no node of that type and keys (it stays a
        SavedNode).  Raises FormatError when the static data cannot be rebuilt."""
        candidates = self.nodes.get((module, qualname, keys))
        if not candidates:
            return None
        node_type = candidates[0][0]
        # Equal saved text means equal static data only when it is data: opaque
        # data of one type all reads the same, so a like node would be a guess.
        aux = next((a for _, a in candidates if static is not None
                    and not is_opaque_static(static) and static_of(a) == static), None)
        if aux is None:
            try:
                aux = rebuild_static(static, self.objects)
            except _NotData as e:
                if is_opaque_static(static):
                    raise FormatError(
                        f"a result {module}.{qualname} was traced with static data that was "
                        f"not saved as data (a {json.loads(static)['opaque']}), so no node of "
                        f"like can be checked to hold it; load without like= (the result is "
                        f"a SavedNode)") from None
                raise FormatError(
                    f"a result {module}.{qualname} was traced with static data "
                    f"{describe_static(static)}, which no node of like has and which cannot "
                    f"be rebuilt as data ({e}); load without like= (the result is a SavedNode) "
                    f"or give like a node with that static data") from None
        flat = [tree_util.tree_flatten(c) for c in children]
        treedef = tree_util.PyTreeDef.from_node_data_and_children(
            tree_util.default_registry, (node_type, aux), [t for _, t in flat])
        return tree_util.tree_unflatten(treedef, [x for leaves, _ in flat for x in leaves])


def restored_tree(node: Any, like_treedef):
    """The structure of the saved JSON structure ``node`` with its custom nodes and
    namedtuples rebuilt as the types of ``like_treedef`` (see :class:`LiveIndex`)."""
    return tree_util.tree_structure(_example(node, 0, LiveIndex(like_treedef)))
