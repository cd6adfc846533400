"""``emit_python`` keeps a NaN's sign and payload (adv29a).

They are data: ``copysign``, ``signbit`` and bitcasts read them.  The emitted
module used to spell every NaN ``np.nan``.  Checked against ``jax.jit`` of the
same function, bit for bit.
"""
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

import jaxpr_cc
from emitted import emitted_function

_BITS = {np.dtype(np.float16): np.uint16, np.dtype(ml_dtypes.bfloat16): np.uint16,
         np.dtype(np.float32): np.uint32, np.dtype(np.float64): np.uint64}


def _nans(dtype):
    """A canonical NaN, its negative, NaNs with payloads and signalling NaNs, as
    ``dtype``."""
    uint = _BITS[np.dtype(dtype)]
    width = np.dtype(uint).itemsize * 8
    mantissa = {16: 10 if np.dtype(dtype) == np.float16 else 7, 32: 23, 64: 52}[width]
    quiet = (int(np.array(np.nan, dtype).view(uint)) & ~(1 << (width - 1)))
    sign = 1 << (width - 1)
    inf = int(np.array(np.inf, dtype).view(uint))
    signalling = [inf | 1, inf | sign | 1]  # quiet bit clear, payload 1
    bits = [quiet, quiet | sign, quiet | 1, quiet | sign | (1 << (mantissa - 2)), 0, *signalling]
    return np.array(bits, uint).view(dtype)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.float64],
                         ids=["f16", "bf16", "f32", "f64"])
def test_nan_constants_and_literals_keep_their_bits(dtype, tmp_path):
    with jax.enable_x64(dtype == np.float64):
        consts = _nans(dtype)
        uint = _BITS[np.dtype(dtype)]
        negative_nan = consts[1]  # a scalar literal of the program

        def f(x):
            table = lax.bitcast_convert_type(jnp.where(x > 0, x, jnp.asarray(consts)), uint)
            picked = jnp.where(x > 0, x, negative_nan)
            return table, lax.bitcast_convert_type(picked, uint), jnp.signbit(picked)

        x = jnp.zeros(7, dtype)
        want = jax.jit(f)(x)
        program = jaxpr_cc.trace(f, x)
        got = emitted_function(program, tmp_path)(x)
        for w, g in zip(want, got):
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_a_param_holding_a_negative_nan_keeps_its_sign(tmp_path):
    def f(x):  # gather's fill_value is a param
        return jnp.signbit(x.at[jnp.array([0, 7])].get(mode="fill", fill_value=-jnp.nan))

    x = jnp.arange(3.0, dtype=jnp.float32)
    want = jax.jit(f)(x)
    got = emitted_function(jaxpr_cc.trace(f, x), tmp_path)(x)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert bool(want[1])


def test_two_rules_differing_in_a_nan_payload_stay_two_functions():
    """emit_python shared one function between custom rules whose printed
    regions are equal: NaN prints as ``nan`` whatever its payload, so the second
    rule returned the first's constant (adversary, stop 32)."""
    quiet = np.float32(np.nan)
    payload = np.frombuffer(np.uint32(0x7FC00123).tobytes(), np.float32)[0]

    def rule(c):
        @jax.custom_jvp
        def s(x):
            return x * 0 + jnp.asarray(c)

        s.defjvp(lambda p, t: (s(p[0]), t[0]))
        return s

    def f(x):
        return rule(quiet)(x), rule(payload)(x)

    x = jnp.float32(0.5)
    ns: dict = {}
    exec(jaxpr_cc.emit_python(jaxpr_cc.trace(f, x)), ns)
    bits = [np.asarray(v).tobytes() for v in jax.jit(ns["f"])(x)]
    assert bits == [np.asarray(v).tobytes() for v in jax.jit(f)(x)]
    assert bits[0] != bits[1]
