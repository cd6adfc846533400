"""closed_over='reverse' on a custom_vjp whose primal runs a while_loop: the
reverse-mode derivative of that primal does not exist in JAX.  An emitted module
that keeps the user's custom_vjp raised JAX's own "Reverse-mode differentiation
does not work for lax.while_loop" from deep inside the rule (adversary, stop 40);
it now says which rule, which value and which policies work, as the Program does
when JAX differentiates that rule.  With forward mode (the Program's default, and
emit_python(forward_mode=True)) the derivative is formed through the rewritten
rule.  Reference: the implicit derivative of x = cos(b x) + b / 2 in float64."""
import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_cc
from jaxpr_cc.examples.fixed_point import fixed_point

B = 0.5


def sol(b):
    return fixed_point(lambda _, x: jnp.cos(b * x) + 0.5 * b, 0.0, jnp.float32(0.5))


def _implicit_derivative(b):
    x = 0.5
    for _ in range(500):
        x = np.cos(b * x) + 0.5 * b
    return (0.5 - x * np.sin(b * x)) / (1.0 + b * np.sin(b * x))


def _module(tmp_path, source, name):
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.sol


def test_an_emitted_custom_vjp_says_why_reverse_cannot_be_formed(tmp_path):
    program = jaxpr_cc.trace(sol, jnp.float32(B), closed_over="reverse")
    emitted = _module(tmp_path, jaxpr_cc.emit_python(program), "reverse_kept")
    np.testing.assert_allclose(emitted(jnp.float32(B)), program(jnp.float32(B)), rtol=1e-6)
    # (The module defines its own ClosedOverError: it does not import jaxpr_cc.)
    with pytest.raises(ValueError, match=r"closed_over='reverse'.*while_loop.*"
                                         r"closed_over='auto' or 'forward'") as info:
        jax.grad(emitted)(jnp.float32(B))
    assert type(info.value).__name__ == "ClosedOverError"
    assert len(str(info.value).splitlines()) == 1


def test_forward_mode_forms_it_through_the_rewritten_rule(tmp_path):
    program = jaxpr_cc.trace(sol, jnp.float32(B), closed_over="reverse")
    want = _implicit_derivative(B)
    # (float32, solves stopped at steps of 1e-6: a few 1e-4 from the exact value.)
    np.testing.assert_allclose(jax.grad(program)(jnp.float32(B)), want, rtol=5e-4)
    emitted = _module(tmp_path, jaxpr_cc.emit_python(program, forward_mode=True),
                      "reverse_forward")
    np.testing.assert_allclose(jax.grad(emitted)(jnp.float32(B)), want, rtol=5e-4)
