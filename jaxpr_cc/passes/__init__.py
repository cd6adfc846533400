"""passes stage of the jaxpr-cc pipeline.

Importing this package registers the built-in passes (``closure-convert``,
``hoist-consts``, ``cse``, ``dce``).  Passes of other packages are found through
the entry-point group ``jaxpr_cc.passes``: each entry point names a Pass subclass
(registered under the entry point's name unless it registered itself) or a
module whose import registers passes with ``@register_pass``.  They are loaded
the first time a pipeline string is parsed (``ensure_plugins_loaded``).
"""
from __future__ import annotations

import warnings

from . import closure_convert, cse, dce, hoist_consts  # noqa: F401  (registration)
from . import canonicalize, constant_fold, copy_propagation, simplify  # noqa: F401  (registration)
from . import implicit_diff, stable_log1pexp, straight_through, vjp_to_jvp  # noqa: F401
from .base import PASS_REGISTRY, Pass, PassContext, register_pass

ENTRY_POINT_GROUP = "jaxpr_cc.passes"

#: What ``jaxpr_cc.jit``, ``jaxpr-cc compile``, the demo and the goldens run.
DEFAULT_PIPELINE = "closure-convert,hoist-consts,cse,dce"
_plugins_loaded = False


def load_plugins(*, force: bool = False) -> list[str]:
    """Load passes from the ``jaxpr_cc.passes`` entry points; returns the entry-point
    names loaded.  A plugin that fails to load is reported as a warning naming the
    entry point, and skipped."""
    global _plugins_loaded
    if _plugins_loaded and not force:
        return []
    _plugins_loaded = True
    from importlib.metadata import entry_points
    loaded = []
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        try:
            obj = ep.load()
        except Exception as e:  # a broken plugin must not break jaxpr-cc
            warnings.warn(f"jaxpr-cc: pass plugin {ep.name!r} ({ep.value}) failed to load: "
                          f"{type(e).__name__}: {e}; it is skipped", RuntimeWarning, stacklevel=2)
            continue
        if isinstance(obj, type) and issubclass(obj, Pass) and obj not in PASS_REGISTRY.values():
            try:
                register_pass(ep.name)(obj)
            except (TypeError, ValueError) as e:
                warnings.warn(f"jaxpr-cc: pass plugin {ep.name!r} ({ep.value}): {e}; it is skipped",
                              RuntimeWarning, stacklevel=2)
                continue
        loaded.append(ep.name)
    return loaded


def ensure_plugins_loaded() -> None:
    if not _plugins_loaded:
        load_plugins()


def available_passes() -> dict[str, type[Pass]]:
    """Every registered pass by name, plugins included."""
    ensure_plugins_loaded()
    return dict(sorted(PASS_REGISTRY.items()))


__all__ = ["DEFAULT_PIPELINE", "PASS_REGISTRY", "Pass", "PassContext", "register_pass", "load_plugins",
           "ensure_plugins_loaded", "available_passes", "ENTRY_POINT_GROUP"]
