"""SSA values of the graph IR.

A ``Value`` is defined exactly once: by an equation's output slot, or by a region
(its inputs and constants).  Operands that are not values are JAX ``Literal``s,
which are immutable and carry no use-def edges.
"""
from __future__ import annotations

from typing import Any, Union

from ..jax_adapter import Literal


class Value:
    """An SSA value: its abstract value, its definer and a naming hint."""

    __slots__ = ("aval", "producer", "index", "name")

    def __init__(self, aval, producer=None, index: int = 0, name: str | None = None):
        self.aval = aval
        # An Equation, or the RegionEntry of the region that binds it.
        self.producer = producer
        # Position among the producer's results (or among the region's binders).
        self.index = index
        # A human-readable hint ("x", "params.w"), used by printers and code generation.
        self.name = name

    def __repr__(self) -> str:
        hint = f" {self.name!r}" if self.name else ""
        return f"<Value{hint} {self.aval.str_short() if hasattr(self.aval, 'str_short') else self.aval}>"


Atom = Union[Value, Literal]


def is_literal(atom: Any) -> bool:
    return isinstance(atom, Literal)
