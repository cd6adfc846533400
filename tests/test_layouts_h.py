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
    ("closure/transpose.py", "num_consts"): "builds the transposed scan's params",
    ("closure/transpose.py", "num_carry"): "builds the transposed scan's params",
    ("closure/transpose.py", "cond_nconsts"): "builds the transposed while's params",
    ("closure/transpose.py", "body_nconsts"): "builds the transposed while's params",
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


# ----------------------------------------------------------------- loop layouts
def _loops():
    import jax
    import jax.numpy as jnp

    x = jnp.linspace(0.0, 1.0, 3, dtype=jnp.float32)
    w = jnp.float32(0.5)

    def while_prog(x, w):
        # The condition closes over ``limit``, the body over ``w``: one constant each.
        limit = jnp.sum(x) + 3.0

        def cond(c):
            return c[1] < limit

        def body(c):
            a, s, i = c
            return a * w, s + 1.0, i + 1

        return jax.lax.while_loop(cond, body, (x, jnp.float32(0.0), 0))

    def scan_prog(x, w):
        def step(carry, xs):
            a, b = carry
            return (a * w + xs, b), (a + xs, xs * 2.0)

        return jax.lax.scan(step, (jnp.float32(1.0), w), x)

    return [(while_prog, (x, w)), (scan_prog, (x, w))]


def _avals(atoms):
    return [a.aval for a in atoms]


def test_loop_layout_agrees_with_the_loops_jax_stages():
    import jaxpr_cc
    from jaxpr_cc.ir.layouts import loop_of, resized_params, structural_params

    seen = set()
    for fun, args in _loops():
        program = jaxpr_cc.trace(fun, *args)
        for region in program.body.regions():
            for eqn in region.equations:
                loop = loop_of(eqn)
                if loop is None:
                    continue
                seen.add(eqn.prim.name)
                carry = eqn.inputs[loop.carry_start:loop.carry_start + loop.n_carry]
                assert loop.carry_start + loop.n_carry + loop.n_xs == len(eqn.inputs)
                # The final carry has the types of the initial one.
                assert _avals(eqn.outputs[:loop.n_carry]) == _avals(carry)
                group = loop.groups[loop.step_group]
                step = loop.step.region(eqn)
                n = loop.group_size(loop.step_group)
                assert _avals(step.invars[:n]) == _avals(eqn.inputs[group.start:group.stop])
                assert _avals(step.invars[n:n + loop.n_carry]) == _avals(carry)
                assert len(step.invars) == n + loop.n_carry + loop.n_xs
                assert _avals(step.outvars[:loop.n_carry]) == _avals(carry)
                assert len(step.outvars) == len(eqn.outputs)
                for slot, g in loop.tests:
                    test = slot.region(eqn)
                    outer = eqn.inputs[loop.groups[g].start:loop.groups[g].stop]
                    assert _avals(test.invars) == _avals(outer) + _avals(carry)
                    assert len(test.outvars) == 1
                # Keeping everything changes nothing; the layout names only real params.
                assert resized_params(eqn, [True] * len(eqn.inputs),
                                      [True] * len(eqn.outputs)) == eqn.params
                assert structural_params(eqn) <= set(eqn.params)
    assert seen == {"while", "scan"}
    # The while program closes over one value in its condition and one in its body.
    fun, args = _loops()[0]
    while_eqn = next(e for e in jaxpr_cc.trace(fun, *args).body.equations
                     if e.prim.name == "while")
    loop = loop_of(while_eqn)
    assert [loop.group_size(i) for i in range(2)] == [1, 1] and loop.n_carry == 3
