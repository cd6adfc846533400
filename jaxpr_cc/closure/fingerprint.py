"""What a Python rule can see: a hashable fingerprint of a function's reachable state.

A custom function's rules are traced once and reused for later calls only when
tracing them again would give the same jaxpr with the same closed-over values.
Python gives no such guarantee by function identity: a rule reads closure cells,
defaults, globals, bound ``self`` and partial arguments, and any of them can be
rebound between two calls (an Euler step whose vector field reads a time that
changes every step; a ``custom_jvp`` defined once and called again after the
variable it closes over was rebound).

``fingerprint(obj)`` walks everything a function can read:

* a function: its code, closure cells, defaults, attributes, the globals its code
  (and nested code) names, and the program's own modules it imports; each of
  those is walked in turn;
* a module: its attributes that any code met in the walk names, as an attribute or
  a string constant (``config.dt``, ``pkg.settings.dt``, ``physics.force``,
  ``getattr(config, "dt")``), and a program module's PEP 562 ``__getattr__``,
  walked in turn; modules are walked last, with every
  name the walk met, and again while that walk meets new names or modules;
* a class: every attribute of every class in its MRO and its metaclass's (data,
  functions, ``staticmethod``/``classmethod``/``property`` targets), walked in turn;
* ``functools.partial`` parts and attributes, bound methods' function and
  ``self`` (C methods' too: ``cfg.get``), what a ``MappingProxyType``, a dict
  view or a weak reference shows, and plain objects' ``__dict__``, ``__slots__``
  and class (a program's own object with ``__jax_array__`` too);
* built-in containers by content, mutable ones included (``list``, ``dict``,
  ``set``, ``deque``, ``bytearray``, ``array.array``, a ``memoryview``'s current
  bytes), with a subclass instance's attributes and class and a ``defaultdict``'s
  factory: a rule reading ``BUF[0]`` must see an in-place write between calls.

Functions, classes and modules of installed libraries and the standard library are
identified by identity and not walked into: their state is not the program's, and
walking JAX's internals would make the walk too large to be worth it.  What a
library function holds of the program is walked: the function a wrapper wraps
(``jax.named_call``) and a closure's cells (``jax.custom_gradient``'s primal,
equinox's ``filter_custom_jvp``/``filter_custom_vjp`` wrappers hold the user's
functions there); one holding only library callables is found once.  Arrays,
tracers and other opaque objects are identified by ``id`` (the caller keeps them
alive so ids are not reused); Python and numpy scalars by type and bits (so ``-0.0``
differs from ``0.0``, and NaN equals itself); numpy arrays by content, since they
are mutable and are captured by value when traced.  When the walk is too large to
be worth it, the answer is ``None``: the caller then never reuses.
"""
from __future__ import annotations

import array
import builtins
import collections
import contextvars
import dis
import functools
import hashlib
import os
import site
import struct
import sys
import sysconfig
import types
import weakref
from typing import Any

import numpy as np

_SCALARS = (bool, int, float, complex, str, bytes, type(None), type(Ellipsis))
# Scalars whose value is their fingerprint (floats go by bits: ``_scalar``).
_EXACT_SCALARS = frozenset({bool, int, str, bytes, type(None), type(Ellipsis)})
MAX_NODES = 4000


class _TooBig(Exception):
    pass


#: Object arrays up to this many elements are walked element by element.
_MAX_OBJECT_ARRAY = 256

#: What a ``ContextVar`` without a value (and without a default) holds.
_UNSET = ("unset",)


