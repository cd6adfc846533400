"""xorshift hashing with uint32 shifts/xor, uint8 byte rotation, int32 popcount and arithmetic shift."""
import jax
import jax.numpy as jnp
from jax import lax

TAGS = ("uint32", "uint8", "int32", "bitwise", "shift", "cast")
SUPPORTS = ("jvp", "vmap", "jit")


def fun(state, data):
    x = state
    x = x ^ (x << 13)
    x = x ^ (x >> 17)                                  # logical shift on unsigned
    x = x ^ (x << 5)
    mixed = x ^ data.astype(jnp.uint32) * jnp.uint32(0x9E3779B1)
    low = (mixed & jnp.uint32(0xFF)).astype(jnp.uint8)
    rotated = (low << 3) | (low >> 5)                  # uint8 rotate-left by 3
    signed = lax.bitcast_convert_type(mixed, jnp.int32)
    pop = lax.population_count(signed)
    arith = jnp.right_shift(signed, 7)                 # arithmetic shift keeps sign
    return x, rotated, pop, arith, ~rotated


def example_args():
    state = jnp.array([1, 2, 0xDEADBEEF, 12345, 0x80000000, 7], dtype=jnp.uint32)
    data = jnp.array([0, 17, 255, 128, 64, 3], dtype=jnp.uint8)
    return (state, data)
