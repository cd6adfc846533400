"""``closure.rules.forward_only`` as a first-order rule: a program that holds one can
be converted, saved and differentiated, and converting one staged in JAX's form
terminates (each JAX-form level used to stage the next, ~14x larger, without end).

References are analytic (d^k sqrt(x)/dx^k) in float64, never our own output."""
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np

from jaxpr_cc.backends.jaxpr import region_to_closed_jaxpr
from jaxpr_cc.closure.ir_rules import FIRST_ORDER_KEYS, is_first_order_custom
from jaxpr_cc import jax_adapter as jx
from jaxpr_cc.closure.rules import FORWARD_ONLY_LEVELS, forward_only
from jaxpr_cc.frontend.from_jaxpr import region_from_closed_jaxpr
from jaxpr_cc.frontend.staged_rules import convert_program


def newton_sqrt_loop(x):
    """sqrt(x) by a while_loop: JAX cannot reverse-differentiate it."""
    def keep_going(c):
        k, prev, y = c
        return (k < 200) & (jnp.abs(prev - y) > 1e-14)

    def step(c):
        k, _, y = c
        return k + 1, y, 0.5 * (y + x / y)

    return jax.lax.while_loop(keep_going, step, (0, x, 0.5 * (x + 1.0)))[2]


def _sqrt_derivatives(x):
    return [np.sqrt(x), 0.5 * x ** -0.5, -0.25 * x ** -1.5, 0.375 * x ** -2.5]


def _check_orders(fn, x, orders):
    want = _sqrt_derivatives(float(x))
    got = fn
    for order in range(orders + 1):
        np.testing.assert_allclose(float(got(x)), want[order], rtol=1e-9,
                                   err_msg=f"order {order}")
        got = jax.grad(got)


def _custom_equations(region):
    return [eqn for _, eqn in region.walk() if eqn.prim.name in FIRST_ORDER_KEYS]


def test_a_jax_form_forward_only_converts_to_a_first_order_rule():
    with jax.enable_x64(True):
        x = jnp.float64(2.0)
        g = forward_only(lambda v: [newton_sqrt_loop(v)])
        closed = jax.make_jaxpr(lambda v: g(v)[0])(x)
        region = region_from_closed_jaxpr(closed)
        assert any(not is_first_order_custom(e.prim.name, e.params)
                   for e in _custom_equations(region))
        convert_program(SimpleNamespace(body=region))
        custom = _custom_equations(region)
        assert custom and all(is_first_order_custom(e.prim.name, e.params) for e in custom)
        converted = region_to_closed_jaxpr(region)

        def fn(v):
            return jx.eval_jaxpr(converted.jaxpr, converted.consts, v)
        # Reverse mode to FORWARD_ONLY_LEVELS orders (JAX refuses the loop's own).
        _check_orders(lambda v: fn(v)[0], x, FORWARD_ONLY_LEVELS)
        np.testing.assert_allclose(float(jax.jacfwd(jax.jacfwd(lambda v: fn(v)[0]))(x)),
                                   _sqrt_derivatives(2.0)[2], rtol=1e-9)


def test_first_order_forward_only_reverse_orders():
    with jax.enable_x64(True):
        x = jnp.float64(3.0)
        for levels in (1, 2):
            g = forward_only(lambda v: [newton_sqrt_loop(v)], levels)
            _check_orders(lambda v: g(v)[0], x, levels)
            # Forward mode goes on past the levels (through the loop itself).
            h = lambda v: g(v)[0]  # noqa: E731
            for _ in range(3):
                h = jax.jacfwd(h)
            np.testing.assert_allclose(float(h(x)), _sqrt_derivatives(3.0)[3], rtol=1e-9)


def test_a_program_stores_a_forward_only_rule_as_its_primal_and_levels(tmp_path):
    # Its jvp (a vmapped jvp of the primal, ~14x larger through a loop) is made from
    # the primal when JAX first differentiates it, not when the program is built:
    # a primal call of diffrax's BacksolveAdjoint with a PID controller spent
    # minutes making jvp bodies it never ran.
    import jaxpr_cc
    from jaxpr_cc.closure.ir_rules import FORWARD_ONLY_PARAM

    with jax.enable_x64(True):
        x = jnp.float64(2.0)
        g = forward_only(lambda v: [newton_sqrt_loop(v)])
        program = jaxpr_cc.trace(lambda v: g(v)[0], x)
        custom = _custom_equations(program.body)
        assert [e.params[FORWARD_ONLY_PARAM] for e in custom] == [FORWARD_ONLY_LEVELS]
        assert all("jvp_jaxpr" not in e.params for e in custom)
        jaxpr_cc.save(program, tmp_path / "p.jcc")
        loaded = jaxpr_cc.load(tmp_path / "p.jcc")
        for fn in (program, loaded):
            _check_orders(fn, x, FORWARD_ONLY_LEVELS)
            np.testing.assert_allclose(float(jax.jacfwd(jax.jacfwd(fn))(x)),
                                       _sqrt_derivatives(2.0)[2], rtol=1e-9)
        # Emitted Python holds every rule: the jvp is made there.
        namespace: dict = {}
        exec(compile(jaxpr_cc.emit_python(program), "<emitted>", "exec"), namespace)
        emitted = namespace[program.name] if program.name in namespace else None
        assert emitted is not None
        _check_orders(emitted, x, 1)
