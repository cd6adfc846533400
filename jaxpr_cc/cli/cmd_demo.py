"""``jaxpr-cc demo``: the main job on a bundled example.

A fixed-point solver whose update function closes over a traced parameter ``b``
(``jaxpr_cc/examples/fixed_point.py``): plain JAX cannot differentiate it.  The demo
traces it (custom rules materialized, the closure converted), runs the default
pipeline, saves and reloads the program, compiles it with XLA, runs it, and prints
value and gradient beside JAX's results and the implicit-function reference.

``--b`` must lie where the iteration converges (``B_RANGE``); the solver also stops
after ``MAX_ITERATIONS`` steps, and the demo says so when it did not converge.
"""
from __future__ import annotations

import argparse
import math
import os
import tempfile

# The example's constants, repeated so that `jaxpr-cc demo --help` does not import
# JAX; tests/test_cli_outputs.py checks that they agree.
B_RANGE = (-2.0, 1.0)


def parameter_b(text: str) -> float:
    """argparse type of --b: a number in B_RANGE."""
    low, high = B_RANGE
    try:
        b = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(b):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    if not low <= b <= high:
        raise argparse.ArgumentTypeError(
            f"{text} is outside [{low:g}, {high:g}], where the solver's iteration "
            f"x <- cos(b x) + b/2 converges; give a value in that range")
    return b


def register(sub) -> None:
    p = sub.add_parser("demo", help="trace, optimize, save, reload, compile and run the bundled example",
                       description="Run the main job on the bundled fixed-point example: trace a solver "
                                   "whose function closes over a parameter, run the default pipeline, "
                                   "save and reload the program, compile it, run it, and print the "
                                   "value and gradient beside JAX's reference.")
    p.add_argument("--b", type=parameter_b, default=0.7,
                   help=f"the parameter the solver's function closes over, in "
                        f"[{B_RANGE[0]:g}, {B_RANGE[1]:g}] (default 0.7)")
    p.add_argument("--show-ir", action="store_true", help="print the optimized IR")
    p.set_defaults(run=run)


def run(args) -> int:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import jaxpr_cc
    from jaxpr_cc.examples import fixed_point as ex
    from jaxpr_cc.passes import DEFAULT_PIPELINE

    b = jnp.float32(args.b)
    print(f"program: x* = cos(b x*) + b/2, solved by a custom_vjp fixed-point iteration whose "
          f"update closes over b = {args.b}")
    _, steps, converged = ex.solve_closed_over_status(b)
    if not bool(converged):
        print(f"solver:    no fixed point: the iteration did not converge within "
              f"{ex.MAX_ITERATIONS} steps (tolerance {ex.TOLERANCE:g}) for b = {args.b}; it "
              f"converges for b in [{ex.B_RANGE[0]:g}, {ex.B_RANGE[1]:g}]")
        print("NOT CONVERGED")
        return 1
    print(f"solver:    converged in {int(steps)} steps (at most {ex.MAX_ITERATIONS})")
    program = jaxpr_cc.trace(ex.solve_closed_over, b)
    print(f"traced:    {program.num_equations()} equations, first-order: {program.is_first_order()}")
    optimized = jaxpr_cc.run_passes(program, DEFAULT_PIPELINE)
    print(f"pipeline:  {DEFAULT_PIPELINE} -> {optimized.num_equations()} equations")
    if args.show_ir:
        print(optimized)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "solve_closed_over.jaxprcc")
        jaxpr_cc.save(optimized, path)
        size = os.path.getsize(path)
        loaded = jaxpr_cc.load(path)
    same = str(loaded) == str(optimized)
    print(f"saved:     {size} bytes; reloaded program prints identically: {same}")
    executable = jaxpr_cc.compile(loaded)
    value = executable(b)
    grad = jax.jit(jax.grad(loaded))(b)

    ref_value = ex.solve_closed_over(b)
    try:
        jax.grad(ex.solve_closed_over)(b)
        jax_grad = "computed"
    except Exception as e:  # JAX cannot see the closed-over b
        jax_grad = f"fails: {type(e).__name__}"
    reference = ex.solve_closed_over_reference_grad(b)
    print(f"value     jaxpr-cc (compiled) {float(value):.7f}   jax {float(ref_value):.7f}")
    print(f"gradient  jaxpr-cc            {float(grad):.7f}   jax {jax_grad}")
    print(f"          implicit-function reference {float(reference):.7f}")
    # Both results carry the solver's error, about TOLERANCE / (1 - contraction rate)
    # in absolute terms, which is what matters where the gradient crosses zero.
    ok = (same and np.allclose(value, ref_value, rtol=1e-6, atol=ex.TOLERANCE)
          and np.allclose(grad, reference, rtol=1e-3, atol=100 * ex.TOLERANCE))
    print("match" if ok else "MISMATCH")
    return 0 if ok else 1
