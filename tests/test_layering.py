"""Imports go downward: each subpackage imports only the layers below it.

Every ``import`` of a ``jaxpr_cc`` module (at module level or inside a function) is
read from the source.  The layer order is the pipeline's: the JAX adapter, file
storage (the writer and value codecs every file shares), the custom-rule core, the
IR, the frontend, the backends, the file format, rewrites and passes, and the drivers
on top.  No module imports a layer above its own, so no two subpackages import each
other.  The package root (``jaxpr_cc/__init__.py``) is above every layer: it exports
the public names and provides what ``Program``'s user methods need from the layers
above ``ir`` (``ir/program_services.py``).
"""
import ast
import pathlib
import textwrap

import networkx as nx

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "jaxpr_cc"

# Lowest first.  A module may import its own layer and any layer before it.
LAYERS = ["jax_adapter", "storage", "closure", "ir", "frontend", "backends", "io", "rewrite",
          "passes", "examples", "jit_function", "golden", "cli"]


def _layer_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "jaxpr_cc" or len(parts) < 2:
        return None  # the package itself (``from .. import jit``: the public API)
    return parts[1]


def _imports(root: pathlib.Path = PACKAGE):
    """(file relative to the package, imported module) for every jaxpr_cc import."""
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
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


def _upward_imports(root: pathlib.Path = PACKAGE) -> list[tuple[str, str]]:
    """(importing file, imported module) for every import of a layer above the file's."""
    upward = []
    for rel, target in _imports(root):
        mine, theirs = _own_layer(rel), _layer_of(target)
        if mine == "__init__" or theirs is None or theirs not in LAYERS or mine == theirs:
            continue
        if LAYERS.index(theirs) > LAYERS.index(mine):
            upward.append((rel, target))
    return upward


def test_imports_only_go_downward():
    assert _upward_imports() == []


def test_ir_imports_nothing_above_it():
    below_ir = LAYERS[:LAYERS.index("ir") + 1]
    for rel, target in _imports():
        if _own_layer(rel) == "ir" and _layer_of(target) is not None:
            assert _layer_of(target) in below_ir, (rel, target)


def test_no_import_cycle_between_subpackages():
    graph = nx.DiGraph()
    for rel, target in _imports():
        mine, theirs = _own_layer(rel), _layer_of(target)
        if mine == "__init__" or theirs is None or mine == theirs:
            continue
        graph.add_edge(mine, theirs)
    assert list(nx.simple_cycles(graph)) == []


def test_the_check_sees_upward_imports_at_module_and_function_level(tmp_path):
    # A copy of the layout with three upward imports: ir -> frontend inside a method,
    # backends -> io at module level (relative), closure -> ir (absolute).
    package = tmp_path / "jaxpr_cc"
    sources = {
        "__init__.py": "from .io import save\n",
        "ir/__init__.py": "",
        "ir/program.py": """
            from .region import Region
            from ..storage.pytrees import SavedNode

            class Program:
                def from_jaxpr(self):
                    from ..frontend.from_jaxpr import region_from_closed_jaxpr
        """,
        "backends/__init__.py": "",
        "backends/xla.py": "from ..io import pytrees\nfrom ..ir.program import Program\n",
        "closure/__init__.py": "",
        "closure/rules.py": "import jaxpr_cc.ir.region\nfrom ..jax_adapter import Primitive\n",
    }
    for name, source in sources.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(textwrap.dedent(source))
    assert sorted(_upward_imports(package)) == [
        ("backends/xla.py", "jaxpr_cc.io"),
        ("closure/rules.py", "jaxpr_cc.ir.region"),
        ("ir/program.py", "jaxpr_cc.frontend.from_jaxpr"),
    ]


def test_program_services_are_provided_by_the_package_root():
    import jaxpr_cc  # noqa: F401  (the root provides them on import)
    from jaxpr_cc.ir import program_services
    assert program_services.missing() == []
