"""``jaxpr_cc.jit``: a drop-in for ``jax.jit`` that compiles through jaxpr-cc.

``jaxpr_cc.jit(f, **options)`` is a real ``jax.jit`` object, built with the same
options, around a stand-in for ``f``.  When JAX traces the stand-in for a new input
signature, the stand-in traces ``f`` with :func:`jaxpr_cc.trace` (custom rules
materialized, closures converted), runs the pass pipeline and evaluates the
resulting program on JAX's tracers.  So what JAX compiles is jaxpr-cc's program,
and everything else is ``jax.jit`` itself: keyword validation and its errors,
static and donated arguments, shardings, the C++ dispatch cache, the AOT stages
(``.trace()``, ``.lower()``, ``.eval_shape()``), ``jax.eval_shape``, and
transformations (an outer ``grad``/``vmap``/``jvp``/``jit`` sees one ``jit`` call
whose body carries the program's own custom derivative rules).

On top of ``jax.jit`` the returned function has ``.program(*args)`` (the program
after the pipeline), ``.executable(*args)`` (that program compiled with
:func:`jaxpr_cc.compile`, which can be saved), ``.cache_size()`` (programs traced)
and ``.clear_cache()``.  As with ``jax.jit``'s global cache, ``jit`` objects of the
same function with the same options share their programs.
"""
from __future__ import annotations

import copy
import functools
import inspect
import warnings
import weakref
from typing import Any, Callable, Iterable

import jax
from jax import tree_util

from .backends import xla
# Importing the closure session registers its JAX user context, which lengthens
# JAX's trace context: do it before the first cache key is made from that context.
from .closure import session as _closure_session  # noqa: F401
from .frontend.trace import innermost_function, traced_arg_shardings
from .ir.program import Program
from .jax_adapter import jit_resolved_argnums, manual_axis_type_of, on_clear_caches, trace_context

__all__ = ["DEFAULT", "DEFAULT_PIPELINE", "JitFunction", "default_pipeline", "jit"]

#: The passes ``pipeline=DEFAULT`` asks for (those this build registers run).
from .passes import DEFAULT_PIPELINE  # noqa: E402  (the one definition lives with the passes)


class _Default:
    """Sentinel for ``pipeline=DEFAULT``: distinct from an explicit pipeline string,
    which must run exactly as written."""

    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT: Any = _Default()


class _NotGiven:
    """A ``jax.jit`` keyword the caller did not pass: JAX's own default applies."""

    def __repr__(self) -> str:
        return "<not given>"


_NOT_GIVEN: Any = _NotGiven()


def jit(fun: Callable = _NOT_GIVEN, /, *, pipeline: Any = DEFAULT, forward_mode: bool = True,
        in_shardings: Any = _NOT_GIVEN, out_shardings: Any = _NOT_GIVEN,
        static_argnums: int | Iterable[int] | None = _NOT_GIVEN,
        static_argnames: str | Iterable[str] | None = _NOT_GIVEN,
        donate_argnums: int | Iterable[int] | None = _NOT_GIVEN,
        donate_argnames: str | Iterable[str] | None = _NOT_GIVEN,
        keep_unused: bool = _NOT_GIVEN, device: Any = _NOT_GIVEN, backend: Any = _NOT_GIVEN,
        inline: bool = _NOT_GIVEN, compiler_options: dict | None = _NOT_GIVEN) -> Callable:
    """Compile ``fun`` through jaxpr-cc; use exactly like ``jax.jit`` (the same
    keywords, also as ``@jit(static_argnums=...)``).

    ``pipeline`` is a pass pipeline string for ``jaxpr_cc.run_passes``; ``None`` or
    ``""`` runs no passes; ``DEFAULT`` runs the passes of :data:`DEFAULT_PIPELINE`
    that this build has.  ``forward_mode`` (default True) gives every custom_vjp
    rule a forward mode (``jax.jvp``/``jacfwd``/``hessian`` through it) from its
    transposed bwd, as the ``vjp-to-jvp`` pass does; reverse mode still runs the
    user's bwd and compiles to the same code.  Its only cost is trace time
    (building the transposes); ``forward_mode=False`` skips it.  The other
    keywords are ``jax.jit``'s and mean what they mean there.
    """
    if not isinstance(forward_mode, bool):
        raise TypeError(f"jaxpr_cc.jit: forward_mode must be True or False, got "
                        f"{type(forward_mode).__name__}")
    given = {k: v for k, v in (("in_shardings", in_shardings), ("out_shardings", out_shardings),
                               ("static_argnums", static_argnums),
                               ("static_argnames", static_argnames),
                               ("donate_argnums", donate_argnums),
                               ("donate_argnames", donate_argnames),
                               ("keep_unused", keep_unused), ("device", device),
                               ("backend", backend), ("inline", inline),
                               ("compiler_options", compiler_options))
             if v is not _NOT_GIVEN}
    if fun is _NOT_GIVEN:
        return functools.partial(jit, pipeline=pipeline, forward_mode=forward_mode, **given)
    # jax.jit's own checks of the function itself (not callable, a generator
    # function...), which the stand-in would pass: its errors, raised here.
    jax.jit(fun)
    stand_in = JitFunction.shared(fun, pipeline, given, forward_mode)
    # jax.jit validates every keyword here and raises its own errors (a bad
    # static_argnums is its ValueError, not something found while tracing).
    refused = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            jitted = jax.jit(stand_in, **given)
        except Exception as e:  # noqa: BLE001 -- raised below, after jax.jit's warnings
            refused = e
    # jax.jit's warnings (deprecated keywords) name the caller's line, also when it
    # then refuses the keywords.
    for w in caught:
        warnings.warn(w.message, w.category, stacklevel=2)
    if refused is not None:
        raise refused
    return stand_in._jaxpr_cc_state.attach(jitted, fun)


