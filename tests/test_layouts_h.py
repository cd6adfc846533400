"""Loop and closed-over-operand params are named only by ``jaxpr_cc/ir`` and
``jaxpr_cc/jax_adapter.py``: passes and backends read operand layouts from
``jaxpr_cc.ir.layouts`` (``constant_groups``, ``loop_of``, ``resized_params``,
``closed_over_count``), so a change in how JAX stores them is one edit there.

The few modules still allowed to name one are listed with the reason; an entry
that no longer names its param must be removed, so the list only shrinks."""
from __future__ import annotations

import ast
import pathlib

import jaxpr_cc

PACKAGE = pathlib.Path(jaxpr_cc.__file__).parent

#: Params whose names only the layout table and the adapter may spell.  ``linear``
#: (scan's per-operand flags) is a common word, so only ``linear=`` keywords count.
LOOP_PARAMS = {"body_nconsts", "cond_nconsts", "num_consts", "num_carry"}
KEYWORD_ONLY = {"linear"}

#: (module, param) -> why that module may still name it.
ALLOWED = {
    ("passes/transpose.py", "num_consts"): "builds the transposed scan's params",
    ("passes/transpose.py", "num_carry"): "builds the transposed scan's params",
    ("passes/transpose.py", "cond_nconsts"): "builds the transposed while's params",
    ("passes/transpose.py", "body_nconsts"): "builds the transposed while's params",
    # jaxpr_cc's own first-order custom rules (defined in closure/ir_rules.py) store
    # their closed-over count as ``num_consts``: these modules construct such rules.
    ("closure/ir_rules.py", "num_consts"): "defines the custom-rule equation form",
    ("closure/rules.py", "num_consts"): "the JVPRule field of that name",
    ("closure/session.py", "num_consts"): "constructs custom rules",
    ("frontend/staged_rules.py", "num_consts"): "rebuilds staged custom-rule params",
    ("passes/vjp_to_jvp.py", "num_consts"): "rewrites custom_vjp into linear_call params",
    ("passes/implicit_diff.py", "num_consts"): "constructs a custom rule (JVPRule field)",
    ("passes/stable_log1pexp.py", "num_consts"): "constructs a custom rule (JVPRule field)",
    # The keyword of the emitted runtime helper _custom_vjp_with_consts (our own
    # API, spelled in emitted code).
    ("backends/python_custom.py", "num_consts"): "keyword of the emitted helper",
}


def _named_params(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in LOOP_PARAMS:
            names.add(node.value)
        elif isinstance(node, ast.keyword) and node.arg in LOOP_PARAMS | KEYWORD_ONLY:
            names.add(node.arg)
    return names


def _hits() -> dict[tuple[str, str], None]:
    hits = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("ir/") or rel == "jax_adapter.py":
            continue
        for name in _named_params(ast.parse(path.read_text(), filename=str(path))):
            hits[(rel, name)] = None
    return hits


def test_only_ir_and_adapter_name_loop_params():
    unexpected = sorted(h for h in _hits() if h not in ALLOWED)
    assert not unexpected, (
        f"modules outside jaxpr_cc/ir and jax_adapter.py name layout params {unexpected}: "
        "read them through jaxpr_cc.ir.layouts (loop_of, constant_groups, resized_params, "
        "closed_over_count) instead")


def test_allow_list_only_shrinks():
    stale = sorted(set(ALLOWED) - set(_hits()))
    assert not stale, f"no longer named, remove from ALLOWED: {stale}"


def test_detector_sees_a_param_read_and_a_keyword():
    tree = ast.parse("n = eqn.params['body_nconsts']\nf(linear=(False,))\ng('linear')")
    assert _named_params(tree) == {"body_nconsts", "linear"}
