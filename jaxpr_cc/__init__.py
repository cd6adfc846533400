"""jaxpr-cc: a jaxpr-level source-transformation compiler for JAX.

Pipeline: ``frontend`` (trace Python / take ClosedJaxprs) -> ``closure`` (custom
rules made first-order) -> ``ir`` (graph IR on networkx) -> ``passes`` ->
``backends`` (jaxprs, Python source, XLA executables); ``io`` saves programs.

The public names are loaded on first use, so ``import jaxpr_cc`` (and the CLI, and
the pytest plugin) does not import libcst, XLA backends or the file format until
they are needed.
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> (module, attribute)
_EXPORTS = {
    "trace": ("jaxpr_cc.frontend.trace", "trace"),
    "Program": ("jaxpr_cc.ir.program", "Program"),
    "VerificationError": ("jaxpr_cc.ir.verifier", "VerificationError"),
    "closure_convert": ("jaxpr_cc.closure.api", "closure_convert"),
    "ClosedOverError": ("jaxpr_cc.closure.errors", "ClosedOverError"),
    "ClosureConversionError": ("jaxpr_cc.closure.errors", "ClosureConversionError"),
    "register_pass": ("jaxpr_cc.passes.base", "register_pass"),
    "run_passes": ("jaxpr_cc.passes.manager", "run_passes"),
    "PassManager": ("jaxpr_cc.passes.manager", "PassManager"),
    "PassError": ("jaxpr_cc.passes.manager", "PassError"),
    "PipelineError": ("jaxpr_cc.passes.pipeline", "PipelineError"),
    "DEFAULT_PIPELINE": ("jaxpr_cc.passes", "DEFAULT_PIPELINE"),
    "compile": ("jaxpr_cc.backends.xla", "compile"),
    "Executable": ("jaxpr_cc.backends.xla", "Executable"),
    "emit_python": ("jaxpr_cc.backends.python_source", "emit_python"),
    "write_python": ("jaxpr_cc.backends.python_source", "write_python"),
    "PythonEmitError": ("jaxpr_cc.backends.python_source", "PythonEmitError"),
    "jit": ("jaxpr_cc.jit_function", "jit"),
    "save": ("jaxpr_cc.io", "save"),
    "load": ("jaxpr_cc.io", "load"),
    "LoadError": ("jaxpr_cc.io", "LoadError"),
    "SaveError": ("jaxpr_cc.io", "SaveError"),
}

__all__ = sorted(_EXPORTS) + ["__version__"]


# Program lives in ir, which the later layers build on, yet some of its user methods are
# served by layers above ir (from_jaxpr, to_jaxpr, __call__, save).  ir may not import
# them, so ir/program_services.py names what Program needs and this module -- above
# every layer, and always run before any module of the package -- provides it.  Each
# provider imports its module when first called, so importing jaxpr_cc still loads no
# backend or file format.
def _region_from_closed_jaxpr(closed_jaxpr, arg_names):
    from .frontend.from_jaxpr import region_from_closed_jaxpr
    return region_from_closed_jaxpr(closed_jaxpr, arg_names)


def _region_to_closed_jaxpr(region):
    from .backends.jaxpr import region_to_closed_jaxpr
    return region_to_closed_jaxpr(region)


def _forward_mode_jaxpr(program):
    from .passes.vjp_to_jvp import forward_mode_jaxpr
    return forward_mode_jaxpr(program)


def _save_program(program, path) -> None:
    from .io.api import save
    save(program, path)


def _forward_mode_region(region):
    from .passes.vjp_to_jvp import forward_mode_region
    return forward_mode_region(region)


def _forward_mode_body(closed):
    from .passes.vjp_to_jvp import body_with_forward_mode
    return body_with_forward_mode(closed)


def _with_forward_mode(program):
    from .passes.vjp_to_jvp import with_forward_mode
    return with_forward_mode(program)


def _provide_program_services() -> None:
    from .ir import program_services
    program_services.provide(region_from_closed_jaxpr=_region_from_closed_jaxpr,
                             region_to_closed_jaxpr=_region_to_closed_jaxpr,
                             forward_mode_jaxpr=_forward_mode_jaxpr,
                             forward_mode_region=_forward_mode_region,
                             with_forward_mode=_with_forward_mode,
                             save_program=_save_program)
    # The closure layer's forward-mode columns run a rule's primal with forward mode
    # through the custom_vjp rules it calls: vjp-to-jvp's rewrite, a layer above.
    from .closure.rules import register_forward_mode_body
    register_forward_mode_body(_forward_mode_body)


_provide_program_services()


def _hide_own_frames() -> None:
    # Errors raised by the user's function under jaxpr_cc.jit, and the source
    # locations of what it traces, show the user's frames as under jax.jit.
    import os

    from .jax_adapter import hide_frames_of
    hide_frames_of(os.path.dirname(os.path.abspath(__file__)))


_hide_own_frames()


def __getattr__(name: str) -> Any:
    try:
        module, attr = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'jaxpr_cc' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
