"""The module view of a Program: its named functions.

A Program is a module.  Its entry function is ``program.body``; every other region
is reached through a call-like equation's params (a ``jit`` body, a loop body, a
``cond`` branch, a custom rule's fwd / bwd / jvp).  Equations hold the Region they
call, so a region JAX traced once and called from many sites is one Region object,
and a custom rule that calls its own custom function is a cycle in the call graph.

A region called from more than one site (or, through a cycle, from itself) is a
*named function* of the module: the printer prints it once and every call site
refers to it by symbol (``@name``); the file format stores it once.  A region called
from exactly one site is printed inline there.  Names are assigned in a fixed
pre-order walk from the entry, so the same module always gets the same names.
"""
from __future__ import annotations

import re

from .region import Region

_IDENT = re.compile(r"[^A-Za-z0-9_]")

# The params through which a region may (indirectly) call itself: the bodies of custom
# rules (fwd, bwd, jvp, transpose), which JAX runs only when it differentiates, so a
# recursive rule unfolds one level per derivative order.  Any other cycle (a loop body
# that contains its own loop) would never end.
RECURSIVE_PARAMS = frozenset({"fwd_jaxpr", "bwd_jaxpr", "jvp_jaxpr", "transpose_jaxpr",
                              "jvp_variants", "fwd_variants", "bwd_variants",
                              "transpose_variants"})


def endless_cycle(entry: Region) -> str | None:
    """A description of a cycle in the call graph that does not pass through a
    custom rule's body (see ``RECURSIVE_PARAMS``), or None when there is none."""
    import networkx as nx
    graph = nx.DiGraph()
    for region in entry.regions():
        graph.add_node(id(region))
        for eqn in region._order:
            for key, _, callee in eqn.regions():
                if key not in RECURSIVE_PARAMS:
                    graph.add_edge(id(region), id(callee), label=f"{eqn.prim.name}.{key}")
    try:
        cycle = nx.find_cycle(graph)
    except nx.NetworkXNoCycle:
        return None
    return " -> ".join(graph.edges[u, v]["label"] for u, v in cycle)


def call_counts(entry: Region) -> dict[int, int]:
    """How many param slots refer to each region reachable from ``entry`` (by id)."""
    counts: dict[int, int] = {}
    for region in entry.regions():
        for eqn in region._order:
            for _, _, callee in eqn.regions():
                counts[id(callee)] = counts.get(id(callee), 0) + 1
    return counts


def recursive_regions(entry: Region) -> set[int]:
    """Ids of the regions that (through some chain of calls) call themselves."""
    import networkx as nx
    graph = nx.DiGraph()
    for region in entry.regions():
        for eqn in region._order:
            for _, _, callee in eqn.regions():
                graph.add_edge(id(region), id(callee))
    found: set[int] = set()
    for component in nx.strongly_connected_components(graph):
        if len(component) > 1 or any(graph.has_edge(n, n) for n in component):
            found |= component
    return found


def function_names(entry: Region, entry_name: str, *, shared: bool = True) -> dict[int, str]:
    """Symbol names for the module's named functions, by region id.

    The entry is always named ``entry_name``; every other region called from more
    than one site (with ``shared``; else only recursive ones) gets a name from its
    first call site, made unique with a numeric suffix.
    """
    counts = call_counts(entry)
    if not shared:
        recursive = recursive_regions(entry)
        counts = {rid: (2 if rid in recursive else 1) for rid in counts}
    names = {id(entry): entry_name}
    taken = {entry_name}
    for region in entry.regions():
        for eqn in region._order:
            for key, idx, callee in eqn.regions():
                if id(callee) in names or counts.get(id(callee), 0) < 2:
                    continue
                base = _IDENT.sub("_", _symbol_base(eqn, key, callee)) or "fn"
                name, n = base, 1
                while name in taken:
                    n += 1
                    name = f"{base}_{n}"
                taken.add(name)
                names[id(callee)] = name
    return names


# Params that hold the function a call-like equation calls (its name is the call's);
# any other region param is a part of it (a rule body, a loop body) named after both.
_CALLEE_PARAMS = frozenset({"jaxpr", "call_jaxpr", "callee", "fun_jaxpr"})


def _symbol_base(eqn, key: str, callee: Region) -> str:
    """A call's name when it has one (``jit``'s function name, a custom rule's), else
    the primitive and the param (``cond_branches``, ``while_body``).  Names come from
    the program's structure only, so a program and its re-traced emitted Python agree."""
    name = eqn.params.get("name")
    part = key.removesuffix("_jaxpr")
    if not name:
        return eqn.prim.name if key in _CALLEE_PARAMS else f"{eqn.prim.name}_{part}"
    if key in _CALLEE_PARAMS:
        return str(name)
    return f"{name}_{part}"


def functions(entry: Region, entry_name: str) -> dict[str, Region]:
    """The module's function table: ``{name: region}``, entry first, then the named
    functions in the order they are first called."""
    names = function_names(entry, entry_name)
    by_id = {id(r): r for r in entry.regions()}
    return {name: by_id[rid] for rid, name in names.items()}