#: fun -> {(pipeline, jax.jit options): stand-in}.  As jax.jit's global cache is
#: keyed on the function and the options, so is this: ``jaxpr_cc.jit(f)(x)`` twice
#: traces ``f`` once.  Weak in ``fun``; a stand-in holds ``fun`` only weakly, so an
#: entry lives as long as ``fun`` does and keeps nothing alive by itself.
_SHARED: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()

#: Every live state, so that ``jax.clear_caches()`` forgets their traced programs:
#: jax.jit then retraces the stand-in, and the stand-in must retrace the function
#: too (it may read globals that changed), not return the program traced before.
_STATES: "weakref.WeakSet[JitFunction]" = weakref.WeakSet()


def _clear_all_programs() -> None:
    # The stand-ins stay shared: jax.jit's caches are per function, so a later
    # ``jit(f).clear_cache()`` clears what every ``jit(f)`` uses.
    for state in list(_STATES):
        state._cache.clear()


_CLEAR_HOOK = on_clear_caches(_clear_all_programs)  # held: JAX holds it weakly


class _Entry:
    """One traced input signature: its program, how to evaluate it on JAX's tracers,
    and (on request) its compiled executables by argument placement."""
    __slots__ = ("program", "evaluate", "executables")

    def __init__(self, program: Program, forward_mode: bool = True):
        self.program = program
        # What runs is the program with a forward mode through its custom_vjp
        # rules (reverse mode still runs their bwd); ``program`` is what the
        # pipeline made, as inspected and compiled.
        self.evaluate = xla.emit_function(program, forward_mode=forward_mode)
        self.executables: dict = {}

    def run(self, leaves: list):
        outs = self.evaluate(*self.program.params, *leaves)
        return tree_util.tree_unflatten(self.program.out_tree, outs)


class _StandIn:
    """What ``jax.jit`` wraps: it runs jaxpr-cc's program for the signature JAX
    traces it at.  It looks like the user's function to JAX (name, signature, and
    ``__wrapped__`` for JAX's source locations in errors and debug info) but holds
    it only weakly: ``jit`` keeps a stand-in as long as the function lives."""

    def __init__(self, state: "JitFunction", fun: Callable):
        # The function's own attributes first (jax.jit copies them all onto the
        # object it returns, as functools.wraps does), then ours.
        self.__dict__.update(getattr(fun, "__dict__", {}))
        self.__dict__.pop("__wrapped__", None)
        self._jaxpr_cc_state = state
        inner = fun
        while isinstance(inner, functools.partial):
            inner = inner.func
        for attr in ("__module__", "__name__", "__qualname__", "__doc__", "__annotations__"):
            value = getattr(fun, attr, None)
            if value is None:
                value = getattr(inner, attr, None)
            if value is not None or attr == "__doc__":  # not this class's docstring
                setattr(self, attr, value)
        if state._signature is not None:
            self.__signature__ = state._signature

    @property
    def __wrapped__(self):
        # JAX names a function in errors by unwrapping ``__wrapped__`` after removing
        # partials: hand it the user's innermost function.
        return innermost_function(self._jaxpr_cc_state._fun)

    def __call__(self, /, *args, **kwargs):
        return self._jaxpr_cc_state._staged_call(args, kwargs)

    def __repr__(self) -> str:
        return repr(self._jaxpr_cc_state._fun)

    def __deepcopy__(self, memo) -> "_StandIn":
        # As copy.deepcopy shares the function a jax.jit holds (functions copy as
        # themselves), a copy shares the stand-in: its state holds traced programs
        # (with JAX tracebacks that cannot be copied), caches that need no copy.
        return self


