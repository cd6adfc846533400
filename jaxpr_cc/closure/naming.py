"""Best-effort Python names and source locations for rules and closed-over values,
so errors can say "closes over 'k'" rather than "closes over const 3"."""
from __future__ import annotations

import functools
import inspect
import os
from typing import Any, Iterable

from .. import jax_adapter as jx


def source_of(fn: Any) -> str:
    label = jx.wrapped_fun_label(fn)
    if label is not None:
        return label[1]
    fn = _unwrap(jx.wrapped_fun_target(fn))
    code = getattr(fn, "__code__", None)
    if code is None:
        return "<unknown>"
    return f"{os.path.basename(code.co_filename)}:{code.co_firstlineno}"


def name_of(fn: Any) -> str:
    """The name of the Python function ``fn`` (a ``WrappedFun``'s: the user's
    function, also when JAX staged it behind a thunk of its own)."""
    label = jx.wrapped_fun_label(fn)
    if label is not None:
        return label[0]
    fn = _unwrap(jx.wrapped_fun_target(fn))
    return getattr(fn, "__name__", None) or type(fn).__name__


def _unwrap(fn: Any) -> Any:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__wrapped__", fn) if not hasattr(fn, "__code__") else fn


def const_names(values: list, roots: Iterable[Any]) -> tuple[str, ...]:
    """Names for ``values`` found by identity in the closures, partial arguments and
    referenced globals of ``roots`` (searched breadth-first, a few levels deep)."""
    wanted = {id(v): i for i, v in enumerate(values)}
    names: dict[int, str] = {}
    seen: set[int] = set()
    frontier = [(r, "") for r in roots]
    for _ in range(4):
        nxt = []
        for obj, prefix in frontier:
            if id(obj) in seen or obj is None:
                continue
            seen.add(id(obj))
            for label, child in _children(obj):
                full = f"{prefix}{label}"
                if id(child) in wanted and id(child) not in names:
                    names[id(child)] = full
                if callable(child) or isinstance(child, (tuple, list)):
                    nxt.append((child, ""))
        frontier = nxt
    return tuple(names.get(id(v), f"const{i}") for i, v in enumerate(values))


def _children(obj: Any):
    if isinstance(obj, functools.partial):
        for i, a in enumerate(obj.args):
            yield f"arg{i}", a
        for k, a in (obj.keywords or {}).items():
            yield k, a
        yield "func", obj.func
        return
    if isinstance(obj, (tuple, list)):
        for a in obj:
            yield "item", a
        return
    code = getattr(obj, "__code__", None)
    closure = getattr(obj, "__closure__", None)
    if code is not None and closure:
        for name, cell in zip(code.co_freevars, closure):
            try:
                yield name, cell.cell_contents
            except ValueError:
                continue
    if code is not None:
        glb = getattr(obj, "__globals__", {})
        for name in code.co_names:
            if name in glb and not inspect.ismodule(glb[name]):
                yield name, glb[name]
    inner = getattr(obj, "fun", None)  # jax.custom_vjp / custom_jvp objects
    if inner is not None:
        yield "fun", inner
