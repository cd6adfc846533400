"""Imports go downward: each subpackage imports only the layers below it.

Every ``import`` of a ``jaxpr_cc`` module (at module level or inside a function) is
read from the source.  The layer order is the pipeline's: the JAX adapter, the
custom-rule core, the IR, the frontend, the backends, the file format, rewrites and
passes, and the drivers on top.  The upward imports not yet removed are listed, each
with its reason; a new one fails, and so does a listed one that is gone (so the list
only shrinks).
"""
import ast
import pathlib

import networkx as nx

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "jaxpr_cc"

# Lowest first.  A module may import its own layer and any layer before it.
LAYERS = ["jax_adapter", "closure", "ir", "frontend", "backends", "io", "rewrite", "passes",
          "examples", "jit_function", "golden", "cli"]

# (importing file, imported layer): why it is still there.
KNOWN_UPWARD = {
    ("ir/program.py", "frontend"): "Program.from_jaxpr (user API)",
    ("ir/program.py", "backends"): "Program.to_jaxpr / __call__ (user API)",
    ("ir/program.py", "io"): "Program.save and saved pytree structures (user API)",
    ("ir/program.py", "passes"): "Program.__call__ under AD uses the forward-mode rewrite",
    ("ir/calling_convention.py", "io"): "SavedNode: custom pytree nodes read from files",
    ("backends/python_source.py", "io"): "write_python writes through io's atomic writer",
    ("backends/xla.py", "io"): "executables compare saved pytree structures",
    ("backends/xla_archive.py", "io"): "the executable archive shares io's codecs",
}


def _layer_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "jaxpr_cc" or len(parts) < 2:
        return None  # the package itself (``from .. import jit``: the public API)
    return parts[1]


def _imports():
    """(file relative to the package, imported module) for every jaxpr_cc import."""
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        module = ["jaxpr_cc", *rel.with_suffix("").parts]
        if module[-1] == "__init__":
            module = module[:-1]
        package = module if path.name == "__init__.py" else module[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[:len(package) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if not target.startswith("jaxpr_cc"):
                    continue
                if node.module is None or target == "jaxpr_cc":
                    for alias in node.names:
                        yield rel.as_posix(), f"{target}.{alias.name}"
                else:
                    yield rel.as_posix(), target
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("jaxpr_cc."):
                        yield rel.as_posix(), alias.name


def _own_layer(rel: str) -> str:
    first = rel.split("/")[0]
    return first[:-3] if first.endswith(".py") else first


def test_every_module_is_in_a_layer():
    layers = {_own_layer(rel) for rel, _ in _imports()} - {"__init__"}
    assert layers <= set(LAYERS), sorted(layers - set(LAYERS))


def test_imports_only_go_downward():
    upward = {}
    for rel, target in _imports():
        mine, theirs = _own_layer(rel), _layer_of(target)
        if mine == "__init__" or theirs is None or theirs not in LAYERS or mine == theirs:
            continue
        if LAYERS.index(theirs) > LAYERS.index(mine):
            upward.setdefault((rel, theirs), target)
    new = sorted(set(upward) - set(KNOWN_UPWARD))
    gone = sorted(set(KNOWN_UPWARD) - set(upward))
    assert not new, f"upward imports: {[(k, upward[k]) for k in new]}"
    assert not gone, f"removed upward imports still listed in KNOWN_UPWARD: {gone}"


def test_no_import_cycle_between_subpackages_outside_the_known_list():
    graph = nx.DiGraph()
    for rel, target in _imports():
        mine, theirs = _own_layer(rel), _layer_of(target)
        if mine == "__init__" or theirs is None or mine == theirs:
            continue
        if (rel, theirs) in KNOWN_UPWARD:
            continue
        graph.add_edge(mine, theirs)
    assert list(nx.simple_cycles(graph)) == []