class JitFunction:
    """The state behind ``jaxpr_cc.jit`` functions of one Python function and one
    set of options: the stand-in ``jax.jit`` wraps, and the per-signature programs.
    Nothing here refers to the ``jax.jit`` objects (no reference cycles: dropping
    the last of them frees the programs and what they closed over at once)."""

    def __init__(self, fun: Callable, *, pipeline: Any, jit_options: dict,
                 forward_mode: bool = True):
        if not callable(fun):
            raise TypeError(f"jaxpr_cc.jit: expected a function, got {type(fun).__name__}")
        self._label = f"jaxpr_cc.jit({_fun_name(fun)})"
        self._pipeline = _resolve_pipeline(pipeline, self._label)
        # The pipeline's own vjp-to-jvp (with its options) is not run twice.
        self._forward_mode = forward_mode and "vjp-to-jvp" not in self._pipeline
        self._options = dict(jit_options)
        try:
            self._fun_ref: Callable[[], Any] = weakref.ref(fun)
            self._weak_error: TypeError | None = None
            hash(fun)
        except TypeError as e:
            # jax.jit's caches hold functions weakly and by hash: it accepts such a
            # function but fails when called, with this error; so do we.
            self._fun_ref = lambda: fun
            self._weak_error = e
        try:
            self._signature: inspect.Signature | None = inspect.signature(fun)
        except (TypeError, ValueError):
            self._signature = None
        self._static_nums: tuple[int, ...] = ()
        self._static_names: frozenset[str] = frozenset()
        self._has_statics = False
        self._donate_nums: tuple[int, ...] = ()
        self._donate_names: frozenset[str] = frozenset()
        self._resolved = False
        self._cache: dict = {}
        _STATES.add(self)

    @classmethod
    def shared(cls, fun: Callable, pipeline: Any, jit_options: dict,
               forward_mode: bool = True) -> "_StandIn":
        """The stand-in for ``fun`` with these options: the one made before while
        ``fun`` lives, else a new one (with a new state)."""
        make = functools.partial(cls, pipeline=pipeline, jit_options=jit_options,
                                 forward_mode=forward_mode)
        try:
            key = (_option_key(pipeline), _option_key(jit_options), forward_mode)
            hash(key)
            per_fun = _SHARED.get(fun)
        except TypeError:  # unhashable options, or fun cannot be weakly referenced
            return _StandIn(make(fun), fun)
        stand_in = per_fun.get(key) if per_fun is not None else None
        if stand_in is not None and stand_in._jaxpr_cc_state._fun is not fun:
            # An equal but distinct callable: it gets its own stand-in, which holds
            # it (a shared one would trace the other object).
            return _StandIn(make(fun), fun)
        if stand_in is None:
            stand_in = _StandIn(make(fun), fun)
            if stand_in._jaxpr_cc_state._weak_error is None:
                _SHARED.setdefault(fun, {})[key] = stand_in
        return stand_in

    @property
    def _fun(self) -> Callable:
        return self._fun_ref()

    def attach(self, jitted, fun) -> Callable:
        """``jitted`` (a ``jax.jit`` of the stand-in) as ``jit`` returns it: with
        ``program``, ``executable``, ``cache_size`` and ``clear_cache`` of ours, and
        holding ``fun`` (the stand-in does not)."""
        if not self._resolved:
            static_nums, static_names, donate_nums, donate_names = jit_resolved_argnums(jitted)
            self._donate_names = frozenset(donate_names)
            self._static_nums = static_nums
            self._static_names = frozenset(static_names)
            self._has_statics = bool(static_nums or static_names)
            # donate_argnames are resolved to positions by JAX when the signature is known.
            self._donate_nums = donate_nums
            self._resolved = True
        jax_clear_cache = type(jitted).clear_cache
        jitted_ref = weakref.ref(jitted)
        jitted.program = _holding(fun, self.program)
        jitted.executable = _holding(fun, self.executable)
        jitted.cache_size = self.cache_size

        def clear_cache() -> None:
            self._cache.clear()
            alive = jitted_ref()
            if alive is not None:
                jax_clear_cache(alive)
        jitted.clear_cache = clear_cache
        jitted.__wrapped__ = fun

        def deepcopy(memo) -> Callable:
            # What copy.deepcopy does to a jax.jit function (a new one from its
            # pickled state, the function shared), our attributes included:
            # without them the copy would be jax.jit of the stand-in alone.
            alive = jitted_ref()
            state = copy.deepcopy(alive.__getstate__(), memo)
            new = type(alive).__new__(type(alive))
            new.__setstate__(state)
            memo[id(alive)] = new
            new.__dict__.update(alive.__dict__)
            return self.attach(new, fun)
        jitted.__deepcopy__ = deepcopy
        return jitted

    def _staged_call(self, args: tuple, kwargs: dict):
        """The stand-in's body, called by ``jax.jit`` with static arguments as values
        and every dynamic leaf as a tracer of its trace."""
        if self._weak_error is not None:
            raise TypeError(*self._weak_error.args)
        dyn_args, dyn_kwargs, statics = self._split_statics(args, kwargs)
        leaves, tree = tree_util.tree_flatten((dyn_args, dyn_kwargs))
        if jax.config.jax_disable_jit or not all(isinstance(x, jax.core.Tracer) for x in leaves):
            # jax.jit calls its function on concrete values only when jit is disabled
            # (jax.disable_jit): then it runs the Python function, and so do we.
            return self._fun(*args, **kwargs)
        avals = [jax.typeof(x) for x in leaves]
        key = (tree, _statics_key(statics), trace_context(), *avals)
        entry = self._cache.get(key)
        if entry is None:
            entry, _ = self._add_entry(key, statics, tree, avals, leaves)
        return entry.run(leaves)

    def _split_statics(self, args: tuple, kwargs: dict):
        """(dynamic args, dynamic kwargs, statics) as ``jax.jit`` splits them with its
        resolved static_argnums/static_argnames."""
        if not self._has_statics:
            return args, kwargs, None
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

    # ------------------------------------------------------------ new signature
    def _add_entry(self, key, statics, tree, avals, leaves) -> _Entry:
        target = self._bind_statics(statics)
        # Arrays are traced at their types; other leaves (tokens) as themselves, and
        # so are jax.Ref arguments: a ShapeDtypeStruct has no Ref type, and the
        # program must read and write the caller's Ref as jax.jit's trace does.
        specs = [_spec(a) if hasattr(a, "shape") and not isinstance(a, jax.ref.AbstractRef)
                 else x for a, x in zip(avals, leaves)]
        spec_args, spec_kwargs = tree_util.tree_unflatten(tree, specs)
        # Errors raised by the user's function propagate unchanged from here.
        from .closure.session import jax_errors, patterns_when_given
        from .frontend.trace import trace_call
        with jax_errors(), patterns_when_given():  # as jax.jit would raise them
            program = trace_call(target, tuple(spec_args), dict(spec_kwargs))
        program = _run_pipeline(program, self._pipeline, self._label)
        entry = _Entry(program, forward_mode=self._forward_mode)
        if not _holds_tracers(program):
            # A program that closed over a tracer of an enclosing transformation is
            # only valid inside that trace: use it once, never cache it.
            self._cache[key] = entry
        return entry, program

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
        with_statics.__name__ = _fun_name(fun)
        with_statics.__wrapped__ = fun  # JAX's errors locate the user's function
        if self._signature is not None:
            # trace() names the program's inputs after the remaining parameters.
            taken = {i for i, _ in static_pos} | set(static_kw)
            params = [p for i, p in enumerate(self._signature.parameters.values())
                      if i not in taken and p.name not in taken]
            with_statics.__signature__ = self._signature.replace(parameters=params)
        return with_statics

    def _donated_leaves(self, dyn_args: tuple, dyn_kwargs: dict, statics) -> list[int]:
        """Flat argument-leaf indices of the donated arguments: positional ones by
        donate_argnums, keyword ones by name (JAX resolves donate_argnums and
        donate_argnames to each other through the signature, so an argument donated
        by position is donated when passed by keyword too, as in jax.jit)."""
        if not self._donate_nums and not self._donate_names:
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
        # Keyword leaves follow the positional ones, in the dict's flattening order
        # (sorted keys).
        for name in sorted(dyn_kwargs):
            n = tree_util.tree_structure(dyn_kwargs[name]).num_leaves
            if name in self._donate_names:
                leaves.update(range(pos, pos + n))
            pos += n
        return sorted(leaves)

    # ---------------------------------------------------------- inspection
    def program(self, /, *args, **kwargs) -> Program:
        """The program (after the pipeline) that runs for these arguments, with
        their placements on a device mesh (this ``jit``'s in_shardings, else the
        committed arrays' shardings) as its ``arg_shardings``, as
        :func:`jaxpr_cc.trace` records them, so that :func:`jaxpr_cc.compile`
        lays the arguments out as this ``jit`` does."""
        _, program, dyn_args, dyn_kwargs, _, leaves = self._entry_for(args, kwargs)
        placed = traced_arg_shardings(tuple(dyn_args), dict(dyn_kwargs))
        given = self._options.get("in_shardings")
        if given is not None:
            args_tree, kwargs_tree = program.in_tree.children()
            flat_given = xla._flat_arg_shardings(program, given, args_tree, kwargs_tree)
            placed = tuple(g if g is not None else (None if placed is None else placed[i])
                           for i, g in enumerate(flat_given))
            if all(s is None for s in placed):
                placed = None
        # The cached program is shared by every call with these types; the
        # placements belong to these arguments (a shallow copy: passes copy).
        return program if placed == program.arg_shardings else program.replace(arg_shardings=placed)

    def executable(self, /, *args, **kwargs) -> xla.Executable:
        """The program for these arguments compiled with :func:`jaxpr_cc.compile`,
        placed as this ``jit`` places it (its in_shardings/out_shardings, else the
        arguments' committed shardings; its donated arguments): an
        :class:`~jaxpr_cc.Executable` that can be saved and loaded elsewhere."""
        entry, program, dyn_args, dyn_kwargs, statics, leaves = self._entry_for(args, kwargs)
        args_tree, kwargs_tree = program.in_tree.children()
        given = self._options.get("in_shardings")
        if given is not None and dyn_kwargs:
            # jax.jit's rule (and its words): in_shardings place positional arguments.
            raise ValueError("pjit does not support kwargs when in_shardings is specified.")
        flat_given = (xla._flat_arg_shardings(program, given, args_tree, kwargs_tree)
                      if given is not None else [None] * len(leaves))
        committed = [xla._committed_sharding(x) for x in leaves]
        for g, c, x in zip(flat_given, committed, leaves):
            _check_committed_placement(g, c, x)
        arg_shardings = [g if g is not None else c for g, c in zip(flat_given, committed)]
        donated = self._donated_leaves(dyn_args, dyn_kwargs, statics)
        on_device = self._device_sharding()
        if on_device is not None:
            arg_shardings = [on_device] * len(leaves)
        place = (tuple(arg_shardings), tuple(donated))
        exe = entry.executables.get(place)
        if exe is None:
            exe = xla.compile_flat(program, arg_shardings,
                                   out_shardings=self._options.get("out_shardings"),
                                   donated=donated,
                                   compiler_options=self._options.get("compiler_options"),
                                   on_device=on_device,
                                   keep_unused=bool(self._options.get("keep_unused", False)))
            entry.executables[place] = exe  # holds its program
        return exe

    def _device_sharding(self):
        """Where jax.jit's deprecated ``device=``/``backend=`` put everything (every
        input and output on that one device, as jax.jit resolves them), else None."""
        device = self._options.get("device")
        backend = self._options.get("backend")
        if device is not None:
            return jax.sharding.SingleDeviceSharding(device)
        if backend is not None:
            return jax.sharding.SingleDeviceSharding(jax.local_devices(backend=backend)[0])
        return None

    def _entry_for(self, args, kwargs) -> tuple:
        dyn_args, dyn_kwargs, statics = self._split_statics(args, kwargs)
        leaves, tree = tree_util.tree_flatten((dyn_args, dyn_kwargs))
        avals = [_leaf_aval(x, self._label) for x in leaves]
        key = (tree, _statics_key(statics), trace_context(), *avals)
        try:
            entry = self._cache.get(key)
        except TypeError:
            raise self._unhashable(statics) from None
        if entry is None:
            entry, _ = self._add_entry(key, statics, tree, avals, leaves)
        return entry, entry.program, dyn_args, dyn_kwargs, statics, leaves

    def cache_size(self) -> int:
        """How many programs (input signatures) this function has traced."""
        return len(self._cache)

    def clear_cache(self) -> None:
        """Forget the traced programs (``jit(f).clear_cache()`` also clears
        jax.jit's caches of the stand-in)."""
        self._cache.clear()

    def __repr__(self) -> str:
        return f"<{self._label}>"


