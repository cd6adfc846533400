"""Test helper: import the Python module ``emit_python`` writes for a program."""
from __future__ import annotations

import importlib.util

import jaxpr_cc


def emitted_function(program, directory):
    """The function of ``program``'s emitted module, written to ``directory`` and
    imported from there (as a user would, without jaxpr-cc on the call path)."""
    path = directory / f"{program.name}.py"
    jaxpr_cc.write_python(program, path)
    spec = importlib.util.spec_from_file_location(f"emitted_{program.name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, program.name)
