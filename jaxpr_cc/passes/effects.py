"""Which equations the optimizing passes must leave alone.

Three questions, answered from a table keyed by primitive name plus the
equation's JAX effects (and, for equations with nested regions, what is inside):

* ``has_side_effects`` -- may ``dce`` drop it when its results are unused?  No if it
  carries an effect JAX's own DCE keeps (printing, ordered I/O, state writes), or
  it is a host callback (even ``pure_callback``, which JAX may drop: a user who
  wrote a callback usually wants it run), or a nested region contains such an
  equation.
* ``is_mergeable`` -- may ``cse`` merge it with an identical equation?  Not if it
  has any effect other than a named-axis dependence (collectives are pure
  functions of their operands), is a callback, generates random bits, or nests
  any of those.
* ``is_random`` / ``is_callback`` -- the table lookups themselves.

Results for regions are cached per :class:`EffectOracle`, which a pass creates
for one run (regions change between runs).
"""
from __future__ import annotations

from ..ir.equation import Equation
from ..ir.region import Region
from ..jax_adapter import is_named_axis_effect, is_removable_effect
from .signature import has_regions

#: Primitives that call back into the host Python process.
CALLBACK_PRIMITIVES = frozenset({
    "debug_callback", "debug_print", "pure_callback", "io_callback", "callback",
    "outside_call", "host_callback_call", "inside_call",
})

#: Primitives that produce or derive random bits.  They are deterministic
#: functions of their key, but merging two of them would silently correlate
#: samples a user meant to draw twice (and ``rng_uniform`` is stateful).
RANDOM_PRIMITIVES = frozenset({
    "random_bits", "random_seed", "random_split", "random_fold_in", "random_clone",
    "rng_bit_generator", "rng_uniform", "threefry2x32",
})


def is_callback(eqn: Equation) -> bool:
    return eqn.prim.name in CALLBACK_PRIMITIVES


def is_random(eqn: Equation) -> bool:
    return eqn.prim.name in RANDOM_PRIMITIVES


def has_kept_effects(eqn: Equation) -> bool:
    """The equation carries an effect that JAX's own DCE would not drop."""
    effects = eqn.effects
    return bool(effects) and any(not is_removable_effect(e) for e in effects)


def has_unmergeable_effects(eqn: Equation) -> bool:
    effects = eqn.effects
    return bool(effects) and any(not is_named_axis_effect(e) for e in effects)


class EffectOracle:
    """Answers the questions above, caching per-region results for one pass run."""

    def __init__(self):
        self._side: dict[int, bool] = {}
        self._unmergeable: dict[int, bool] = {}
        self._keep: list[Region] = []  # keeps cached regions alive, so ids stay unique

    def has_side_effects(self, eqn: Equation) -> bool:
        if eqn.effects and has_kept_effects(eqn):
            return True
        if eqn.prim.name in CALLBACK_PRIMITIVES:
            return True
        if has_regions(eqn):
            return any(self._region_flag(sub, self._side, self._eqn_side)
                       for _, _, sub in eqn.regions())
        return False

    def is_mergeable(self, eqn: Equation) -> bool:
        return not self._eqn_unmergeable(eqn)

    # ----------------------------------------------------------- internals
    def _eqn_side(self, eqn: Equation) -> bool:
        return self.has_side_effects(eqn)

    def _eqn_unmergeable(self, eqn: Equation) -> bool:
        name = eqn.prim.name
        if name in CALLBACK_PRIMITIVES or name in RANDOM_PRIMITIVES:
            return True
        if eqn.effects and has_unmergeable_effects(eqn):
            return True
        if has_regions(eqn):
            return any(self._region_flag(sub, self._unmergeable, self._eqn_unmergeable)
                       for _, _, sub in eqn.regions())
        return False

    def _region_flag(self, region: Region, cache: dict, test) -> bool:
        key = id(region)
        hit = cache.get(key)
        if hit is None:
            # A region that calls itself adds no effect through the cycle: answer False
            # for it while its equations are being examined.
            cache[key] = False
            hit = cache[key] = any(test(e) for e in region.equations)
            self._keep.append(region)
        return hit

    def forget(self, region: Region) -> None:
        """Drop cached answers for ``region`` after a pass changed it."""
        self._side.pop(id(region), None)
        self._unmergeable.pop(id(region), None)
