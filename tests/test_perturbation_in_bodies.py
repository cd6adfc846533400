"""A custom rule called inside a scan or while_loop body, a cond branch or a
jitted function gets the tangents JAX gives it: where the loop's, branch's or
call's operands carry one, and for a carry, where its start or the body makes
one (JAX's fixed point).  The rules here assert, as equinox's
filter_custom_vjp does, that a non-differentiable input is not perturbed, or
give an input a cotangent only where it is.  Reference: JAX's own grad of the
same programs (of the same steps unrolled, for a while_loop)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_cc


@jax.custom_vjp
def scaled(x, c):
    return x * c


def _fwd(x, c):
    # As equinox's filter_custom_vjp does for a non-differentiable input.
    assert not c.perturbed, "c is perturbed"
    return x.value * c.value, c.value


def _bwd(c, g):
    return g * jnp.cos(c), None


scaled.defvjp(_fwd, _bwd, symbolic_zeros=True)


@jax.custom_vjp
def product(x, c):
    return x * c


def _product_fwd(x, c):
    return x.value * c.value, (x.value, c.value, c.perturbed)


def _product_bwd(res, g):
    x, c, c_perturbed = res
    # A rule that gives c a cotangent only where JAX perturbs it.
    return g * c, (g * x if c_perturbed else None)


product.defvjp(_product_fwd, _product_bwd, symbolic_zeros=True)

TS = jnp.array([0.5, 1.5, 2.0], jnp.float32)


@jax.jit
def _jitted(x, c):
    return scaled(x, c) + x


PROGRAMS = {
    # The scanned slice and the step counter are constants.
    "scan_slices": lambda k: jax.lax.scan(lambda x, t: (scaled(x, t), None), k, TS)[0],
    "fori_loop": lambda k: jax.lax.fori_loop(
        0, 3, lambda i, s: (scaled(s[0], s[1]), s[1] * 2.0), (k, jnp.float32(0.5)))[0],
    "cond_operand": lambda k: jax.lax.cond(
        k > 0, lambda x, c: scaled(x, c), lambda x, c: x, k, jnp.float32(1.5)),
    "switch_operand": lambda k: jax.lax.switch(
        1, [lambda x, c: x, lambda x, c: scaled(x, c)], k, jnp.float32(1.5)),
    "jit_argument": lambda k: _jitted(k, jnp.float32(1.5)),
    "jit_in_scan": lambda k: jax.lax.scan(lambda x, t: (_jitted(x, t), None), k, TS)[0],
}


# A carry that starts as a constant and that the body perturbs (c <- c + k): JAX
# perturbs it from the first step (its fixed point), and the rule gives it a
# cotangent; one that stays constant gets none.
CARRIES = {
    "scan_carry_made_perturbed": lambda k: jax.lax.scan(
        lambda s, _: ((product(s[0], s[1]), s[1] + k), None), (k, jnp.float32(0.5)), None,
        length=3)[0][0],
    "scan_carry_kept_constant": lambda k: jax.lax.scan(
        lambda s, _: ((product(s[0], s[1]), s[1] * 2.0), None), (k, jnp.float32(0.5)), None,
        length=3)[0][0],
    "carry_made_perturbed_late": lambda k: jax.lax.scan(
        lambda s, _: ((product(s[0], s[1]), s[2], s[2] + k), None),
        (k, jnp.float32(0.5), jnp.float32(0.25)), None, length=4)[0][0],
}


@pytest.mark.parametrize("program", [*PROGRAMS.values(), *CARRIES.values()],
                         ids=[*PROGRAMS, *CARRIES])
def test_a_rule_in_a_body_gets_the_tangents_jax_gives(program):
    k = jnp.float32(0.7)
    want = jax.grad(program)(k)
    np.testing.assert_allclose(jax.grad(jaxpr_cc.jit(program))(k), want, rtol=1e-6)
    np.testing.assert_allclose(jax.grad(jaxpr_cc.trace(program, k))(k), want, rtol=1e-6)
    np.testing.assert_allclose(jax.jacfwd(jaxpr_cc.jit(program))(k), want, rtol=1e-5)


# JAX differentiates no while_loop in reverse mode and no custom_vjp in forward
# mode; the reference is JAX's grad of the same steps unrolled in Python.
WHILE_LOOPS = {
    "counter": (lambda k: jax.lax.while_loop(
        lambda s: s[1] < 2.5, lambda s: (scaled(s[0], s[1]), s[1] + 1.0),
        (k, jnp.float32(0.5)))[0],
        lambda k: scaled(scaled(k, jnp.float32(0.5)), jnp.float32(1.5))),
    "carry_made_perturbed": (lambda k: jax.lax.while_loop(
        lambda s: s[2] < 3, lambda s: (product(s[0], s[1]), s[1] + k, s[2] + 1),
        (k, jnp.float32(0.5), 0))[0],
        lambda k: product(product(product(k, jnp.float32(0.5)), 0.5 + k), 0.5 + k + k)),
}


@pytest.mark.parametrize("pair", list(WHILE_LOOPS.values()), ids=list(WHILE_LOOPS))
def test_a_rule_in_a_while_loop_body_is_perturbed_as_jax_perturbs_it(pair):
    program, unrolled = pair
    k = jnp.float32(0.7)
    want = jax.grad(unrolled)(k)
    np.testing.assert_allclose(jax.jacfwd(jaxpr_cc.jit(program))(k), want, rtol=1e-5)


def _outer_rule(inner):
    @jax.custom_vjp
    def outer(x):
        return jnp.sin(x)

    outer.defvjp(lambda x: (jnp.sin(x), jnp.cos(x)), lambda c, g: (inner(c, g),))
    return outer


# The same rules inside another rule's bwd, which forward mode transposes.
IN_A_BWD = {
    "scan": lambda c, g: jax.lax.scan(lambda u, t: (scaled(u, t) * c, None), g, TS)[0],
    "jit": lambda c, g: _jitted(g, c * 0 + 1.5) * c,
    "cond": lambda c, g: jax.lax.cond(c > 0, lambda u, t: scaled(u, t), lambda u, t: u, g,
                                      jnp.float32(1.5)) * c,
    "while": lambda c, g: jax.lax.while_loop(
        lambda s: s[1] < 2.5, lambda s: (scaled(s[0], s[1]), s[1] + 1.0),
        (g, jnp.float32(0.5)))[0] * c,
    "slices_of_residuals": lambda c, g: jax.lax.scan(
        lambda u, t: (scaled(u, t), None), g, jnp.stack([c, c]))[0],
}


@pytest.mark.parametrize("inner", list(IN_A_BWD.values()), ids=list(IN_A_BWD))
def test_forward_mode_through_a_bwd_calling_the_rule_in_a_body(inner):
    fun = _outer_rule(inner)
    k = jnp.float32(0.7)
    np.testing.assert_allclose(jax.jacfwd(jaxpr_cc.jit(fun))(k), jax.grad(fun)(k), rtol=1e-5)
