"""jaxpr-cc: a jaxpr-level source-transformation compiler for JAX.

Pipeline: ``frontend`` (trace Python / take ClosedJaxprs) -> ``ir`` (graph IR on
networkx) -> ``passes`` -> ``backends`` (jaxpr, Python source, XLA executables).
"""
from .closure import ClosedOverError, ClosureConversionError, RuleDepthError
from .closure.api import closure_convert
from .frontend.trace import trace
from .ir.program import Program
from .ir.verifier import VerificationError

__version__ = "0.1.0"

__all__ = ["ClosedOverError", "ClosureConversionError", "Program", "RuleDepthError",
           "VerificationError", "closure_convert", "trace", "__version__"]
