"""Spring-mass integrator step with a namedtuple state and nested dict params in and out."""
from collections import namedtuple

import jax
import jax.numpy as jnp

TAGS = ("namedtuple", "dict", "tuple", "nested_pytree", "pytree_in", "pytree_out", "float32")
SUPPORTS = ("grad", "jvp", "vmap", "jit")

State = namedtuple("State", ["position", "velocity"])


def fun(state, params):
    spring = params["spring"]
    mass, dt = params["integrator"]
    force = -spring["k"] * state.position - spring["damping"] * state.velocity
    velocity = state.velocity + dt * force / mass
    position = state.position + dt * velocity
    energy = {
        "kinetic": 0.5 * mass * jnp.sum(velocity ** 2),
        "potential": 0.5 * spring["k"] * jnp.sum(position ** 2),
    }
    return State(position, velocity), energy


def example_args():
    state = State(jnp.array([1.0, 0.0, -0.5], jnp.float32), jnp.array([0.0, 0.3, 0.1], jnp.float32))
    params = {
        "spring": {"k": jnp.float32(4.0), "damping": jnp.float32(0.2)},
        "integrator": (jnp.float32(1.5), jnp.float32(0.1)),
    }
    return (state, params)
