"""Helpers shared by the implicit-diff tests."""
import jaxpr_cc
from jaxpr_cc.passes.manager import PassManager


def rewrite_with_stats(fun, *args):
    """The traced program, its implicit-diff rewrite and the pass's statistics."""
    pm = PassManager("implicit-diff")
    program = jaxpr_cc.trace(fun, *args)
    new = pm.run(program)
    return program, new, dict(pm.statistics)["implicit-diff"]


def reasons(stats) -> str:
    """The statistics' reasons for loops left alone, on one line."""
    return " | ".join(k for k in stats if k.startswith("loop "))
