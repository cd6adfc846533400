"""What ``Program``'s user methods need from the layers above ``ir``.

``Program`` is defined in ``ir``, the layer every other one builds on, but four of its
public methods are served by layers above it: ``Program.from_jaxpr`` by the frontend,
``program.to_jaxpr()`` and ``program(*args)`` by the jaxpr backend (and, when the call
is differentiated, by the forward-mode rewrite in ``passes``), ``program.save(path)``
by the saved-program format (``io``).  ``ir`` imports nothing above it
(tests/test_layering.py), so the dependency is inverted: this module names each service
Program needs, with its signature, and the package root (``jaxpr_cc/__init__.py``)
provides them.  The root sits above every layer and Python always runs it before any
module of the package, so the services are in place before a ``Program`` can exist.

Inverting rather than moving the methods keeps them on ``Program`` with their
signatures and docstrings (they are the public API), and keeps each implementation in
the layer that owns it.
"""
from __future__ import annotations

from typing import Any, Callable

# name -> what provides it (for the message when it is missing)
_SERVICES = {
    "region_from_closed_jaxpr": "jaxpr_cc.frontend.from_jaxpr",
    "region_to_closed_jaxpr": "jaxpr_cc.backends.jaxpr",
    "forward_mode_jaxpr": "jaxpr_cc.passes.vjp_to_jvp",
    "forward_mode_region": "jaxpr_cc.passes.vjp_to_jvp",
    "with_forward_mode": "jaxpr_cc.passes.vjp_to_jvp",
    "save_program": "jaxpr_cc.io.api",
}
_provided: dict[str, Callable[..., Any]] = {}


def provide(**services: Callable[..., Any]) -> None:
    """Install the implementation of each named service (called by ``jaxpr_cc/__init__.py``)."""
    unknown = sorted(set(services) - set(_SERVICES))
    if unknown:
        raise ValueError(f"provide: unknown Program services {unknown}; the services are "
                         f"{sorted(_SERVICES)}")
    _provided.update(services)


def missing() -> list[str]:
    """The services not provided yet (empty once ``jaxpr_cc`` is imported)."""
    return [name for name in _SERVICES if name not in _provided]


def _service(name: str) -> Callable[..., Any]:
    try:
        return _provided[name]
    except KeyError:
        raise RuntimeError(
            f"Program needs {name} from {_SERVICES[name]}, which jaxpr_cc/__init__.py provides "
            f"when the package is imported; import jaxpr_cc completely before using Program"
        ) from None


def region_from_closed_jaxpr(closed_jaxpr, arg_names):
    """The IR region of a ``ClosedJaxpr``, its inputs named ``arg_names`` (or None)."""
    return _service("region_from_closed_jaxpr")(closed_jaxpr, arg_names)


def region_to_closed_jaxpr(region):
    """A region back as a ``ClosedJaxpr``."""
    return _service("region_to_closed_jaxpr")(region)


def forward_mode_jaxpr(program):
    """``program`` as a ``ClosedJaxpr`` whose custom_vjp rules also have a forward mode,
    for evaluation under JAX's autodiff."""
    return _service("forward_mode_jaxpr")(program)


def forward_mode_region(region):
    """``region`` with forward mode through the custom_vjp rules it calls (a rewritten
    copy), or None when it calls none (the Python backend's forward-mode primals)."""
    return _service("forward_mode_region")(region)


def with_forward_mode(program):
    """``program`` with a forward mode through its custom_vjp rules (the rewrite a
    Program's differentiated call evaluates): a rewritten copy, or ``program`` itself
    when it has no custom_vjp call (the Python backend emits this one)."""
    return _service("with_forward_mode")(program)


def save_program(program, path) -> None:
    """Write ``program`` to ``path`` in the saved-program format."""
    _service("save_program")(program, path)
