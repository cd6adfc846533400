"""``jaxpr-cc demo``: the main job on a bundled example."""
from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("demo", help="trace and run the bundled fixed-point example",
                       description="Trace the bundled fixed-point solver example, print its IR, "
                                   "run it and compare with JAX.")
    p.set_defaults(run=run)


def run(args) -> int:
    import jax
    import numpy as np

    import jaxpr_cc
    from jaxpr_cc.examples import fixed_point as ex

    (a,) = ex.EXAMPLE_ARGS
    program = jaxpr_cc.trace(ex.newton_sqrt, a)
    program.verify()
    print(program)
    ours = program(a)
    ref = ex.newton_sqrt(a)
    ours_grad = jax.grad(program)(a)
    ref_grad = jax.grad(ex.newton_sqrt)(a)
    print(f"value     jaxpr-cc {float(ours):.7f}   jax {float(ref):.7f}")
    print(f"gradient  jaxpr-cc {float(ours_grad):.7f}   jax {float(ref_grad):.7f}")
    ok = np.array_equal(ours, ref) and np.allclose(ours_grad, ref_grad)
    print("match" if ok else "MISMATCH")
    return 0 if ok else 1
