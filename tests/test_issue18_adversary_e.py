"""jaxpr_cc.jit and programs closing over mutable state (issue 18, adversary e)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_cc


def test_a_closed_over_ref_is_state_not_a_constant():
    # hoist-consts read the Ref as an array, item by item, forever (ref[i] never
    # raises IndexError): it is mutable state, never hoisted, folded or deduplicated.
    x = jnp.arange(3.0) + 1
    results = {}
    for jit in (jax.jit, jaxpr_cc.jit):
        r = jax.new_ref(jnp.zeros(3))

        @jit
        def f(x):
            r[...] += x
            return x * 2

        np.testing.assert_array_equal(np.asarray(f(x)), 2 * np.asarray(x))
        f(x)
        results[jit] = np.asarray(r[...])
    np.testing.assert_array_equal(results[jaxpr_cc.jit], results[jax.jit])


def test_saving_a_program_closing_over_a_ref_says_why(tmp_path):
    r = jax.new_ref(jnp.zeros(3))

    def f(x):
        r[...] += x
        return x

    program = jaxpr_cc.trace(f, jnp.ones(3))
    with pytest.raises(Exception, match="Ref.*cannot be saved") as info:
        jaxpr_cc.save(program, tmp_path / "p.jcc")
    assert "\n" not in str(info.value)
    assert not (tmp_path / "p.jcc").exists()
