"""jaxpr_cc.jit raises JAX's own error, with its text, where jaxpr_cc.trace accepts
more than JAX: a tracer passed in a custom_vjp ``nondiff_argnums`` position (JAX's
tests/custom_api_test.py::test_nondiff_arg_tracer_error).  jaxpr_cc.trace makes such
a value a closed-over operand (tests/test_closure.py::test_tracer_in_nondiff_position)."""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import pytest

import jaxpr_cc


def _rule():
    @partial(jax.custom_vjp, nondiff_argnums=(0,))
    def f(x, y):
        return x * y

    f.defvjp(lambda x, y: (f(x, y), jnp.cos(y)), lambda x, cos_y, g: (cos_y * g,))
    return f


def _message_of(fn, *args):
    with pytest.raises(jax.errors.UnexpectedTracerError) as info:
        fn(*args)
    return str(info.value).split("\nSee ")[0]


@pytest.mark.parametrize("differentiate", [False, True], ids=["call", "grad"])
def test_jit_raises_jax_error_for_tracer_in_nondiff_position(differentiate):
    f = _rule()
    ours, theirs = jaxpr_cc.jit(lambda x, y: f(x, y)), jax.jit(lambda x, y: f(x, y))
    if differentiate:
        ours, theirs = jax.grad(ours, 1), jax.grad(theirs, 1)
    assert _message_of(ours, 2.0, 3.0) == _message_of(theirs, 2.0, 3.0)
    assert "custom_vjp" in _message_of(ours, 2.0, 3.0)


def test_trace_still_accepts_tracer_in_nondiff_position():
    f = _rule()
    program = jaxpr_cc.trace(lambda x, y: f(x, y), 2.0, 3.0)
    assert float(program(2.0, 3.0)) == 6.0

