"""What a jitted function closed over is freed as soon as the last reference to
the function is dropped, without waiting for the garbage collector, as with
jax.jit (JAX's api_test ``test_jit_reference_dropping``): the graph IR holds no
reference cycle through a region's constants."""
import weakref

import jax
import jax.numpy as jnp
import pytest

import jaxpr_cc


def _closures():
    def plain(x):
        return lambda: x

    def computed(x):
        return lambda y: jnp.sin(x) * y

    def in_cond(x):
        return lambda y: jax.lax.cond(y.sum() > 0, lambda v: v + x, lambda v: v - x, y)

    def in_scan(x):
        return lambda y: jax.lax.scan(lambda c, _: (c * x, None), y, None, length=3)[0]
    return {"plain": (plain, ()), "computed": (computed, (jnp.ones(10),)),
            "in_cond": (in_cond, (jnp.ones(10),)), "in_scan": (in_scan, (jnp.ones(10),))}


@pytest.mark.parametrize("pipeline", ["default", None])
@pytest.mark.parametrize("case", sorted(_closures()))
def test_jit_drops_closed_over_arrays(case, pipeline):
    make, args = _closures()[case]
    x = jnp.arange(10.0)
    f = make(x)
    kw = {} if pipeline == "default" else {"pipeline": None}
    g = jaxpr_cc.jit(f, **kw)
    x = weakref.ref(x)
    expected = jax.jit(f)(*args)
    assert jnp.array_equal(g(*args), expected)
    g(*args)
    del f
    assert x() is not None  # g still holds the function
    assert jnp.array_equal(g(*args), expected)
    del g
    assert x() is None


def test_traced_program_drops_closed_over_arrays():
    x = jnp.arange(10.0)
    program = jaxpr_cc.trace(lambda y: y * x, jnp.ones(10))
    x = weakref.ref(x)
    assert x() is not None
    del program
    assert x() is None


def test_program_object_is_kept_while_held():
    # An equation's region is held weakly: it must stay reachable while the
    # program that holds it lives.
    x = jnp.arange(3.0)
    program = jaxpr_cc.trace(lambda y: jnp.sin(y) * x, jnp.ones(3))
    for region, eqn in program.body.walk():
        assert eqn.region is region
    assert program.body.entry.region is program.body
