"""Random-feature projection closing over a 64x64 float32 numpy matrix built at module level."""
import jax
import jax.numpy as jnp
import numpy as np

TAGS = ("large_constant", "matmul", "float32")
SUPPORTS = ("grad", "jvp", "vmap", "jit")

_RNG = np.random.RandomState(1234)
PROJECTION = (_RNG.randn(64, 64) / 8.0).astype(np.float32)
OFFSETS = np.linspace(0.0, 2.0 * np.pi, 64, endpoint=False).astype(np.float32)


def fun(x):
    # x: (batch, 64)
    features = jnp.cos(x @ PROJECTION + OFFSETS) * np.float32(np.sqrt(2.0 / 64.0))
    recon = features @ PROJECTION.T
    return recon, jnp.sum(features * features, axis=-1)


def example_args():
    return (jnp.linspace(-1.0, 1.0, 3 * 64, dtype=jnp.float32).reshape(3, 64),)


# The traced program closes over three float32 constants; hoist-consts turns them
# into bound parameters ahead of x, leaving no constant behind.
# RUN: --check-prefix=TRACE
# TRACE-LABEL: func @fun(%x:f32[3,64])
# TRACE-NEXT:  const %c0:f32[64,64] = array<f32[64,64] sha256:
# TRACE-NEXT:  const %c1:f32[64] = array<f32[64] sha256:
# TRACE-NEXT:  const %c2:f32[64,64] = array<f32[64,64] sha256:
# RUN: hoist-consts
# CHECK:      # bound params: 3
# CHECK-NEXT: func @fun(%param0:f32[64,64], %param1:f32[64], %param2:f32[64,64], %x:f32[3,64])
# CHECK-NOT:  const
# CHECK:      dot_general[{{.*}}] %x, %param0
# CHECK:      broadcast_in_dim[{{.*}}] %param1
# CHECK:      dot_general[{{.*}}] {{%[0-9]+}}, %param2