class Fingerprinter:
    """One walk.  ``keepalive`` receives every object identified by ``id``.
    ``names``: every name the code met so far mentions; ``modules``: the modules met
    so far, whose attributes ``modules_part`` walks."""

    def __init__(self, keepalive: list, max_nodes: int = MAX_NODES):
        self.keepalive = keepalive
        self.budget = max_nodes
        self.names: set = set()
        self.modules: dict[int, types.ModuleType] = {}
        self.active: set = set()
        self.done: dict = {}

    def modules_part(self) -> tuple:
        """The named attributes of every module met, walked until no new module or
        name turns up (walking an attribute can reach more code and modules)."""
        while True:
            names, modules = frozenset(self.names), list(self.modules.values())
            out = tuple((m.__name__, tuple((a, self(attrs[a])) for a in sorted(names)
                                           if a in (attrs := vars(m))))
                        for m in modules)
            if len(self.modules) == len(modules) and len(self.names) == len(names):
                return out

    def __call__(self, obj) -> Any:
        self.budget -= 1
        if self.budget < 0:
            raise _TooBig
        if type(obj) in _EXACT_SCALARS:  # (the common case, without isinstance)
            return (type(obj), obj)
        if type(obj) in _SCALARS:
            return _scalar(obj)
        if isinstance(obj, _SCALARS):  # a subclass's instance: its value and attributes
            self.keepalive.append(obj)
            base = next(t for t in _SCALARS if isinstance(obj, t))
            return ("scalar", _scalar(base(obj)), self(type(obj)),
                    self(getattr(obj, "__dict__", None)))
        key = id(obj)
        if key in self.done:
            return self.done[key]
        stable = _LIBRARY_CALLABLES.get(key)
        if stable is not None and stable[0] is obj:
            return stable[1]
        if key in self.active:  # a cycle: the object's identity stands for it
            self.keepalive.append(obj)
            return ("cycle", key)
        self.active.add(key)
        try:
            out = self._walk(obj)
        finally:
            self.active.discard(key)
        self.done[key] = out
        return out

    def _opaque(self, obj) -> tuple:
        self.keepalive.append(obj)
        return ("id", type(obj), id(obj))

    def _walk(self, obj) -> Any:
        # The kinds most walks are made of, by exact type (the order of the tests
        # below only matters for subclasses and instance-dependent kinds).
        fast = _FAST_WALKS.get(type(obj))
        if fast is not None:
            return fast(self, obj)
        if isinstance(obj, np.ndarray):
            if obj.dtype.hasobject and obj.size <= _MAX_OBJECT_ARRAY:
                # Its bytes are pointers: the objects, by content (a large one --
                # a column of strings -- by its pointers, as its elements' identities).
                content = ("objects", tuple(self(x) for x in obj.ravel().tolist()))
            else:
                content = hashlib.blake2b(obj.tobytes(), digest_size=16).digest()
            # (A subclass's instance holds attributes too: ``A.scale``.)
            extra = () if type(obj) is np.ndarray else (self(type(obj)),
                                                         self(getattr(obj, "__dict__", None)))
            return ("np", obj.shape, obj.dtype.str, content, extra)
        if isinstance(obj, np.generic):
            return ("np", obj.dtype.str, obj.tobytes())
        if isinstance(obj, types.ModuleType):
            return self._module(obj)
        if isinstance(obj, type):
            return self._class(obj)
        if isinstance(obj, _BUILTIN_CONTAINERS):
            # Mutable built-in containers are compared by content (a rule reading
            # ``BUF[0]`` sees an in-place write), and a subclass's own attributes,
            # class and (``defaultdict``) default factory too.
            return (self._container_type(obj), self._container(obj), self._extra_state(obj))
        if isinstance(obj, memoryview):
            # A view reads its buffer's current bytes (a bytearray's, an array's).
            return ("memoryview", obj.format, obj.shape, obj.readonly, obj.tobytes())
        if isinstance(obj, types.FunctionType):
            return self._function(obj)
        if isinstance(obj, types.MethodType):
            return ("method", self(obj.__func__), self(obj.__self__))
        if isinstance(obj, _BOUND_BUILTINS) and not isinstance(
                getattr(obj, "__self__", None), (types.ModuleType, type(None))):
            # ``cfg.get``, ``cfg.__getitem__``: a C method reads its object.
            return ("bound", self._opaque(obj), self(obj.__self__))
        if isinstance(obj, types.MappingProxyType):
            return ("mappingproxy", self(dict(obj)))
        if isinstance(obj, _DICT_VIEWS):
            return (type(obj).__name__, tuple(self(x) for x in tuple(obj)))
        if isinstance(obj, weakref.ref):
            # (``KeyedRef``s too: what a ``WeakValueDictionary`` holds.)
            return ("weakref", self(obj()))
        if isinstance(obj, contextvars.ContextVar):
            # Its value in the current context, which ``set`` rebinds.
            return ("contextvar", self._opaque(obj), self(obj.get(_UNSET)))
        if isinstance(obj, (staticmethod, classmethod)):
            return (type(obj), self(obj.__func__))
        if isinstance(obj, property):
            return ("property", self(obj.fget), self(obj.fset), self(obj.fdel))
        if isinstance(obj, functools.partial):
            return ("partial", self(obj.func), self(obj.args), self(obj.keywords),
                    self(getattr(obj, "__dict__", None)))
        if isinstance(obj, (types.BuiltinFunctionType, types.CodeType)):
            return self._opaque(obj)
        if _is_array_like(obj) and (_in_library(type(obj)) or not hasattr(obj, "__dict__")):
            # (A program's own class with ``__jax_array__`` is walked as an object:
            # its attributes are what the array is made from.)
            return self._opaque(obj)
        if _in_library(type(obj)) and callable(obj) and hasattr(obj, "__wrapped__"):
            # A library's wrapper (``jax.jit``): fixed at creation, so its identity
            # and what it wraps.
            wrapped = obj.__wrapped__
            inner = self(wrapped)
            attrs = getattr(obj, "__dict__", None)
            attrs = {k: v for k, v in attrs.items() if k != "__wrapped__"} \
                if isinstance(attrs, dict) else {}
            if _is_library_callable(wrapped):
                # A library's wrapper of a library function (``jnp.tanh``), unless
                # it holds a program's rule (``jax.custom_jvp(jnp.sin)`` with the
                # program's jvp): only functions it holds can be the program's
                # (its other attributes are the library's: a signature, a cache).
                rules = [v for v in attrs.values() if callable(v) and not _is_library_callable(v)]
                held = self(rules)
                if all(_is_library_callable(v) for v in rules):
                    return _library_callable(obj, ("wrapper", self._opaque(obj), inner))
                return ("wrapper", self._opaque(obj), inner, held)
            # A wrapper of the program's function: what it holds besides (a
            # custom_vjp's fwd and bwd, a custom_jvp's jvp: rules it runs).
            return ("wrapper", self._opaque(obj), inner, self(attrs))
        attrs = getattr(obj, "__dict__", None)
        slots = _slot_names(obj)
        if isinstance(attrs, dict) or slots:
            self.keepalive.append(obj)
            return ("object", self(type(obj)), id(obj), self(attrs),
                    tuple((n, self(getattr(obj, n))) for n in slots))
        return self._opaque(obj)

    def _container_type(self, obj):
        cls = type(obj)
        return cls if cls in _BUILTIN_CONTAINER_TYPES else self(cls)

    def _container(self, obj) -> tuple:
        if isinstance(obj, (bytearray, bytes)):
            return ("bytes", bytes(obj))
        if isinstance(obj, array.array):
            return ("array", obj.typecode, obj.tobytes())
        if isinstance(obj, dict):
            # A snapshot: reading an attribute can import lazily and grow a dict.
            return tuple((self(k), self(v)) for k, v in list(obj.items()))
        if isinstance(obj, (set, frozenset)):
            # Order-free: two equal sets can iterate in different orders.
            return frozenset(self(x) for x in list(obj))
        return tuple(self(x) for x in tuple(obj))  # tuple, list, deque

    def _extra_state(self, obj) -> tuple:
        """What a container holds besides its items: ``defaultdict``'s factory, a
        deque's ``maxlen``, a subclass instance's ``__dict__`` and slots."""
        extra = []
        if isinstance(obj, collections.defaultdict):
            extra.append(("default_factory", self(obj.default_factory)))
        if isinstance(obj, collections.deque):
            extra.append(("maxlen", obj.maxlen))
        if type(obj) not in _BUILTIN_CONTAINER_TYPES:
            attrs = getattr(obj, "__dict__", None)
            if isinstance(attrs, dict):
                extra.append(("attrs", self(attrs)))
            extra.extend((n, self(getattr(obj, n))) for n in _slot_names(obj))
        return tuple(extra)

    def _module(self, module: types.ModuleType) -> tuple:
        """A module's identity; its attributes are walked by ``modules_part`` (read
        from its ``__dict__``: no lazy import, no deprecation warning)."""
        self.keepalive.append(module)
        self.modules.setdefault(id(module), module)
        if callable(vars(module).get("__getattr__")) and not _is_library_file(
                getattr(module, "__file__", None) or ""):
            # PEP 562: an attribute the module's dict lacks is what its
            # ``__getattr__`` returns, so that function (and what it reads) counts.
            self.names.add("__getattr__")
        return ("module", module.__name__)

    def _class(self, cls: type) -> tuple:
        """A class's identity and, for a program's own class, everything its
        attribute dicts hold (data, methods, static methods, properties): rules
        read them as ``Cls.c``, ``self.c`` or ``self.method(...)``, and any can be
        rebound between calls."""
        out = [self._opaque(cls)]
        # A class attribute may live on a program's own metaclass (``Meta.k``).
        for c in (*cls.__mro__, *(m for m in type(cls).__mro__ if m is not type)):
            if _in_library(c):
                continue
            for name, value in list(vars(c).items()):
                if name not in ("__dict__", "__weakref__", "__doc__"):
                    out.append((c.__qualname__, name, self(value)))
        return ("class", tuple(out))

    def _function(self, fn: types.FunctionType) -> tuple:
        self.keepalive.append(fn)
        code = fn.__code__
        if _is_library_file(code.co_filename):
            # A library's wrapper function (``jax.named_call``) runs the function
            # it wraps, and a library's closure (``jax.custom_gradient``'s primal,
            # equinox's ``filter_custom_jvp`` wrappers) the functions its cells
            # hold: either may be the program's.  One that reaches only library
            # callables is found once, by identity.
            wrapped = vars(fn).get("__wrapped__")
            held = [_cell_contents(c) for c in fn.__closure__ or ()]
            if wrapped is not None:
                held.append(wrapped)
            if not held:
                return _library_callable(fn, ("function", id(fn)))
            out = ("function", id(fn), tuple(self(x) for x in held))
            if all(_is_library_callable(x) for x in held):
                return _library_callable(fn, out)
            return out
        code_names, sorted_names, sorted_imports = _code_names(code)
        self.names |= code_names
        cells = tuple(self(_cell_contents(c)) for c in (fn.__closure__ or ()))
        g = fn.__globals__
        if "globals" in code_names:
            # ``globals()[key]`` with a key computed at run time: any global.
            sorted_names = tuple(sorted(set(sorted_names) | set(g)))
        names = tuple(n for n in sorted_names if n in g)
        # A name the module does not define resolves through ``builtins``, which
        # a program can set (``builtins.SCALE = 2.0``).
        builtin = _builtins_dict(g)
        rebuilt = tuple((n, self(builtin[n])) for n in _loaded_globals(code)
                        if n not in g and n in builtin and builtin[n] is not _BUILTINS.get(n, _UNSET))
        # Modules the code imports itself (``import cfg`` inside the function):
        # a program's own module is walked like one it reads as a global.
        imported = tuple(self(sys.modules[n]) for n in sorted_imports
                         if n not in g and n in sys.modules
                         and not _is_library_file(getattr(sys.modules[n], "__file__", None)
                                                  or ""))
        return ("function", fn.__code__, cells, self(fn.__defaults__),
                self(fn.__kwdefaults__), tuple((n, self(g[n])) for n in names), imported,
                self(getattr(fn, "__dict__", None) or None), rebuilt)


