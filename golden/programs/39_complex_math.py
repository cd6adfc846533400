"""complex64 signal math: phase rotation, conj products, magnitude, angle and an FFT."""
import jax
import jax.numpy as jnp

TAGS = ("complex64", "elementwise", "float32")
SUPPORTS = ("grad", "jvp", "vmap", "jit")


def fun(z, w):
    phase = jnp.exp(1j * jnp.angle(z))
    rotated = z * jnp.exp(1j * w)                     # w is real float32
    cross = jnp.conj(z) * rotated
    power = jnp.abs(rotated) ** 2
    spectrum = jnp.fft.fft(z)
    return cross + phase, power, jnp.real(spectrum) * jnp.imag(spectrum)


def example_args():
    t = jnp.linspace(0.0, 1.0, 8, dtype=jnp.float32)
    z = (1.0 + t) * jnp.exp(1j * 2.0 * jnp.pi * t)
    return (z.astype(jnp.complex64), jnp.linspace(-0.5, 0.5, 8, dtype=jnp.float32))