# --------------------------------------------------------------------- helpers
def _check_committed_placement(given, committed, x) -> None:
    """jax.jit's errors for an in_sharding that disagrees with where a committed
    argument is (it does not move a committed array behind the caller's back)."""
    if given is None or committed is None or not isinstance(
            given, jax.sharding.Sharding):
        return
    aval = jax.typeof(x)
    if given.memory_kind != committed.memory_kind:
        raise ValueError(f"Memory kinds passed to jax.jit does not match memory kind on the "
                         f"respective arg. Got jit memory kind: {given.memory_kind}, arg "
                         f"memory kind: {committed.memory_kind} for arg type: {aval}")
    if not given.is_equivalent_to(committed, x.ndim):
        raise ValueError(f"Sharding passed to jit does not match the sharding on the "
                         f"respective arg. Got jit sharding: {given},\narg sharding: "
                         f"{committed} for arg type: {aval}")


def _holding(fun: Callable, method: Callable) -> Callable:
    """``method`` of the state (which holds ``fun`` weakly) as a function that keeps
    ``fun`` alive, so that it works after the jit object is gone
    (``jaxpr_cc.jit(lambda a: ...).program(x)``)."""
    @functools.wraps(method)
    def call(*args, **kwargs):
        return method(*args, **kwargs)
    call.jaxpr_cc_function = fun
    return call