def fingerprint(obj, keepalive: list, max_nodes: int = MAX_NODES):
    """A hashable fingerprint of ``obj`` and everything it can read, or None when the
    walk exceeds ``max_nodes`` or meets something unhashable."""
    try:
        walk = Fingerprinter(keepalive, max_nodes)
        out = (walk(obj), walk.modules_part())
        hash(out)
    except Exception:  # too large, unhashable, too deep, or reading an attribute failed
        return None
    return out


# C methods bound to an object (``{}.get``, ``{}.__getitem__``).
_BOUND_BUILTINS = (types.BuiltinMethodType, types.MethodWrapperType)
# Live views of a dict's content.
_DICT_VIEWS = (type({}.keys()), type({}.values()), type({}.items()))

# Built-in containers walked by content (``bytes`` is a scalar above; a subclass of
# it, like one of any of these, is walked with its attributes).
_BUILTIN_CONTAINERS = (tuple, list, dict, set, frozenset, bytearray, array.array,
                       collections.deque)
# Exact types whose fingerprint may name the type itself: they hold no state of
# their own beyond their items (``defaultdict``/``deque`` extras are walked apart).
_BUILTIN_CONTAINER_TYPES = frozenset({
    tuple, list, dict, set, frozenset, bytearray, array.array, collections.deque,
    collections.defaultdict, collections.OrderedDict, collections.Counter})


