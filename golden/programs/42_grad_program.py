"""The program is jax.grad of an L2-regularized logistic-regression loss w.r.t. (w, b)."""
import jax
import jax.numpy as jnp
import numpy as np

TAGS = ("transformed_grad", "pytree_out", "float32")
SUPPORTS = ("grad", "jvp", "vmap", "jit")
GRAD_ARGNUMS = (0, 1)


def _loss(w, b, features, labels):
    logits = features @ w + b
    nll = jnp.mean(jax.nn.softplus(logits) - labels * logits)
    return nll + 0.01 * jnp.sum(w * w)


fun = jax.grad(_loss, argnums=(0, 1))


def example_args():
    rng = np.random.RandomState(42)
    features = jnp.asarray(rng.randn(6, 3).astype(np.float32))
    labels = jnp.array([1, 0, 1, 1, 0, 0], jnp.float32)
    return (jnp.array([0.1, -0.3, 0.2], jnp.float32), jnp.float32(0.05), features, labels)


# The traced gradient calls softplus through a jit with three outputs; only the
# first is used, so DCE leaves a one-output jit.
# RUN: cse --check-prefix=BEFORE
# BEFORE: {{%[0-9]+}}:f32[6], {{%[0-9]+}}:f32[6], {{%[0-9]+}}:f32[6] = jit[{{.*}}name='softplus'
# RUN: cse,dce
# CHECK-LABEL: func @_loss(
# CHECK:      [[Z:%[0-9]+]]:f32[6] = add {{%[0-9]+}}, %b
# CHECK-NOT:  , {{%[0-9]+}}:f32[6] = jit[
# CHECK:      {{%[0-9]+}}:f32[6] = jit[name='softplus'] [[Z]] {
