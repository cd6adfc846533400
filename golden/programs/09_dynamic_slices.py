"""Sliding-window buffer update with lax.dynamic_slice / dynamic_update_slice at a traced offset."""
import jax
import jax.numpy as jnp
from jax import lax

TAGS = ("dynamic_slice", "dynamic_update_slice", "int32", "float32")
SUPPORTS = ("grad", "jvp", "vmap", "jit")


def fun(buf, patch, start):
    window = lax.dynamic_slice(buf, (start, jnp.int32(0)), (3, 4))
    updated = lax.dynamic_update_slice(buf, patch * 2.0 + window, (start + 1, jnp.int32(2)))
    rows = lax.dynamic_slice_in_dim(updated, start, 2, axis=0)
    return updated, rows.sum(axis=0)


def example_args():
    buf = jnp.arange(8 * 6, dtype=jnp.float32).reshape(8, 6) / 10.0
    patch = jnp.ones((3, 4), jnp.float32) * jnp.float32(-0.5)
    return (buf, patch, jnp.int32(2))


# Both dynamic slices wrap a negative `start` the same way (lt / add / select_n):
# CSE keeps the first wrap and the second slice indexes with it.
# RUN: cse
# CHECK-LABEL: func @fun(%buf:f32[8,6], %patch:f32[3,4], %start:i32[])
# CHECK:      [[NEG:%[0-9]+]]:bool[] = lt %start, 0:i32[]
# CHECK-NEXT: [[WRAP:%[0-9]+]]:i32[] = add %start, 8:i32[]
# CHECK-NEXT: [[IDX:%[0-9]+]]:i32[] = select_n [[NEG]], %start, [[WRAP]]
# CHECK:      dynamic_slice[slice_sizes=(3, 4)] %buf, [[IDX]],
# CHECK:      [[UPD:%[0-9]+]]:f32[8,6] = dynamic_update_slice %buf,
# CHECK-NOT:  lt %start, 0:i32[]
# CHECK:      dynamic_slice[slice_sizes=(2, 6)] [[UPD]], [[IDX]], 0:i32[]