#: Library functions and library wrappers of them (``jnp.tanh``), by id: their
#: fingerprint is their identity, so it is found once (and they are kept alive,
#: as a library keeps them anyway).
_LIBRARY_CALLABLES: dict[int, tuple[Any, tuple]] = {}


def _library_callable(obj, out: tuple) -> tuple:
    _LIBRARY_CALLABLES[id(obj)] = (obj, out)
    return out


def _is_library_callable(obj) -> bool:
    """Was ``obj`` found to be a library callable reaching no program state?"""
    return _LIBRARY_CALLABLES.get(id(obj), (None,))[0] is obj


def _walk_builtin_container(walk: Fingerprinter, obj) -> tuple:
    return (type(obj), walk._container(obj), walk._extra_state(obj))


#: ``_walk`` by exact type for the kinds a walk meets most (each as the general
#: tests would classify it).
_FAST_WALKS = {
    types.FunctionType: Fingerprinter._function,
    types.ModuleType: Fingerprinter._module,
    type: Fingerprinter._class,
    **{t: _walk_builtin_container for t in (tuple, list, dict, set, frozenset)},
}


def _scalar(obj) -> tuple:
    """Python scalars by type and bits: ``0.0 == -0.0`` and ``nan != nan``, but a
    rule reading either can give other numbers."""
    if isinstance(obj, float):
        return (type(obj), struct.pack("<d", obj))
    if isinstance(obj, complex):
        return (type(obj), struct.pack("<dd", obj.real, obj.imag))
    return (type(obj), obj)


