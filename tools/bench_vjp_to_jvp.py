"""Forward mode through custom_vjp rules (``vjp-to-jvp``, on by default in
``jaxpr_cc.jit``) against JAX on the original function, in one run.

A 256 -> 256 function built from custom_vjp layers (``y = tanh(W x + b)`` with a
hand-written bwd), two of them in sequence.  Prints the run time (compiled, best
of several, the two sides interleaved) of

1. ``jax.jacfwd(jaxpr_cc.jit(model))`` against ``jax.jacrev(model)``
   (target <= 1.2);
2. ``jax.hessian`` (forward over reverse) of a scalar loss through
   ``jaxpr_cc.jit`` against ``jax.hessian`` of the same model written without
   custom rules (target <= 1.5);
3. reverse mode, ``jax.grad`` of that loss through ``jaxpr_cc.jit`` (its rules
   rewritten: custom_jvp whose tangent's transpose is the user's bwd) against
   ``jax.grad`` of the original custom_vjp model (target <= 1.02); the compiled
   HLO of the two is also compared, by opcode counts and instruction by
   instruction (names, metadata and source locations aside): identical HLO means
   the rewrite costs reverse mode nothing, and a ratio off 1 is timing noise.

Every pair is checked to agree first.

    .venv/bin/python tools/bench_vjp_to_jvp.py [--n 256] [--repeat 50]
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxpr_cc  # noqa: E402


@jax.custom_vjp
def layer(w, b, x):
    return jnp.tanh(w @ x + b)


def _layer_fwd(w, b, x):
    y = jnp.tanh(w @ x + b)
    return y, (w, x, y)


def _layer_bwd(res, ct):
    w, x, y = res
    g = ct * (1.0 - y * y)
    return jnp.outer(g, x), g, w.T @ g


layer.defvjp(_layer_fwd, _layer_bwd)


def model(params, x):
    (w1, b1), (w2, b2) = params
    return layer(w2, b2, layer(w1, b1, x))


def plain_model(params, x):
    (w1, b1), (w2, b2) = params
    return jnp.tanh(w2 @ jnp.tanh(w1 @ x + b1) + b2)


def loss_of(model):
    return lambda params, x: jnp.sum(model(params, x) ** 2)


def run_pair(fn_a, fn_b, args, repeat: int) -> tuple[float, float]:
    """Best times of two compiled functions, measured alternately (so that load
    from other processes hits both alike)."""
    jax.block_until_ready(fn_a(*args))  # compile
    jax.block_until_ready(fn_b(*args))
    best_a = best_b = float("inf")
    for _ in range(repeat):
        for fn, which in ((fn_a, 0), (fn_b, 1)):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*args))
            dt = time.perf_counter() - t0
            if which == 0:
                best_a = min(best_a, dt)
            else:
                best_b = min(best_b, dt)
    return best_a, best_b


def opcode_counts(jitted, args) -> dict:
    """Instruction counts by opcode of the optimized HLO."""
    text = jitted.lower(*args).compile().as_text()
    counts: dict = {}
    for m in re.finditer(r"=\s*\S+\s+([a-z][\w-]*)\(", text):
        counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return counts


_DEBUG_TABLES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")


def normalized_hlo(jitted, args) -> list[str]:
    """The optimized HLO's instructions with names, metadata and source locations
    removed: equal lists mean the same computation, instruction by instruction."""
    text = jitted.lower(*args).compile().as_text()
    out, in_table = [], False
    for line in map(str.strip, text.splitlines()):
        if line in _DEBUG_TABLES:
            in_table = True
            continue
        if in_table and (line.startswith(("ENTRY", "%", "HloModule")) or not line):
            in_table = False
        if in_table or not line or line.startswith("HloModule"):
            continue
        line = re.sub(r", metadata=\{[^}]*\}", "", line)
        line = re.sub(r", stack_frame_id=\d+", "", line)
        out.append(re.sub(r"%[\w.\-]+", "%v", line))
    return out


def check(a, b, what, rtol=1e-4, atol=1e-5):
    if not np.allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol):
        err = float(jnp.max(jnp.abs(jnp.asarray(a) - jnp.asarray(b))))
        raise SystemExit(f"{what}: results differ (max abs difference {err:.3g})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=256, help="input and output dimension")
    ap.add_argument("--repeat", type=int, default=50)
    opts = ap.parse_args()
    n = opts.n
    rng = np.random.default_rng(0)
    scale = 1.0 / np.sqrt(n)
    params = tuple((jnp.asarray(rng.normal(size=(n, n)) * scale, jnp.float32),
                    jnp.asarray(rng.normal(size=(n,)) * 0.1, jnp.float32)) for _ in range(2))
    x = jnp.asarray(rng.normal(size=(n,)), jnp.float32)
    args = (params, x)
    ours = jaxpr_cc.jit(model)            # forward mode by default
    ours_loss = jaxpr_cc.jit(loss_of(model))
    rows = []

    jacfwd_new = jax.jit(jax.jacfwd(ours, argnums=1))
    jacrev_old = jax.jit(jax.jacrev(model, argnums=1))
    check(jacfwd_new(*args), jacrev_old(*args), "jacfwd vs jacrev")
    rows.append(("jacfwd(jaxpr_cc.jit) / jacrev(original)",
                 *run_pair(jacfwd_new, jacrev_old, args, opts.repeat), 1.2))

    # Context, not a target: the same ratio for JAX's own forward and reverse
    # mode on the model written without custom rules.
    jacfwd_plain = jax.jit(jax.jacfwd(plain_model, argnums=1))
    jacrev_plain = jax.jit(jax.jacrev(plain_model, argnums=1))
    check(jacfwd_plain(*args), jacrev_old(*args), "plain jacfwd vs jacrev")
    rows.append(("(context) jacfwd / jacrev, no custom rules",
                 *run_pair(jacfwd_plain, jacrev_plain, args, opts.repeat), None))

    hess_new = jax.jit(jax.hessian(ours_loss, argnums=1))
    hess_plain = jax.jit(jax.hessian(loss_of(plain_model), argnums=1))
    check(hess_new(*args), hess_plain(*args), "hessian vs plain hessian", rtol=1e-3, atol=1e-4)
    rows.append(("hessian(jaxpr_cc.jit) / hessian(no custom rules)",
                 *run_pair(hess_new, hess_plain, args, opts.repeat), 1.5))

    grad_new = jax.jit(jax.grad(ours_loss, argnums=(0, 1)))
    grad_old = jax.jit(jax.grad(loss_of(model), argnums=(0, 1)))
    for a, b in zip(jax.tree_util.tree_leaves(grad_new(*args)),
                    jax.tree_util.tree_leaves(grad_old(*args))):
        check(a, b, "reverse mode", rtol=1e-6, atol=1e-7)
    rows.append(("grad(jaxpr_cc.jit) / grad(original custom_vjp)",
                 *run_pair(grad_new, grad_old, args, opts.repeat), 1.02))
    same_hlo = opcode_counts(grad_new, args) == opcode_counts(grad_old, args)
    same_text = normalized_hlo(grad_new, args) == normalized_hlo(grad_old, args)

    print(f"function: {n} -> {n}, two custom_vjp layers tanh(W x + b); "
          f"best of {opts.repeat}, alternating")
    print(f"{'measure':<50} {'ours ms':>9} {'reference ms':>13} {'ratio':>7} {'target':>7}")
    for name, t_new, t_ref, target in rows:
        ratio = t_new / t_ref
        verdict = "" if target is None else ("ok" if ratio <= target else "OVER")
        print(f"{name:<50} {t_new * 1e3:>9.3f} {t_ref * 1e3:>13.3f} {ratio:>7.3f} "
              f"{'' if target is None else '<= ' + str(target):>7} {verdict}")
    print(f"reverse mode: optimized HLO opcode counts identical to the original's: {same_hlo}")
    # Identical instructions: any difference in the grad ratio is timing noise.
    print(f"reverse mode: optimized HLO identical to the original's, instruction by "
          f"instruction (names and source locations aside): {same_text}")


if __name__ == "__main__":
    main()
