"""``jaxpr_cc.jit``: a drop-in for ``jax.jit`` that compiles through jaxpr-cc.

Per input signature it traces the function with :func:`jaxpr_cc.trace` (custom
rules materialized, closures converted), runs the pass pipeline, emits the program
and compiles it with XLA into an :class:`~jaxpr_cc.Executable`.  Called with
concrete arguments it runs that executable; called while a JAX transformation is
tracing (``grad``, ``vmap``, ``jvp``, an outer ``jit``...) it binds the emitted
program into that trace, wrapped in one ``jax.jit`` call, so the transformation sees
the program's own custom derivative rules.

The returned callable is JAX's C++ jit dispatcher with our cache miss behind it:
once a signature has run, its calls go from C++ straight to our executable.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Iterable

import jax
from jax import tree_util

from .backends import xla
from .ir.program import Program
from .jax_adapter import ArrayImpl, make_jit_dispatcher, trace_state_clean

__all__ = ["DEFAULT", "DEFAULT_PIPELINE", "JitFunction", "default_pipeline", "jit"]

#: The passes ``pipeline=DEFAULT`` asks for (those this build registers run).
from .passes import DEFAULT_PIPELINE  # noqa: E402  (the one definition lives with the passes)


class _Default:
    """Sentinel for ``pipeline=DEFAULT``: distinct from an explicit pipeline string,
    which must run exactly as written."""

    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT: Any = _Default()


def jit(fun: Callable | None = None, *, pipeline: Any = DEFAULT,
        static_argnums: int | Iterable[int] | None = None,
        static_argnames: str | Iterable[str] | None = None,
        donate_argnums: int | Iterable[int] | None = None) -> Callable:
    """Compile ``fun`` through jaxpr-cc; use like ``jax.jit`` (also as
    ``@jit(static_argnums=...)``).

    ``pipeline`` is a pass pipeline string for ``jaxpr_cc.run_passes``; ``None`` or
    ``""`` runs no passes; ``DEFAULT`` runs the passes of :data:`DEFAULT_PIPELINE`
    that this build has.
    """
    if fun is None:
        return functools.partial(jit, pipeline=pipeline, static_argnums=static_argnums,
                                 static_argnames=static_argnames, donate_argnums=donate_argnums)
    return JitFunction(fun, pipeline=pipeline, static_argnums=static_argnums,
                       static_argnames=static_argnames, donate_argnums=donate_argnums).wrapper()


class _Entry:
    """One input signature: its program, and lazily its executable and bound form."""
    __slots__ = ("program", "executable", "bound", "arg_shardings", "donated")

    def __init__(self, program: Program, arg_shardings: list, donated: list[int]):
        self.program = program
        self.executable: xla.Executable | None = None
        self.bound: Callable | None = None
        self.arg_shardings = arg_shardings
        self.donated = donated

    def compile(self) -> xla.Executable:
        self.executable = xla.compile_flat(self.program, self.arg_shardings,
                                           donated=self.donated)
        return self.executable

    def bind(self, leaves: list):
        if self.bound is None:
            # One jax.jit around the emitted program: an outer jit sees a single call,
            # and grad/vmap/jvp transform the program's equations, custom rules included.
            self.bound = jax.jit(xla.emit_function(self.program))
        outs = self.bound(*self.program.params, *leaves)
        return tree_util.tree_unflatten(self.program.out_tree, outs)


class JitFunction:
    """The state behind a ``jaxpr_cc.jit`` function: options and the cache of
    per-signature entries.  ``jit`` returns :meth:`wrapper`."""

    def __init__(self, fun: Callable, *, pipeline: Any, static_argnums, static_argnames,
                 donate_argnums):
        if not callable(fun):
            raise TypeError(f"jaxpr_cc.jit: expected a function, got {type(fun).__name__}")
        self._fun = fun
        self._label = f"jaxpr_cc.jit({getattr(fun, '__qualname__', None) or fun!r})"
        self._pipeline = _resolve_pipeline(pipeline, self._label)
        try:
            self._signature: inspect.Signature | None = inspect.signature(fun)
        except (TypeError, ValueError):
            self._signature = None
        nums, names = _static_spec(self._signature, static_argnums, static_argnames, self._label)
        self._static_nums: tuple[int, ...] = nums
        self._static_names: frozenset[str] = names
        self._has_statics = bool(nums or names)
        self._donate_nums = _int_tuple(donate_argnums, "donate_argnums", self._label)
        clash = set(self._donate_nums) & set(nums)
        if clash:
            raise ValueError(f"{self._label}: arguments {sorted(clash)} are both static and "
                             f"donated; only array arguments can be donated")
        self._cache: dict = {}
        self._cpp_cache: Any = None  # the C++ dispatcher's cache, once wrapper() made it

    # ---------------------------------------------------------------- calling
    def __call__(self, *args, **kwargs):
        return self.cache_miss(*args, **kwargs)[0]

    def _lookup(self, args: tuple, kwargs: dict) -> tuple:
        if self._has_statics:
            args, kwargs, statics = self._split_statics(args, kwargs)
        else:
            statics = None
        leaves, tree = tree_util.tree_flatten((args, kwargs))
        key = (tree, statics, *[x.aval if type(x) is ArrayImpl and not x.committed
                                else _leaf_key(x, self._label) for x in leaves])
        try:
            entry = self._cache.get(key)
        except TypeError:
            raise self._unhashable(statics) from None
        return entry, key, args, kwargs, statics, leaves, tree

    def wrapper(self) -> Callable:
        """The function ``jit`` returns: JAX's own C++ jit dispatcher, with
        :meth:`cache_miss` behind it.  After a concrete call it caches our
        executable's fast path for that signature, so a cached call never enters
        Python: it costs what a ``jax.jit`` call costs, and signatures (static
        values, weak types, committed shardings, trace context) are told apart
        exactly as ``jax.jit`` tells them apart."""
        name = getattr(self._fun, "__name__", "fun")
        jitted, self._cpp_cache = make_jit_dispatcher(
            name, self.cache_miss, self._static_nums, sorted(self._static_names))
        functools.update_wrapper(jitted, self._fun)
        jitted.program = self.program
        jitted.executable = self.executable
        jitted.cache_size = self.cache_size
        jitted.clear_cache = self.clear_cache
        return jitted

    def cache_miss(self, *args, **kwargs):
        """Called by the C++ dispatcher for a signature it has no fast path for (the
        first call, calls under a transformation, executables with effects):
        ``(outputs, fastpath or None, False)``."""
        entry, key, args, kwargs, statics, leaves, tree = self._lookup(args, kwargs)
        if entry is None:
            entry = self._add_entry(key, args, kwargs, statics, leaves, tree)
        if not trace_state_clean():
            return entry.bind(leaves), None, False
        exe = entry.executable or entry.compile()
        outputs = exe.call_flat(*leaves)
        return outputs, exe.fastpath(outputs), False

    def _split_statics(self, args: tuple, kwargs: dict):
        n = len(args)
        nums = {i if i >= 0 else i + n for i in self._static_nums}
        dyn_args = tuple(a for i, a in enumerate(args) if i not in nums)
        static_pos = tuple((i, args[i]) for i in sorted(nums) if 0 <= i < n)
        names = self._static_names
        if names and kwargs:
            static_kw = tuple(sorted(((k, v) for k, v in kwargs.items() if k in names),
                                     key=lambda kv: kv[0]))
            kwargs = {k: v for k, v in kwargs.items() if k not in names}
        else:
            static_kw = ()
        return dyn_args, kwargs, (static_pos, static_kw)

    def _unhashable(self, statics) -> TypeError:
        static_pos, static_kw = statics if statics is not None else ((), ())
        for where, value in [(f"argument {i}", v) for i, v in static_pos] + \
                            [(f"argument {k!r}", v) for k, v in static_kw]:
            try:
                hash(value)
            except TypeError:
                return TypeError(f"{self._label}: static {where} has unhashable type "
                                 f"{type(value).__name__}; static arguments must be hashable "
                                 f"(pass a tuple instead of a list, for example)")
        return TypeError(f"{self._label}: the arguments cannot be used as a cache key")

    # ------------------------------------------------------------ cache miss
    def _add_entry(self, key, args, kwargs, statics, leaves, tree) -> _Entry:
        target = self._bind_statics(statics)
        specs = [_spec(x) for x in leaves]
        spec_args, spec_kwargs = tree_util.tree_unflatten(tree, specs)
        # Errors raised by the user's function propagate unchanged from here.
        from .frontend.trace import trace
        program = trace(target, *spec_args, **spec_kwargs)
        program = _run_pipeline(program, self._pipeline, self._label)
        arg_shardings = [x.sharding if isinstance(x, jax.Array) and not _is_tracer(x)
                         and x.committed else None for x in leaves]
        entry = _Entry(program, arg_shardings, self._donated_leaves(args, statics))
        if not _holds_tracers(program):
            # A program that closed over a tracer of an enclosing transformation is
            # only valid inside that trace: use it once, never cache it.
            self._cache[key] = entry
        return entry

    def _bind_statics(self, statics) -> Callable:
        fun = self._fun
        if statics is None:
            return fun
        static_pos, static_kw = statics
        static_kw = dict(static_kw)

        def with_statics(*dyn_args, **dyn_kwargs):
            full = list(dyn_args)
            for i, v in static_pos:
                full.insert(i, v)
            return fun(*full, **dyn_kwargs, **static_kw)
        with_statics.__name__ = getattr(fun, "__name__", "fun")
        if self._signature is not None:
            # trace() names the program's inputs after the remaining parameters.
            taken = {i for i, _ in static_pos} | set(static_kw)
            params = [p for i, p in enumerate(self._signature.parameters.values())
                      if i not in taken and p.name not in taken]
            with_statics.__signature__ = self._signature.replace(parameters=params)
        return with_statics

    def _donated_leaves(self, dyn_args: tuple, statics) -> list[int]:
        """Flat argument-leaf indices of the donated positional arguments."""
        if not self._donate_nums:
            return []
        static_positions = sorted(i for i, _ in statics[0]) if statics is not None else []
        n_args = len(dyn_args) + len(static_positions)
        starts, pos = [], 0
        for a in dyn_args:
            starts.append(pos)
            pos += tree_util.tree_structure(a).num_leaves
        starts.append(pos)
        leaves: set[int] = set()
        for d in self._donate_nums:
            d = d if d >= 0 else d + n_args
            if not 0 <= d < n_args or d in static_positions:
                continue  # not passed in this call (jax.jit ignores it too)
            j = d - sum(1 for i in static_positions if i < d)
            leaves.update(range(starts[j], starts[j + 1]))
        return sorted(leaves)

    # ---------------------------------------------------------- inspection
    def program(self, *args, **kwargs) -> Program:
        """The program (after the pipeline) that runs for these arguments."""
        return self._entry_for(args, kwargs).program

    def executable(self, *args, **kwargs) -> xla.Executable:
        """The compiled executable that runs for these arguments."""
        entry = self._entry_for(args, kwargs)
        return entry.executable or entry.compile()

    def _entry_for(self, args, kwargs) -> _Entry:
        entry, key, args, kwargs, statics, leaves, tree = self._lookup(args, kwargs)
        return entry or self._add_entry(key, args, kwargs, statics, leaves, tree)

    def cache_size(self) -> int:
        return len(self._cache)

    def clear_cache(self) -> None:
        self._cache.clear()
        if self._cpp_cache is not None:
            self._cpp_cache.clear()

    def __repr__(self) -> str:
        return f"<{self._label}>"


# --------------------------------------------------------------------- helpers
def _leaf_key(x: Any, label: str):
    """Cache-key part of an argument leaf that is not an uncommitted jax.Array."""
    t = type(x)
    if t is ArrayImpl:
        return (x.aval, x.sharding)  # committed: its placement is part of the signature
    if t in (bool, int, float, complex):
        return t  # a Python scalar's type fixes its (weak) aval
    try:
        return jax.typeof(x)
    except TypeError:
        raise TypeError(f"{label}: argument leaf of type {t.__name__} is not an array; "
                        f"mark it static with static_argnums/static_argnames") from None


def _spec(x: Any) -> jax.ShapeDtypeStruct:
    a = x.aval if type(x) is ArrayImpl else jax.typeof(x)
    return jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type)


def _is_tracer(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)


def _holds_tracers(program: Program) -> bool:
    values = list(program.params)
    for region in program.body.regions():
        values.extend(region.consts or ())
    return any(_is_tracer(v) for v in values)


def _int_tuple(value, what: str, label: str) -> tuple[int, ...]:
    if value is None:
        return ()
    items = (value,) if isinstance(value, int) else tuple(value)
    for i in items:
        if not isinstance(i, int) or isinstance(i, bool):
            raise TypeError(f"{label}: {what} must be ints, got {i!r}")
    return items


def _static_spec(signature, static_argnums, static_argnames, label: str):
    """Static positions and names.  As jax.jit does: when only one of the two is
    given, the other is completed through the signature, so such an argument is
    static whether passed by position or by name."""
    nums = set(_int_tuple(static_argnums, "static_argnums", label))
    if static_argnames is None:
        names: set[str] = set()
    elif isinstance(static_argnames, str):
        names = {static_argnames}
    else:
        names = set(static_argnames)
        if not all(isinstance(n, str) for n in names):
            raise TypeError(f"{label}: static_argnames must be strings, got {static_argnames!r}")
    if signature is not None:
        params = list(signature.parameters.values())
        either = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
        offset = sum(1 for p in params if p.kind is p.POSITIONAL_ONLY)
        if static_argnames is None:
            n_positional = offset + len(either)
            for i in nums:
                j = (i if i >= 0 else i + n_positional) - offset
                if 0 <= j < len(either):
                    names.add(either[j])
        elif static_argnums is None:
            nums.update(offset + either.index(n) for n in names if n in either)
        known = {p.name for p in params}
        has_var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
        unknown = sorted(n for n in names if n not in known)
        if unknown and not has_var_kw:
            raise ValueError(f"{label}: static_argnames {unknown} are not parameters of the "
                             f"function")
    return tuple(sorted(nums)), frozenset(names)


def _resolve_pipeline(pipeline: Any, label: str) -> str:
    """The pipeline string to run ('' for none)."""
    if pipeline is None or pipeline == "":
        return ""
    if isinstance(pipeline, _Default):
        return default_pipeline()
    if not isinstance(pipeline, str):
        raise TypeError(f"{label}: pipeline must be a pass pipeline string, None or DEFAULT, "
                        f"got {type(pipeline).__name__}")
    if _pass_manager() is None:
        raise ValueError(f"{label}: pipeline={pipeline!r} needs the pass manager "
                         f"(jaxpr_cc.run_passes), which this build does not have; use "
                         f"pipeline=None")
    return pipeline


def _pass_manager():
    import jaxpr_cc
    return getattr(jaxpr_cc, "run_passes", None)


def default_pipeline() -> str:
    """The passes of :data:`DEFAULT_PIPELINE` this build registers, as a pipeline string."""
    if _pass_manager() is None:
        return ""
    from .passes.base import PASS_REGISTRY
    return ",".join(name for name in DEFAULT_PIPELINE.split(",") if name in PASS_REGISTRY)


def _run_pipeline(program: Program, pipeline: str, label: str) -> Program:
    if not pipeline:
        return program
    result = _pass_manager()(program, pipeline)
    if not isinstance(result, Program):
        raise TypeError(f"{label}: jaxpr_cc.run_passes returned {type(result).__name__}, "
                        f"expected a Program")
    return result