#: The ``builtins`` names as the interpreter started: only one a program set or
#: rebound since is walked (the others are the interpreter's own).
_BUILTINS = dict(vars(builtins))


def _builtins_dict(g: dict) -> dict:
    b = g.get("__builtins__", builtins)
    return b if isinstance(b, dict) else vars(b)


def _cell_contents(cell):
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell: a variable not yet assigned
        return ("empty-cell",)


@functools.lru_cache(maxsize=4096)
def _global_names(code: types.CodeType) -> frozenset:
    """The globals and attributes ``code`` (and code nested in it) names, and the
    identifier-like string constants it holds (``getattr(config, "dt")``,
    ``globals()["dt"]``)."""
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _global_names(c)
        elif isinstance(c, str) and c.isidentifier():
            names.add(c)
    return frozenset(names)


@functools.lru_cache(maxsize=4096)
def _loaded_globals(code: types.CodeType) -> tuple:
    """The names ``code`` (and code nested in it) loads as globals, sorted: the
    ones that can resolve through ``builtins``."""
    names = {ins.argval for ins in dis.get_instructions(code)
             if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names.update(_loaded_globals(c))
    return tuple(sorted(names))


@functools.lru_cache(maxsize=4096)
def _code_names(code: types.CodeType) -> tuple[frozenset, tuple, tuple]:
    """``_global_names(code)``, the same sorted, and ``_imported_names(code)`` sorted."""
    names = _global_names(code)
    return names, tuple(sorted(names)), tuple(sorted(_imported_names(code)))


@functools.lru_cache(maxsize=4096)
def _imported_names(code: types.CodeType) -> frozenset:
    """The modules ``code`` (and code nested in it) imports by name, or may:
    a dotted-name string constant (``importlib.import_module("pkg.settings")``,
    ``__import__("pkg")``) counts when such a module is loaded."""
    names = {ins.argval for ins in dis.get_instructions(code) if ins.opname == "IMPORT_NAME"}
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _imported_names(c)
        elif isinstance(c, str) and c.replace(".", "_").isidentifier():
            names.add(c)
    return frozenset(names)


def _library_roots() -> tuple:
    paths = sysconfig.get_paths()
    roots = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    try:
        roots.update(site.getsitepackages())
    except AttributeError:  # some embedded interpreters have no site-packages list
        pass
    # jaxpr-cc itself is a library to the programs it traces (an editable install
    # lives outside site-packages).
    roots.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return tuple(os.path.join(os.path.realpath(r), "") for r in roots if r)


_LIBRARY_ROOTS = _library_roots()


@functools.lru_cache(maxsize=4096)
def _is_library_file(filename: str) -> bool:
    if not filename or filename.startswith("<"):
        return False
    return os.path.realpath(filename).startswith(_LIBRARY_ROOTS)


def _in_library(obj) -> bool:
    """Whether a function or class comes from an installed library or the standard
    library (builtins included) rather than from the program."""
    if isinstance(obj, types.FunctionType):
        return _is_library_file(obj.__code__.co_filename)
    module = sys.modules.get(getattr(obj, "__module__", None) or "")
    if module is None:
        return False
    if module.__name__ == "builtins":
        return True
    return _is_library_file(getattr(module, "__file__", None) or "")


def _is_array_like(obj) -> bool:
    try:
        return hasattr(obj, "__jax_array__") or (hasattr(obj, "aval") and hasattr(obj, "shape"))
    except Exception:  # noqa: BLE001 -- a __getattr__ raising KeyError: not an array
        return False


def _slot_names(obj) -> tuple:
    """The slots ``obj`` has a value in, as attribute names: a class may give
    ``__slots__`` as one string, and a private slot ``__v`` is stored as
    ``_Class__v``."""
    out = []
    for c in type(obj).__mro__:
        names = getattr(c, "__slots__", ())
        for n in ((names,) if isinstance(names, str) else names):
            if not isinstance(n, str) or n in ("__dict__", "__weakref__"):
                continue
            if n.startswith("__") and not n.endswith("__"):
                n = f"_{c.__name__.lstrip('_')}{n}"
            if hasattr(obj, n):
                out.append(n)
    return tuple(out)