def _fun_name(fun: Any) -> str:
    while isinstance(fun, functools.partial):
        fun = fun.func
    return getattr(fun, "__qualname__", None) or getattr(fun, "__name__", None) or \
        type(fun).__name__


def _option_key(value):
    """A hashable form of a jit option (dicts, e.g. compiler_options, as sorted
    items); raises TypeError when there is none."""
    if isinstance(value, dict):
        return tuple(sorted((k, _option_key(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("list", tuple(_option_key(v) for v in value))
    return (type(value), value)


def _statics_key(statics):
    """Static values with their types: jax.jit tells 1, 1.0 and True apart, which
    compare (and hash) equal."""
    if statics is None:
        return None
    static_pos, static_kw = statics
    return (tuple((i, type(v), v) for i, v in static_pos),
            tuple((k, type(v), v) for k, v in static_kw))


def _leaf_aval(x: Any, label: str):
    try:
        return jax.typeof(x)
    except TypeError:
        raise TypeError(f"{label}: argument leaf of type {type(x).__name__} is not an array; "
                        f"mark it static with static_argnums/static_argnames") from None


def _spec(aval) -> jax.ShapeDtypeStruct:
    # With sharding in types (jax.set_mesh, Explicit axes) the program is traced at
    # the same sharded types as jax.jit traces the function.
    # Inside shard_map (check_vma) it is traced at the same varying manual axes,
    # so its collectives and its mixing of varying and invariant values type-check
    # as they do when jax.jit traces the function there.
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type,
                                manual_axis_type=manual_axis_type_of(aval),
                                **xla._typed_sharding(aval))


def _holds_tracers(program: Program) -> bool:
    values = list(program.params)
    for region in program.body.regions():
        values.extend(region.consts or ())
    return any(isinstance(v, jax.core.Tracer) for v in values)


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
