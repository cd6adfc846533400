"""Structural and type checks of the graph IR.

Structure is checked here (definitions before uses, graph edges agreeing with
operand lists, no dangling nodes); types are checked by emitting the jaxpr and
running JAX's own ``check_jaxpr``, so our notion of well-typed is JAX's.
"""
from __future__ import annotations

from typing import Iterator

from .equation import Equation
from .region import Region, RegionEntry
from .value import Value, is_literal


class VerificationError(ValueError):
    """The program is malformed; the message names the equation and the value."""


def _where(path: str, i: int, eqn: Equation) -> str:
    return f"{path}: equation #{i} ({eqn.prim.name})"


def verify_region(region: Region, path: str = "body", _seen: set | None = None) -> None:
    """Check ``region`` and every region it calls, each once (a function called from
    many sites, or recursively, is checked once, at the first path that reaches it)."""
    if _seen is None:
        _seen = set()
    if id(region) in _seen:
        return
    _seen.add(id(region))
    defined: set = set()
    binders = region.constvars + region.invars
    for k, v in enumerate(binders):
        if v.producer is not region.entry or v.index != k:
            raise VerificationError(f"{path}: binder {k} ({v!r}) is not defined by this region")
        defined.add(v)
    if region.consts is not None and len(region.consts) != len(region.constvars):
        raise VerificationError(
            f"{path}: {len(region.constvars)} constant binders but {len(region.consts)} constants")
    g = region.graph
    # networkx's documented adjacency structure (``pred[v][u][key] = data``, as
    # ir/graph_build.py writes it), read directly: its accessor methods cost more
    # than the check itself on every operand.
    pred, nodes = g._pred, g._node
    for i, eqn in enumerate(region._order):
        if eqn.region is not region or eqn not in nodes:
            raise VerificationError(f"{_where(path, i, eqn)} is not linked into this region's graph")
        eqn_pred = pred[eqn]
        n_value_operands = 0
        for pos, atom in enumerate(eqn.inputs):
            if type(atom) is not Value:
                if is_literal(atom):
                    continue
                if not isinstance(atom, Value):
                    raise VerificationError(
                        f"{_where(path, i, eqn)}: operand {pos} is {atom!r}, not a value")
            n_value_operands += 1
            if atom not in defined:
                raise VerificationError(
                    f"{_where(path, i, eqn)}: operand {pos} ({atom!r}) is used before it is defined "
                    f"or is not defined in this region")
            keydict = eqn_pred.get(atom.producer)
            edge = keydict.get(pos) if keydict is not None else None
            if edge is None or edge["value"] is not atom:
                raise VerificationError(
                    f"{_where(path, i, eqn)}: operand {pos} ({atom!r}) has no matching use-def edge")
        in_degree = sum(map(len, eqn_pred.values())) if eqn_pred else 0
        if in_degree != n_value_operands:
            raise VerificationError(
                f"{_where(path, i, eqn)}: graph has {in_degree} operand edges, "
                f"equation has {n_value_operands} value operands")
        for k, out in enumerate(eqn.outputs):
            if out.producer is not eqn or out.index != k:
                raise VerificationError(f"{_where(path, i, eqn)}: result {k} ({out!r}) names another producer")
            defined.add(out)
        if eqn.has_regions():
            for key, idx, sub in eqn.regions():
                label = key if idx is None else f"{key}[{idx}]"
                verify_region(sub, f"{path}/{eqn.prim.name}#{i}.{label}", _seen)
    for pos, atom in enumerate(region.outvars):
        if is_literal(atom):
            continue
        if atom not in defined:
            raise VerificationError(f"{path}: output {pos} ({atom!r}) is not defined in this region")
        edge = g.get_edge_data(atom.producer, region.exit, key=pos)
        if edge is None or edge["value"] is not atom:
            raise VerificationError(f"{path}: output {pos} ({atom!r}) has no matching use-def edge")
    expected_nodes = len(region._order) + 2
    if g.number_of_nodes() != expected_nodes:
        stray = [n for n in g if not isinstance(n, RegionEntry) and n is not region.exit
                 and n not in region._order]
        raise VerificationError(f"{path}: dangling graph nodes not in the equation list: {stray[:3]!r}")


def verify_program(program, *, types: bool = True, first_order: bool = False) -> None:
    """Check ``program``; raise VerificationError naming what is wrong."""
    from ..jax_adapter import JaxprTypeError, check_jaxpr
    n_params = len(program.params)
    n_args = len(program.body.invars) - n_params
    if n_args != program.in_tree.num_leaves:
        raise VerificationError(
            f"{program.name}: {n_args} argument inputs but in_tree has {program.in_tree.num_leaves} leaves")
    if len(program.body.outvars) != program.out_tree.num_leaves:
        raise VerificationError(
            f"{program.name}: {len(program.body.outvars)} outputs but out_tree has "
            f"{program.out_tree.num_leaves} leaves")
    verify_region(program.body)
    if first_order:
        bad = first_order_violations(program)
        if bad:
            raise VerificationError(f"{program.name}: not first-order: {bad[0]}")
    if types:
        closed = program.to_jaxpr()
        try:
            check_jaxpr(closed.jaxpr)
        except JaxprTypeError as e:
            msg = " ".join(str(e).split())
            raise VerificationError(f"{program.name}: type error: {msg[:2000]}") from None


def first_order_violations(program) -> list[str]:
    """Where the program is not first-order: callables in params, nested constants."""
    from .printer import _is_function
    import jax
    # JAX's named checkpoint policies are data (saved and printed by name).
    named = {id(v) for v in vars(jax.checkpoint_policies).values() if callable(v)}
    found = []
    seen: set = set()

    def scan(region: Region, path: str, top: bool) -> Iterator[str]:
        if id(region) in seen:
            return
        seen.add(id(region))
        if not top and region.constvars:
            yield f"{path} carries {len(region.constvars)} constants"
        for i, eqn in enumerate(region._order):
            for k, v in eqn.params.items():
                for leaf in (v if isinstance(v, tuple) else (v,)):
                    if _is_function(leaf) and id(leaf) not in named:
                        yield f"{_where(path, i, eqn)}: parameter {k!r} is a Python callable"
            for key, idx, sub in eqn.regions():
                label = key if idx is None else f"{key}[{idx}]"
                yield from scan(sub, f"{path}/{eqn.prim.name}#{i}.{label}", False)

    found.extend(scan(program.body, "body", True))
    return found
